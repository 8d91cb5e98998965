"""Tuning study logic with the probe replaced by a stand-in (real probes: tests/integration/test_tune_cli.py)."""
import threading
from pathlib import Path

import optuna
import pytest

from autoplan.clusterio import load_cluster
from autoplan.errors import InputError
from autoplan.integrations.probe import ProbeResult
from autoplan.modelio import load_model
from autoplan.solvers.space import Problem
from autoplan.tuning import study as study_mod
from autoplan.tuning.candidates import build_candidates
from autoplan.tuning.study import parse_faults, run_tune
from autoplan.workload import Workload

TINY = Path(__file__).parents[1] / "data" / "tiny.json"
SLOWDOWN = 3.0  # the stand-in 'measures' 3x the predicted step time


def problem() -> Problem:
    return Problem(model=load_model(str(TINY)), cluster=load_cluster("cpu", 2),
                   workload=Workload(seq_len=128, global_batch_size=8), engine="deepspeed")


class FakeProbe:
    """Records what was probed; ok unless a fault is injected; optional measured memory."""

    def __init__(self, mem_factor=None):
        self.calls = []
        self.releases = []
        self.mem_factor = mem_factor
        self.lock = threading.Lock()

    def __call__(self, plan, *, engine, out_dir, iters, warmup, launcher, timeout_s, fault=None, build_timeout_s=None,
                 log=None, megatron_release=None):
        with self.lock:
            self.calls.append((plan.strategy.label(), fault))
            self.releases.append(megatron_release)
        est = plan.estimate
        status = {"fail": "failed", "hang": "hung"}.get(fault, "ok")
        step = est.step_time_s * SLOWDOWN if status == "ok" else None
        tokens = plan.workload.tokens_per_step / step if step else None
        mem = {0: est.peak_mem_gib * self.mem_factor} if self.mem_factor else {}
        return ProbeResult(
            status=status, error=None if status == "ok" else f"injected {fault}", engine=engine, launcher=launcher,
            strategy_label=plan.strategy.label(), world_size=2, iterations_logged=6, warmup_iters=warmup,
            step_times_s=[step] if step else [], step_time_s=step, tokens_per_s=tokens,
            tokens_per_s_per_gpu=tokens / 2 if tokens else None, peak_mem_gib_by_rank=mem,
            predicted_step_time_s=est.step_time_s, predicted_tokens_per_s_per_gpu=est.tokens_per_s_per_gpu,
            predicted_peak_mem_gib=est.peak_mem_gib, step_time_ratio=SLOWDOWN if step else None,
            log_path=str(out_dir / "probe.log"), out_dir=str(out_dir), wall_time_s=1.0, command=["fake"])


@pytest.fixture
def fake(monkeypatch):
    probe = FakeProbe()
    monkeypatch.setattr(study_mod, "run_probe", probe)
    return probe


def test_parse_faults():
    assert parse_faults("1:fail, 2:hang") == {1: "fail", 2: "hang"}
    assert parse_faults("") == {}
    with pytest.raises(InputError, match="N:fail or N:hang"):
        parse_faults("1:explode")


def test_seeds_first_then_calibrated_order_and_faults_do_not_stop(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("AUTOPLAN_TUNE_FAULTS", "1:fail,2:hang")
    report = run_tune(problem(), trials=5, out_dir=tmp_path, seeds=3, launcher="local")
    ranked, _ = build_candidates(problem())
    assert [label for label, _ in fake.calls[:3]] == [c.strategy.label() for c in ranked[:3]]
    assert [f for _, f in fake.calls] == [None, "fail", "hang", None, None]
    assert [t.status for t in report.trials] == ["ok", "failed", "hung", "ok", "ok"]
    assert report.trials[1].reason == "injected fail"
    assert len({t.label for t in report.trials}) == 5
    # A uniform 3x slowdown is learnt exactly after the first ok probe.
    assert report.corrections["compute_scale"] == pytest.approx(SLOWDOWN, rel=1e-3)
    assert report.trials[3].corrected_step_time_error == pytest.approx(0.0, abs=1e-3)
    assert report.trials[0].step_time_error == pytest.approx(1 / SLOWDOWN - 1)
    ok = [t for t in report.trials if t.status == "ok"]
    assert report.best["number"] == max(ok, key=lambda t: t.measured_tokens_per_s_per_gpu).number
    assert (Path(report.best["files"]) / "ds_config.json").exists()
    assert (tmp_path / "tune_report.json").exists()


def test_megatron_release_reaches_the_probes_and_the_best_files(tmp_path, fake):
    megatron = Problem(model=load_model(str(TINY)), cluster=load_cluster("cpu", 2),
                       workload=Workload(seq_len=128, global_batch_size=8), engine="megatron")
    report = run_tune(megatron, trials=2, out_dir=tmp_path, seeds=2, launcher="local",
                      megatron_release="core_v0.16.1")
    assert fake.releases == ["core_v0.16.1"] * 2
    assert "# for Megatron-LM core_v0.16.1 " in (Path(report.best["files"]) / "megatron_args.txt").read_text()


def test_resume_continues_without_reseeding_or_repeats(tmp_path, fake):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    run_tune(problem(), trials=2, out_dir=tmp_path, storage=url, study_name="s", seeds=3, launcher="local")
    report = run_tune(problem(), trials=3, out_dir=tmp_path, storage=url, study_name="s", seeds=3,
                      launcher="local")
    ranked, _ = build_candidates(problem())
    # The third seed waited in storage across the interruption and is probed first on resume.
    assert [label for label, _ in fake.calls[:3]] == [c.strategy.label() for c in ranked[:3]]
    assert [t.number for t in report.trials] == [0, 1, 2, 3, 4]
    assert len({t.label for t in report.trials}) == 5


def test_two_workers_share_one_sqlite_study(tmp_path, fake):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    errors = []

    def worker(i):
        try:
            run_tune(problem(), trials=3, out_dir=tmp_path / f"w{i}", storage=url, study_name="shared",
                     launcher="local")
        except Exception as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    study = optuna.load_study(study_name="shared", storage=url)
    probed = [t.params["strategy"] for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(probed) == 6 and len(set(probed)) == 6  # no strategy probed twice


def test_memory_correction_prunes_before_launch(tmp_path, monkeypatch):
    probe = FakeProbe(mem_factor=50.0)  # measured peak is 50x the prediction: nothing else fits in 4 GiB
    monkeypatch.setattr(study_mod, "run_probe", probe)
    report = run_tune(problem(), trials=4, out_dir=tmp_path, seeds=1, launcher="local")
    assert report.corrections["memory_scale"] == pytest.approx(50.0)
    assert len(probe.calls) == 1
    excluded = [p for p in report.pruned if "x memory correction 50.00" in p["reason"]]
    assert len(excluded) == report.runnable - 1
    assert report.best["number"] == 0


def test_no_runnable_candidate_is_input_error(tmp_path, fake):
    p = problem()
    p = Problem(model=p.model, cluster=p.cluster, workload=p.workload, engine="deepspeed", fixed={"cp": 2})
    with pytest.raises(InputError):
        run_tune(p, trials=1, out_dir=tmp_path, launcher="local")
