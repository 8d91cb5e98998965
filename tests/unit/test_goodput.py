"""Goodput under failures: the published interval formulas' worked cases, the closed form against the simulator,
published effective-training-time figures, the search objective and the CLI (autoplan/costmodel/goodput.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from autoplan.clusterio import load_cluster, with_resilience
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.goodput import daly_interval, daly_terms, overlap_loss, useful_fraction, young_interval
from autoplan.modelio import load_model
from autoplan.resilience import ASYNC_OVERLAP_SLOWDOWN
from autoplan.strategy import Strategy
from autoplan.workload import make_workload
from conftest import run_cli

MINUTE, HOUR = 60.0, 3600.0


@pytest.mark.parametrize("mtbf_h, tau_min, digits", [(24, 117, 0), (6, 57, 0), (0.25, 9.1, 1)])
def test_daly_2006_worked_cases(mtbf_h, tau_min, digits):
    """Daly 2006 figs. 3-5: delta = 5 min, R = 10 min, M = 24 h, 6 h, 15 min give tau_opt = 117, 57 and 9.1 min."""
    tau = float(daly_interval(5 * MINUTE, mtbf_h * HOUR)) / MINUTE
    assert round(tau, digits) == tau_min


def test_daly_interval_is_the_mtbf_past_twice_the_mtbf():
    """Daly 2006 eq. 37: tau_opt = M once delta >= 2M."""
    assert float(daly_interval(3 * HOUR, 1 * HOUR)) == 1 * HOUR


def test_young_1974_interval_on_a_published_case():
    """Young's (1974, CACM 17(9):530-531) T_c = sqrt(2 T_s T_f) as Low et al. 2012 work it (Distributed GraphLab,
    PVLDB 5(8), sec. 4.3): 64 machines with a per-machine MTBF of 1 year and a 2-minute checkpoint give an interval
    of about 3 hours. Young's own example (one IBM 360/50 installation) is not reproduced: its numbers are in no
    source available here (docs/sources.md, "Goodput")."""
    mtbf = 365 * 24 * HOUR / 64
    assert round(float(young_interval(2 * MINUTE, mtbf)) / HOUR) == 3


def test_useful_fraction_minimum_is_at_the_daly_interval():
    """Daly's interval maximises tau / T(tau) of his complete cost function (to the accuracy of his perturbation
    series): no interval on a fine grid does better by more than 0.01 points."""
    delta, restart, mtbf = 60.0, 600.0, 3 * HOUR
    grid = np.linspace(100, 5000, 20000)
    best = useful_fraction(grid, delta, restart, mtbf).max()
    assert best - useful_fraction(daly_interval(delta, mtbf), delta, restart, mtbf) < 1e-4


def test_simulator_agrees_with_the_closed_form():
    """benchmarks/goodput_sim.py over its MTBF x checkpoint-cost grid, blocking, async without and with the
    overlapped steps slowed: within 0.5 points."""
    from benchmarks.goodput_sim import TOLERANCE_POINTS, grid

    rows = grid(failures=100_000, seed=1)
    assert len(rows) == 60 and {r[4] for r in rows} == {0.0, ASYNC_OVERLAP_SLOWDOWN}
    assert max(abs(r[-1]) for r in rows) <= TOLERANCE_POINTS


def test_simulator_separates_the_overlap_term():
    """The simulator's slowed steps are what the closed form's overlap term prices: at a short MTBF and a long
    background write, leaving the term out of the closed form misses the simulated fraction by far more than the
    tolerance, and the restart exception (no save in flight after a restart) is needed too."""
    from benchmarks.goodput_sim import RESTART_S, TOLERANCE_POINTS, simulate

    delta, persist, mtbf, s = 6.0, 300.0, 0.5 * HOUR, ASYNC_OVERLAP_SLOWDOWN
    overlap = float(overlap_loss(persist, s))
    stall, restart = daly_terms(delta, persist, overlap, RESTART_S)
    tau = float(max(daly_interval(stall, mtbf), persist))
    sim = 100 * simulate(tau, delta, persist, RESTART_S, mtbf, 400_000, np.random.default_rng(3), s)
    exact = 100 * float(useful_fraction(tau, stall, restart, mtbf))
    no_overlap = 100 * float(useful_fraction(tau, delta, RESTART_S + persist, mtbf))
    no_exception = 100 * float(useful_fraction(tau, stall, RESTART_S + persist, mtbf))
    assert abs(sim - exact) <= TOLERANCE_POINTS
    assert no_overlap - sim > 10 * TOLERANCE_POINTS and sim - no_exception > 4 * TOLERANCE_POINTS


def test_async_save_costs_the_steps_it_overlaps():
    """Llama-3.1-405B on 16,384 H100 with async saves: the background write of every save slows the steps it
    overlaps by ResilienceSpec.async_overlap_slowdown for its duration; that loss is part of the stall, sets Daly's
    interval, and costs goodput against a free overlap (async_overlap_slowdown=0)."""
    strategy = dict(tp=8, pp=16, vpp=8, cp=2, mbs=1, sp=True, zero=1)
    priced = _estimate("llama3.1-405b", "h100", 16384, strategy, 2048)
    free = _estimate("llama3.1-405b", "h100", 16384, strategy, 2048, async_overlap_slowdown=0.0)
    assert priced.checkpoint_method == "async" and priced.checkpoint_persist_s > 1.0
    assert priced.checkpoint_overlap_s == pytest.approx(ASYNC_OVERLAP_SLOWDOWN * priced.checkpoint_persist_s)
    assert free.checkpoint_overlap_s == 0.0
    assert priced.checkpoint_stall_s == pytest.approx(free.checkpoint_stall_s + priced.checkpoint_overlap_s)
    steps = round(float(daly_interval(priced.checkpoint_stall_s, priced.expected_job_mtbf_s)) / priced.step_time_s)
    assert priced.checkpoint_interval_steps == max(1, steps)
    assert priced.checkpoint_interval_steps > 4 * free.checkpoint_interval_steps
    assert priced.useful_fraction < free.useful_fraction
    blocking = _estimate("llama3.1-405b", "h100", 16384, strategy, 2048, ckpt_method="blocking")
    assert blocking.checkpoint_overlap_s == 0.0 and blocking.useful_fraction < priced.useful_fraction


def _estimate(model, gpu, gpus, strategy, gbs, **resilience):
    m = load_model(model, ())
    c = with_resilience(load_cluster(gpu, gpus), resilience, "test") if resilience else load_cluster(gpu, gpus)
    wl = make_workload(8192, gbs)
    return estimate(m, c, Strategy(**strategy), wl)


def test_llama3_effective_training_time():
    """Llama 3 (arXiv:2407.21783 sec. 3.3.4): more than 90% effective training time for Llama 3.1 405B on 16,384 H100
    with 419 unexpected interruptions in 54 days. Published inputs: that failure rate (the default), 16M-token
    batches (gbs 2,048 x 8,192), 2 TB/s sustained checkpoint storage (the default), spare capacity (24K GPUs in the
    cluster for a 16K job: no repair wait). Assumed: blocking saves of the layout of the paper (tp8 pp16 cp1, dp 128),
    the default restart costs."""
    e = _estimate("llama3.1-405b", "h100", 16384, dict(tp=8, pp=16, vpp=7, cp=1, mbs=1, sp=True, zero=1), 2048,
                  ckpt_method="blocking")
    assert e.expected_job_mtbf_s == pytest.approx(54 * 86400 / 419, rel=1e-9)
    assert 0.90 < e.useful_fraction < 0.97


def test_byterobust_effective_training_time():
    """ByteRobust (Wan et al. 2025, arXiv:2509.16293): 97% ETTR for a three-month job on 9,600 GPUs, with warm
    standby machines and near-zero-overhead (asynchronous) checkpoints. Assumed: the default failure rate (Llama 3's),
    a 70B dense model, H100 nodes, async saves, no repair wait (warm standbys), the default restart costs."""
    e = _estimate("llama3-70b", "h100", 9600, dict(tp=8, pp=4, vpp=5, mbs=1, sp=True, zero=1), 1200,
                  ckpt_method="async")
    assert abs(e.useful_fraction - 0.97) < 0.03


def test_repair_wait_without_spares_lowers_goodput():
    """With no spare nodes each hardware failure waits for the repair: a longer restart, less useful time."""
    base = dict(tp=8, pp=16, vpp=7, mbs=1, sp=True, zero=1)
    pool = _estimate("llama3.1-405b", "h100", 16384, base, 2048)
    none = _estimate("llama3.1-405b", "h100", 16384, base, 2048, spare_nodes=0)
    many = _estimate("llama3.1-405b", "h100", 16384, base, 2048, spare_nodes=64)
    assert none.restart_s > many.restart_s >= pool.restart_s
    assert none.useful_fraction < many.useful_fraction <= pool.useful_fraction


def test_checkpoint_bytes_follow_the_sharding():
    """A global checkpoint's per-rank share is the same unique state whatever the ZeRO stage; a local checkpoint
    holds what the rank holds: the distributed optimizer's rank keeps its full bf16 weight shard, FSDP's 1/dp of
    it."""
    args = ("llama3-8b", "h100", 1024, 2048)
    dist = {m: _estimate(*args[:3], dict(tp=2, mbs=1, sp=True, zero=1), args[3], ckpt_method=m) for m in
            ("async", "local")}
    fsdp = {m: _estimate(*args[:3], dict(tp=2, mbs=1, sp=True, zero=3), args[3], ckpt_method=m) for m in
            ("async", "local")}
    assert dist["async"].checkpoint_gib_per_rank == pytest.approx(fsdp["async"].checkpoint_gib_per_rank, rel=0.02)
    assert dist["local"].checkpoint_gib_per_rank > 20 * fsdp["local"].checkpoint_gib_per_rank
    assert dist["local"].checkpoint_stall_s > fsdp["local"].checkpoint_stall_s


def _plans(capsys, *extra):
    code, out, err = run_cli(["plan", "--model", "llama3-8b", "--cluster", "h100", "--gpus", "1024", "--gbs", "2048",
                              "--ckpt-method", "local", "--top", "3", "--json", *extra], capsys)
    assert code == 0, err
    return json.loads(out)["plans"]


def test_goodput_objective_picks_fsdp_over_the_distributed_optimizer(capsys):
    """Llama-3-8B on 1,024 H100 with local checkpoints: the fastest plan (distributed optimizer, zero 1) saves each
    rank's full bf16 weight shard, 7.6 GiB, every checkpoint; Megatron-FSDP (zero 3) is 0.07% slower per step but
    saves 1/dp of it, so it checkpoints far more often for less stall and loses less work per failure: it delivers
    more tokens per second once failures are counted."""
    fast, good = _plans(capsys)[0], _plans(capsys, "--objective", "goodput")[0]
    assert fast["strategy"]["zero"] == 1 and good["strategy"]["zero"] == 3
    assert fast["estimate"]["step_time_s"] < good["estimate"]["step_time_s"]
    assert good["estimate"]["goodput_tokens_per_s"] > fast["estimate"]["goodput_tokens_per_s"]
    assert good["estimate"]["checkpoint_gib_per_rank"] < fast["estimate"]["checkpoint_gib_per_rank"]


def test_estimate_json_goodput_keys(capsys):
    code, out, err = run_cli(["estimate", "--model", "llama3-70b", "--gpus", "64", "--strategy",
                              "tp=8,pp=2,mbs=1,zero=1", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    for key in ("goodput_tokens_per_s", "checkpoint_interval_s", "checkpoint_stall_s", "checkpoint_gib_per_rank",
                "expected_job_mtbf_s"):
        assert isinstance(d[key], float) and d[key] > 0, key
    assert d["goodput_tokens_per_s"] < d["tokens_per_s"]


@pytest.mark.parametrize("args, words", [
    (["--resilience", "spare_nodez=3"], "spare_nodez"),
    (["--resilience", "failures_per_1k_node_days=-1"], "failures_per_1k_node_days"),
    (["--ckpt-method", "nvme"], "ckpt_method"),
    (["--resilience", "node_mtbf_h"], "key=value"),
    (["--objective", "uptime"], "--objective"),
])
def test_bad_resilience_input_is_one_line(args, words, capsys):
    code, out, err = run_cli(["plan", "--model", "llama3-8b", "--gpus", "8", *args], capsys)
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err


def test_cluster_file_resilience(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("gpu: h100\nnum_gpus: 64\nresilience:\n  node_mtbf_h: 2400\n  ckpt_method: blocking\n")
    c = load_cluster(str(path))
    assert c.resilience.ckpt_method == "blocking" and c.resilience.node_failures_per_s(8) == 1 / (2400 * HOUR)
    path.write_text("gpu: h100\nresilience:\n  node_mtbf: 2400\n")
    from autoplan.errors import InputError

    with pytest.raises(InputError, match="node_mtbf"):
        load_cluster(str(path))


def test_goodput_plan_emits_the_priced_checkpoints(tmp_path, capsys):
    """The winner's Megatron files carry the interval it was priced with and the local-checkpoint flags."""
    code, out, err = run_cli(["plan", "--model", "llama3-8b", "--cluster", "h100", "--gpus", "1024", "--gbs", "2048",
                              "--ckpt-method", "local", "--objective", "goodput", "--emit", "megatron", "--out",
                              str(tmp_path)], capsys)
    assert code == 0, err
    args = (tmp_path / "megatron_args.txt").read_text()
    plan = json.loads((tmp_path / "plan.json").read_text())
    steps = plan["estimate"]["checkpoint_interval_steps"]
    assert f"--non-persistent-save-interval {steps}\n" in args
    assert "--non-persistent-ckpt-type local" in args and "--replication-jump 8" in args
    assert '--non-persistent-local-ckpt-dir "${LOCAL_CKPT_DIR}"' in args
    assert "LOCAL_CKPT_DIR=" in (tmp_path / "train.sh").read_text()


def _goodput_plan(method, **strategy):
    """A golden-style plan ranked by goodput with a priced checkpoint interval of 40 steps."""
    from engine_checks.plans import GPT2_SMALL, make_plan

    plan = make_plan(GPT2_SMALL, 16, 1024, 64, **strategy)
    est = plan.estimate.model_copy(update={"checkpoint_method": method, "checkpoint_interval_steps": 40,
                                           "checkpoint_interval_s": 40.0})
    return plan.model_copy(update={"estimate": est, "objective": "goodput"})


@pytest.mark.parametrize("method, section", [("async", {"writer": {"type": "fast", "decoupled": True}}),
                                             ("local", {"use_node_local_storage": True}), ("blocking", None)])
def test_deepspeed_files_carry_the_priced_checkpoints(method, section):
    from integrations.deepspeed import deepspeed_config, emit_deepspeed

    plan = _goodput_plan(method, zero=1, mbs=2)
    assert deepspeed_config(plan).get("checkpoint") == section
    assert "checkpoint" not in deepspeed_config(plan, probe=True)
    launch = emit_deepspeed(plan)["launch.sh"]
    assert 'SAVE_INTERVAL="${SAVE_INTERVAL:-40}"' in launch and '--save-interval "$SAVE_INTERVAL"' in launch
    assert "--save-interval" not in emit_deepspeed(plan, probe=True)["launch.sh"]


def test_megatron_async_files():
    from integrations.megatron import emit_megatron

    files = emit_megatron(_goodput_plan("async", zero=1, mbs=2))
    assert files["megatron_args.txt"].endswith("--async-save\n--use-persistent-ckpt-worker\n--ckpt-format torch_dist\n")
    assert 'SAVE_INTERVAL="${SAVE_INTERVAL:-40}"' in files["train.sh"]
    fsdp = emit_megatron(_goodput_plan("async", zero=3, mbs=2))["megatron_args.txt"]
    assert fsdp.count("--ckpt-format") == 1 and "--ckpt-format fsdp_dtensor" in fsdp  # Megatron-FSDP's own format
    probe = emit_megatron(_goodput_plan("async", zero=1, mbs=2), probe=True)["megatron_args.txt"]
    assert "--async-save" not in probe and "--save" not in probe


def test_ds_train_takes_the_save_arguments():
    from integrations.ds_train import parse_args

    a = parse_args(["--deepspeed_config", "c.json", "--model-json", "m.json", "--seq-len", "64", "--save-dir", "ck",
                    "--save-interval", "40"])
    assert (a.save_dir, a.save_interval) == ("ck", 40)
