"""`autoplan probe PLAN.json`: run a plan for a few real iterations and compare with the prediction.

Exit codes: 0 the probe ran ok, 3 it failed (oom, error or hang), 2 bad input."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from autoplan.cli.console import console as _console, progress_console
from autoplan.cli.emit import MEGATRON_VERSION_HELP, launch_options
from autoplan.errors import InputError, ProbeFailure
from autoplan.integrations.probe import (DEFAULT_BUILD_TIMEOUT_S, DEFAULT_ITERS, DEFAULT_TIMEOUT_S, DEFAULT_WARMUP,
                                         ENGINES, ProbeResult, load_plan_file, run_probe)


def _table(res: ProbeResult) -> Table:
    table = Table(title=f"probe {res.strategy_label} ({res.engine}, {res.world_size} ranks): {res.status}")
    table.add_column("quantity")
    table.add_column("predicted", justify="right")
    table.add_column("measured", justify="right")
    fmt = lambda x, f: f.format(x) if x is not None else "-"  # noqa: E731
    table.add_row("step time (s)", fmt(res.predicted_step_time_s, "{:.4f}"), fmt(res.step_time_s, "{:.4f}"))
    table.add_row("tokens/s/device", fmt(res.predicted_tokens_per_s_per_gpu, "{:.1f}"),
                  fmt(res.tokens_per_s_per_gpu, "{:.1f}"))
    table.add_row("peak memory (GiB)", fmt(res.predicted_peak_mem_gib, "{:.2f}"),
                  fmt(res.measured_peak_mem_gib, "{:.2f}"))
    return table


def probe(plan_file: Path = typer.Argument(..., help="Plan JSON (a Plan, or `autoplan plan --json` output)."),
          engine: str = typer.Option(..., "--engine", help="megatron or deepspeed."),
          iters: int = typer.Option(DEFAULT_ITERS, "--iters", help="Iterations to train."),
          warmup: int = typer.Option(DEFAULT_WARMUP, "--warmup", help="Leading iterations left out of the median."),
          launcher: str = typer.Option("torchrun", "--launcher", help="local, torchrun or slurm."),
          timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", help="Seconds before a hang is killed."),
          build_timeout: float = typer.Option(DEFAULT_BUILD_TIMEOUT_S, "--build-timeout",
                                              help="Seconds allowed for building the engine's ops before the "
                                                   "timed run (not part of --timeout)."),
          out: Optional[Path] = typer.Option(None, "--out", help="Folder for the probe files and log."),
          megatron_version: Optional[str] = typer.Option(None, "--megatron-version", help=MEGATRON_VERSION_HELP),
          as_json: bool = typer.Option(False, "--json", help="Print the ProbeResult as JSON.")) -> None:
    """Emit the plan's probe files, train a few iterations, report measured vs predicted."""
    if engine not in ENGINES:
        raise InputError(f"--engine {engine!r} is unknown; valid engines: {', '.join(ENGINES)}")
    release = launch_options(engine, launcher, megatron_version)
    plan = load_plan_file(plan_file)
    out_dir = out or Path(tempfile.mkdtemp(prefix="autoplan-probe-"))
    progress = progress_console()
    res = run_probe(plan, engine=engine, out_dir=out_dir, iters=iters, warmup=warmup, launcher=launcher,
                    timeout_s=timeout, build_timeout_s=build_timeout, megatron_release=release,
                    log=lambda s: progress.print(s, highlight=False, markup=False))
    if as_json:
        print(json.dumps(res.model_dump(), indent=2))
    else:
        console = _console()
        console.print(_table(res))
        if res.error:
            console.print(f"[red]{res.status}[/red]: {res.error}")
        console.print(f"log: {res.log_path}")
    if res.status != "ok":
        raise ProbeFailure(f"{res.status}: {res.error} (log: {res.log_path})")


def register(app: typer.Typer) -> None:
    app.command("probe")(probe)
