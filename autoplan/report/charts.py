"""Plotly figures of a plan: pure functions from the cost model's results to `plotly.graph_objects.Figure`s.

Every chart names its traces so that a page (and the browser test) can tell its marks apart: the timeline's
`forward` and `backward` traces hold one bar per (pipeline rank, model chunk, micro-batch)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import plotly.graph_objects as go

from autoplan.costmodel.rank import MEMORY_KEYS, TIME_KEYS
from autoplan.report.timeline import Timeline

# One colour per term, shared by every chart (Plotly's default qualitative palette, D3 "category10", plus greys).
COLOURS = {
    "forward": "#1f77b4", "backward": "#ff7f0e", "bubble": "#d9d9d9", "dp_comm": "#2ca02c", "optimizer": "#9467bd",
    "comm": "#d62728", "recompute": "#8c564b",
    "compute": "#1f77b4", "tp_comm": "#d62728", "cp_comm": "#e377c2", "ep_comm": "#bcbd22", "pp_comm": "#17becf",
    "offload": "#7f7f7f",
    "weights": "#1f77b4", "grads": "#ff7f0e", "activations": "#d62728", "logits": "#e377c2",
    "transient": "#8c564b", "cuda_context": "#7f7f7f", "nccl": "#bcbd22", "fragmentation": "#c7c7c7",
    "cuda_graphs": "#17becf",
}
COMM_PARTS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "offload")
MS = 1e3


def _layout(fig: go.Figure, title: str, height: int, **kw) -> go.Figure:
    fig.update_layout(title=dict(text=title, x=0.0, xanchor="left", y=1.0, yanchor="top", yref="container",
                                 pad=dict(t=8)),
                      height=height, template="plotly_white", margin=dict(l=70, r=20, t=78, b=45),
                      legend=dict(orientation="h", x=0.0, y=1.0, yanchor="bottom"), **kw)
    return fig


def _pass_hover(s, vpp: int) -> str:
    chunk = f", chunk {s.chunk}" if vpp > 1 else ""
    parts = "<br>".join(f"{k}: {v * MS:.2f} ms" for k, v in s.parts.items() if v > 0)
    return (f"rank {s.rank}{chunk}, micro-batch {s.micro_batch}: {s.kind}<br>{s.start_s * MS:.1f} - "
            f"{s.end_s * MS:.1f} ms<br>{parts}")


def timeline_figure(tl: Timeline, title: str = "Pipeline timeline", priced_s: Optional[float] = None) -> go.Figure:
    """Horizontal bars per pipeline rank: forward and backward passes (a shade per model chunk), the exposed
    communication and recompute inside each pass, the idle time before the last backward ends (the bubble), then
    the exposed data-parallel communication and the optimizer step. Times in ms; `priced_s`, the estimate's step
    time, is named in the title where the drawn step differs from it."""
    fig = go.Figure()
    ranks = [f"rank {r}" for r in range(tl.pp)]
    for kind in ("forward", "backward"):
        segs = tl.passes(kind)
        opacity = [1.0 - 0.5 * s.chunk / max(tl.vpp - 1, 1) for s in segs]
        # A white edge separates passes while they are wide enough; on thinner bars it would wash out the colour.
        edge = 0.3 if tl.vpp * tl.num_microbatches <= 64 else 0.0
        fig.add_trace(go.Bar(
            name=kind, orientation="h", y=[ranks[s.rank] for s in segs], base=[s.start_s * MS for s in segs],
            x=[s.duration_s * MS for s in segs], marker=dict(color=COLOURS[kind], opacity=opacity,
                                                              line=dict(width=edge, color="white")),
            hovertext=[_pass_hover(s, tl.vpp) for s in segs], hoverinfo="text"))
    for name, keys in (("exposed comm", COMM_PARTS), ("recompute", ("recompute",))):
        segs = [s for s in tl.passes() if sum(s.parts.get(k, 0.0) for k in keys) > 0]
        if not segs:
            continue
        widths = [sum(s.parts.get(k, 0.0) for k in keys) for s in segs]
        fig.add_trace(go.Bar(
            name=name, orientation="h", y=[ranks[s.rank] for s in segs],
            base=[(s.end_s - w) * MS for s, w in zip(segs, widths)], x=[w * MS for w in widths], width=0.25,
            marker=dict(color=COLOURS["comm" if name == "exposed comm" else "recompute"]),
            hovertext=[f"rank {s.rank}, micro-batch {s.micro_batch} {s.kind}: {name} {w * MS:.2f} ms"
                       for s, w in zip(segs, widths)], hoverinfo="text"))
    gaps = _idle_gaps(tl)
    if gaps:
        fig.add_trace(go.Bar(
            name="bubble (idle)", orientation="h", y=[ranks[r] for r, _, _ in gaps], base=[a * MS for _, a, _ in gaps],
            x=[(b - a) * MS for _, a, b in gaps], marker=dict(color=COLOURS["bubble"]),
            hovertext=[f"rank {r}: idle {(b - a) * MS:.2f} ms" for r, a, b in gaps], hoverinfo="text"))
    for kind in ("dp_comm", "optimizer"):
        segs = [s for s in tl.segments if s.kind == kind and s.duration_s > 0]
        if segs:
            fig.add_trace(go.Bar(
                name=kind, orientation="h", y=[ranks[s.rank] for s in segs], base=[s.start_s * MS for s in segs],
                x=[s.duration_s * MS for s in segs], marker=dict(color=COLOURS[kind]),
                hovertext=[f"rank {s.rank}: {kind} {s.duration_s * MS:.2f} ms" for s in segs], hoverinfo="text"))
    fig.add_vline(x=tl.step_time_s * MS, line=dict(color="black", dash="dot", width=1))
    priced = f" (priced {priced_s:.3f} s)" if priced_s and abs(priced_s / tl.step_time_s - 1) > 1e-3 else ""
    return _layout(fig, f"{title}: {tl.step_time_s:.3f} s per step{priced} ({tl.num_microbatches} micro-batches, "
                        f"pp {tl.pp}{f', {tl.vpp} chunks per rank' if tl.vpp > 1 else ''})",
                   height=170 + 38 * tl.pp, barmode="overlay", xaxis_title="ms from the step's start",
                   yaxis=dict(autorange="reversed"))


def _idle_gaps(tl: Timeline):
    """(rank, start, end) of each wait between a rank's passes, and before its first and after its last, up to the
    end of the pipeline phase."""
    gaps = []
    for r in range(tl.pp):
        t = 0.0
        for s in sorted((s for s in tl.passes() if s.rank == r), key=lambda s: s.start_s):
            if s.start_s - t > 1e-12:
                gaps.append((r, t, s.start_s))
            t = s.end_s
        if tl.pipeline_end_s - t > 1e-12:
            gaps.append((r, t, tl.pipeline_end_s))
    return gaps


def memory_figure(stage_memory: Sequence[dict], capacity_gib: float, headroom: float = 0.0,
                  in_flight: Optional[Sequence[int]] = None, title: str = "Memory per pipeline rank") -> go.Figure:
    """Stacked bars of each rank's predicted memory by kind (GiB) against the device's capacity and the usable
    line (capacity less the headroom). `stage_memory`: Estimate.stage_memory as dicts."""
    fig = go.Figure()
    ranks = [f"rank {s['stage']}" for s in stage_memory]
    for key in MEMORY_KEYS:
        values = [s["breakdown_gib"].get(key, 0.0) for s in stage_memory]
        if not any(values):
            continue
        hover = []
        for i, (s, v) in enumerate(zip(stage_memory, values)):
            extra = f" ({in_flight[i]} micro-batch chunks in flight)" if in_flight and key == "activations" else ""
            hover.append(f"rank {s['stage']} ({s['num_layers']} layers): {key} {v:.2f} GiB{extra}")
        fig.add_trace(go.Bar(name=key, x=ranks, y=values, marker=dict(color=COLOURS.get(key)), hovertext=hover,
                             hoverinfo="text"))
    fig.add_hline(y=capacity_gib, line=dict(color="black", width=1.5),
                  annotation_text=f"capacity {capacity_gib:.1f} GiB", annotation_position="top left")
    if headroom > 0:
        fig.add_hline(y=capacity_gib * (1 - headroom), line=dict(color="#d62728", dash="dash", width=1.2),
                      annotation_text=f"headroom {headroom:.0%}", annotation_position="bottom left")
    return _layout(fig, title, height=420, barmode="stack", yaxis_title="GiB")


def front_figure(points: Dict[str, List[dict]], marked: Sequence[dict], capacity_gib: float,
                 title: str = "Trade-off front of the search") -> go.Figure:
    """Throughput vs peak memory of priced candidates, one trace per layout family (`points`: family -> list of
    {label, peak_gib, tokens_per_s_per_gpu}), the Pareto front among those that fit, and `marked` plans
    ({role, label, peak_gib, tokens_per_s_per_gpu}: winner, runner-up, baseline)."""
    fig = go.Figure()
    for family, pts in points.items():
        fig.add_trace(go.Scatter(
            name=family, mode="markers", x=[p["peak_gib"] for p in pts], y=[p["tokens_per_s_per_gpu"] for p in pts],
            marker=dict(size=5, opacity=0.55), hovertext=[p["label"] for p in pts], hoverinfo="text+x+y"))
    front = pareto([p for pts in points.values() for p in pts if p["peak_gib"] <= capacity_gib])
    if front:
        fig.add_trace(go.Scatter(name="front (fits)", mode="lines", x=[p["peak_gib"] for p in front],
                                 y=[p["tokens_per_s_per_gpu"] for p in front],
                                 line=dict(color="black", width=1, shape="hv"), hoverinfo="skip"))
    symbols = {"winner": ("star", 16, "#d62728"), "runner-up": ("diamond", 10, "#ff7f0e"),
               "baseline": ("x", 12, "black")}
    for role, (symbol, size, colour) in symbols.items():
        pts = [p for p in marked if p["role"] == role]
        if pts:
            fig.add_trace(go.Scatter(
                name=role, mode="markers", x=[p["peak_gib"] for p in pts], y=[p["tokens_per_s_per_gpu"] for p in pts],
                marker=dict(symbol=symbol, size=size, color=colour, line=dict(width=1, color="black")),
                hovertext=[f"{role}: {p['label']}" for p in pts], hoverinfo="text+x+y"))
    fig.add_vline(x=capacity_gib, line=dict(color="black", dash="dot", width=1),
                  annotation_text="capacity", annotation_position="top right")
    # Opens on the candidates up to twice the capacity (those far beyond are a zoom-out away).
    return _layout(fig, title, height=460, xaxis=dict(title="peak memory per GPU, GiB", range=[0, 2 * capacity_gib]),
                   yaxis_title="tokens/s per GPU")


def pareto(points: List[dict]) -> List[dict]:
    """Points no other point beats on both axes (less memory and more tokens/s), by rising memory."""
    front, best = [], -1.0
    for p in sorted(points, key=lambda p: (p["peak_gib"], -p["tokens_per_s_per_gpu"])):
        if p["tokens_per_s_per_gpu"] > best:
            front.append(p)
            best = p["tokens_per_s_per_gpu"]
    return front


def breakdown_figure(rows: Sequence[dict], title: str = "Time per step by cause") -> go.Figure:
    """Stacked horizontal bars of each plan's time terms (s); `rows`: {label, time_breakdown}."""
    fig = go.Figure()
    labels = [r["label"] for r in rows]
    for key in TIME_KEYS:
        values = [r["time_breakdown"].get(key, 0.0) for r in rows]
        if any(values):
            fig.add_trace(go.Bar(name=key, orientation="h", y=labels, x=values, marker=dict(color=COLOURS.get(key)),
                                 hovertext=[f"{lab}: {key} {v:.3f} s" for lab, v in zip(labels, values)],
                                 hoverinfo="text"))
    return _layout(fig, title, height=150 + 40 * len(rows), barmode="stack", xaxis_title="seconds per step",
                   yaxis=dict(autorange="reversed", automargin=True))


def tune_figure(trials: Sequence[dict], title: str = "Measured vs predicted step time per trial") -> go.Figure:
    """Predicted (the uncorrected cost model) and corrected step time against the measured one, per probed
    trial, with the y = x line."""
    fig = go.Figure()
    timed = [t for t in trials if t.get("measured_step_time_s")]
    for key, name, symbol in (("predicted_step_time_s", "cost model", "circle"),
                              ("corrected_step_time_s", "corrected (calibration fit)", "diamond")):
        pts = [t for t in timed if t.get(key)]
        if pts:
            fig.add_trace(go.Scatter(
                name=name, mode="markers", x=[t["measured_step_time_s"] for t in pts], y=[t[key] for t in pts],
                marker=dict(symbol=symbol, size=9), hoverinfo="text",
                hovertext=[f"trial {t['number']}: {t['label']}<br>measured {t['measured_step_time_s']:.3f} s, "
                           f"{name} {t[key]:.3f} s" for t in pts]))
    if timed:
        values = [t["measured_step_time_s"] for t in timed] + [t.get("predicted_step_time_s") or 0 for t in timed]
        hi = max(values) * 1.05
        fig.add_trace(go.Scatter(name="y = x", mode="lines", x=[0, hi], y=[0, hi], hoverinfo="skip",
                                 line=dict(color="black", dash="dot", width=1)))
    return _layout(fig, title, height=440, xaxis_title="measured step time, s", yaxis_title="predicted step time, s")


def trial_memory_figure(trials: Sequence[dict], title: str = "Measured vs predicted peak memory per trial"
                        ) -> go.Figure:
    fig = go.Figure()
    pts = [t for t in trials if t.get("measured_peak_mem_gib") and t.get("predicted_peak_mem_gib")]
    if pts:
        fig.add_trace(go.Scatter(
            name="cost model", mode="markers", x=[t["measured_peak_mem_gib"] for t in pts],
            y=[t["predicted_peak_mem_gib"] for t in pts], marker=dict(size=9), hoverinfo="text",
            hovertext=[f"trial {t['number']}: {t['label']}" for t in pts]))
        hi = max(max(t["measured_peak_mem_gib"], t["predicted_peak_mem_gib"]) for t in pts) * 1.05
        fig.add_trace(go.Scatter(name="y = x", mode="lines", x=[0, hi], y=[0, hi], hoverinfo="skip",
                                 line=dict(color="black", dash="dot", width=1)))
    return _layout(fig, title, height=400, xaxis_title="measured peak, GiB", yaxis_title="predicted peak, GiB")


__all__ = ["timeline_figure", "memory_figure", "front_figure", "breakdown_figure", "tune_figure",
           "trial_memory_figure", "pareto"]
