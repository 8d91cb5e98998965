"""Probe runner: Megatron path replayed through a fake Megatron-LM checkout whose pretrain_gpt.py prints real
Megatron-LM log excerpts (tests/fixtures/logs); plan-file loading; the probe CLI."""
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from autoplan.clusterio import load_cluster
from autoplan.costmodel.estimate import estimate
from autoplan.errors import InputError
from autoplan.integrations.launchers import LaunchOutcome
from autoplan.integrations.logparse import parse_log
from autoplan.integrations.probe import (load_plan_file, result_from_log, run_probe, step_times_after_warmup)
from autoplan.modelio import load_model
from autoplan.results import Plan
from autoplan.strategy import Strategy
from autoplan.workload import Workload

HERE = Path(__file__).parent
LOGS = HERE / "fixtures" / "logs"

FAKE_PRETRAIN = textwrap.dedent("""
    # Stand-in for Megatron-LM's pretrain_gpt.py: checks it got Megatron arguments, then prints a real log.
    import os, sys, time
    assert "--micro-batch-size" in sys.argv and "--train-iters" in sys.argv, sys.argv
    if os.environ.get("RANK", "0") == "0":
        with open(os.environ["FAKE_MEGATRON_LOG"]) as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()
        open("fake_rank0_logged", "w").close()
    else:  # exit after rank 0 has logged, as Megatron's ranks fail together, however slow this machine is
        while not os.path.exists("fake_rank0_logged"):
            time.sleep(0.05)
    if os.environ.get("FAKE_MEGATRON_HANG"):
        time.sleep(300)
    sys.exit(int(os.environ.get("FAKE_MEGATRON_EXIT", "0")))
""")


def tiny_plan(strategy: Strategy = Strategy(zero=1), gpus: int = 2) -> Plan:
    model = load_model(str(HERE / "data" / "tiny.json"))
    cluster = load_cluster("cpu", gpus)
    workload = Workload(seq_len=128, global_batch_size=128)
    return Plan(model=model, cluster=cluster, workload=workload, strategy=strategy,
                estimate=estimate(model, cluster, strategy, workload))


@pytest.fixture
def fake_megatron(tmp_path, monkeypatch):
    root = tmp_path / "Megatron-LM"
    root.mkdir()
    (root / "pretrain_gpt.py").write_text(FAKE_PRETRAIN)
    monkeypatch.setenv("MEGATRON_LM", str(root))
    return root


def test_megatron_probe_ok_from_real_log(tmp_path, fake_megatron, monkeypatch):
    monkeypatch.setenv("FAKE_MEGATRON_LOG", str(LOGS / "megatron_ling_v2_pretrain.log"))
    plan = tiny_plan()
    res = run_probe(plan, engine="megatron", out_dir=tmp_path / "probe", iters=10, warmup=2, launcher="local",
                    timeout_s=60)
    assert res.status == "ok", res.error
    # Iterations 3..10 of the Ling-V2 log; the median of the 8 step times.
    assert len(res.step_times_s) == 8
    assert res.step_time_s == pytest.approx((10.7656 + 10.7674) / 2)
    assert res.tokens_per_s == pytest.approx(128 * 128 / res.step_time_s)
    assert res.tokens_per_s_per_gpu == pytest.approx(res.tokens_per_s / 2)
    assert res.peak_mem_gib_by_rank == {0: pytest.approx(63359.77001953125 / 1024)}
    assert res.step_time_ratio == pytest.approx(res.step_time_s / plan.estimate.step_time_s)
    assert res.predicted_step_time_s == plan.estimate.step_time_s
    out = tmp_path / "probe"
    assert {"megatron_args.txt", "train.sh", "sbatch.sh", "probe.log", "probe_result.json"} <= {
        p.name for p in out.iterdir()}
    assert json.loads((out / "probe_result.json").read_text())["status"] == "ok"


def test_megatron_probe_oom(tmp_path, fake_megatron, monkeypatch):
    monkeypatch.setenv("FAKE_MEGATRON_LOG", str(LOGS / "megatron_issue525_oom.log"))
    monkeypatch.setenv("FAKE_MEGATRON_EXIT", "1")
    res = run_probe(tiny_plan(), engine="megatron", out_dir=tmp_path / "p", launcher="local", timeout_s=60)
    assert res.status == "oom"
    assert res.error.startswith("torch.cuda.OutOfMemoryError: CUDA out of memory")
    assert res.step_time_s is None and res.tokens_per_s is None


def test_megatron_probe_failure_reports_error_line(tmp_path, fake_megatron, monkeypatch):
    log = tmp_path / "err.log"
    log.write_text("Traceback (most recent call last):\nAssertionError: something broke\n")
    monkeypatch.setenv("FAKE_MEGATRON_LOG", str(log))
    monkeypatch.setenv("FAKE_MEGATRON_EXIT", "1")
    res = run_probe(tiny_plan(), engine="megatron", out_dir=tmp_path / "p", launcher="local", timeout_s=60)
    assert res.status == "failed" and res.error == "AssertionError: something broke"


def test_megatron_probe_hang_is_killed(tmp_path, fake_megatron, monkeypatch):
    monkeypatch.setenv("FAKE_MEGATRON_LOG", str(LOGS / "megatron_issue756_mixtral.log"))
    monkeypatch.setenv("FAKE_MEGATRON_HANG", "1")
    res = run_probe(tiny_plan(), engine="megatron", out_dir=tmp_path / "p", launcher="local", timeout_s=3)
    assert res.status == "hung" and "timeout" in res.error
    assert res.wall_time_s < 15


def test_megatron_probe_needs_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    with pytest.raises(InputError, match="MEGATRON_LM"):
        run_probe(tiny_plan(), engine="megatron", out_dir=tmp_path / "p", launcher="local")


def test_iters_must_exceed_warmup(tmp_path, fake_megatron):
    with pytest.raises(InputError, match="--iters=2 must exceed --warmup=2"):
        run_probe(tiny_plan(), engine="megatron", out_dir=tmp_path / "p", iters=2, warmup=2)


def test_clean_exit_without_iterations_is_a_failure(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("nothing useful\n")
    outcome = LaunchOutcome(launcher="local", command=["x"], returncode=0, timed_out=False, wall_time_s=1.0,
                            log_path=str(log))
    res = result_from_log(tiny_plan(), "megatron", outcome, "megatron", 2, tmp_path)
    assert res.status == "failed" and "no iteration" in res.error


def test_deepspeed_rates_become_step_times():
    parsed = parse_log((LOGS / "deepspeed_issue1825_timer_old.log").read_text(), "deepspeed")
    assert step_times_after_warmup(parsed, warmup=0, global_batch=64) == pytest.approx(
        [64 / 83.48609168106144, 64 / 83.73838805358588])
    assert step_times_after_warmup(parsed, warmup=40, global_batch=64) == pytest.approx([64 / 83.73838805358588])


def test_plan_file_forms(tmp_path):
    plan = tiny_plan()
    single = tmp_path / "plan.json"
    single.write_text(plan.model_dump_json())
    assert load_plan_file(single) == plan
    listing = tmp_path / "plans.json"
    listing.write_text(json.dumps({"model": plan.model.model_dump(), "cluster": plan.cluster.model_dump(),
                                   "workload": plan.workload.model_dump(),
                                   "plans": [{"strategy": plan.strategy.to_dict(),
                                              "estimate": plan.estimate.model_dump()}]}))
    assert load_plan_file(listing).strategy == plan.strategy
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_plan_file(bad)
    with pytest.raises(InputError, match="does not exist"):
        load_plan_file(tmp_path / "missing.json")


def _cli(args, env):
    import subprocess

    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", "probe", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_probe_cli_exit_codes(tmp_path, fake_megatron):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(tiny_plan().model_dump_json())
    env = dict(os.environ, FAKE_MEGATRON_LOG=str(LOGS / "megatron_issue756_mixtral.log"))
    ok = _cli([str(plan_file), "--engine", "megatron", "--launcher", "local", "--out", str(tmp_path / "a"),
               "--json"], env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["step_time_s"] == pytest.approx(5.5338)
    env["FAKE_MEGATRON_LOG"] = str(LOGS / "megatron_issue525_oom.log")
    env["FAKE_MEGATRON_EXIT"] = "1"
    oom = _cli([str(plan_file), "--engine", "megatron", "--launcher", "local", "--out", str(tmp_path / "b")], env)
    assert oom.returncode == 3
    assert "oom: " in oom.stderr and "Traceback" not in oom.stderr
    bad = _cli([str(plan_file), "--engine", "jax"], env)
    assert bad.returncode == 2 and "valid engines" in bad.stderr
