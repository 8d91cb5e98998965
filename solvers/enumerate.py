"""Exhaustive search with exact pruning, vectorised with numpy: the baseline and the oracle.

Pruning (exact under the cost model): (1) a group (one layout, mbs, fp8, sp) whose least-memory knob setting
(full uniform recompute, the highest ZeRO stage) does not fit is infeasible as a whole; (2) inside a group,
recompute options are tried from least to most recompute and the group stops at the first option with a fitting
ZeRO stage — more recompute only adds time. `brute_force` prices every candidate with no pruning."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from autoplan import recompute as R
from autoplan.costmodel.hardware import GIB
from autoplan.solvers.common import SolveResult, plans_from, price
from autoplan.solvers.space import Grid, Problem, enumerate_grid

SHAPE_KEYS = ("tp", "pp", "cp", "ep")


def _finish(problem: Problem, grid: Grid, idx: np.ndarray, steps: np.ndarray, peaks: np.ndarray, fits: np.ndarray,
            top_k: int, solver: str, infeasible: Dict[str, int], profile=None, step_times=None) -> SolveResult:
    """Plans in order of `steps` (what the objective ranks by: Evaluation.rank_s); `step_times` are the step times
    themselves (default: `steps`)."""
    step_times = steps if step_times is None else step_times
    lay = grid.layouts
    feas = idx[fits]
    order = feas[np.lexsort((np.arange(len(feas)), steps[fits]))]  # stable: ties keep enumeration order
    plans = plans_from(problem, lay, order[:top_k], profile=profile)
    # Best plan of each other shape, for --explain: each shape's first candidate in `order`, in that order.
    shape = np.stack([getattr(lay, k)[order] for k in SHAPE_KEYS], axis=1)
    first = np.sort(np.unique(shape, axis=0, return_index=True)[1])
    top_keys = {tuple(row) for row in shape[:top_k].tolist()}
    others = [int(order[f]) for f in first if tuple(shape[f].tolist()) not in top_keys][:6]
    return SolveResult(
        plans=plans, solver=solver, space_size=len(lay), evaluated=len(idx), feasible=int(fits.sum()), wall_s=0.0,
        infeasible=infeasible, smallest_peak_gib=float(peaks.min() / GIB) if len(peaks) else None,
        best_by_shape=plans_from(problem, lay, others, profile=profile),
        feasible_step_times=np.sort(step_times[fits]))


def brute_force(problem: Problem, *, top_k: int = 5, profile=None, **_) -> SolveResult:
    """Price every legal candidate (no pruning)."""
    grid = enumerate_grid(problem)
    ev = price(problem, grid.layouts, profile=profile)
    fits = ev.fits(problem.mem_headroom)
    idx = np.arange(len(grid.layouts))
    infeasible = {"out of memory": int((~fits).sum())} if (~fits).any() else {}
    return _finish(problem, grid, idx, ev.rank_s, ev.peak_mem_bytes, fits, top_k, "brute-force", infeasible,
                   profile, ev.step_time_s)


def enumerate_search(problem: Problem, *, top_k: int = 5, progress=None, profile=None, **_) -> SolveResult:
    grid = enumerate_grid(problem)
    lay, group, level = grid.layouts, grid.group, grid.level
    n = len(lay)
    if n == 0:
        return SolveResult([], "enumerate", 0, 0, 0, 0.0, {"no legal layout": 1})
    n_groups = int(group.max()) + 1
    rc_rank = _recompute_rank(lay)
    # Pass 1: the least-memory setting of each group.
    last_level = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(last_level, group, level)
    probe = np.flatnonzero(level == last_level[group])
    ev = price(problem, lay.take(probe), profile=profile)
    done = len(probe)
    if progress:
        progress(done, n)
    ok_groups = np.zeros(n_groups, dtype=bool)
    ok_groups[group[probe[ev.fits(problem.mem_headroom)]]] = True
    priced_idx: List[np.ndarray] = [probe]
    priced_step: List[np.ndarray] = [ev.rank_s]
    priced_time: List[np.ndarray] = [ev.step_time_s]
    priced_peak: List[np.ndarray] = [ev.peak_mem_bytes]
    priced_fit: List[np.ndarray] = [ev.fits(problem.mem_headroom)]
    # Pass 2..: recompute options in increasing order, every ZeRO stage of an option together.
    solved = ~ok_groups  # infeasible groups are finished
    for r in np.unique(rc_rank):
        sel = np.flatnonzero((rc_rank == r) & ~solved[group])
        sel = np.setdiff1d(sel, probe, assume_unique=True)
        if len(sel) == 0:
            continue
        ev = price(problem, lay.take(sel), profile=profile)
        fits = ev.fits(problem.mem_headroom)
        priced_idx.append(sel)
        priced_step.append(ev.rank_s)
        priced_time.append(ev.step_time_s)
        priced_peak.append(ev.peak_mem_bytes)
        priced_fit.append(fits)
        solved[group[sel[fits]]] = True
        # A group whose probe (least memory) fitted at this same option is also solved.
        done += len(sel)
        if progress:
            progress(min(done, n), n)
    if progress:
        progress(n, n)
    idx = np.concatenate(priced_idx)
    steps, peaks, fits = (np.concatenate(x) for x in (priced_step, priced_peak, priced_fit))
    infeasible = {
        "out of memory at least-memory setting": int((~ok_groups).sum()),
        "dominated (a faster setting of the same layout fits)": int(n - len(idx)),
    }
    infeasible = {k: v for k, v in infeasible.items() if v}
    return _finish(problem, grid, idx, steps, peaks, fits, top_k, "enumerate", infeasible, profile,
                   np.concatenate(priced_time))


def _recompute_rank(lay) -> np.ndarray:
    """Order of recompute options by amount: none < selective (by the number of modules) < full block n
    (ascending n) < full uniform."""
    big = 10_000
    modules = sum(R.has(lay.recompute_modules, name).astype(np.int64) for name in R.MODULES)
    return np.where(lay.recompute == 0, 0, np.where(lay.recompute == 1, modules,
                    np.where(lay.recompute_block, 2 * len(R.MODULES) + lay.recompute_layers, big)))
