"""`autoplan plan`: search the strategy space and rank the plans."""
from __future__ import annotations

import time
from typing import List, Optional

import typer

from autoplan.cli.common import (CKPT_METHOD_HELP, DEFAULT_GBS, DEFAULT_SEQ, RESILIENCE_HELP, apply_resilience,
                                 load_inputs, print_json, read_strategy)
from autoplan.cli.emit import MEGATRON_VERSION_HELP, emit_request
from autoplan import keys as K
from autoplan.numerics import PRECISION_HELP


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)


def plan_cmd(
    model: str = typer.Option("llama3-70b", "--model", help="Catalogue name, HF config.json or native spec."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help="Override a model field: key=value."),
    cluster: str = typer.Option("h100", "--cluster", help="GPU id (see `autoplan clusters`) or cluster YAML."),
    gpus: int = typer.Option(64, "--gpus", help="Number of GPUs (world size)."),
    seq: int = typer.Option(DEFAULT_SEQ, "--seq", help="Sequence length, tokens."),
    gbs: int = typer.Option(DEFAULT_GBS, "--gbs", help="Global batch, sequences."),
    top: int = typer.Option(5, "--top", help="How many plans to show."),
    objective: str = typer.Option("throughput", "--objective",
                                  help="throughput: fastest on all --gpus; goodput: most tokens per second net of "
                                       "failures, checkpoints and restarts; cost: fewest GPU-hours per token, "
                                       "trying --gpus, --gpus/2, --gpus/4, ... (whole nodes)."),
    ckpt_method: Optional[str] = typer.Option(None, "--ckpt-method", help=CKPT_METHOD_HELP),
    resilience: Optional[List[str]] = typer.Option(None, "--resilience", help=RESILIENCE_HELP),
    solver: str = typer.Option("cpsat", "--solver", help="enumerate, cpsat (enumerate + CP-SAT stage refinement), "
                                                        "optuna, or brute-force."),
    fix: Optional[List[str]] = typer.Option(None, "--fix", help="Only plans with key=value (e.g. --fix tp=8); "
                                                                 f"keys: {K.help_text()}."),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help="No plans with key=value."),
    allow: Optional[List[str]] = typer.Option(None, "--allow", help="Widen the space: tp-outside-domain, "
                                              "no-sp, non-pow2-mbs (ep-outside-domain is accepted: expert "
                                              "parallelism already may leave the NVLink domain)."),
    engine: str = typer.Option("megatron", "--engine", help="megatron or deepspeed (what the engine can run)."),
    precision: Optional[str] = typer.Option(None, "--precision", help=PRECISION_HELP),
    mem_headroom: float = typer.Option(0.0, "--mem-headroom", help="Fraction of device memory to keep free."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Your own strategy, estimated beside the best."),
    baseline_from_megatron: Optional[str] = typer.Option(None, "--baseline-from-megatron",
                                                         help="Baseline from Megatron-LM args or a script."),
    explain: bool = typer.Option(False, "--explain", help="Why the winner wins."),
    emit: Optional[str] = typer.Option(None, "--emit", help="Write launch files: megatron,deepspeed."),
    out: Optional[str] = typer.Option(None, "--out", help="Folder for plan.json and emitted files."),
    megatron_version: Optional[str] = typer.Option(None, "--megatron-version", help=MEGATRON_VERSION_HELP),
    seed: int = typer.Option(0, "--seed", help="Seed for the stochastic solvers."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Measured profile(s), comma-separated: layer "
                                          "times (autoplan profile) and/or collectives (autoplan profile-comm)."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration file written by "
                                              "`autoplan calibrate` (fitted constants of this cluster's GPU)."),
    as_json: bool = typer.Option(False, "--json", help="Print {'plans': [...]} as JSON (stable keys)."),
    report: Optional[str] = typer.Option(None, "--report", help="Write an HTML report of the search (plan.html)."),
) -> None:
    """Find the fastest strategies that fit in memory."""
    from autoplan.errors import InputError
    from autoplan.solvers.policy import check_fixed_labels, search_constraints
    from autoplan.solvers.space import Problem, parse_constraints

    if objective not in ("throughput", "goodput", "cost"):
        raise InputError(f"--objective {objective!r} must be throughput, goodput or cost")
    if top <= 0:
        raise InputError(f"--top={top} must be >= 1")
    formats = emit_request(emit, out, megatron_version)  # refused before the search: a bad one writes nothing
    m, c, wl = load_inputs(model, sets, cluster, gpus, seq, gbs)
    c = apply_resilience(c, ckpt_method, resilience)
    prof, c = _profiles(profile, m, c, quiet=as_json)
    from autoplan.calibration.calfile import load_and_apply

    c, cal = load_and_apply(calibration, c, cluster)
    fixed, excluded = search_constraints(parse_constraints(fix or [], "--fix"),
                                         parse_constraints(exclude or [], "--exclude"))
    allowed = frozenset(a.strip() for item in (allow or []) for a in item.split(",") if a.strip())
    problem = Problem(m, c, wl, fixed=fixed, excluded={k: tuple(v) for k, v in excluded.items()}, allow=allowed,
                      engine=engine, mem_headroom=mem_headroom, precision=precision, calibration=cal,
                      objective="goodput" if objective == "goodput" else "throughput")
    if objective == "cost":
        result = _run_cost(problem, solver, top, seed, prof, quiet=as_json)
    else:
        result = _run(problem, solver, top, seed, prof, quiet=as_json)
    check_fixed_labels(problem, result)
    _engine_model_note(problem)
    base_plan = _baseline(problem, baseline, baseline_from_megatron, prof)
    if not result.plans:
        _no_plan(result, problem, as_json)
        raise typer.Exit(1)
    if report:
        from autoplan.report.write import write_plan_report

        write_plan_report(report, result, problem, base_plan, prof)
    if out:
        _write_out(result, problem, out, formats,
                   lambda engine: _engine_best(problem, engine, solver, seed, prof, result.plans[0].cluster),
                   megatron_version)
    if as_json:
        payload = {"plans": [{"strategy": p.strategy.to_dict(), "estimate": p.estimate.contract(),
                              "num_gpus": p.cluster.num_gpus} for p in result.plans],
                   "model": m.model_dump(), "cluster": c.model_dump(), "workload": wl.model_dump(),
                   "search": _search_summary(result)}
        if base_plan is not None:
            payload["baseline"] = {"strategy": base_plan.strategy.to_dict(), "estimate": base_plan.estimate.contract()}
        print_json(payload)
        return
    _print(result, problem, base_plan, explain, objective)


def _engine_model_note(problem) -> None:
    """Say up front when the engine's launch files cannot express the model (the plans are still priced: another
    engine or Megatron-Bridge can run them), instead of leaving it to a refusal at emit time."""
    import sys

    if problem.engine != "megatron":
        return
    from autoplan.integrations.megatron import inexpressible_problem

    problem_text = inexpressible_problem(problem.model)
    if problem_text:
        print(f"note: the plans are priced, but `emit --format megatron` will refuse them: {problem_text}",
              file=sys.stderr)


def _profiles(spec, model, cluster, quiet):
    """--profile: the check estimate uses (costmodel.measured.resolve_profiles); (layer profile, cluster)."""
    import sys

    from autoplan.costmodel.measured import resolve_profiles

    resolved = resolve_profiles(spec, model, cluster)
    if not quiet:
        for note in resolved.notes:
            print(f"note: {note}", file=sys.stderr)
    return resolved.layers, resolved.cluster


def _run(problem, solver, top, seed, prof, quiet):
    """Solve; a progress bar appears only once the search has run for a second."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from autoplan.solvers.api import solve

    if quiet:
        return solve(problem, solver, top_k=top, seed=seed, profile=prof)
    started = time.perf_counter()
    state = {}

    def progress(done, total):
        if "bar" not in state:
            if time.perf_counter() - started <= 1.0:
                return
            bar = Progress(TextColumn("[bold]searching[/bold]"), BarColumn(),
                           TextColumn("{task.completed:,}/{task.total:,}"), TimeElapsedColumn(), transient=True)
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task("search", total=total)
        state["bar"].update(state["task"], completed=done, total=total)

    try:
        return solve(problem, solver, top_k=top, seed=seed, profile=prof, progress=progress)
    finally:
        if "bar" in state:
            state["bar"].stop()


def _no_plan(result, problem, as_json):
    import sys

    from autoplan.solvers.policy import no_plan_reason

    msg = no_plan_reason(result, problem)
    if as_json:
        print_json({"plans": [], "error": msg, "search": _search_summary(result)})
    print(f"autoplan: {msg}", file=sys.stderr)


def _engine_best(problem, engine, solver, seed, prof, cluster):
    """What `--emit` writes for an engine whose files cannot carry the winner (solvers/policy.py engine_best), with
    what those files need fixed (cli/emit.py emit_fixed: e.g. a DeepSpeed training run has no pipeline stages)."""
    from autoplan.cli.emit import emit_fixed
    from autoplan.solvers.policy import engine_best

    return engine_best(problem, engine, cluster, lambda sub: _run(sub, solver, 1, seed, prof, quiet=True),
                       emit_fixed(engine))


def _run_cost(problem, solver, top, seed, prof, quiet):
    """--objective cost: the search over several cluster sizes (solvers/policy.py), each with the progress bar."""
    from autoplan.solvers.policy import run_over_sizes

    return run_over_sizes(problem, lambda sub: _run(sub, solver, top, seed, prof, quiet), solver, top)


def _baseline(problem, text, from_megatron, prof):
    from autoplan.costmodel.estimate import estimate
    from autoplan.results import Plan
    from autoplan.validate import validate

    if not text and not from_megatron:
        return None
    if from_megatron:
        from autoplan.integrations import importers

        wl = problem.workload  # the job is the plan's: a model fragment's layout is completed like a --baseline
        given = dict(importers.from_megatron_args(from_megatron, seq_len=wl.seq_len,
                                                  global_batch_size=wl.global_batch_size,
                                                  world_size=problem.cluster.num_gpus).strategy)
    else:
        given = read_strategy(text)
    from autoplan.complete import complete_strategy

    s, notes = complete_strategy(problem.model, problem.cluster, problem.workload, given, engine=problem.engine)
    s = validate(problem.model, problem.cluster, problem.workload, s)
    est = estimate(problem.model, problem.cluster, s, problem.workload, cal=problem.calibration, profile=prof,
                   headroom=problem.mem_headroom, notes=notes, engine=problem.engine)
    return Plan(model=problem.model, cluster=problem.cluster, workload=problem.workload, strategy=s, estimate=est)


def _search_summary(result) -> dict:
    return {"solver": result.solver, "space_size": result.space_size, "evaluated": result.evaluated,
            "feasible": result.feasible, "wall_s": round(result.wall_s, 3), "rejected": result.infeasible}


def _write_out(result, problem, out, formats, engine_best, megatron_version=None):
    """plan.json and the --emit formats' files in --out, written all or none."""
    import sys
    from pathlib import Path

    from autoplan.cli.emit import search_emit_files, write_all

    def stamped(plan):
        """Under --objective goodput a plan's launch files carry the checkpoint interval and method it was ranked
        by (integrations/megatron.py checkpoint_args, deepspeed.py checkpoint_section)."""
        if plan is None or problem.objective != "goodput":
            return plan
        return plan.model_copy(update={"objective": "goodput"})

    best = stamped(result.plans[0])
    files, said, missing = {Path(out) / "plan.json": best.model_dump_json(indent=2)}, [], []
    if formats:
        emitted, said, missing = search_emit_files(best, formats, Path(out), lambda e: stamped(engine_best(e)),
                                                   megatron_version=megatron_version)
        files.update(emitted)
    write_all(files)
    for line in said + missing:
        print(f"emitted {line}", file=sys.stderr)
    if missing:
        raise typer.Exit(1)


def _print(result, problem, base_plan, explain, objective):
    from autoplan.cli.render import console, estimate_tables, plans_table

    m, c, wl = problem.model, problem.cluster, problem.workload
    where = f"up to {c.num_gpus}" if objective == "cost" else f"{c.num_gpus}"
    title = (f"{m.name} on {where} x {c.gpu.id}, seq {wl.seq_len}, gbs {wl.global_batch_size}: "
             f"top {len(result.plans)} of {result.feasible:,} feasible"
             + (", by GPU-hours per token" if objective == "cost" else "")
             + (", by goodput" if objective == "goodput" else ""))
    console.print(plans_table(result.plans, title, show_gpus=objective == "cost"))
    rejected = ", ".join(f"{v:,} {k}" for k, v in result.infeasible.items())
    console.print(f"searched {result.space_size:,} legal candidates ({result.evaluated:,} priced) in "
                  f"{result.wall_s:.2f} s with {result.solver}" + (f"; skipped: {rejected}" if rejected else ""))
    best = result.plans[0]
    e = best.estimate
    if e.useful_fraction is not None:
        console.print(f"goodput ({e.checkpoint_method} checkpoints): job MTBF {e.expected_job_mtbf_s / 3600:,.2f} h, "
                      f"restart {e.restart_s:,.0f} s; #1 saves {e.checkpoint_gib_per_rank:,.2f} GiB per rank every "
                      f"{e.checkpoint_interval_steps} steps, {e.useful_fraction:.1%} of the time trains and is kept")
    if objective == "cost":
        for p in result.plans[:3]:
            gpu_hours = 1e9 / p.estimate.tokens_per_s_per_gpu / 3600
            console.print(f"cost: {p.cluster.num_gpus} GPUs, {p.strategy.label()}: {gpu_hours:,.0f} GPU-hours "
                          f"per billion tokens, {p.estimate.step_time_s:.2f} s/step")
    if base_plan is not None:
        b = base_plan.estimate
        if b.fits:
            console.print(f"baseline [cyan]{base_plan.strategy.label()}[/cyan]: {b.step_time_s:.3f} s/step; "
                          f"best is {b.step_time_s / best.estimate.step_time_s:.2f}x faster")
        else:
            console.print(f"baseline [cyan]{base_plan.strategy.label()}[/cyan] does not fit: needs "
                          f"{b.peak_mem_gib:.1f} GiB of {b.capacity_gib:.1f} GiB per GPU")
    if explain:
        for t in estimate_tables(best.estimate, f"Why #1 wins: {best.strategy.label()}"):
            console.print(t)
        _explain_vs(result, best)


def _explain_vs(result, best):
    from autoplan.cli.render import console
    from rich.table import Table

    others = result.plans[1:3] + result.best_by_shape
    if not others:
        return
    t = Table(title="Against the runners-up and the best plan of each other shape (seconds per step)")
    keys = [k for k, v in best.estimate.time_breakdown.items()
            if v > 0 or any(o.estimate.time_breakdown.get(k, 0) > 0 for o in others)]
    t.add_column("plan", no_wrap=True)
    for k in keys:
        t.add_column(k, justify="right")
    t.add_column("step", justify="right", style="bold")
    t.add_column("peak GiB", justify="right")
    for p in [best] + others:
        e = p.estimate
        t.add_row(p.strategy.label(), *(f"{e.time_breakdown[k]:.2f}" for k in keys), f"{e.step_time_s:.3f}",
                  f"{e.peak_mem_gib:.1f}")
    console.print(t)
