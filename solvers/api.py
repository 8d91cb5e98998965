"""One interface for every solver: `solve(problem, solver=..., top_k=..., seed=..., budget_s=...)`.

A solver returns a `SolveResult`: the best plans first, how many candidates the space held and how many were
priced, and why the rest were rejected. Solvers never raise for an infeasible problem: they return no plans and
the reasons."""
from __future__ import annotations

import time
from typing import Dict, Optional

from autoplan.solvers.common import SolveResult, SolverFn, plans_from, price
from autoplan.solvers.space import Problem

__all__ = ["Problem", "SolveResult", "solve", "solvers", "price", "plans_from"]


def solvers() -> Dict[str, SolverFn]:
    """Every solver by name. Imported on first use, so that importing this module loads no solver's library
    (ortools, optuna)."""
    from autoplan.solvers import cpsat, enumerate as _enum, optuna_search

    return {"enumerate": _enum.enumerate_search, "brute-force": _enum.brute_force, "cpsat": cpsat.cpsat_search,
            "optuna": optuna_search.optuna_search}


def solve(problem: Problem, solver: str = "enumerate", *, top_k: int = 5, seed: int = 0,
          budget_s: Optional[float] = None, progress=None, profile=None) -> SolveResult:
    """Run a solver by name. `progress(done, total)` is called as work proceeds, when given."""
    table = solvers()
    if solver not in table:
        from autoplan.errors import InputError

        raise InputError(f"unknown solver {solver!r}; choose one of: {', '.join(sorted(table))}")
    start = time.perf_counter()
    result = table[solver](problem, top_k=top_k, seed=seed, budget_s=budget_s, progress=progress,
                           profile=profile)
    result.wall_s = time.perf_counter() - start
    return result
