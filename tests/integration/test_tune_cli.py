"""`autoplan tune` end to end. DeepSpeed: real probes of tiny.json on 2 CPU ranks (gloo), one made to fail and one
to hang. Megatron: real launches of a stand-in pretrain_gpt.py that replays a real Megatron-LM log (Megatron
needs CUDA; real Megatron probes are not run here); two workers share one sqlite study concurrently."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoplan.integrations.launchers import KILL_GRACE_S
from conftest import deadline_s
from test_probe import FAKE_PRETRAIN

HERE = Path(__file__).parents[1]
TINY = HERE / "data" / "tiny.json"
LOGS = HERE / "fixtures" / "logs"


# A tiny DeepSpeed probe on 2 CPU ranks: torchrun and both ranks import torch and deepspeed on 2 cores, start gloo,
# load the op, build the model and run a few iterations; an ok one took up to 7.9 start-ups on a loaded host
# (README "Probes: op builds, stale locks, interrupts"), and start-up is measured once while the load may grow
# during the test. Four times that is its hang deadline: an ok probe finishes
# within it, a hung one is killed at it.
PROBE_STARTUPS = 32
# A probe that hangs sleeps at its first iteration whatever its deadline, so the deadline of a run that holds only
# the hanging probe need only outlast the launch and the kill: a few start-ups.
HANG_STARTUPS = 4


def _tune(args, cwd, env=None, timeout=None):
    timeout = timeout or deadline_s(200)  # a safety net only: every probe has its own deadline
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", "tune", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _processes_mentioning(text: str):
    found = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append((pid_dir.name, cmdline))
    return found


@pytest.mark.slow
def test_deepspeed_tune_with_failing_and_hanging_probes_then_resume(tmp_path):
    """A hung probe is killed at its deadline and recorded, a failing one recorded, and a resumed study goes on with
    new plans. The hang runs first, alone, under a short deadline (it sleeps at its first iteration, so any deadline
    kills it); the probes that must finish run on resume under the full PROBE_STARTUPS deadline, which they never
    wait out."""
    base = ["--model", str(TINY), "--cluster", "cpu", "--gpus", "2", "--seq", "128", "--gbs", "8",
            "--engine", "deepspeed", "--storage", "sqlite:///study.db", "--out", "out", "--json"]
    hung = _tune(base + ["--trials", "1", "--probe-timeout", str(round(deadline_s(HANG_STARTUPS)))], tmp_path,
                 dict(os.environ, AUTOPLAN_TUNE_FAULTS="0:hang"))
    # No probe of the study has succeeded yet: exit 3 (a probe failure), the trial recorded in the report.
    assert hung.returncode == 3, hung.stderr[-3000:]
    assert "no probe of study 'autoplan-tune' succeeded" in hung.stderr
    first = json.loads((tmp_path / "out" / "tune_report.json").read_text())
    assert [t["status"] for t in first["trials"]] == ["hung"]
    assert "timed out" in first["trials"][0]["reason"]
    assert not _processes_mentioning(str(tmp_path / "out" / "trials"))  # the hung probe left nothing

    done = _tune(base + ["--trials", "3", "--probe-timeout", str(round(deadline_s(PROBE_STARTUPS)))], tmp_path,
                 dict(os.environ, AUTOPLAN_TUNE_FAULTS="2:fail"))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert [t["number"] for t in report["trials"]] == [0, 1, 2, 3]
    assert len({t["label"] for t in report["trials"]}) == 4
    assert [t["status"] for t in report["trials"]] == ["hung", "ok", "failed", "ok"]
    assert "AUTOPLAN_FAULT=fail" in report["trials"][2]["reason"]
    for t in report["trials"]:
        assert Path(tmp_path / t["log"]).exists() if not Path(t["log"]).is_absolute() else Path(t["log"]).exists()
    ok = [t for t in report["trials"] if t["status"] == "ok"]
    assert all(t["measured_tokens_per_s_per_gpu"] > 0 and t["predicted_step_time_s"] > 0 for t in ok)
    assert report["best"]["number"] == max(ok, key=lambda t: t["measured_tokens_per_s_per_gpu"])["number"]
    best_dir = tmp_path / report["best"]["files"]
    assert {"ds_config.json", "launch.sh", "ds_hf_train.py", "plan.json"} <= {
        p.name for p in best_dir.iterdir()}
    assert report["corrections"]["time_probes"] == 2
    assert not _processes_mentioning(str(tmp_path / "out" / "trials"))


@pytest.mark.slow
def test_megatron_tune_two_concurrent_workers_share_sqlite(tmp_path):
    root = tmp_path / "Megatron-LM"
    root.mkdir()
    (root / "pretrain_gpt.py").write_text(FAKE_PRETRAIN)
    env = dict(os.environ, MEGATRON_LM=str(root), FAKE_MEGATRON_LOG=str(LOGS / "megatron_issue756_mixtral.log"))
    args = ["--model", str(TINY), "--cluster", "cpu", "--gpus", "2", "--seq", "128", "--gbs", "8",
            "--engine", "megatron", "--trials", "3", "--storage", "sqlite:///shared.db", "--study-name", "mt",
            "--launcher", "local", "--iters", "10", "--warmup", "2", "--probe-timeout", "60", "--json"]
    procs = [subprocess.Popen([sys.executable, "-m", "autoplan.cli.main", "tune", *args, "--out", f"w{i}"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=deadline_s(100)) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    import optuna

    study = optuna.load_study(study_name="mt", storage=f"sqlite:///{tmp_path / 'shared.db'}")
    probed = [t.params["strategy"] for t in study.trials if t.user_attrs.get("status")]
    assert len(probed) == 6 and len(set(probed)) == 6
    assert all(t.user_attrs["status"] == "ok" for t in study.trials if t.user_attrs.get("status"))
    # The replayed Mixtral log (no memory report, so no memory correction): median of 5.4449, 5.5338, 5.7186 s.
    assert {round(t.user_attrs["measured_step_time_s"], 4) for t in study.trials
            if t.user_attrs.get("status")} == {5.5338}
    assert (tmp_path / "w0" / "best" / "megatron_args.txt").exists()


def _megatron_env(tmp_path, **extra):
    root = tmp_path / "Megatron-LM"
    root.mkdir(exist_ok=True)
    (root / "pretrain_gpt.py").write_text(FAKE_PRETRAIN)
    return root, dict(os.environ, MEGATRON_LM=str(root), FAKE_MEGATRON_LOG=str(LOGS / "megatron_issue756_mixtral.log"),
                      **extra)


MT_ARGS = ["--model", str(TINY), "--cluster", "cpu", "--gpus", "2", "--seq", "128", "--gbs", "8",
           "--engine", "megatron", "--storage", "sqlite:///study.db", "--launcher", "local", "--iters", "10",
           "--warmup", "2", "--probe-timeout", "600", "--out", "out"]


def _wait_for(check, timeout_s, what):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout_s:.0f} s")


def _trials(tmp_path):
    import optuna

    return optuna.load_study(study_name="autoplan-tune", storage=f"sqlite:///{tmp_path / 'study.db'}").trials


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_tune_stopped_during_a_probe_then_resumed(tmp_path, sig):
    """Stopped while its first probe hangs: nothing it started survives; the trial is recorded FAIL (at once, or
    for SIGKILL when the next worker finds the process gone); the resumed study keeps it and goes on."""
    root, env = _megatron_env(tmp_path, FAKE_MEGATRON_HANG="1")
    worker = subprocess.Popen([sys.executable, "-m", "autoplan.cli.main", "tune", *MT_ARGS, "--trials", "3"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: len(_processes_mentioning(str(root))) == 2, deadline_s(20), "the probe's two ranks")
    worker.send_signal(sig)
    _, err = worker.communicate(timeout=deadline_s(4))
    _wait_for(lambda: not _processes_mentioning(str(root)), KILL_GRACE_S + deadline_s(2, floor_s=10.0),
              "every rank gone")
    if sig != signal.SIGKILL:
        assert worker.returncode == 130 and "Traceback" not in err, err
        assert err.strip().splitlines()[-1] == "autoplan: interrupted; every process it started was stopped"
        first = _trials(tmp_path)[0]
        assert first.state.name == "FAIL" and first.user_attrs["reason"] == f"worker interrupted ({sig.name})"
    resumed = _tune([*MT_ARGS, "--trials", "1", "--json"], tmp_path, {k: v for k, v in env.items()
                                                                       if k != "FAKE_MEGATRON_HANG"})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json.loads(resumed.stdout)
    assert [t["status"] for t in report["trials"]] == ["failed", "ok"]
    reason = report["trials"][0]["reason"]
    assert ("stopped before the probe ended" in reason) if sig == signal.SIGKILL else ("interrupted" in reason)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_tune_with_unreadable_storage_is_bad_input(tmp_path, damage):
    db = tmp_path / "study.db"
    if damage == "garbage":
        db.write_bytes(b"not a database " * 200)
    else:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(storage=f"sqlite:///{db}", study_name="autoplan-tune")
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=5)
        db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])
    done = _tune(["--model", str(TINY), "--cluster", "cpu", "--gpus", "2", "--seq", "128", "--gbs", "8",
                  "--engine", "deepspeed", "--trials", "1", "--storage", "sqlite:///study.db", "--out", "out"],
                 tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoplan: error: --storage 'sqlite:///study.db' is not a "
                                                   "readable Optuna database (")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_deepspeed_tune_on_a_machine_without_built_ops(tmp_path):
    """No DeepSpeed op built yet (an empty extensions folder): the first-use build runs before the probe is timed,
    under its own deadline, so a hang deadline far shorter than the build still gives a measured probe."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    args = ["--model", str(TINY), "--cluster", "cpu", "--gpus", "2", "--seq", "128", "--gbs", "8",
            "--engine", "deepspeed", "--trials", "1", "--out", "out", "--iters", "4", "--warmup", "1",
            "--probe-timeout", str(round(deadline_s(PROBE_STARTUPS))), "--json"]
    done = _tune(args, tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert [t["status"] for t in report["trials"]] == ["ok"]
    assert report["trials"][0]["measured_tokens_per_s_per_gpu"] > 0
    assert "op deepspeed_shm_comm: ready after" in done.stderr
    assert (tmp_path / "ext" / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").exists()
    assert not list((tmp_path / "ext").glob("*/lock"))
    result = json.loads((tmp_path / "out" / "trials" / "trial-000" / "probe_result.json").read_text())
    assert result["build_time_s"] > 0
