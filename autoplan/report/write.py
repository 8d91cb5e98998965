"""Writing report pages: what `plan`, `estimate`, `tune --report`, `report` and `compare --out` call. A page is
written whole or not at all (a temporary file renamed into place)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from autoplan.errors import InputError
from autoplan.report import charts
from autoplan.report.build import checked_timeline, front_points, headline, plan_page, plan_title, tune_page
from autoplan.report.compare import Comparison
from autoplan.report.inputs import Saved
from autoplan.report.page import Page, Section, render
from autoplan.results import Plan


def check_path(path: str) -> Path:
    """The page's path; its folder must exist (nothing is created for it)."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"--report/--out {path} is a folder; give a file name, e.g. {p / 'plan.html'}")
    if not p.parent.is_dir():
        raise InputError(f"--report/--out {path}: folder {p.parent} does not exist; create it or pick another path")
    return p


def write_page(path: str, page: Page) -> Path:
    p = check_path(path)
    text = render(page)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # what open() would have made, not mkstemp's 0600
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return p


def search_notes(result) -> list:
    """What the search did and excluded, in words (solvers/api.py SolveResult)."""
    notes = [f"searched {result.space_size:,} legal candidates ({result.evaluated:,} priced, {result.feasible:,} fit) "
             f"with {result.solver}"]
    notes += [f"skipped {v:,}: {k}" for k, v in result.infeasible.items()]
    return notes + list(result.notes)


def write_plan_report(path: str, result, problem, baseline: Optional[Plan] = None, profile=None) -> Path:
    """`plan --report`: the winner's timeline and memory, the search's front, the top plans' breakdown, notes."""
    from dataclasses import replace

    check_path(path)
    best = result.plans[0]
    space = replace(problem, cluster=best.cluster)  # --objective cost: the size the winner runs on
    page = plan_page(best, engine=problem.engine, profile=profile, headroom=problem.mem_headroom,
                     front=front_points(space, profile), runners_up=result.plans[1:], baseline=baseline,
                     notes=search_notes(result))
    return write_page(path, page)


def write_estimate_report(path: str, plan: Plan, *, engine: str = "megatron", profile=None,
                          headroom: float = 0.0) -> Path:
    """`estimate --report`: one strategy's timeline, memory and breakdown."""
    check_path(path)
    return write_page(path, plan_page(plan, engine=engine, profile=profile, headroom=headroom, kind="estimate"))


def write_tune_report(path: str, report) -> Path:
    """`tune --report`: measured vs predicted per trial and the calibration fit (tuning/report.py TuneReport)."""
    check_path(path)
    return write_page(path, tune_page(report.model_dump()))


def saved_page(saved: Saved, *, engine: str = "megatron", headroom: float = 0.0, front: bool = True) -> Page:
    """`autoplan report FILE`: a saved plan's page; its front is the unconstrained search space of its model,
    cluster and workload under `engine` (the file does not record --fix/--exclude)."""
    if saved.plan is None:
        raise InputError(f"{saved.name} is an estimate without its model, cluster and workload, which the timeline "
                         f"needs; save a plan (plan --out DIR, or plan --json > plan.json), or run estimate ... "
                         f"--report FILE.html")
    points = None
    if front:
        from autoplan.solvers.space import Problem

        points = front_points(Problem(saved.plan.model, saved.plan.cluster, saved.plan.workload, engine=engine,
                                      mem_headroom=headroom))
    notes = []
    if saved.search:
        notes.append(f"searched {saved.search.get('space_size', 0):,} legal candidates with "
                     f"{saved.search.get('solver')}")
        notes += [f"skipped {v:,}: {k}" for k, v in (saved.search.get("rejected") or {}).items()]
    if points:
        notes.append(f"the trade-off front shows the unconstrained {engine} search space of this model, cluster "
                     f"and workload (the file does not record --fix / --exclude)")
    return plan_page(saved.plan, engine=engine, headroom=headroom, front=points, runners_up=saved.runners_up,
                     baseline=saved.baseline, notes=notes)


def compare_page(items: Sequence[Saved], comp: Comparison, *, engine: str = "megatron") -> Page:
    """The comparison side by side: the table, the breakdowns, and each plan's timeline and memory in a column."""
    table = [["figure"] + comp.names] + [[name] + values for name, values in comp.rows]
    table += [[f"key: {k}"] + [str(v) for v in values] for k, values in comp.differing_keys.items()]
    sections = [
        Section("Figures", table=table),
        Section("Why the fastest is faster", items=comp.why),
        Section("Time breakdown", charts=[("breakdown", charts.breakdown_figure(
            [{"label": f"{s.name}: {s.strategy.label()}", "time_breakdown": s.estimate.time_breakdown}
             for s in items]))]),
    ]
    cols = len(items)
    timelines, memories, notes = [], [], []
    for i, s in enumerate(items):
        if s.plan is None:
            notes.append(f"{s.name} is an estimate without its model: no timeline")
            timelines.append((f"p{i}timeline", _empty(f"{s.name}: no timeline (an estimate file)")))
        else:
            tl, mismatch = checked_timeline(s.plan, engine=engine)
            timelines.append((f"p{i}timeline", charts.timeline_figure(tl, title=s.name,
                                                                      priced_s=s.estimate.step_time_s)))
            notes += [f"{s.name}: {mismatch}"] if mismatch else []
        memories.append((f"p{i}memory", charts.memory_figure([m.model_dump() for m in s.estimate.stage_memory],
                                                             s.estimate.capacity_gib, title=f"{s.name}: memory")))
    sections.append(Section("Pipeline timelines", charts=timelines, columns=cols))
    sections.append(Section("Memory per pipeline rank", charts=memories, columns=cols))
    if notes:
        sections.append(Section("Notes", items=notes))
    sub = "; ".join(f"{s.name}: {headline(s.estimate)}" for s in items)
    title = plan_title(items[0].plan) if items[0].plan is not None else "Comparison"
    return Page(f"Comparison: {title}", sub, sections)


def _empty(title: str):
    import plotly.graph_objects as go

    return charts._layout(go.Figure(), title, height=200)


__all__ = ["write_page", "write_plan_report", "write_estimate_report", "write_tune_report", "saved_page",
           "compare_page"]
