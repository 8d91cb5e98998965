"""`autoplan report` (one saved plan as an HTML page) and `autoplan compare` (saved plans or estimates side by
side: a table, and with --out the same page)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
    app.command("compare")(compare_cmd)


def report_cmd(
    plan: str = typer.Argument(..., help="plan.json (plan --out DIR) or the output of plan --json."),
    out: Optional[str] = typer.Option(None, "--out", help="HTML file to write (default: PLAN with .html)."),
    engine: str = typer.Option("megatron", "--engine", help="Engine the plan was priced for (megatron, deepspeed)."),
    mem_headroom: float = typer.Option(0.0, "--mem-headroom", help="Fraction of memory kept free (the line drawn)."),
    front: bool = typer.Option(True, "--front/--no-front", help="Price the search space for the trade-off front."),
) -> None:
    """Write one self-contained HTML page of a saved plan: pipeline timeline, memory per rank, trade-off front."""
    from autoplan.errors import InputError
    from autoplan.report.inputs import load_saved
    from autoplan.report.write import saved_page, write_page

    from autoplan.keys import ENGINES

    if engine not in ENGINES:
        raise InputError(f"--engine {engine!r} must be {' or '.join(ENGINES)}")
    if not 0.0 <= mem_headroom < 1.0:
        raise InputError(f"--mem-headroom={mem_headroom} must be in [0, 1); e.g. 0.1 keeps 10% free")
    saved = load_saved(plan)
    target = out or str(Path(plan).with_suffix(".html"))
    path = write_page(target, saved_page(saved, engine=engine, headroom=mem_headroom, front=front))
    print(f"wrote {path}")


def compare_cmd(
    files: List[str] = typer.Argument(..., help="Two or more plan.json, plan --json or estimate --json files."),
    out: Optional[str] = typer.Option(None, "--out", help="Also write the comparison as an HTML page."),
    engine: str = typer.Option("megatron", "--engine", help="Engine the plans were priced for (for the timelines)."),
) -> None:
    """Compare saved plans or estimates: figures, time and memory terms, differing keys, why one is faster."""
    from rich.table import Table

    from autoplan.cli.render import console
    from autoplan.errors import InputError
    from autoplan.report.compare import compare
    from autoplan.report.inputs import load_saved

    if len(files) < 2:
        raise InputError(f"compare needs two or more files, got {len(files)}; e.g. autoplan compare a.json b.json")
    items = [load_saved(f) for f in files]
    names = [s.name for s in items]
    if len(set(names)) < len(names):  # same file names from different folders: tell them apart by path
        items = [type(s)(**{**s.__dict__, "name": f}) for s, f in zip(items, files)]
    comp = compare(items)
    if out:
        from autoplan.report.write import check_path, compare_page, write_page

        check_path(out)
    t = Table(title="Comparison")
    t.add_column("figure")
    for name in comp.names:
        t.add_column(name, justify="right")
    for name, values in comp.rows:
        t.add_row(name, *values)
    console.print(t)
    if comp.differing_keys:
        console.print("strategy keys that differ: " + "; ".join(
            f"{k}: {' / '.join(str(v) for v in values)}" for k, values in comp.differing_keys.items()))
    else:
        console.print("strategy keys that differ: none")
    for line in comp.why:
        console.print(line, highlight=False)
    if out:
        print(f"wrote {write_page(out, compare_page(items, comp, engine=engine))}")
