"""Complete a partial strategy: keys the user left out are chosen by the search with the given keys fixed
(so the least recompute that fits, the distributed optimizer where it helps, ...), and the choices are reported."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from autoplan.cluster import ClusterSpec
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.strategy import CONTRACT_KEYS, Strategy, strategy_from_mapping
from autoplan.workload import Workload

# Keys the search does not vary; a user value is kept as given.
PASS_THROUGH = ("fp8_recipe", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "moe_a2a_overlap",
                "recompute_method", "recompute_layers")


def default_completion(given: Dict[str, Any]) -> Strategy:
    """The plain defaults for missing keys (sp when tp > 1), used to explain why a partial strategy is illegal."""
    values = dict(given)
    tp = int(values.get("tp", 1))
    values.setdefault("sp", tp > 1)
    values.pop("dp", None)
    return strategy_from_mapping(values)


def complete_strategy(model: ModelSpec, cluster: ClusterSpec, workload: Workload, given: Dict[str, Any],
                      engine: str = "megatron") -> Tuple[Strategy, List[str]]:
    """(strategy, notes). A complete strategy is validated and returned as is."""
    from autoplan.validate import validate

    missing = [k for k in CONTRACT_KEYS if k not in given]
    if not missing:
        try:
            return validate(model, cluster, workload, strategy_from_mapping(given)), []
        except InputError:
            # An uneven pipeline split the user left out is chosen for them; anything else is their error.
            if "first_stage_layers" in given or "last_stage_layers" in given or given.get("pp", 1) == 1:
                raise
            missing = ["first_stage_layers", "last_stage_layers"]
    plain = default_completion(given)
    from autoplan.solvers.api import solve
    from autoplan.solvers.space import Problem

    # fp8_recipe also goes to the search: it decides which recompute modules FP8 candidates can run.
    fixed = {k: v for k, v in given.items() if (k not in PASS_THROUGH or k == "fp8_recipe") and k != "dp"}
    problem = Problem(model, cluster, workload, fixed=fixed, engine=engine, allow=_allowances(given))
    result = solve(problem, "enumerate", top_k=1)
    if result.space_size == 0:
        # No legal completion: the plain defaults name the broken rule (validate raises).
        validate(model, cluster, workload, plain)
        raise InputError(f"no legal strategy has {', '.join(f'{k}={v}' for k, v in given.items())}; "
                         f"run `autoplan plan` with --fix for the keys you need")
    if not result.plans:
        # Nothing legal fits: report the plain completion (it will say fits: false) after validating it.
        strategy = validate(model, cluster, workload, plain)
        return strategy, [f"no completion of the given keys fits in memory; showing defaults for: "
                          f"{', '.join(missing)}"]
    chosen = result.plans[0].strategy
    extra = {k: given[k] for k in PASS_THROUGH if k in given}
    if extra:
        chosen = strategy_from_mapping({**chosen.model_dump(exclude_none=True), **extra})
    chosen = validate(model, cluster, workload, chosen)
    picked = ", ".join(f"{k}={_fmt(getattr(chosen, k))}" for k in missing if getattr(chosen, k) is not None)
    return chosen, [f"chosen for you (fastest that fits): {picked}"]


def _fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _allowances(given: Dict[str, Any]) -> frozenset:
    """Search preferences never override what the user wrote: widen the space to hold the given keys."""
    allow = {"tp-outside-domain", "ep-outside-domain", "non-pow2-mbs"}  # preferences, not rules
    if given.get("sp") is False and given.get("tp", 1) > 1:
        allow.add("no-sp")
    return frozenset(allow)
