"""`autoplan tune`: probe the cost model's best plans for real, correct the model as results come in, keep the
best measured plan.

Several workers can share one study: run the same command (same --storage and --study-name) on several
machines. sqlite URLs suit workers on one host; PostgreSQL/MySQL URLs (postgresql://..., mysql+pymysql://...)
are passed to Optuna unchanged and need their driver installed. An interrupted study resumes from --storage.

Exit codes: 0 a best plan was measured, 3 no probe succeeded, 2 bad input."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from autoplan.clusterio import load_cluster
from autoplan.cli.console import console as _console, progress_console
from autoplan.cli.emit import MEGATRON_VERSION_HELP, launch_options
from autoplan.errors import ProbeFailure
from autoplan.integrations.probe import DEFAULT_BUILD_TIMEOUT_S
from autoplan.modelio import load_model
from autoplan.numerics import PRECISION_HELP
from autoplan.solvers.space import Problem
from autoplan.tuning.report import render_table
from autoplan.tuning.study import DEFAULT_SEEDS, run_tune
from autoplan.workload import make_workload


def tune(model: str = typer.Option(..., "--model", help="Catalogue name, config.json or model YAML."),
         cluster: str = typer.Option(..., "--cluster", help="GPU id (e.g. h100, cpu) or cluster YAML."),
         gpus: int = typer.Option(..., "--gpus", help="Devices per probe run."),
         seq: int = typer.Option(..., "--seq", help="Sequence length, tokens."),
         gbs: int = typer.Option(..., "--gbs", help="Global batch size, sequences."),
         engine: str = typer.Option(..., "--engine", help="megatron or deepspeed."),
         precision: Optional[str] = typer.Option(None, "--precision", help=PRECISION_HELP),
         trials: int = typer.Option(20, "--trials", help="Probes this worker runs at most."),
         budget_minutes: float = typer.Option(60.0, "--budget-minutes", help="No new probe after this."),
         storage: Optional[str] = typer.Option(None, "--storage", help="Optuna RDB URL, e.g. sqlite:///autoplan.db."),
         study_name: str = typer.Option("autoplan-tune", "--study-name", help="Study to create or resume."),
         out: Path = typer.Option(Path("autoplan-tune"), "--out", help="Folder for trials, report, best plan."),
         iters: int = typer.Option(6, "--iters", help="Iterations per probe."),
         warmup: int = typer.Option(2, "--warmup", help="Leading iterations of each probe left out."),
         launcher: str = typer.Option("torchrun", "--launcher", help="local, torchrun or slurm."),
         probe_timeout: float = typer.Option(600.0, "--probe-timeout", help="Seconds before a probe counts as hung."),
         build_timeout: float = typer.Option(DEFAULT_BUILD_TIMEOUT_S, "--build-timeout",
                                             help="Seconds allowed for building the engine's ops before each timed "
                                                  "probe (not part of --probe-timeout)."),
         seeds: int = typer.Option(DEFAULT_SEEDS, "--seeds", help="Cost-model top plans enqueued first."),
         calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration file written by "
                                                   "`autoplan calibrate` (fitted constants of this cluster's GPU)."),
         megatron_version: Optional[str] = typer.Option(None, "--megatron-version", help=MEGATRON_VERSION_HELP),
         as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
         html: Optional[str] = typer.Option(None, "--report", help="Write an HTML report: measured vs predicted.")
         ) -> None:
    """Tune a plan with real probe runs (Optuna study, cost-model seeded, calibrated)."""
    release = launch_options(engine, launcher, megatron_version)
    from autoplan.calibration.calfile import load_and_apply

    spec, cal = load_and_apply(calibration, load_cluster(cluster, gpus), cluster)
    problem = Problem(model=load_model(model), cluster=spec, workload=make_workload(seq, gbs), engine=engine,
                      precision=precision, calibration=cal)
    console = progress_console()
    report = run_tune(problem, trials=trials, out_dir=out, storage=storage, study_name=study_name,
                      budget_minutes=budget_minutes, iters=iters, warmup=warmup, launcher=launcher,
                      probe_timeout_s=probe_timeout, build_timeout_s=build_timeout, seeds=seeds, log=lambda s: console.print(s, highlight=False, markup=False),
                      megatron_release=release)
    if html:
        from autoplan.report.write import write_tune_report

        write_tune_report(html, report)
    if as_json:
        print(json.dumps(report.model_dump(), indent=2))
    else:
        out_console = _console()
        out_console.print(render_table(report))
        c = report.corrections
        out_console.print(f"corrections: compute x{c['compute_scale']:.3f}, comm x{c['comm_scale']:.3f}, "
                          f"memory x{c['memory_scale']:.3f} ({c['time_probes']} timed probes)")
        if report.best:
            out_console.print(f"best: {report.best['label']} at {report.best['measured_tokens_per_s_per_gpu']:.1f} "
                              f"tokens/s/device; files in {report.best['files']}")
    if report.best is None:
        raise ProbeFailure(f"no probe of study {report.study_name!r} succeeded; see {out / 'tune_report.json'}")


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
