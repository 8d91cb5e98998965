"""Pages of a plan, an estimate, a comparison and a tune study, assembled from the cost model's results (pure but
for the cost model calls that rebuild the per-rank figures a saved plan does not hold)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from autoplan.report import charts
from autoplan.report.page import Page, Section
from autoplan.report.timeline import Timeline, timeline_of
from autoplan.results import Estimate, Plan

FRONT_POINTS = 2500  # candidates drawn on the trade-off front at most (a seeded sample beyond, front kept)


def headline(est: Estimate) -> str:
    return (f"{est.step_time_s:.3f} s/step, {est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {est.mfu:.1%}, "
            f"peak {est.peak_mem_gib:.1f} of {est.capacity_gib:.1f} GiB")


def plan_title(plan: Plan) -> str:
    wl = plan.workload
    return (f"{plan.model.name} on {plan.cluster.num_gpus} x {plan.cluster.gpu.id}, seq {wl.seq_len}, "
            f"gbs {wl.global_batch_size}")


def checked_timeline(plan: Plan, *, engine: str = "megatron", profile=None) -> tuple:
    """(timeline, note): the plan's timeline, and a note when the cost model of this install prices the plan
    differently from the figures saved in it (another version, engine or profile priced it)."""
    from autoplan.costmodel.estimate import estimate

    tl = timeline_of(plan.model, plan.cluster, plan.workload, plan.strategy, engine=engine, profile=profile)
    saved = plan.estimate.step_time_s
    if abs(tl.step_time_s / saved - 1.0) <= 1e-3:
        return tl, ""
    now = estimate(plan.model, plan.cluster, plan.strategy, plan.workload, profile=profile, engine=engine)
    if abs(now.step_time_s / saved - 1.0) > 1e-3:
        return tl, (f"this install's cost model prices the plan at {now.step_time_s:.3f} s per step, the plan file "
                    f"says {saved:.3f} s (priced by another version, engine or --profile); the timeline is this "
                    f"install's")
    return tl, (f"the pipeline's ranks run Megatron's order in {tl.step_time_s:.3f} s, "
                f"{1 - tl.step_time_s / saved:.2%} less than the priced {saved:.3f} s: with end ranks faster than "
                f"the middle ones, the cost model's bubble (sum_s t_s - t_max) / v (costmodel/schedule.py) is an "
                f"upper bound of the schedule")


def timeline_sections(plan: Plan, tl: Timeline, prefix: str, headroom: float = 0.0) -> List[Section]:
    est = plan.estimate
    return [
        Section("Pipeline timeline", charts=[(f"{prefix}timeline", charts.timeline_figure(
            tl, priced_s=est.step_time_s))],
                note="Each rank's forward (blue) and backward (orange) passes in Megatron's order, a lighter shade "
                     "per later model chunk; red marks exposed TP/CP/EP/PP communication and brown recompute inside "
                     "a pass, grey the idle time (the bubble); the exposed DP communication and the optimizer step "
                     "close the step. Hover a bar for its figures."),
        Section("Memory per pipeline rank",
                charts=[(f"{prefix}memory", charts.memory_figure([s.model_dump() for s in est.stage_memory],
                                                                 est.capacity_gib, headroom, tl.ranks.in_flight))],
                note="Predicted peak of each rank by kind; activations hold the rank's in-flight micro-batches "
                     "(hover), weights include FP8 copies and gathered ZeRO-3 parameters."),
    ]


def plan_page(plan: Plan, *, engine: str = "megatron", profile=None, headroom: float = 0.0,
              front: Optional[Dict[str, List[dict]]] = None, runners_up: Sequence[Plan] = (),
              baseline: Optional[Plan] = None, notes: Sequence[str] = (), kind: str = "plan") -> Page:
    """The report of a plan (kind 'plan') or of one estimated strategy (kind 'estimate')."""
    tl, mismatch = checked_timeline(plan, engine=engine, profile=profile)
    sections = timeline_sections(plan, tl, "", headroom)
    if front:
        marked = [_marked("winner", plan)] + [_marked("runner-up", p) for p in runners_up]
        if baseline is not None:
            marked.append(_marked("baseline", baseline))
        n = sum(len(v) for v in front.values())
        sections.append(Section("Trade-off front", charts=[("front", charts.front_figure(
            front, marked, plan.estimate.capacity_gib * (1 - headroom)))],
            note=f"{n:,} priced candidates of the search space, coloured by pipeline schedule; the line joins those "
                 f"that fit and that no other beats on both axes. Hover a point for its strategy."))
    rows = [plan] + list(runners_up) + ([baseline] if baseline is not None else [])
    if len(rows) > 1 or kind == "estimate":
        sections.append(Section("Time breakdown", charts=[("breakdown", charts.breakdown_figure(
            [{"label": _row_label(i, p, baseline), "time_breakdown": p.estimate.time_breakdown}
             for i, p in enumerate(rows)]))]))
    all_notes = list(plan.estimate.notes) + list(notes) + ([mismatch] if mismatch else [])
    if all_notes:
        sections.append(Section("Notes", items=all_notes))
    title = f"{plan_title(plan)}: {plan.strategy.label(plan.model.is_moe)}"
    return Page(title, headline(plan.estimate), sections)


def _row_label(i: int, p: Plan, baseline: Optional[Plan]) -> str:
    if baseline is not None and p is baseline:
        return f"baseline {p.strategy.label()}"
    return f"#{i + 1} {p.strategy.label()}"


def _marked(role: str, p: Plan) -> dict:
    return {"role": role, "label": p.strategy.label(), "peak_gib": p.estimate.peak_mem_gib,
            "tokens_per_s_per_gpu": p.estimate.tokens_per_s_per_gpu}


def family(lay, i: int) -> str:
    """The pipeline schedule a candidate runs: no pipeline, 1F1B or interleaved, with an uneven split or a layout
    string named."""
    if lay.pp[i] == 1:
        return "no pipeline"
    kind = "interleaved" if lay.vpp[i] > 1 else "1F1B"
    if lay.layout is not None and lay.layout[i]:
        return f"{kind}, layout string"
    if lay.first[i] >= 0 or lay.last[i] >= 0 or (lay.account is not None and lay.account[i]):
        return f"{kind}, uneven split"
    return kind


def front_points(problem, profile=None, limit: int = FRONT_POINTS, seed: int = 0) -> Dict[str, List[dict]]:
    """Throughput and peak memory of the legal candidates of `problem` (solvers/space.py), priced by the cost
    model; beyond `limit`, a seeded sample plus every candidate on the front. Family -> points."""
    from autoplan.costmodel.hardware import GIB
    from autoplan.solvers.api import price
    from autoplan.solvers.space import enumerate_grid

    lay = enumerate_grid(problem).layouts
    if not len(lay):
        return {}
    ev = price(problem, lay, profile=profile)
    tps = problem.workload.tokens_per_step / ev.step_time_s / problem.cluster.num_gpus
    peak = ev.peak_mem_bytes / GIB
    idx = np.arange(len(lay))
    if len(idx) > limit:
        order = np.lexsort((-tps, peak))  # by rising memory, the faster first (charts.pareto's order)
        best_before = np.concatenate([[-np.inf], np.maximum.accumulate(tps[order])[:-1]])
        on_front = order[tps[order] > best_before]
        rng = np.random.default_rng(seed)
        idx = np.union1d(rng.choice(idx, size=limit, replace=False), on_front)
    out: Dict[str, List[dict]] = {}
    for i in idx:
        out.setdefault(family(lay, i), []).append(
            {"label": lay.strategy(int(i)).label(), "peak_gib": float(peak[i]), "tokens_per_s_per_gpu": float(tps[i])})
    return dict(sorted(out.items()))


def tune_page(report: dict) -> Page:
    """The report of a tune study (`autoplan tune --json`'s object): measured vs predicted per trial and the
    calibration fit."""
    trials = report.get("trials", [])
    corr = report.get("corrections", {})
    fit = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in corr.items())
    rows = [["trial", "strategy", "status", "predicted s", "corrected s", "measured s", "error", "pred GiB",
             "meas GiB"]]
    for t in trials:
        rows.append([t["number"], t["label"], t["status"], _f(t.get("predicted_step_time_s")),
                     _f(t.get("corrected_step_time_s")), _f(t.get("measured_step_time_s")),
                     f"{t['step_time_error']:+.1%}" if t.get("step_time_error") is not None else "",
                     _f(t.get("predicted_peak_mem_gib"), 1), _f(t.get("measured_peak_mem_gib"), 1)])
    best = report.get("best") or {}
    sub = (f"{report.get('model')} on {report.get('num_gpus')} x {report.get('cluster')}, seq {report.get('seq_len')}, "
           f"gbs {report.get('global_batch_size')}, {report.get('engine')}: {len(trials)} trials")
    sections = [
        Section("Measured vs predicted", columns=2, charts=[("tune_time", charts.tune_figure(trials)),
                                                            ("tune_memory", charts.trial_memory_figure(trials))]),
        Section("Calibration fit", items=[fit or "no timed probe yet"]),
        Section("Trials", table=rows),
    ]
    if best:
        sections.append(Section("Best measured", items=[f"{best.get('label')}: "
                                                        f"{best.get('measured_tokens_per_s_per_gpu', 0):.1f} "
                                                        f"tokens/s/device; files in {best.get('files')}"]))
    return Page(f"Tune study {report.get('study_name')}", sub, sections)


def _f(x, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else ""
