"""CP-SAT refinement: assign layers to pipeline ranks and choose recompute, minimising the pipeline time under
each rank's memory limit (OR-Tools CP-SAT).

Megatron can express uneven pipelines as first/last-rank layer counts with equal middle ranks
(`--decoder-first/last-pipeline-num-layers`) and one recompute setting for all ranks, so that is the model:
integer layer counts (first, mid, last) and one recompute option. Per-layer time and memory are linear in the
layer count of a rank; their coefficients come from the vectorised cost model itself (priced at two layer
counts), so CP-SAT and enumeration price the same physics. The returned plans are re-priced exactly."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
from ortools.sat.python import cp_model

from autoplan.costmodel.calibration import DEFAULT
from autoplan.costmodel.evaluate import MEMORY_KEYS, num_microbatches, rank_cost
from autoplan.costmodel.hardware import hardware_of
from autoplan.costmodel.layout import Layouts
from autoplan.solvers.api import SolveResult, plans_from, price, register
from autoplan.solvers.space import Problem, recompute_options

US = 1e6  # CP-SAT works in integer microseconds ...
MIB = 2**20  # ... and integer MiB


def _row(lay: Layouts, i: int, **update) -> Layouts:
    sub = lay.take(np.array([i]))
    fields = {k: np.asarray([v]) for k, v in update.items()}
    return Layouts(**{**sub.__dict__, **fields})


def _linear_coeffs(problem: Problem, base: Layouts, stage: int, x1: int, x2: int, key: str):
    """(slope, intercept) per layer of rank `stage`'s micro-batch time and memory, from two pricings."""
    hw = hardware_of(problem.cluster)
    out = []
    for x in (x1, x2):
        lay = Layouts(**{**base.__dict__, key: np.asarray([x])})
        rc = rank_cost(problem.model, hw, problem.workload, lay, np.asarray([stage]), DEFAULT)
        mem = sum(float(np.asarray(rc.memory[k]).reshape(-1)[0]) for k in MEMORY_KEYS)
        out.append((float(rc.per_microbatch[0]), mem))
    (t1, m1), (t2, m2) = out
    dt, dm = (t2 - t1) / (x2 - x1), (m2 - m1) / (x2 - x1)
    return (dt, t1 - dt * x1), (dm, m1 - dm * x1)


def refine(problem: Problem, lay: Layouts, i: int, time_limit_s: float = 2.0, seed: int = 0
           ) -> Optional[Tuple[Layouts, float]]:
    """Best (first, last, recompute) for candidate i's layout. Returns the new layout row and the model's
    objective (s), or None when no assignment fits."""
    m = problem.model
    pp, vpp = int(lay.pp[i]), int(lay.vpp[i])
    if pp < 2:
        return None
    L = m.num_layers
    cap = problem.cluster.gpu.hbm_gib * 2**30 * (1 - problem.mem_headroom)
    m_micro = float(num_microbatches(problem.workload, lay.take(np.array([i])))[0])
    chunk = max(L // pp // vpp, 1)
    options = recompute_options(problem, chunk)
    model = cp_model.CpModel()
    # ---- variables: layer counts of the first, middle and last ranks (multiples of vpp), one recompute option
    first = model.NewIntVar(vpp, L, "first")
    last = model.NewIntVar(vpp, L, "last")
    mid = model.NewIntVar(vpp if pp > 2 else 0, L, "mid")
    for v, name in ((first, "f"), (last, "l"), (mid, "m")):
        q = model.NewIntVar(0, L, f"{name}_chunks")
        model.Add(v == vpp * q)  # every chunk holds the same number of layers
    # Every layer is placed exactly once.
    model.Add(first + last + (pp - 2) * mid == L)
    if pp == 2:
        model.Add(mid == 0)
    choose = [model.NewBoolVar(f"rc{k}") for k in range(len(options))]
    model.AddExactlyOne(choose)
    times = {}
    for stage_name, stage, var, key in (("first", 0, first, "first"), ("last", pp - 1, last, "last"),
                                        ("mid", 1, mid, "first")):
        if stage_name == "mid" and pp == 2:
            continue
        t_terms = []
        for k, (rc, block, rl) in enumerate(options):
            base = _row(lay, i, recompute=rc, recompute_block=block, recompute_layers=rl,
                        first=max(L // pp, 1), last=max(L // pp, 1))
            # A middle rank is priced as stage 1 with its own layer count set through `first` of a 3+ stage
            # split would be wrong; price it through the even middle instead: vary `first` and read stage 1.
            st = stage if stage_name != "mid" else 1
            if stage_name == "mid":
                (dt, t0), (dm, m0) = _mid_coeffs(problem, base, pp)
            else:
                (dt, t0), (dm, m0) = _linear_coeffs(problem, base, st, max(vpp, 1), 2 * max(vpp, 1), key)
            # Layers on this rank when option k is chosen (0 otherwise): x_k = var * choose[k].
            x_k = model.NewIntVar(0, L, f"x_{stage_name}_{k}")
            model.Add(x_k == var).OnlyEnforceIf(choose[k])
            model.Add(x_k == 0).OnlyEnforceIf(choose[k].Not())
            # Memory limit of this rank under option k.
            model.Add(int(round(dm / MIB)) * x_k + int(round(m0 / MIB)) <= int(cap / MIB)).OnlyEnforceIf(choose[k])
            t_terms.append((int(round(dt * US)), x_k, int(round(t0 * US)), choose[k]))
        t_var = model.NewIntVar(0, 10**12, f"t_{stage_name}")
        model.Add(t_var == sum(a * x + b * c for a, x, b, c in t_terms))
        times[stage_name] = t_var
    # ---- objective: m * t_max + (sum over ranks - t_max) / vpp, scaled by vpp to stay integral
    t_max = model.NewIntVar(0, 10**12, "t_max")
    model.AddMaxEquality(t_max, list(times.values()))
    total = times["first"] + times["last"] + ((pp - 2) * times["mid"] if "mid" in times else 0)
    model.Minimize(int(m_micro * vpp - 1) * t_max + total)
    # ---- solve
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = 1  # deterministic
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    k = next(j for j, c in enumerate(choose) if solver.Value(c))
    rc, block, rl = options[k]
    f, la, mi = solver.Value(first), solver.Value(last), solver.Value(mid)
    even = pp > 2 and f == la == mi or pp == 2 and f == la and L % pp == 0
    new = _row(lay, i, recompute=rc, recompute_block=block, recompute_layers=rl,
               first=-1 if even else f, last=-1 if even else la)
    return new, solver.ObjectiveValue() / US / vpp


def _mid_coeffs(problem: Problem, base: Layouts, pp: int):
    """Slope/intercept of a middle rank: vary first and last together so the middle count moves by pp-2."""
    hw = hardware_of(problem.cluster)
    L = problem.model.num_layers
    pts = []
    mid_vals = []
    for mid in (max(1, L // pp - 1), max(2, L // pp)):
        rest = L - (pp - 2) * mid
        f = rest // 2
        lay = Layouts(**{**base.__dict__, "first": np.asarray([f]), "last": np.asarray([rest - f])})
        rc = rank_cost(problem.model, hw, problem.workload, lay, np.asarray([1]), DEFAULT)
        mem = sum(float(np.asarray(rc.memory[k]).reshape(-1)[0]) for k in MEMORY_KEYS)
        pts.append((float(rc.per_microbatch[0]), mem))
        mid_vals.append(mid)
    (t1, m1), (t2, m2) = pts
    dx = (mid_vals[1] - mid_vals[0]) or 1
    dt, dm = (t2 - t1) / dx, (m2 - m1) / dx
    return (dt, t1 - dt * mid_vals[0]), (dm, m1 - dm * mid_vals[0])


@register("cpsat")
def cpsat_search(problem: Problem, *, top_k: int = 5, seed: int = 0, budget_s: Optional[float] = None,
                 progress=None, profile=None, **_) -> SolveResult:
    """Enumerate, then refine the stage split and recompute of the best pipelined layouts with CP-SAT."""
    from autoplan.solvers.enumerate import enumerate_search

    base = enumerate_search(problem, top_k=max(top_k, 8), progress=progress, profile=profile)
    if not base.plans:
        base.solver = "cpsat"
        return base
    from autoplan.costmodel.layout import layouts_from_strategies

    lay = layouts_from_strategies([p.strategy for p in base.plans], problem.cluster.num_gpus)
    per_call = 2.0 if budget_s is None else max(0.2, budget_s / max(len(base.plans), 1))
    refined = [lay]
    for i in range(len(lay)):
        got = refine(problem, lay, i, time_limit_s=per_call, seed=seed)
        if got is not None:
            refined.append(got[0])
    merged = Layouts(**{k: np.concatenate([getattr(r, k) for r in refined]) for k in lay.__dict__})
    ev = price(problem, merged, profile=profile)
    fits = ev.fits(problem.mem_headroom)
    # Deduplicate identical strategies, best first.
    order = [int(j) for j in np.argsort(ev.step_time_s, kind="stable") if fits[j]]
    seen, keep = set(), []
    for j in order:
        key = merged.strategy(j).label()
        if key not in seen:
            seen.add(key)
            keep.append(j)
    plans = plans_from(problem, merged, keep[:top_k], profile=profile)
    return SolveResult(plans=plans, solver="cpsat", space_size=base.space_size,
                       evaluated=base.evaluated + len(merged), feasible=base.feasible, wall_s=0.0,
                       infeasible=base.infeasible, smallest_peak_gib=base.smallest_peak_gib,
                       best_by_shape=base.best_by_shape,
                       notes=[f"CP-SAT refined {len(refined) - 1} of {len(lay)} pipelined layouts"])
