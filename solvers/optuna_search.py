"""Optuna (TPE) search over the same space: for spaces too large to enumerate and for measured objectives.

Each dimension of a strategy is one categorical parameter, sampled in a fixed order and conditioned on the values
already chosen (define-by-run, a parameter name per prefix), so every sample is a legal grid point: the choices
offered at each step are exactly the children of the prefix in a trie built from the grid."""
from __future__ import annotations

import time
from typing import Dict, Optional, Tuple

import numpy as np

from autoplan.solvers.common import SolveResult, plans_from, price
from autoplan.solvers.space import Grid, Problem, enumerate_grid

DIMS = ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "sp", "zero", "recompute", "recompute_block",
        "recompute_layers", "recompute_modules", "fp8", "first", "last")


def build_trie(grid: Grid) -> dict:
    """Nested dicts over DIMS; leaves are grid indices."""
    lay = grid.layouts
    cols = [getattr(lay, d) for d in DIMS]
    trie: dict = {}
    for i in range(len(lay)):
        node = trie
        for c in cols[:-1]:
            node = node.setdefault(int(c[i]), {})
        node[int(cols[-1][i])] = i
    return trie


def suggest(trial, trie: dict) -> int:
    """Walk the trie; each step is a categorical over the children of the path so far."""
    node, path = trie, []
    for d in DIMS:
        choices = sorted(node)
        name = d if not path else f"{d}|{','.join(map(str, path))}"
        v = choices[0] if len(choices) == 1 else trial.suggest_categorical(name, choices)
        path.append(v)
        node = node[v]
    return node


def optuna_search(problem: Problem, *, top_k: int = 5, seed: int = 0, budget_s: Optional[float] = None,
                  progress=None, profile=None, n_trials: int = 400, **_) -> SolveResult:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    grid = enumerate_grid(problem)
    lay = grid.layouts
    if len(lay) == 0:
        return SolveResult([], "optuna", 0, 0, 0, 0.0, {"no legal layout": 1})
    trie = build_trie(grid)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(40, n_trials // 4))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    priced: Dict[int, Tuple[float, bool, float]] = {}
    illegal = 0
    start = time.perf_counter()
    for t in range(n_trials):
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
        trial = study.ask()
        i = suggest(trial, trie)
        if i not in priced:
            ev = price(problem, lay.take(np.array([i])), profile=profile)
            priced[i] = (float(ev.rank_s[0]), bool(ev.fits(problem.mem_headroom)[0]),
                         float(ev.peak_mem_bytes[0]))
        step, fits, _ = priced[i]
        study.tell(trial, step if fits else step * 1e3)  # a point that does not fit ranks below any that fits
        if progress:
            progress(t + 1, n_trials)
    _polish(problem, grid, priced, profile)
    feasible = sorted((v[0], i) for i, v in priced.items() if v[1])
    plans = plans_from(problem, lay, [i for _, i in feasible[:top_k]], profile=profile)
    return SolveResult(plans=plans, solver="optuna", space_size=len(lay), evaluated=len(priced),
                       feasible=len(feasible), wall_s=0.0,
                       infeasible={k: v for k, v in {"illegal combination": illegal,
                                                     "out of memory": len(priced) - len(feasible)}.items() if v},
                       smallest_peak_gib=min((v[2] for v in priced.values()), default=None) and
                       min(v[2] for v in priced.values()) / 2**30)


def _polish(problem: Problem, grid: Grid, priced: Dict[int, Tuple[float, bool, float]], profile, groups: int = 8):
    """Price every memory-knob setting (ZeRO stage, recompute) of the best layouts TPE found, vectorised: TPE
    explores the layout, this settles the knobs exactly."""
    feasible = sorted((v[0], i) for i, v in priced.items() if v[1])
    best_groups = []
    for _, i in feasible:
        g = int(grid.group[i])
        if g not in best_groups:
            best_groups.append(g)
        if len(best_groups) == groups:
            break
    idx = np.flatnonzero(np.isin(grid.group, best_groups))
    idx = np.array([i for i in idx if i not in priced], dtype=np.int64)
    if len(idx) == 0:
        return
    ev = price(problem, grid.layouts.take(idx), profile=profile)
    fits = ev.fits(problem.mem_headroom)
    for j, i in enumerate(idx):
        priced[int(i)] = (float(ev.rank_s[j]), bool(fits[j]), float(ev.peak_mem_bytes[j]))
