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

from autoplan.costmodel.rank import MEMORY_KEYS, num_microbatches, rank_cost
from autoplan.costmodel.hardware import hardware_of
from autoplan.costmodel.layout import Layouts
from autoplan.solvers.common import SolveResult, plans_from, price
from autoplan.solvers.space import Problem, delayed_fp8, fp8_recompute_options, refresh_searched

US = 1e6  # CP-SAT works in integer microseconds ...
MIB = 2**20  # ... and integer MiB


def _row(lay: Layouts, i: int, **update) -> Layouts:
    sub = lay.take(np.array([i]))
    fields = {k: np.asarray([v]) for k, v in update.items()}
    return Layouts(**{**sub.__dict__, **fields})


def _coefficients(problem: Problem, lay: Layouts, i: int, options, pp: int, vpp: int
                  ) -> Dict[Tuple[str, int], Tuple[Tuple[float, float], Tuple[float, float]]]:
    """((time slope, intercept), (memory slope, intercept)) per layer of the first, middle and last ranks under
    each recompute option, from one vectorised pricing at two layer counts per rank type."""
    L = problem.model.num_layers
    rows, stages, keys = [], [], []
    x1, x2 = max(vpp, 1), 2 * max(vpp, 1)
    mids = (max(1, L // pp - 1), max(2, L // pp))
    for k, (rc, block, rl, mods) in enumerate(options):
        knobs = dict(recompute=rc, recompute_block=block, recompute_layers=rl, recompute_modules=mods)
        for x in (x1, x2):
            rows.append(dict(knobs, first=x, last=max(L // pp, 1)))
            stages.append(0)
            keys.append(("first", k, x))
            rows.append(dict(knobs, first=max(L // pp, 1), last=x))
            stages.append(pp - 1)
            keys.append(("last", k, x))
        if pp > 2:
            for mid in mids:  # vary first and last together so the middle ranks hold `mid` layers
                rest = L - (pp - 2) * mid
                rows.append(dict(knobs, first=rest // 2, last=rest - rest // 2))
                stages.append(1)
                keys.append(("mid", k, mid))
    base = lay.take(np.full(len(rows), i))
    cols = {name: np.array([r[name] for r in rows]) for name in rows[0]}
    # The rows are --decoder-first/last-pipeline-num-layers splits, whatever split the candidate came with.
    cols.update(account=np.zeros(len(rows), np.int64), layout=np.full(len(rows), None, dtype=object))
    batch = refresh_searched(problem, Layouts(**{**base.__dict__, **cols}))
    rc_ = rank_cost(problem.model, hardware_of(problem.cluster), problem.workload, batch, np.array(stages),
                    problem.calibration)
    t = np.asarray(rc_.per_microbatch, dtype=float)
    mem = sum(np.broadcast_to(np.asarray(rc_.memory[key], dtype=float), t.shape) for key in MEMORY_KEYS)
    points: Dict[Tuple[str, int], List[Tuple[float, float, float]]] = {}
    for n, (name, k, x) in enumerate(keys):
        points.setdefault((name, k), []).append((float(x), float(t[n]), float(mem[n])))
    out = {}
    for key, ((xa, ta, ma), (xb, tb, mb)) in points.items():
        dx = (xb - xa) or 1.0
        dt, dm = (tb - ta) / dx, (mb - ma) / dx
        out[key] = ((dt, ta - dt * xa), (dm, ma - dm * xa))
    return out


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
    # The recompute options this candidate runs: FP8 delayed scaling drops layernorm / moe_act (space.py).
    options = fp8_recompute_options(problem, chunk, bool(lay.fp8[i]) and delayed_fp8(problem))
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
    coeffs = _coefficients(problem, lay, i, options, pp, vpp)
    times = {}
    for stage_name, var in (("first", first), ("last", last), ("mid", mid)):
        if stage_name == "mid" and pp == 2:
            continue
        t_terms = []
        for k in range(len(options)):
            (dt, t0), (dm, m0) = coeffs[(stage_name, k)]
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
    rc, block, rl, mods = options[k]
    f, la, mi = solver.Value(first), solver.Value(last), solver.Value(mid)
    even = pp > 2 and f == la == mi or pp == 2 and f == la and L % pp == 0
    new = refresh_searched(problem, _row(lay, i, recompute=rc, recompute_block=block, recompute_layers=rl,
                                         recompute_modules=mods, first=-1 if even else f, last=-1 if even else la,
                                         account=0, layout=None))
    return new, solver.ObjectiveValue() / US / vpp


def cpsat_search(problem: Problem, *, top_k: int = 5, seed: int = 0, budget_s: Optional[float] = None,
                 progress=None, profile=None, **_) -> SolveResult:
    """Enumerate, then refine the stage split and recompute of the best pipelined layouts with CP-SAT."""
    from autoplan.solvers.enumerate import enumerate_search

    base = enumerate_search(problem, top_k=max(top_k, 8), progress=progress, profile=profile)
    if not base.plans:
        base.solver = "cpsat"
        return base
    from autoplan.costmodel.layout import layouts_from_strategies

    # Refine each distinct pipelined layout once (the stage split and recompute are what CP-SAT chooses).
    distinct, seen = [], set()
    for p in base.plans:
        s = p.strategy
        key = (s.tp, s.pp, s.vpp, s.cp, s.ep, s.etp, s.mbs, s.zero, s.fp8, s.sp)
        if key not in seen and s.pp > 1 and problem.engine == "megatron":  # DeepSpeed: even stages only
            seen.add(key)
            distinct.append(s)
    gpu = problem.cluster.gpu.id
    lay = layouts_from_strategies([p.strategy for p in base.plans], problem.cluster.num_gpus, problem.engine, gpu)
    targets = layouts_from_strategies(distinct[:4], problem.cluster.num_gpus, problem.engine, gpu) if distinct else None
    per_call = 2.0 if budget_s is None else max(0.2, budget_s / 4)
    refined = [lay]
    for i in range(len(targets) if targets is not None else 0):
        got = refine(problem, targets, i, time_limit_s=per_call, seed=seed)
        if got is not None:
            refined.append(got[0])
    merged = Layouts(**{k: np.concatenate([getattr(r, k) for r in refined]) for k in lay.__dict__})
    ev = price(problem, merged, profile=profile)
    fits = ev.fits(problem.mem_headroom)
    # Deduplicate identical strategies (every key, not the label, which can leave out e.g. etp), best first.
    order = [int(j) for j in np.argsort(ev.rank_s, kind="stable") if fits[j]]
    seen, keep = set(), []
    for j in order:
        key = merged.strategy(j).key()
        if key not in seen:
            seen.add(key)
            keep.append(j)
    plans = plans_from(problem, merged, keep[:top_k], profile=profile)
    return SolveResult(plans=plans, solver="cpsat", space_size=base.space_size,
                       evaluated=base.evaluated + len(merged), feasible=base.feasible, wall_s=0.0,
                       infeasible=base.infeasible, smallest_peak_gib=base.smallest_peak_gib,
                       best_by_shape=base.best_by_shape,
                       notes=[f"CP-SAT refined the stage split and recompute of {len(refined) - 1} layouts"])
