"""Search policy: how `--fix` / `--exclude` reach the search (`search_constraints`), which rule to name when they
leave no legal candidate (`why_nothing_is_legal`), and the cost objective's search over cluster sizes
(`run_over_sizes`), the fixed FP8 labels' check on the winner (`check_fixed_labels`), why a search returned no plan
(`no_plan_reason`) and the best plan for another engine (`engine_best`). The command line (autoplan/cli/plan.py)
parses the options and prints; this is what they mean."""
from __future__ import annotations

from dataclasses import replace as dc_replace
from typing import Callable, Dict, Optional

from autoplan.errors import InputError
from autoplan.strategy import SPLIT_KEYS


def fix_contradicts_exclude(fixed: dict, excluded: dict) -> None:
    """A key whose every --fix value is also excluded leaves no plan: a one-line InputError naming both options."""
    for key, values in fixed.items():
        banned = excluded.get(key, ())
        if values and all(v in banned for v in values):
            shown = "|".join("+".join(v) if isinstance(v, tuple) else str(v) for v in values)
            raise InputError(f"--fix {key}={shown} contradicts --exclude {key}={shown}: every fixed value is "
                             f"excluded; drop one of the two")


def search_constraints(fixed: dict, excluded: dict):
    """(fixed, excluded) as the search honours them. A switch the search does not vary (solvers/space.py SWITCHES)
    takes one value on every plan, so excluding a boolean one fixes the other value; keys the search cannot honour
    are refused with the reason."""
    from autoplan.solvers.space import LABELS, SWITCHES

    for key, values in fixed.items():
        if key == "dp":
            raise InputError(f"--fix dp={values[0]}: dp is derived as GPUs / (tp*pp*cp), not searched; "
                             f"fix tp, pp and cp instead (e.g. --fix tp=2 --fix pp=1 --fix cp=1)")
        if (key in SWITCHES or key in LABELS[1:]) and len(set(map(str, values))) > 1:
            raise InputError(f"--fix {key}={'|'.join(map(str, values))}: the search does not vary {key}; "
                             f"give one value")
    fix_contradicts_exclude(fixed, excluded)
    fixed = dict(fixed)
    for key, values in excluded.items():
        if key == "dp":
            raise InputError("--exclude dp: dp is derived as GPUs / (tp*pp*cp); exclude tp, pp or cp values instead")
        if key in SWITCHES and all(isinstance(v, bool) for v in values):
            keep = [v for v in (True, False) if v not in values]
            if not keep:
                raise InputError(f"--exclude {key}: excludes both true and false; drop one")
            if key in fixed and fixed[key][0] not in keep:
                raise InputError(f"--fix {key}={fixed[key][0]} contradicts --exclude {key}={fixed[key][0]}")
            fixed[key] = keep
        elif key in SWITCHES or key in LABELS[1:]:
            raise InputError(f"--exclude {key}: the search does not vary {key} (one value on every plan); "
                             f"use --fix {key}=VALUE")
    _full_recompute_keys(fixed)
    _selective_recompute_keys(fixed)
    return fixed, {k: v for k, v in excluded.items() if k not in SWITCHES}


def _selective_recompute_keys(fixed: dict) -> None:
    """recompute_modules is selective recompute's module set (Strategy's rule): with another recompute fixed it is a
    one-line error."""
    recompute = fixed.get("recompute")
    if "recompute_modules" in fixed and recompute and "selective" not in recompute:
        modules = "+".join(fixed["recompute_modules"][0])
        raise InputError(f"--fix recompute_modules={modules}: the modules apply only to recompute=selective "
                         f"(got --fix recompute={recompute[0]}); drop one of the two")


def _full_recompute_keys(fixed: dict) -> None:
    """recompute_method / recompute_layers describe full recompute only (Strategy's rule), so fixing one fixes
    recompute=full on every plan; with another recompute fixed it is a one-line error."""
    given = [k for k in ("recompute_method", "recompute_layers") if k in fixed]
    if not given:
        return
    recompute = fixed.get("recompute")
    if recompute and "full" not in recompute:
        raise InputError(f"--fix {given[0]}={fixed[given[0]][0]}: it applies only to recompute=full (got --fix "
                         f"recompute={recompute[0]}); drop one of the two")
    fixed["recompute"] = ["full"]


def why_nothing_is_legal(problem) -> Optional[str]:
    """The rule that empties the space: for each fixed key whose removal leaves legal candidates, the first such
    candidate carrying the fixed value, validated (autoplan/validate.py names the rule); None when no single fixed
    key is to blame."""
    from autoplan.solvers.space import enumerate_grid
    from autoplan.validate import validate

    generic = None
    for key, values in problem.fixed.items():
        relaxed = dc_replace(problem, fixed={k: v for k, v in problem.fixed.items() if k != key})
        grid = enumerate_grid(relaxed)
        if not len(grid.layouts):
            continue
        value = values[0] if isinstance(values, (list, tuple)) else values
        shown = "+".join(value) if isinstance(value, tuple) else value  # a module set as the user writes it
        # A stage-split key needs pipelining: judge it on the first pipelined candidate when there is one.
        piped = [i for i in range(len(grid.layouts)) if grid.layouts.pp[i] > 1] if key in SPLIT_KEYS else []
        base = grid.layouts.strategy(piped[0] if piped else 0).model_dump(exclude={"dp"})
        if key == "recompute":
            base.pop("recompute_method", None), base.pop("recompute_layers", None), base.pop("recompute_modules", None)
        if key == "recompute_modules":  # a module set is selective recompute
            base.update(recompute="selective", recompute_method=None, recompute_layers=None)
        try:
            candidate = type(grid.layouts.strategy(0))(**{**base, key: value})
            validate(problem.model, problem.cluster, problem.workload, candidate)
        except InputError as e:
            return f"--fix {key}={shown}: {e}"
        except ValueError as e:  # pydantic's ValidationError: its first error's message
            errors = getattr(e, "errors", None)
            return f"--fix {key}={shown}: {errors()[0]['msg'] if callable(errors) else str(e).splitlines()[0]}"
        if problem.engine == "deepspeed":
            from autoplan.integrations.engines import deepspeed_unsupported

            reason = deepspeed_unsupported(candidate, problem.model)
            if reason:
                return f"--fix {key}={shown}: {reason}"
        generic = generic or (f"--fix {key}={shown}: no legal candidate of this layout space can carry it "
                              f"(with {problem.engine}){_nearest(grid, key, value)}; relax --fix {key}")
    return generic  # a key with a named rule wins over one without


def _nearest(grid, key: str, value) -> str:
    """', legal KEY with the other keys as given: a, b, c' (the values of `key` among the relaxed space's
    candidates, nearest to `value` first), or '' for a key the layout table does not hold."""
    column = getattr(grid.layouts, key, None)
    if column is None or not len(column):
        return ""
    values = sorted({v.item() for v in column})
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        values = sorted(values, key=lambda v: (abs(v - value), v))
    return f", legal {key} with the other keys as given: {', '.join(str(v) for v in values[:6])}"


def gpu_counts_for_cost(problem) -> list:
    """--gpus, --gpus/2, --gpus/4, ... that fill whole nodes or fit in one."""
    n, node = problem.cluster.num_gpus, problem.cluster.gpu.gpus_per_node
    counts = []
    while n >= 1:
        if n <= node or n % node == 0:
            counts.append(n)
        if n % 2:
            break
        n //= 2
    return counts


def run_over_sizes(problem, run: Callable, solver: str, top: int):
    """The cost objective: plans over several cluster sizes (`gpu_counts_for_cost`), each searched by `run(problem)`,
    ranked by GPU-hours per token (= highest tokens/s/GPU)."""
    from autoplan.solvers.api import SolveResult

    plans, space, evaluated, feasible, wall, rejected, smallest = [], 0, 0, 0, 0.0, {}, None
    counts = gpu_counts_for_cost(problem)
    for n in counts:
        sub = dc_replace(problem, cluster=problem.cluster.model_copy(update={"num_gpus": n}))
        r = run(sub)
        plans += r.plans
        space, evaluated, feasible, wall = space + r.space_size, evaluated + r.evaluated, feasible + r.feasible, \
            wall + r.wall_s
        for k, v in r.infeasible.items():
            rejected[k] = rejected.get(k, 0) + v
        if r.smallest_peak_gib is not None:
            smallest = r.smallest_peak_gib if smallest is None else min(smallest, r.smallest_peak_gib)
    plans.sort(key=lambda p: -p.estimate.tokens_per_s_per_gpu)
    return SolveResult(plans=plans[:top], solver=f"{solver} (cost over {len(counts)} sizes)",
                       space_size=space, evaluated=evaluated, feasible=feasible, wall_s=wall, infeasible=rejected,
                       smallest_peak_gib=smallest)


def check_fixed_labels(problem, result) -> None:
    """The FP8 format and recipe the user fixed are stamped on plans the cost model priced alike; a plan they make
    illegal (e.g. fp8_recipe=mxfp8 before Blackwell) is refused with validate's rule."""
    from autoplan.solvers.space import LABELS
    from autoplan.validate import validate

    given = [k for k in LABELS if k in problem.fixed]
    if not given or not result.plans:
        return
    try:
        validate(problem.model, problem.cluster, problem.workload, result.plans[0].strategy)
    except InputError as e:
        fixed = ", ".join(f"--fix {k}={problem.fixed[k][0]}" for k in given)
        raise InputError(f"{fixed}: {e}") from None


def engine_refuses_model(problem):
    """The engine's reason when it cannot run the model under any strategy (checked on the plainest one: no tp, pp,
    cp, ep, fp8 or recompute), or None."""
    if problem.engine != "deepspeed":
        return None
    from autoplan.integrations.engines import deepspeed_unsupported
    from autoplan.strategy import Strategy

    return deepspeed_unsupported(Strategy(), problem.model)


def no_plan_reason(result, problem) -> str:
    """Why a search returned no plan, in one line: the rule a --fix breaks (raised as an InputError: bad input),
    the engine's refusal of the model, an empty layout space, or the memory the smallest candidate needs, with
    what to try."""
    from autoplan.solvers.space import fp8_choices

    need = result.smallest_peak_gib
    cap = problem.cluster.gpu.hbm_gib * (1 - problem.mem_headroom)
    n = problem.cluster.num_gpus
    if result.space_size == 0 and problem.fixed:
        reason = why_nothing_is_legal(problem)
        if reason:
            raise InputError(reason)
    model_refusal = engine_refuses_model(problem) if result.space_size == 0 else None
    if model_refusal:
        msg = f"no {problem.engine} plan for {problem.model.name}: {model_refusal}"
    elif result.space_size == 0:
        msg = (f"no legal strategy for {problem.model.name} on {n} x {problem.cluster.gpu.id} with seq "
               f"{problem.workload.seq_len}, gbs {problem.workload.global_batch_size}"
               f"{' and the given --fix/--exclude' if problem.fixed or problem.excluded else ''}; "
               f"check that gbs is divisible by the data-parallel size, or relax --fix")
    else:
        # Model states shrink about linearly with more GPUs (ZeRO / pipeline sharding): scale to the need.
        want = n * 2
        while need is not None and want < n * need / cap and want < n * 1024:
            want *= 2
        hints = [f"try >= {want} GPUs"]
        if problem.cluster.gpu.has_dtype("fp8") and problem.engine == "megatron" and "fp8" not in problem.fixed \
                and not any(fp8_choices(problem)):
            hints.append("--precision fp8 (FP8 GEMMs change the numerics)")
        if problem.mem_headroom:
            hints.append("a smaller --mem-headroom")
        msg = (f"no strategy fits: the smallest needs {need:.1f} GiB per GPU on {n} GPUs "
               f"(capacity {cap:.1f} GiB); {' or '.join(hints)}")
    return msg


def engine_best(problem, engine: str, cluster, run: Callable, needs: Optional[Dict[str, object]] = None):
    """The best plan of the same search for `engine` on the winner's cluster (with --objective cost, the size it
    chose), searched by `run(problem)` with `needs` (keys the engine's emitted files need fixed) added to the
    fixed keys, or None: what `--emit` writes for that engine when it cannot write the winner."""
    needs = needs or {}
    if engine == problem.engine and not needs:
        return None
    if any(k in problem.fixed and problem.fixed[k] != v for k, v in needs.items()):
        return None  # the user fixed what the emitted files cannot carry: the emitter's refusal says so
    if problem.precision == "fp8" and engine != "megatron":
        return None  # that engine runs no FP8 GEMMs (solvers/space.py Problem): it has no plan of this search
    r = run(dc_replace(problem, engine=engine, cluster=cluster, fixed={**problem.fixed, **needs}))
    return r.plans[0] if r.plans else None
