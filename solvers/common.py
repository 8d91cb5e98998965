"""What every solver shares: the `SolveResult` it returns, pricing candidates in bounded chunks (`price`) and
turning chosen rows into full `Plan`s (`plans_from`). The solvers build on this module; `api` picks one by name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.estimate import Evaluation, estimate_from, evaluate
from autoplan.costmodel.layout import Layouts
from autoplan.results import Plan
from autoplan.solvers.space import Problem, stamp_fixed


@dataclass
class SolveResult:
    """What a solver found. `plans` are feasible, best first; `infeasible` counts rejected candidates by reason."""

    plans: List[Plan]
    solver: str
    space_size: int  # legal candidates in the space
    evaluated: int  # candidates priced by the cost model
    feasible: int  # of those, how many fit
    wall_s: float
    infeasible: Dict[str, int] = field(default_factory=dict)
    smallest_peak_gib: Optional[float] = None  # least memory any candidate needs (for the 'nothing fits' message)
    best_by_shape: List[Plan] = field(default_factory=list)  # best plan of each other (tp, pp, cp, ep) shape
    notes: List[str] = field(default_factory=list)
    feasible_step_times: Optional[np.ndarray] = None  # step time of every priced candidate that fits, s

    @property
    def candidates_per_s(self) -> float:
        return self.evaluated / self.wall_s if self.wall_s > 0 else float("inf")


SolverFn = Callable[..., SolveResult]


def price(problem: Problem, lay: Layouts, cal: Optional[Calibration] = None, profile=None, chunk: int = 100_000
          ) -> Evaluation:
    """Evaluate candidates in chunks (bounded memory), concatenating the per-candidate arrays; `cal` defaults to
    the problem's calibration."""
    cal = cal or problem.calibration
    parts = []
    for start in range(0, len(lay), chunk):
        sub = lay.take(slice(start, start + chunk))
        ev = evaluate(problem.model, problem.cluster, problem.workload, sub, cal, profile,
                      checkpoints=problem.objective == "goodput")
        parts.append(_ranked(problem, ev))
    if len(parts) == 1:
        return parts[0]
    joined = lambda name: (None if getattr(parts[0], name) is None  # noqa: E731
                           else np.concatenate([getattr(p, name) for p in parts]))
    return Evaluation(
        step_time_s=np.concatenate([p.step_time_s for p in parts]),
        peak_mem_bytes=np.concatenate([p.peak_mem_bytes for p in parts]),
        capacity_bytes=parts[0].capacity_bytes,
        time_terms={k: np.concatenate([p.time_terms[k] for p in parts]) for k in parts[0].time_terms},
        memory_terms={k: np.concatenate([p.memory_terms[k] for p in parts]) for k in parts[0].memory_terms},
        num_microbatches=np.concatenate([p.num_microbatches for p in parts]),
        checkpoint_local_bytes=joined("checkpoint_local_bytes"),
        checkpoint_unique_bytes=joined("checkpoint_unique_bytes"),
        rank_time_s=joined("rank_time_s"),
    )


def _ranked(problem: Problem, ev: Evaluation) -> Evaluation:
    """`ev` with what the search minimises: under --objective goodput the step time over the useful-time fraction
    (the same tokens per step, so the least is the most goodput); otherwise the step time itself."""
    if problem.objective != "goodput":
        return ev
    from dataclasses import replace

    from autoplan.costmodel.goodput import cluster_goodput

    g = cluster_goodput(problem.cluster, ev.step_time_s, ev.checkpoint_local_bytes, ev.checkpoint_unique_bytes)
    return replace(ev, rank_time_s=ev.step_time_s / g.useful_fraction)


def plans_from(problem: Problem, lay: Layouts, idx, notes_for=None, profile=None) -> List[Plan]:
    """Full Plans (every rank priced) for rows `idx` of `lay`, in that order."""
    plans = []
    for i in idx:
        sub = lay.take(np.array([i]))
        ev = evaluate(problem.model, problem.cluster, problem.workload, sub, problem.calibration, profile,
                      every_rank=True)
        est = estimate_from(ev, 0, problem.model, problem.cluster, problem.workload, sub,
                            headroom=problem.mem_headroom, notes=notes_for(i) if notes_for else None,
                            profile=profile)
        plans.append(Plan(model=problem.model, cluster=problem.cluster, workload=problem.workload,
                          strategy=stamp_fixed(problem, sub.strategy(0)), estimate=est))
    return plans
