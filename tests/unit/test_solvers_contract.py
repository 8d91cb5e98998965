"""One behavioural suite for every solver; brute force is the oracle on small problems."""
import json
import time

import numpy as np
import pytest

from autoplan.solvers.api import solve
from autoplan.solvers.space import Problem, enumerate_grid, legal_strategies
from autoplan.validate import validate

from conftest import cluster, make_dense, make_moe, workload

SOLVERS = ["enumerate", "cpsat", "optuna", "brute-force"]
# Optuna's trials take seconds each: its cases run with the slow tests.
SOLVER_CASES = [pytest.param(s, marks=pytest.mark.slow) if s == "optuna" else s for s in SOLVERS]


def small_problems():
    return [
        Problem(make_dense(), cluster(8), workload(gbs=16)),
        Problem(make_moe(), cluster(8), workload(gbs=16)),
        Problem(make_dense(num_layers=12), cluster(16, hbm_gib=8.0), workload(seq=4096, gbs=32)),
    ]


@pytest.mark.parametrize("solver", SOLVER_CASES)
@pytest.mark.parametrize("pi", range(3))
def test_returns_feasible_plans_best_first(solver, pi):
    problem = small_problems()[pi]
    r = solve(problem, solver, top_k=3, seed=1)
    assert r.plans, r.infeasible
    steps = [p.estimate.step_time_s for p in r.plans]
    assert steps == sorted(steps)
    for p in r.plans:
        assert p.estimate.fits
        validate(problem.model, problem.cluster, problem.workload, p.strategy, engine=problem.engine)


@pytest.mark.parametrize("solver", ["enumerate", "cpsat"])
@pytest.mark.parametrize("pi", range(3))
def test_matches_brute_force(solver, pi):
    problem = small_problems()[pi]
    oracle = solve(problem, "brute-force", top_k=1)
    got = solve(problem, solver, top_k=1)
    # cpsat may also find stage splits outside the enumerated grid: never worse than the oracle.
    assert got.plans[0].estimate.step_time_s <= oracle.plans[0].estimate.step_time_s * (1 + 1e-9)
    if solver == "enumerate":
        assert got.plans[0].estimate.step_time_s == pytest.approx(oracle.plans[0].estimate.step_time_s, rel=1e-12)


@pytest.mark.slow
def test_optuna_finds_near_optimum_on_small_space():
    problem = small_problems()[0]
    oracle = solve(problem, "brute-force", top_k=1).plans[0].estimate.step_time_s
    got = solve(problem, "optuna", top_k=1, seed=3).plans[0].estimate.step_time_s
    assert got <= oracle * 1.05


@pytest.mark.parametrize("solver", SOLVER_CASES)
def test_deterministic_for_a_seed(solver):
    problem = small_problems()[1]
    a = solve(problem, solver, top_k=3, seed=7)
    b = solve(problem, solver, top_k=3, seed=7)
    assert [p.strategy for p in a.plans] == [p.strategy for p in b.plans]


@pytest.mark.parametrize("solver", ["optuna", "cpsat"])
def test_respects_time_budget(solver):
    problem = Problem(make_dense(num_layers=32), cluster(64), workload(gbs=256))
    t = time.perf_counter()
    solve(problem, solver, top_k=1, budget_s=1.0)
    assert time.perf_counter() - t < 20.0  # budget bounds the search; enumeration baseline of cpsat is extra


@pytest.mark.parametrize("solver", SOLVER_CASES)
def test_reports_infeasibility_with_reasons(solver):
    huge = make_dense(num_layers=96, hidden_size=12288, ffn_hidden_size=49152, num_attention_heads=96,
                      num_query_groups=96, kv_channels=128)
    r = solve(Problem(huge, cluster(1), workload(gbs=8)), solver, top_k=1)
    assert not r.plans
    assert r.infeasible and sum(r.infeasible.values()) > 0
    assert r.smallest_peak_gib is None or r.smallest_peak_gib > 79


def test_every_point_of_the_space_is_legal():
    for problem in small_problems():
        for s in legal_strategies(problem)[::7]:
            validate(problem.model, problem.cluster, problem.workload, s, engine=problem.engine)


def test_fix_and_exclude_narrow_the_space():
    base = small_problems()[0]
    fixed = Problem(base.model, base.cluster, base.workload, fixed={"tp": [2]}, excluded={"pp": (2,)})
    lay = enumerate_grid(fixed).layouts
    assert len(lay) > 0 and set(lay.tp) == {2} and 2 not in set(lay.pp)


def test_cpsat_stage_split_equals_brute_force():
    """CP-SAT's (first, last, recompute) for one layout equals the best over every split, priced exactly."""
    from autoplan.costmodel.layout import layouts_from_strategies
    from autoplan.costmodel.estimate import evaluate
    from autoplan.solvers.cpsat import refine
    from autoplan import recompute as R
    from autoplan.solvers.space import recompute_options
    from autoplan.strategy import Strategy

    m = make_dense(num_layers=10)
    problem = Problem(m, cluster(4, hbm_gib=3.45), workload(seq=4096, gbs=16))  # tight: forces recompute
    base = layouts_from_strategies([Strategy(pp=4, dp=1, zero=1)], 4)
    got = refine(problem, base, 0)
    assert got is not None
    new, _ = got
    # Brute force over every (first, last) with equal middles and every recompute option.
    cands = []
    for f in range(1, 10):
        for la in range(1, 10):
            rest = 10 - f - la
            if rest <= 0 or rest % 2:
                continue
            for rc, block, rl, mods in recompute_options(problem, 2):
                cands.append(Strategy(pp=4, dp=1, zero=1, first_stage_layers=f, last_stage_layers=la,
                                      recompute={0: "none", 1: "selective", 2: "full"}[rc],
                                      recompute_method=("block" if block else "uniform") if rc == 2 else None,
                                      recompute_layers=rl if rc == 2 else None,
                                      recompute_modules=R.names_of(mods) if rc == 1 else None))
    lay = layouts_from_strategies(cands, 4)
    ev = evaluate(m, problem.cluster, problem.workload, lay, every_rank=True)
    fits = ev.fits()
    assert fits.any()
    best = ev.step_time_s[fits].min()
    mine = evaluate(m, problem.cluster, problem.workload, new, every_rank=True)
    assert bool(mine.fits()[0])
    assert mine.step_time_s[0] == pytest.approx(best, rel=0.01)


def test_fixed_switches_apply_to_every_candidate():
    base = small_problems()[0]
    p = Problem(base.model, base.cluster, base.workload, fixed={"grad_reduce_bf16": [True]})
    lay = enumerate_grid(p).layouts
    assert len(lay) > 0 and lay.grad_reduce_bf16.all()
    best = solve(p, "enumerate", top_k=1).plans[0]
    assert best.strategy.grad_reduce_bf16


def test_fixed_flex_dispatcher_applies_where_experts_are_parallel():
    base = small_problems()[1]
    p = Problem(base.model, base.cluster, base.workload, fixed={"moe_flex_dispatcher": [True]})
    lay = enumerate_grid(p).layouts
    assert (lay.ep > 1).any() and (lay.moe_flex_dispatcher == (lay.ep > 1)).all()
    for i in np.flatnonzero(lay.ep > 1)[:5]:
        s = lay.strategy(int(i))
        assert s.moe_flex_dispatcher and validate(base.model, base.cluster, base.workload, s).moe_flex_dispatcher


def test_plans_differing_only_in_expert_tp_are_both_kept():
    """etp1 and etp2 under tp2, ep1 are different MoE plans: the search keeps both and the table tells them apart."""
    from autoplan.cluster import ClusterSpec
    from autoplan.modelio import load_model
    from autoplan.clusterio import load_gpu
    from autoplan.solvers.api import solve
    from autoplan.solvers.space import Problem
    from autoplan.workload import Workload

    model = load_model("qwen3-30b-a3b")
    problem = Problem(model, ClusterSpec(gpu=load_gpu("b200"), num_gpus=8),
                      Workload(seq_len=4096, global_batch_size=256), fixed={"tp": [2], "ep": [1]})
    plans = solve(problem, "cpsat", top_k=10).plans
    assert len(plans) == 10
    keys = {json.dumps(p.strategy.to_dict(), sort_keys=True) for p in plans}
    assert len(keys) == len(plans)
    assert {p.strategy.etp for p in plans} == {1, 2}
    labels = {p.strategy.label(moe=True) for p in plans}
    assert len(labels) == len(plans)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("pi", range(3))
def test_goodput_objective_ranks_by_goodput(solver, pi):
    """--objective goodput: plans in decreasing goodput; enumerate and CP-SAT reach brute force's best goodput
    (their pruning drops only settings that are slower at the same checkpoint size)."""
    from dataclasses import replace

    from autoplan.clusterio import with_resilience

    base = small_problems()[pi]
    # A failure rate high enough that checkpoints matter on 8-16 GPUs, local checkpoints (sizes follow the sharding).
    c = with_resilience(base.cluster, {"node_mtbf_h": 2.0, "ckpt_method": "local"}, "test")
    problem = replace(base, cluster=c, objective="goodput")
    r = solve(problem, solver, top_k=3, seed=1)
    goodputs = [p.estimate.goodput_tokens_per_s for p in r.plans]
    assert goodputs == sorted(goodputs, reverse=True)
    if solver in ("enumerate", "cpsat"):
        oracle = solve(problem, "brute-force", top_k=1).plans[0].estimate.goodput_tokens_per_s
        assert goodputs[0] >= oracle * (1 - 1e-9)


def test_grid_assembly_keeps_block_order_groups_and_levels():
    """enumerate_grid's shared outer (mbs, fp8, sp) and knob (zero, recompute) tables expand in block order: each
    block's outer rows are its groups, numbered on from the last block's, and its knob rows their levels."""
    from autoplan.solvers.space import KNOBS, OUTER, STRUCTURAL, _assemble

    outers = [np.array([[1, 0, 1], [2, 0, 1]]), np.array([[4, 1, 0]])]
    knobs = [np.array([[0, 0, 0, 0, 0], [1, 2, 0, 1, 0]]), np.array([[3, 0, 0, 0, 0]])]
    blocks = [(tuple(range(11)), 0, 0), (tuple(range(100, 111)), 1, 1), (tuple(range(200, 211)), 1, 0)]
    cols, group, level = _assemble(blocks, outers, knobs)
    a = np.column_stack([cols[name] for name in STRUCTURAL + OUTER + KNOBS])
    expected = [list(range(11)) + o + k for o in ([1, 0, 1], [2, 0, 1]) for k in ([0] * 5, [1, 2, 0, 1, 0])] + \
        [list(range(100, 111)) + [4, 1, 0] + [3, 0, 0, 0, 0]] + \
        [list(range(200, 211)) + [4, 1, 0] + k for k in ([0] * 5, [1, 2, 0, 1, 0])]
    assert a.tolist() == expected
    assert group.tolist() == [0, 0, 1, 1, 2, 3, 3] and level.tolist() == [0, 1, 0, 1, 0, 0, 1]
    # A row filter drops rows before the columns are built; the kept rows keep their groups and levels.
    kept, kg, kl = _assemble(blocks, outers, knobs, keep=lambda pp, vpp, mbs, dp: mbs != 2)
    assert np.column_stack([kept[name] for name in STRUCTURAL + OUTER + KNOBS]).tolist() == \
        [row for row in expected if row[11] != 2]
    assert kg.tolist() == [0, 0, 2, 3, 3] and kl.tolist() == [0, 1, 0, 0, 1]
    empty, g0, l0 = _assemble([], outers, knobs)
    assert set(empty) == set(STRUCTURAL + OUTER + KNOBS) and len(g0) == len(l0) == len(empty["tp"]) == 0
