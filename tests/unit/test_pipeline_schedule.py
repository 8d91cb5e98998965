"""Megatron's interleaved-schedule micro-batch rule (validate, search) and the pipeline bubble of small micro-batch
counts, checked against a simulation of Megatron's per-rank operation order (schedules.py)."""
from __future__ import annotations

import numpy as np
import pytest

from autoplan.cluster import ClusterSpec
from autoplan.clusterio import load_gpu
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.schedule import pipeline_bubble
from autoplan.errors import InputError
from autoplan.modelio import load_model
from autoplan.report.timeline import simulate
from autoplan.solvers.api import solve
from autoplan.solvers.space import Problem, enumerate_grid
from autoplan.strategy import Strategy
from autoplan.validate import first_broken_rule, interleaved_schedule_problem, validate
from autoplan.workload import Workload


# ---- a simulation of Megatron's schedules ------------------------------------------------------------------

def simulated_step(p: int, v: int, m: int, t_fwd: float = 1.0, t_bwd: float = 2.0) -> float:
    """Seconds of one step of p balanced ranks (t_fwd + t_bwd per micro-batch per rank), no communication: each
    rank runs its passes in Megatron's order, each waiting for its dependency (autoplan/report/timeline.py
    `simulate`, which the plan report draws)."""
    spans = simulate(p, v, m, [t_fwd] * p, [t_bwd] * p)
    return max(end for _, end in spans.values())


@pytest.mark.parametrize("p,v", [(2, 1), (4, 1), (8, 1), (4, 2), (4, 3), (8, 4), (2, 16), (4, 12)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
def test_bubble_follows_the_schedule(p, v, m):
    """1F1B at any m and interleaving at m < p or a multiple of p: the bubble is the simulated step less m t."""
    if v > 1 and m >= p and m % p:
        pytest.skip("Megatron refuses interleaving with a partial last group (validate covers it)")
    t = 3.0
    simulated = simulated_step(p, v, m) - m * t
    priced = float(pipeline_bubble(p * t, t, p, v, m))
    assert priced == pytest.approx(simulated, rel=1e-9, abs=1e-9)


def test_small_counts_keep_the_full_bubble():
    """(p - 1)/(v m) holds only from m = p on: with 2 micro-batches on pp4 v12 the bubble is 25x that figure."""
    t = 1.0
    assert float(pipeline_bubble(4 * t, t, 4, 1, 2)) == pytest.approx(3 * t)  # (p - 1)/m of m t, m < p
    short = float(pipeline_bubble(4 * t, t, 4, 12, 2))
    assert short == pytest.approx((4 - 2) * t + (2 - 1) * t / 12)
    assert short > 8 * (4 - 1) * t / 12
    assert float(pipeline_bubble(4 * t, t, 4, 12, 4)) == pytest.approx(3 * t / 12)


# ---- the rule: validate, the search ------------------------------------------------------------------------

def _case(model: str, gpus: int, gbs: int, gpu: str = "h100", seq: int = 4096):
    return load_model(model), ClusterSpec(gpu=load_gpu(gpu), num_gpus=gpus), Workload(seq_len=seq,
                                                                                       global_batch_size=gbs)


def test_rule_matches_megatron():
    assert interleaved_schedule_problem(4, 1, 2) is None  # 1F1B takes any count
    assert interleaved_schedule_problem(4, 2, 8) is None
    for m in (1, 2, 3, 5, 6, 7):
        assert interleaved_schedule_problem(4, 2, m)


def test_qwen3_30b_pp4_v12_with_two_microbatches_is_refused():
    model, cluster, wl = _case("qwen3-30b-a3b", 32, gbs=8)  # dp = 32 / (2*4) = 4, m = 8 / 4 = 2
    s = Strategy(tp=2, pp=4, vpp=12, ep=4, sp=True, mbs=1)
    with pytest.raises(InputError) as info:
        validate(model, cluster, wl, s)
    msg = str(info.value)
    assert "multiple of pp=4" in msg and "got 2" in msg and "vpp=1" in msg and "\n" not in msg
    assert validate(model, cluster, wl.model_copy(update={"global_batch_size": 16}), s).vpp == 12


def test_mixtral_pp2_v16_with_one_microbatch_is_refused():
    model, cluster, wl = _case("mixtral-8x7b", 16, gbs=4)  # tp2 pp2 -> dp 4, m = 1
    s = Strategy(tp=2, pp=2, vpp=16, ep=4, sp=True, mbs=1)
    assert "got 1" in first_broken_rule(model, cluster, wl, s)


@pytest.mark.parametrize("model,gpus,gbs", [("qwen3-30b-a3b", 32, 8), ("mixtral-8x7b", 16, 4)])
def test_search_never_returns_short_interleaving(model, gpus, gbs):
    model, cluster, wl = _case(model, gpus, gbs)
    lay = enumerate_grid(Problem(model, cluster, wl)).layouts
    micro = gbs // (lay.mbs * lay.dp)
    interleaved = lay.vpp > 1
    assert np.all(micro[interleaved] % lay.pp[interleaved] == 0)
    result = solve(Problem(model, cluster, wl), "enumerate", top_k=10)
    for plan in result.plans:
        assert first_broken_rule(model, cluster, wl, plan.strategy) is None
    # Fixing the refused layout leaves nothing legal instead of a plan Megatron would refuse.
    pp, vpp = (4, 12) if gpus == 32 else (2, 16)  # with tp2, cp1: dp = 4, so at most gbs / 4 micro-batches
    fixed = Problem(model, cluster, wl, fixed={"tp": 2, "cp": 1, "pp": pp, "vpp": vpp})
    assert len(enumerate_grid(fixed).layouts) == 0


def test_estimate_prices_the_one_f_one_b_bubble_of_few_microbatches():
    """pp4 without interleaving: the bubble does not shrink with m (it is (p - 1)/m of the work)."""
    model, cluster, _ = _case("llama3-8b", 8, gbs=8)
    s = Strategy(tp=2, pp=4, sp=True, mbs=1)
    two = estimate(model, cluster, s, Workload(seq_len=4096, global_batch_size=2))
    eight = estimate(model, cluster, s, Workload(seq_len=4096, global_batch_size=8))
    assert two.num_microbatches == 2 and eight.num_microbatches == 8
    b2, b8 = two.time_breakdown["bubble"], eight.time_breakdown["bubble"]
    assert b2 == pytest.approx(b8, rel=1e-6)
    assert b2 / two.time_breakdown["compute"] == pytest.approx(4 * b8 / eight.time_breakdown["compute"], rel=1e-6)
