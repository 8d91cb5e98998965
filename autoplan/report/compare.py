"""Side-by-side comparison of saved plans or estimates: the headline figures, every time and memory term, the
strategy keys that differ, and why the fastest is faster (each other one's time terms against it, the largest
difference first)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from autoplan.costmodel.rank import MEMORY_KEYS, TIME_KEYS
from autoplan.report.inputs import Saved


@dataclass(frozen=True)
class Comparison:
    names: List[str]
    rows: List[Tuple[str, List[str]]]  # (figure, one formatted value per result)
    differing_keys: Dict[str, List[object]]  # strategy key -> value per result
    fastest: int
    why: List[str]  # one line per other result: its terms against the fastest's


def compare(items: Sequence[Saved]) -> Comparison:
    """Pure: the comparison of two or more saved results."""
    ests = [s.estimate for s in items]
    rows: List[Tuple[str, List[str]]] = [
        ("strategy", [s.strategy.label() for s in items]),
        ("step time, s", [f"{e.step_time_s:.3f}" for e in ests]),
        ("tokens/s/GPU", [f"{e.tokens_per_s_per_gpu:,.0f}" for e in ests]),
        ("MFU", [f"{e.mfu:.1%}" for e in ests]),
        ("peak memory, GiB", [f"{e.peak_mem_gib:.1f} of {e.capacity_gib:.1f}" for e in ests]),
        ("memory per rank, GiB", [" ".join(f"{m.total_gib:.1f}" for m in e.stage_memory) or "-" for e in ests]),
        ("micro-batches", [str(e.num_microbatches) for e in ests]),
    ]
    rows += [(f"time: {k}, s", [f"{e.time_breakdown.get(k, 0.0):.3f}" for e in ests]) for k in TIME_KEYS
             if any(e.time_breakdown.get(k, 0.0) for e in ests)]
    rows += [(f"memory: {k}, GiB", [f"{e.memory_breakdown.get(k, 0.0):.2f}" for e in ests]) for k in MEMORY_KEYS
             if any(e.memory_breakdown.get(k, 0.0) for e in ests)]
    dicts = [s.strategy.model_dump() for s in items]
    keys = [k for k in dicts[0] if len({repr(d.get(k)) for d in dicts}) > 1]
    fastest = min(range(len(items)), key=lambda i: ests[i].step_time_s)
    why = [_why(items[fastest], items[i]) for i in range(len(items)) if i != fastest]
    return Comparison([s.name for s in items], rows, {k: [d.get(k) for d in dicts] for k in keys}, fastest, why)


def term_differences(fast: Saved, slow: Saved) -> List[Tuple[str, float]]:
    """(time term, slow's seconds minus fast's) for every term that differs, the largest difference first."""
    a, b = fast.estimate.time_breakdown, slow.estimate.time_breakdown
    diffs = [(k, b.get(k, 0.0) - a.get(k, 0.0)) for k in TIME_KEYS]
    return sorted([d for d in diffs if abs(d[1]) > 1e-9], key=lambda d: -abs(d[1]))


def _why(fast: Saved, slow: Saved) -> str:
    gap = slow.estimate.step_time_s - fast.estimate.step_time_s
    if gap <= 0:
        return f"{slow.name} and {fast.name} take the same step time ({fast.estimate.step_time_s:.3f} s)"
    terms = ", ".join(f"{k} {d:+.3f} s" for k, d in term_differences(fast, slow))
    ratio = slow.estimate.step_time_s / fast.estimate.step_time_s
    return (f"{fast.name} is {ratio:.3f}x faster than {slow.name} ({gap:.3f} s per step less); {slow.name} "
            f"against it: {terms}")
