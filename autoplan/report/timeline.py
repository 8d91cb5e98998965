"""The pipeline timeline of one strategy: every pipeline rank's forward and backward pass of every (micro-batch,
model chunk), then the exposed data-parallel communication and the optimizer step, built from the cost model's own
per-rank figures (costmodel/rank.py `rank_cost`, the numbers `estimate` sums into `step_time_s`).

Each rank runs its passes in Megatron's order (schedules.py: warm-up forwards, one forward and one backward, the
cool-down backwards; interleaved, forwards in groups of pp micro-batches per chunk, `get_schedule_table`), and
each pass waits for the one it depends on: a forward for the previous virtual stage's forward of the same
micro-batch, a backward for the next virtual stage's backward (the last virtual stage's for its own forward).
A pass of rank s on one of its v chunks takes 1/v of the rank's per-micro-batch time. The step ends with the
optimizer, which starts on every rank once the last backward is done (its gradient-norm and found-inf all-reduces
span every rank), after the rank's exposed data-parallel communication: the cost model's
`max_s (dp_comm_s + optimizer_s)` tail.

What the cost model prices as one figure per micro-batch is split between the passes as its formulas split it:
TP and EP communication and the pipeline send/receive are one forward and one backward collective of equal size
(evaluate.py `_tp_comm`, `_ep_comm`, `_p2p`); recompute runs in the backward; the CP ring sends K and V forward
and returns dK and dV backward (twice the bytes, `_cp_comm`), so 1/3 of its exposed time is drawn in the forward;
activation offload copies out in the forward and back in the backward (half each)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from autoplan.cluster import ClusterSpec
from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.costmodel.rank import in_flight, num_microbatches, rank_cost
from autoplan.costmodel.hardware import hardware_of
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.model import ModelSpec
from autoplan.strategy import Strategy
from autoplan.workload import Workload

# Per-micro-batch parts of a pass, in drawing order, and the share of each drawn in the forward pass.
PASS_PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "offload")
FORWARD_SHARE = {"tp_comm": 0.5, "cp_comm": 1.0 / 3.0, "ep_comm": 0.5, "pp_comm": 0.5, "offload": 0.5,
                 "recompute": 0.0}
TAIL_KINDS = ("dp_comm", "optimizer")


@dataclass(frozen=True)
class Segment:
    """One bar of the timeline: a pass (forward / backward of one micro-batch on one model chunk) or a tail step
    (dp_comm / optimizer, micro_batch and chunk -1) of one pipeline rank; seconds from the step's start."""

    rank: int
    kind: str
    micro_batch: int
    chunk: int
    start_s: float
    end_s: float
    parts: Dict[str, float] = field(default_factory=dict)  # seconds of each PASS_PARTS term inside the pass

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class RankTimes:
    """Seconds per micro-batch of each pipeline rank (all its chunks), split into forward and backward parts, and
    the rank's per-step tail; `in_flight`: (micro-batch, chunk) pairs whose activations the rank holds at its
    peak."""

    forward: List[Dict[str, float]]
    backward: List[Dict[str, float]]
    dp_comm: List[float]
    optimizer: List[float]
    in_flight: List[int]


@dataclass(frozen=True)
class Timeline:
    pp: int
    vpp: int
    num_microbatches: int
    segments: List[Segment]
    pipeline_end_s: float  # when the last backward finishes
    step_time_s: float  # pipeline_end_s + the longest tail
    idle_s: List[float]  # per rank: time inside the pipeline phase spent waiting (the bubble as that rank sees it)
    ranks: RankTimes

    def passes(self, kind: Optional[str] = None) -> List[Segment]:
        return [s for s in self.segments if s.micro_batch >= 0 and (kind is None or s.kind == kind)]


def rank_times(model: ModelSpec, cluster: ClusterSpec, workload: Workload, strategy: Strategy, *,
               engine: str = "megatron", profile=None, cal: Calibration = DEFAULT) -> RankTimes:
    """The cost model's figures of every pipeline rank of `strategy` (the ones `estimate` reduces)."""
    one = layouts_from_strategies([strategy], cluster.num_gpus, engine=engine, gpu_id=cluster.gpu.id)
    pp = int(one.pp[0])
    lay = one.take(np.zeros(pp, dtype=np.int64))
    stage = np.arange(pp)
    rc = rank_cost(model, hardware_of(cluster), workload, lay, stage, cal, profile)

    def per_rank(x) -> np.ndarray:
        return np.broadcast_to(np.asarray(x, dtype=float), (pp,))

    per_mb = {"compute": per_rank(rc.fwd_bwd), "recompute": per_rank(rc.recompute), "tp_comm": per_rank(rc.tp),
              "cp_comm": per_rank(rc.cp), "ep_comm": per_rank(rc.ep), "pp_comm": per_rank(rc.p2p),
              "offload": per_rank(rc.offload)}
    fwd_compute = per_rank(rc.fwd)
    forward, backward = [], []
    for s in range(pp):
        f = {k: float(v[s]) * FORWARD_SHARE.get(k, 0.0) for k, v in per_mb.items() if k != "compute"}
        f["compute"] = float(fwd_compute[s])
        b = {k: float(per_mb[k][s]) - f[k] for k in per_mb}
        forward.append({k: f[k] for k in PASS_PARTS})
        backward.append(b)
    m_micro = num_microbatches(workload, lay)
    chunks = in_flight(lay, stage, m_micro)
    return RankTimes(forward, backward, [float(x) for x in per_rank(rc.dp_exposed)],
                     [float(x) for x in per_rank(rc.optimizer)], [int(x) for x in per_rank(chunks)])


def schedule_table(m: int, v: int, group: int) -> List[Tuple[int, int]]:
    """(micro-batch, chunk) of each forward of a rank, in order: schedules.py `get_schedule_table`."""
    table: List[Tuple[int, int]] = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        table += [(j, c) for c in range(v) for j in range(lo, hi)]
    return table


def rank_order(p: int, v: int, m: int, rank: int) -> List[Tuple[str, int, int]]:
    """The passes of one rank in Megatron's order: warm-up forwards ((p - rank - 1) * 2 + (v - 1) * p interleaved,
    p - rank - 1 without; schedules.py `get_pp_rank_microbatches`), then one forward and one backward, then the
    cool-down; backward k runs chunk v - 1 - c of forward k's (micro-batch, chunk)."""
    table = schedule_table(m, v, p) if v > 1 else [(j, 0) for j in range(m)]
    total = m * v
    warm = min((p - rank - 1) * 2 + (v - 1) * p if v > 1 else p - rank - 1, total)
    ops: List[Tuple[str, int, int]] = [("forward", *table[k]) for k in range(warm)]
    for k in range(total - warm):
        ops.append(("forward", *table[warm + k]))
        j, c = table[k]
        ops.append(("backward", j, v - 1 - c))
    ops += [("backward", j, v - 1 - c) for j, c in table[total - warm:]]
    return ops


def _of(times, j: int) -> float:
    """A rank's seconds for micro-batch j: one figure for all, or one per micro-batch."""
    return float(times[j]) if isinstance(times, (list, tuple, np.ndarray)) else float(times)


def simulate(p: int, v: int, m: int, fwd: List[float], bwd: List[float]
             ) -> Dict[Tuple[str, int, int, int], Tuple[float, float]]:
    """(start, end) of every pass keyed (kind, rank, micro-batch, chunk): each rank runs `rank_order`, a pass
    starting when the rank is free and its dependency is done. `fwd[r]`, `bwd[r]`: one micro-batch's seconds on
    rank r over all its chunks, or a sequence of them per micro-batch when micro-batches differ."""
    orders = [rank_order(p, v, m, r) for r in range(p)]
    done: Dict[Tuple[str, int, int], float] = {}  # (kind, micro-batch, virtual stage) -> end
    out: Dict[Tuple[str, int, int, int], Tuple[float, float]] = {}
    free, pos, last = [0.0] * p, [0] * p, p * v - 1
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, j, c = orders[r][pos[r]]
                q = c * p + r  # virtual stage
                if kind == "forward":
                    dep, dur = (("forward", j, q - 1) if q > 0 else None), _of(fwd[r], j) / v
                else:
                    dep, dur = (("backward", j, q + 1) if q < last else ("forward", j, q)), _of(bwd[r], j) / v
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep else 0.0)
                free[r] = start + dur
                done[(kind, j, q)] = free[r]
                out[(kind, r, j, c)] = (start, free[r])
                pos[r] += 1
                moved = True
    if pos != [len(o) for o in orders]:
        raise AssertionError(f"the pipeline schedule deadlocked (pp={p}, vpp={v}, micro-batches={m})")
    return out


def build_timeline(times: RankTimes, pp: int, vpp: int, m_micro: int) -> Timeline:
    """The timeline of a step from per-rank figures (`rank_times`); pure."""
    fwd = [sum(f.values()) for f in times.forward]
    bwd = [sum(b.values()) for b in times.backward]
    spans = simulate(pp, vpp, m_micro, fwd, bwd)
    segments = []
    for (kind, r, j, c), (start, end) in sorted(spans.items(), key=lambda kv: (kv[0][1], kv[1][0])):
        parts = times.forward[r] if kind == "forward" else times.backward[r]
        segments.append(Segment(r, kind, j, c, start, end, {k: x / vpp for k, x in parts.items()}))
    pipeline_end = max(end for _, end in spans.values())
    tail_end = pipeline_end
    for r in range(pp):
        t = pipeline_end
        for kind, seconds in (("dp_comm", times.dp_comm[r]), ("optimizer", times.optimizer[r])):
            segments.append(Segment(r, kind, -1, -1, t, t + seconds))
            t += seconds
        tail_end = max(tail_end, t)
    busy = [sum(s.duration_s for s in segments if s.rank == r and s.micro_batch >= 0) for r in range(pp)]
    return Timeline(pp, vpp, m_micro, segments, pipeline_end, tail_end, [pipeline_end - b for b in busy], times)


def timeline_of(model: ModelSpec, cluster: ClusterSpec, workload: Workload, strategy: Strategy, *,
                engine: str = "megatron", profile=None, cal: Calibration = DEFAULT) -> Timeline:
    """The timeline of one step of `strategy` (see the module docstring)."""
    times = rank_times(model, cluster, workload, strategy, engine=engine, profile=profile, cal=cal)
    lay = layouts_from_strategies([strategy], cluster.num_gpus, engine=engine, gpu_id=cluster.gpu.id)
    return build_timeline(times, strategy.pp, strategy.vpp, int(num_microbatches(workload, lay)[0]))
