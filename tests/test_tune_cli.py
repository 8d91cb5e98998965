"""`autoplan tune` end to end. DeepSpeed: real probes of tiny.json on 2 CPU ranks (gloo), one made to fail and one
to hang. Megatron: real launches of a stand-in pretrain_gpt.py that replays a real Megatron-LM log (Megatron
needs CUDA; real Megatron probes are not run here); two workers share one sqlite study concurrently."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_probe import FAKE_PRETRAIN

HERE = Path(__file__).parent
TINY = HERE / "data" / "tiny.json"
LOGS = HERE / "fixtures" / "logs"


def _tune(args, cwd, env=None, timeout=300):
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
    env = dict(os.environ, AUTOPLAN_TUNE_FAULTS="1:fail,2:hang")
    args = ["--model", str(TINY), "--cluster", "cpu", "--gpus", "2", "--seq", "128", "--gbs", "8",
            "--engine", "deepspeed", "--trials", "4", "--storage", "sqlite:///study.db", "--out", "out",
            "--probe-timeout", "30", "--json"]
    start = time.monotonic()
    done = _tune(args, tmp_path, env)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    assert elapsed < 300
    report = json.loads(done.stdout)
    assert [t["status"] for t in report["trials"]] == ["ok", "failed", "hung", "ok"]
    assert "AUTOPLAN_FAULT=fail" in report["trials"][1]["reason"]
    assert "timed out" in report["trials"][2]["reason"]
    for t in report["trials"]:
        assert Path(tmp_path / t["log"]).exists() if not Path(t["log"]).is_absolute() else Path(t["log"]).exists()
    ok = [t for t in report["trials"] if t["status"] == "ok"]
    assert all(t["measured_tokens_per_s_per_gpu"] > 0 and t["predicted_step_time_s"] > 0 for t in ok)
    assert report["best"]["number"] == max(ok, key=lambda t: t["measured_tokens_per_s_per_gpu"])["number"]
    best_dir = tmp_path / report["best"]["files"]
    assert {"ds_config.json", "launch.sh", "ds_train.py", "model.json", "plan.json"} <= {
        p.name for p in best_dir.iterdir()}
    assert report["corrections"]["time_probes"] == 2
    assert not _processes_mentioning(str(tmp_path / "out" / "trials"))  # the hung probe left nothing

    resumed = _tune([a if a != "4" else "1" for a in args], tmp_path, dict(os.environ))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = json.loads(resumed.stdout)
    assert [t["number"] for t in again["trials"]] == [0, 1, 2, 3, 4]
    assert len({t["label"] for t in again["trials"]}) == 5


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
    outs = [p.communicate(timeout=300) for p in procs]
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
