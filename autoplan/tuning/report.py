"""The tune report: every probe with predicted vs measured, the fitted corrections, the best measured plan (its
launch files written under `<out>/best/`), and the strategies never launched with the reason."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import optuna
from pydantic import BaseModel, ConfigDict, Field

from autoplan.fileio import write_text
from autoplan.results import Plan
from autoplan.solvers.space import Problem
from autoplan.tuning.calibration import Corrections
from autoplan.tuning.candidates import Candidate, Pruned, plan_of


class TrialRecord(BaseModel):
    """One probe of the study (any worker)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    number: int = Field(description="Optuna trial number.")
    label: str = Field(description="Strategy label.")
    strategy: Dict[str, Any] = Field(description="Strategy.to_dict().")
    status: str = Field(description="ok, oom, failed, hung, or pruned (never launched).")
    reason: Optional[str] = Field(None, description="Why it is not ok (error line, timeout, pruning reason).")
    log: Optional[str] = Field(None, description="Probe log path.")
    predicted_step_time_s: Optional[float] = Field(None, description="Uncorrected cost-model step time, s.")
    corrected_step_time_s: Optional[float] = Field(None, description="Corrected prediction when it was chosen, s.")
    measured_step_time_s: Optional[float] = Field(None, description="Median measured step time, s.")
    predicted_tokens_per_s_per_gpu: Optional[float] = Field(None, description="Cost-model tokens/s/device.")
    measured_tokens_per_s_per_gpu: Optional[float] = Field(None, description="Measured tokens/s/device.")
    step_time_error: Optional[float] = Field(None, description="predicted / measured - 1 (uncorrected model).")
    corrected_step_time_error: Optional[float] = Field(None, description="corrected / measured - 1.")
    predicted_peak_mem_gib: Optional[float] = Field(None, description="Cost-model peak memory, GiB.")
    measured_peak_mem_gib: Optional[float] = Field(None, description="Measured peak device memory, GiB.")
    probe_wall_s: Optional[float] = Field(None, description="Wall time of the probe, s.")


class TuneReport(BaseModel):
    """`autoplan tune --json`: a stable object."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    study_name: str = Field(description="Optuna study name.")
    storage: Optional[str] = Field(description="Optuna storage URL; None = in memory.")
    engine: str = Field(description="megatron or deepspeed.")
    model: str = Field(description="Model name.")
    cluster: str = Field(description="GPU id.")
    num_gpus: int = Field(description="Devices per probe.")
    seq_len: int = Field(description="Tokens per sequence.")
    global_batch_size: int = Field(description="Sequences per step.")
    space_size: int = Field(description="Legal strategies of the problem.")
    runnable: int = Field(description="Of those, runnable by the engine and predicted to fit.")
    trials: List[TrialRecord] = Field(description="Every trial of the study, in number order.")
    pruned: List[Dict[str, str]] = Field(description="Strategies never launched: {label, reason}.")
    corrections: Dict[str, Any] = Field(description="Fitted correction factors (Corrections).")
    best: Optional[Dict[str, Any]] = Field(description="Best measured trial: number, label, strategy, "
                                                       "measured_tokens_per_s_per_gpu, files (folder).")
    probe_time_s: float = Field(description="Sum of probe wall times over the study's trials, s.")
    wall_time_s: float = Field(description="This worker's wall time, s.")


def _err(pred: Optional[float], measured: Optional[float]) -> Optional[float]:
    return pred / measured - 1.0 if pred and measured else None


def trial_record(t: optuna.trial.FrozenTrial, cand: Optional[Candidate]) -> TrialRecord:
    a = t.user_attrs
    # A trial whose probe never finished (worker interrupted or killed) is FAIL with a reason but no probe status.
    status = a.get("status") or {optuna.trial.TrialState.PRUNED: "pruned",
                                 optuna.trial.TrialState.FAIL: "failed"}.get(t.state, t.state.name.lower())
    return TrialRecord(
        number=t.number, label=cand.strategy.label() if cand else a.get("label", "?"),
        strategy=cand.strategy.to_dict() if cand else {}, status=status, reason=a.get("reason"), log=a.get("log"),
        predicted_step_time_s=a.get("predicted_step_time_s"), corrected_step_time_s=a.get("corrected_step_time_s"),
        measured_step_time_s=a.get("measured_step_time_s"),
        predicted_tokens_per_s_per_gpu=a.get("predicted_tokens_per_s_per_gpu"),
        measured_tokens_per_s_per_gpu=a.get("measured_tokens_per_s_per_gpu"),
        step_time_error=_err(a.get("predicted_step_time_s"), a.get("measured_step_time_s")),
        corrected_step_time_error=_err(a.get("corrected_step_time_s"), a.get("measured_step_time_s")),
        predicted_peak_mem_gib=a.get("predicted_peak_mem_gib"), measured_peak_mem_gib=a.get("measured_peak_mem_gib"),
        probe_wall_s=a.get("probe_wall_s"))


def write_best(problem: Problem, plan: Plan, out_dir: Path, megatron_release: Optional[str] = None) -> Path:
    """The best plan's training launch files (not the probe variant) and its plan JSON, under <out>/best/."""
    from autoplan.integrations.probe import write_files

    from autoplan.errors import InputError

    best_dir = out_dir / "best"
    try:
        if problem.engine == "deepspeed":
            from autoplan.integrations.deepspeed import emit_deepspeed

            files = emit_deepspeed(plan)
        else:
            from autoplan.integrations.megatron import emit_megatron
            from autoplan.integrations.megatron_releases import DEFAULT_RELEASE

            files = emit_megatron(plan, release=megatron_release or DEFAULT_RELEASE)
    except InputError as e:  # e.g. DeepSpeed pipeline stages, which only the probe's stand-in model runs
        files = {"NOT_EMITTED.txt": f"no training launch files for this plan: {e}\n"}
    write_files(files, best_dir)
    write_text(best_dir / "plan.json", plan.model_dump_json(indent=2) + "\n")
    return best_dir


def build_report(problem: Problem, study: optuna.Study, candidates: List[Candidate], pruned: List[Pruned],
                 corr: Corrections, out_dir: Path, storage: Optional[str], wall_time_s: float,
                 space_size: int, megatron_release: Optional[str] = None) -> TuneReport:
    by_key = {c.key: c for c in candidates}
    records = [trial_record(t, by_key.get(t.params.get("strategy", ""))) for t in study.get_trials(deepcopy=False)
               if t.state != optuna.trial.TrialState.WAITING]
    ok = [r for r in records if r.status == "ok" and r.measured_tokens_per_s_per_gpu]
    best = None
    if ok:
        top = max(ok, key=lambda r: r.measured_tokens_per_s_per_gpu)
        trial = study.trials[top.number]
        cand = by_key[trial.params["strategy"]]
        folder = write_best(problem, plan_of(problem, cand), out_dir, megatron_release)
        best = {"number": top.number, "label": top.label, "strategy": top.strategy,
                "measured_tokens_per_s_per_gpu": top.measured_tokens_per_s_per_gpu,
                "measured_step_time_s": top.measured_step_time_s, "files": str(folder)}
    report = TuneReport(
        study_name=study.study_name, storage=storage, engine=problem.engine, model=problem.model.name,
        cluster=problem.cluster.gpu.id, num_gpus=problem.cluster.num_gpus, seq_len=problem.workload.seq_len,
        global_batch_size=problem.workload.global_batch_size, space_size=space_size,
        runnable=len(candidates), trials=records, pruned=[p.model_dump() for p in pruned],
        corrections=corr.model_dump(), best=best, probe_time_s=sum(r.probe_wall_s or 0.0 for r in records),
        wall_time_s=wall_time_s)
    write_text(out_dir / "tune_report.json", json.dumps(report.model_dump(), indent=2) + "\n")
    return report


def render_table(report: TuneReport):
    """A rich table of predicted vs measured for every trial."""
    from rich.table import Table

    table = Table(title=f"autoplan tune: {report.model} on {report.num_gpus} x {report.cluster} ({report.engine})")
    for col in ("#", "strategy", "status", "pred s", "corr s", "meas s", "err", "tok/s/dev", "note"):
        table.add_column(col, justify="right" if col not in ("strategy", "status", "note") else "left")
    for r in report.trials:
        table.add_row(str(r.number), r.label, r.status, _fmt(r.predicted_step_time_s),
                      _fmt(r.corrected_step_time_s), _fmt(r.measured_step_time_s),
                      f"{r.step_time_error:+.0%}" if r.step_time_error is not None else "",
                      f"{r.measured_tokens_per_s_per_gpu:.0f}" if r.measured_tokens_per_s_per_gpu else "",
                      (r.reason or "")[:60])
    return table


def _fmt(x: Optional[float]) -> str:
    return f"{x:.4f}" if x is not None else ""
