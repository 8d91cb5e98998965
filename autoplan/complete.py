"""Complete a partial strategy: keys the user left out are chosen by the search with the given keys fixed
(so the least recompute that fits, the distributed optimizer where it helps, ...), and the choices are reported."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from autoplan import keys as K
from autoplan import recompute as R
from autoplan import switch_rules as SR
from autoplan.cluster import ClusterSpec
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.numerics import MEMORY_ONLY
from autoplan.strategy import CONTRACT_KEYS, SPLIT_KEYS, Strategy, strategy_from_mapping
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
    """(strategy, notes). A complete strategy is validated and returned as is. A pp (and vpp) whose layers Megatron
    cannot split evenly gets the stage split Megatron-Bridge uses for the model, named in the notes; a GPU count
    that leaves the last node partly used is named too."""
    strategy, notes = _complete(model, cluster, workload, given, engine)
    strategy, filled = fill_searched_switches(model, cluster, workload, strategy, given, engine)
    return strategy, notes + filled + _partial_node_note(cluster, strategy)


def fill_searched_switches(model: ModelSpec, cluster: ClusterSpec, workload: Workload, strategy: Strategy,
                           given: Dict[str, Any], engine: str) -> Tuple[Strategy, List[str]]:
    """(strategy, notes): the switches marked `estimate_fills` (autoplan/keys.py) that `given` does not state, set
    as the search sets them for this layout (`Switch.search`) where `validate` accepts the result; a value the user
    wrote, or an imported config stated, is kept."""
    from autoplan.validate import validate

    todo = [k for k in K.SWITCHES if k.estimate_fills and k.name not in given]
    if not todo:
        return strategy, []
    s = strategy
    cols = {"tp": s.tp, "pp": s.pp, "vpp": s.vpp, "cp": s.cp, "ep": s.ep, "etp": s.etp, "mbs": s.mbs,
            "fp8": s.uses_fp8, "sp": s.sp, "zero": s.zero, "rc": SR.RECOMPUTE_CODES[s.recompute],
            "mods": R.mask(s.recompute_modules or ()) if s.recompute == "selective" else 0}
    cols = {k: np.array([v]) for k, v in cols.items()}
    update = {k.name: bool(k.grid(cols, engine, 1)[0]) for k in todo}
    update = {k: v for k, v in update.items() if v != getattr(s, k)}
    if not update:
        return strategy, []
    try:
        filled = validate(model, cluster, workload, strategy_from_mapping({**s.model_dump(exclude_none=True),
                                                                            **update}), engine=engine)
    except InputError:
        return strategy, []
    return filled, ["switches not stated, set as the search sets them: "
                    + ", ".join(f"{k}={_fmt(v)}" for k, v in update.items())]


def _partial_node_note(cluster: ClusterSpec, s: Strategy) -> List[str]:
    extra = cluster.partial_node_gpus
    if not extra:
        return []
    per_node = cluster.gpu.gpus_per_node
    inside = "inside one node" if per_node % s.tp == 0 else f"crossing nodes (tp={s.tp} does not divide {per_node})"
    return [f"{cluster.num_gpus} GPUs: {cluster.num_nodes - 1} full nodes and one with {extra} of its {per_node} GPUs; "
            f"every tensor-parallel group of {s.tp} sits {inside}"]


def _complete(model: ModelSpec, cluster: ClusterSpec, workload: Workload, given: Dict[str, Any],
              engine: str) -> Tuple[Strategy, List[str]]:
    from autoplan.numerics import as_written, numerics_notes
    from autoplan.validate import validate

    numerics = numerics_notes(given)
    given, split_notes = _with_bridge_split(model, as_written(given))
    missing = [k for k in CONTRACT_KEYS if k not in given]
    if not missing:
        try:
            return (validate(model, cluster, workload, strategy_from_mapping(given), engine=engine),
                    numerics + split_notes)
        except InputError:
            # An uneven pipeline split the user left out is chosen for them; anything else is their error.
            if any(k in given for k in SPLIT_KEYS) or given.get("pp", 1) == 1:
                raise
            missing = ["first_stage_layers", "last_stage_layers"]
    plain, plain_notes = default_completion(given), []
    if not any(k in given for k in SPLIT_KEYS):  # the plain defaults split the layers as Megatron-Bridge would
        contract = {k: getattr(plain, k) for k in CONTRACT_KEYS}
        plain_keys, plain_notes = _with_bridge_split(model, contract)
        # exclude_unset: a switch left at its default stays unset, so a rule held only for a switch the user asked
        # for (validate.py: overlap_param_gather without ZeRO) is not applied to the default.
        plain = strategy_from_mapping({**plain.model_dump(exclude_none=True, exclude_unset=True, exclude={"dp"}),
                                       **plain_keys})
    from autoplan.solvers.api import solve
    from autoplan.solvers.space import Problem

    # fp8_recipe also goes to the search: it decides which recompute modules FP8 candidates can run; a full
    # recompute's method and layers do too, so the other keys are chosen for the recompute as written.
    searched = {"fp8_recipe"} | ({"recompute_method", "recompute_layers"}
                                 if "recompute_method" in given and "recompute_layers" in given else set())
    fixed = {k: v for k, v in given.items() if (k not in PASS_THROUGH or k in searched) and k != "dp"}
    problem = Problem(model, cluster, workload, fixed=fixed, engine=engine, allow=_allowances(given))
    result = solve(problem, "enumerate", top_k=1)
    if result.space_size == 0:
        # No legal completion: the plain defaults name the broken rule (validate raises).
        validate(model, cluster, workload, plain, engine=engine)
        from autoplan.solvers.policy import why_nothing_is_legal

        why = why_nothing_is_legal(problem)  # the first fixed key whose rule empties the space, with legal values
        raise InputError(f"no legal strategy has {', '.join(f'{k}={v}' for k, v in given.items())}"
                         + (f": {why.replace('--fix ', '', 1).replace('relax --fix', 'change')}" if why else
                            "; no single key is to blame: change several, or run `autoplan plan` with --fix for the "
                            "keys you need"))
    if not result.plans:
        # Nothing legal fits: report the plain completion (it will say fits: false) after validating it.
        strategy = validate(model, cluster, workload, plain, engine=engine)
        return strategy, numerics + [f"no completion of the given keys fits in memory; showing defaults for: "
                                     f"{', '.join(missing)}"] + split_notes + plain_notes
    chosen = result.plans[0].strategy
    extra = {k: given[k] for k in PASS_THROUGH if k in given}
    if extra:
        chosen = strategy_from_mapping({**chosen.model_dump(exclude_none=True), **extra})
    chosen = validate(model, cluster, workload, chosen, engine=engine)
    picked = ", ".join(f"{k}={_fmt(getattr(chosen, k))}" for k in missing if getattr(chosen, k) is not None)
    notes = numerics + split_notes + [f"chosen for you (fastest that fits): {picked}"]
    # Memory switches the search turns on where legal (solvers/space.py) are chosen too: name them.
    switched = [k for k in MEMORY_ONLY if k not in given and getattr(chosen, k)]
    if switched:
        notes.append("memory-only switches turned on (numerics unchanged): "
                     + ", ".join(f"{k}=true" for k in switched))
    if not split_notes and not any(k in given for k in SPLIT_KEYS):
        notes += _split_note(model, chosen)
    return chosen, notes


def _with_bridge_split(model: ModelSpec, given: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """`given` with vpp read from a layout string, and, when pp (and vpp, default 1 once every contract key is given)
    are fixed without a stage split that Megatron can make evenly, the split Megatron-Bridge uses (pipeline_split)."""
    from autoplan.pipeline_split import bridge_split, layout_vpp

    given = dict(given)
    if given.get("pipeline_layout") and "vpp" not in given and given.get("pp"):
        try:
            given["vpp"] = layout_vpp(given["pipeline_layout"], int(given["pp"])) or 1
        except ValueError:
            pass  # validate names the bad symbol
    pp = int(given.get("pp", 1))
    if pp < 2 or any(k in given for k in SPLIT_KEYS):
        return given, []
    if "vpp" not in given and any(k not in given for k in CONTRACT_KEYS):
        return given, []  # the search chooses vpp and the split together
    found = bridge_split(model, pp, int(given.get("vpp", 1)))
    if found is None:
        return given, []
    keys, note = found
    return {**given, **keys}, [note]


def _split_note(model: ModelSpec, s: Strategy) -> List[str]:
    """How a chosen uneven split reaches Megatron, naming Megatron-Bridge's recipe when it makes the same split."""
    from autoplan.pipeline_split import bridge_split

    bridge = bridge_split(model, s.pp, s.vpp)
    if bridge and all(getattr(s, k) == v for k, v in bridge[0].items()):
        return [bridge[1]]
    if s.pipeline_layout:
        return [f"stage split: --pipeline-model-parallel-layout {s.pipeline_layout}"]
    if s.account_for_embedding or s.account_for_loss:
        return ["stage split: the embedding/loss count as layers (--account-for-embedding/loss-in-pipeline-split)"]
    return []


def _fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _allowances(given: Dict[str, Any]) -> frozenset:
    """Search preferences never override what the user wrote: widen the space to hold the given keys."""
    allow = {"tp-outside-domain", "ep-outside-domain", "non-pow2-mbs"}  # preferences, not rules
    if given.get("sp") is False and given.get("tp", 1) > 1:
        allow.add("no-sp")
    return frozenset(allow)
