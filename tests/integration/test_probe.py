"""Probe runner: Megatron path replayed through a fake Megatron-LM checkout whose pretrain_gpt.py prints real
Megatron-LM log excerpts (tests/fixtures/logs); plan-file loading; the probe CLI."""
import json
import os
import subprocess
import sys
import textwrap
import time
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
from conftest import deadline_s

HERE = Path(__file__).parents[1]
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
    if os.environ.get("FAKE_MEGATRON_SIGNAL"):  # a crash (SIGSEGV) or the OOM killer (SIGKILL) on every rank
        os.kill(os.getpid(), int(os.environ["FAKE_MEGATRON_SIGNAL"]))
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


@pytest.mark.slow
def test_megatron_probe_hang_is_killed(tmp_path, fake_megatron, monkeypatch):
    monkeypatch.setenv("FAKE_MEGATRON_LOG", str(LOGS / "megatron_issue756_mixtral.log"))
    monkeypatch.setenv("FAKE_MEGATRON_HANG", "1")
    timeout = deadline_s(2)  # rank 0 starts and prints its log well within it
    res = run_probe(tiny_plan(), engine="megatron", out_dir=tmp_path / "p", launcher="local", timeout_s=timeout)
    assert res.status == "hung" and "timeout" in res.error
    assert res.wall_time_s < timeout + deadline_s(4)  # the kill ends the ranks promptly (bounded, load-scaled)


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


def _cli(args, env, timeout=None):
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", "probe", *args], env=env,
                          capture_output=True, text=True, timeout=timeout or deadline_s(20))


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


def test_probe_cli_megatron_version_picks_the_files_release(tmp_path, fake_megatron):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(tiny_plan().model_dump_json())
    env = dict(os.environ, FAKE_MEGATRON_LOG=str(LOGS / "megatron_issue756_mixtral.log"))
    ok = _cli([str(plan_file), "--engine", "megatron", "--launcher", "local", "--out", str(tmp_path / "a"),
               "--megatron-version", "core_v0.17.1"], env)
    assert ok.returncode == 0, ok.stderr
    assert "# for Megatron-LM core_v0.17.1 " in (tmp_path / "a" / "megatron_args.txt").read_text()
    for args, message in ((["--engine", "megatron", "--megatron-version", "0.9"], "--megatron-version '0.9' is not"),
                          (["--engine", "deepspeed", "--megatron-version", "0.16"], "--engine deepspeed writes none")):
        bad = _cli([str(plan_file), *args, "--out", str(tmp_path / "b")], env)
        assert bad.returncode == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("sig, name", [(11, "SIGSEGV"), (9, "SIGKILL")])
def test_crashed_rank_names_the_signal(tmp_path, fake_megatron, monkeypatch, sig, name):
    monkeypatch.setenv("FAKE_MEGATRON_LOG", str(LOGS / "megatron_issue756_mixtral.log"))
    monkeypatch.setenv("FAKE_MEGATRON_SIGNAL", str(sig))
    res = run_probe(tiny_plan(), engine="megatron", out_dir=tmp_path / "p", launcher="local", timeout_s=120)
    assert res.status == "failed"
    assert res.error.startswith(f"a rank was killed by {name}")
    assert ("out-of-memory killer" in res.error) == (name == "SIGKILL")


def test_result_written_atomically(tmp_path, monkeypatch):
    """A write that dies half-way leaves the previous file whole and no temporary file."""
    from autoplan import fileio

    target = tmp_path / "probe_result.json"
    fileio.write_text(target, '{"status": "ok"}\n')
    assert target.read_text() == '{"status": "ok"}\n'

    def die(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(fileio.os, "fsync", die)
    with pytest.raises(KeyboardInterrupt):
        fileio.write_text(target, '{"status": "hung"' + " " * 100000)
    assert target.read_text() == '{"status": "ok"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["probe_result.json"]


def _left_lock(root):
    """A DeepSpeed op-build lock under `root` as a killed build leaves it: an hour old. (path, its mtime)"""
    lock = root / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    return lock, old


def test_stale_extension_lock_found_and_orphans_cleared(tmp_path):
    from autoplan.integrations import extlocks

    root = tmp_path / "ext"
    lock, old = _left_lock(root)
    assert extlocks.find_locks([root]) == [lock]
    assert extlocks.is_stale(lock)
    assert f"rm {lock}" in extlocks.stale_message(lock) and "\n" not in extlocks.stale_message(lock)
    assert extlocks.clear_orphans([root], since=time.time()) == []  # older than the launch: reported, not removed
    fresh = root / "cpu_adam" / "lock"
    fresh.parent.mkdir()
    fresh.touch()
    assert not extlocks.is_stale(fresh)  # younger than SETTLE_S: its builder may be writing build.ninja
    # A build in progress: a process works in the folder (as ninja does).
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=lock.parent)
    try:
        assert extlocks.is_stale(lock) is False
        assert extlocks.clear_orphans([root], since=old) == [fresh]
    finally:
        builder.kill()
        builder.wait()
    assert lock.exists() and not fresh.exists()


@pytest.mark.slow
def test_deepspeed_probe_with_stale_build_lock_fails_fast_with_the_fix(tmp_path):
    """A lock left by a killed build: the probe names it in one line with `rm` instead of waiting forever."""
    ext = tmp_path / "ext"
    lock, _ = _left_lock(ext)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(tiny_plan().model_dump_json())
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext))
    start = time.monotonic()
    done = _cli([str(plan_file), "--engine", "deepspeed", "--launcher", "local", "--out", str(tmp_path / "p"),
                 "--timeout", "600"], env, timeout=deadline_s(20))
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - start < deadline_s(6)  # the CLI, then one process that imports deepspeed
    assert "Traceback" not in done.stderr
    line = [x for x in done.stderr.splitlines() if x.startswith("autoplan: probe failed:")]
    assert len(line) == 1 and f"rm {lock}" in line[0] and "stale torch extension-build lock" in line[0]


@pytest.mark.slow
def test_deepspeed_probe_killed_during_op_build_leaves_no_lock(tmp_path, monkeypatch):
    """An op build that overruns its deadline is killed as a group; it is a failed build, not a hung probe, and
    its lock is removed, so the next DeepSpeed start does not wait on it."""
    import threading

    ext = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    # The compiler never returns (torch.utils.cpp_extension runs $CXX, default c++), so the build overruns any
    # deadline however long: a slow machine cannot let a real compile finish inside it.
    compiler = tmp_path / "never-returning-c++"
    compiler.write_text("#!/bin/sh\nexec sleep 3600\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    lock = ext / "deepspeed_shm_comm" / "lock"
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if lock.exists():
                seen.append(True)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    lines = []
    try:
        # Long enough to import deepspeed and start compiling (the lock appears); the compile never ends.
        res = run_probe(tiny_plan(), engine="deepspeed", out_dir=tmp_path / "p", launcher="local", iters=4,
                        warmup=1, timeout_s=600, build_timeout_s=deadline_s(4), log=lines.append)
    finally:
        stop.set()
        watcher.join()
    assert seen, "the build never started, so nothing was tested"
    assert res.status == "failed"
    assert res.error.startswith("building op deepspeed_shm_comm did not finish within --build-timeout=")
    assert not lock.exists()
    assert any("deepspeed_shm_comm: loading" in x for x in lines)
    assert json.loads((tmp_path / "p" / "probe_result.json").read_text())["status"] == "failed"


def test_each_virtual_environment_has_its_own_build_folder(tmp_path):
    # Two venvs whose bin/python link to one base interpreter (as `python -m venv` makes them) must not share a
    # build folder: each environment's ops are built against its own DeepSpeed and include paths.
    from autoplan.integrations import extlocks

    roots = []
    for name in ("env-a", "env-b"):
        (tmp_path / name / "bin").mkdir(parents=True)
        (tmp_path / name / "bin" / "python").symlink_to(sys.executable)
        roots.append(extlocks.environment_root(str(tmp_path / name / "bin" / "python"), env={}))
    assert roots[0] != roots[1]
    assert roots[0] == extlocks.environment_root(str(tmp_path / "env-a" / "bin" / "python"), env={})


def test_probe_and_engine_launches_pick_the_build_folder_by_one_rule():
    """extlocks.own_build_folder is the one rule for the op-build folder: a folder the caller's environment names is
    kept (the probe adds nothing to its launch), an unset or empty one becomes this Python environment's own;
    with_own_build_folder (engine checks, emitted-file launches) applies the same rule to a copy of the environment."""
    from autoplan.integrations import extlocks

    own = {"TORCH_EXTENSIONS_DIR": str(extlocks.environment_root(sys.executable))}
    assert extlocks.own_build_folder({"TORCH_EXTENSIONS_DIR": "/srv/ext"}, sys.executable) == {}
    assert extlocks.own_build_folder({}, sys.executable) == own
    assert extlocks.own_build_folder({"TORCH_EXTENSIONS_DIR": ""}, sys.executable) == own
    assert extlocks.with_own_build_folder({"TORCH_EXTENSIONS_DIR": "/srv/ext"}, sys.executable) == {
        "TORCH_EXTENSIONS_DIR": "/srv/ext"}
    assert extlocks.with_own_build_folder({"TORCH_EXTENSIONS_DIR": ""}, sys.executable) == own


def test_deepspeed_ops_are_prepared_by_one_command(tmp_path):
    """The probe's preparation step and the engine checks run the same command (ds_ops.prepare_args), and it names
    a module this interpreter finds."""
    import importlib.util

    from autoplan.integrations.ds_ops import MODULE, prepare_args
    from autoplan.integrations.probe import deepspeed_program

    program = deepspeed_program(tiny_plan(), tmp_path, iters=4)
    assert program.prepare_args == prepare_args(tmp_path / "ds_config.json") == [
        "-m", MODULE, str(tmp_path / "ds_config.json")]
    assert importlib.util.find_spec(MODULE) is not None
