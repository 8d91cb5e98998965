"""The training's numerics: which strategy keys change them, what a user gets when they write none, and which GEMM
precisions a search may try (`--precision`).

Numerics keys change what the model computes, not only how fast or in how much memory: the GEMM precision (`fp8`
format, `fp8_recipe` scaling, NVFP4 through `fp8_recipe=nvfp4`), the gradient-reduction dtype (`grad_reduce_bf16`)
and the Adam-state dtype (`adam_bf16_states`). They are priced as written or at their plain default (bf16 GEMMs,
fp32 main gradients, fp32 Adam states: Megatron-LM's defaults, megatron/training/arguments.py), and a search tries
FP8 GEMMs only when `--precision` allows them. Memory-only switches (`MEMORY_ONLY`) leave the numerics alone and may
be turned on for the user, who is told so."""
from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Optional

# The GEMM precisions a search may be asked for: bf16 only (the default: what a user gets when they write nothing,
# Megatron-LM's --bf16 without --fp8-format), FP8 only, or both. The catalogue's ModelSpec states no training
# precision, so no model changes the default.
PRECISIONS = ("bf16", "fp8", "any")
PRECISION_HELP = ("GEMM precision the search may use: bf16 (default: bf16 GEMMs, fp32 Adam states), fp8 (FP8 "
                  "GEMMs only) or any (both). A --fix fp8=... or fp8_recipe=... sets it when --precision is not "
                  "given. Optimizer-state and gradient dtypes stay as fixed (adam_bf16_states, grad_reduce_bf16).")

# Strategy keys that change the training's numerics, and the value each has when the user writes nothing.
NUMERICS_DEFAULTS: Dict[str, Any] = {"fp8": "none", "fp8_recipe": None, "grad_reduce_bf16": False,
                                     "adam_bf16_states": False, "bf16_master_weights": False}
# Switches that change memory only (the GEMMs and their inputs are the same): the search may turn them on.
MEMORY_ONLY = ("fp8_param", "te_cross_entropy", "expandable_segments")


def fp8_allowed(precision: Optional[str], fixed: Dict[str, Any]) -> FrozenSet[bool]:
    """Whether FP8 GEMMs may appear (True) and whether bf16 may (False) on a search's plans. `precision` None: what
    the fixed fp8 / fp8_recipe say, else bf16."""
    if precision == "any":
        return frozenset({False, True})
    if precision == "fp8":
        return frozenset({True})
    if precision is None and ("fp8" in fixed or "fp8_recipe" in fixed):
        return frozenset({False, True})  # the fixed values decide (solvers/space.py fp8_choices)
    return frozenset({False})


def precision_conflict(precision: Optional[str], fixed: Dict[str, Any]) -> Optional[str]:
    """The one-line reason a --precision contradicts the fixed fp8 / fp8_recipe, or None."""
    if precision is None:
        return None
    if precision not in PRECISIONS:
        return f"--precision {precision!r} must be one of: {', '.join(PRECISIONS)}"
    fp8 = fixed.get("fp8")
    fp8 = [] if fp8 is None else (list(fp8) if isinstance(fp8, (list, tuple)) else [fp8])
    if precision == "bf16":
        wants_fp8 = [v for v in fp8 if v != "none"] if "none" not in fp8 else []
        if wants_fp8 or "fp8_recipe" in fixed:
            key = f"fp8={wants_fp8[0]}" if wants_fp8 else f"fp8_recipe={_first(fixed['fp8_recipe'])}"
            return f"--fix {key} asks for FP8 GEMMs but --precision bf16 allows none; use --precision fp8 or drop it"
    if precision == "fp8" and fp8 and all(v == "none" for v in fp8):
        return "--fix fp8=none asks for bf16 GEMMs but --precision fp8 allows FP8 only; use --precision bf16"
    return None


def _first(value):
    return value[0] if isinstance(value, list) else value


def as_written(given: Dict[str, Any]) -> Dict[str, Any]:
    """A partial strategy with its left-out numerics at their plain defaults, so that completing it never changes
    them: FP8 GEMMs only where fp8 is written (an fp8_recipe alone is refused by the Strategy's rule, which names
    the fp8 format to write). Full recompute written without a method is Megatron's every layer
    (--recompute-method uniform --recompute-num-layers 1), as the Strategy reads it."""
    out = dict(given)
    out.setdefault("fp8", NUMERICS_DEFAULTS["fp8"])
    if out.get("recompute") == "full":
        out.setdefault("recompute_method", "uniform")
        out.setdefault("recompute_layers", 1)
    return out


def numerics_notes(given: Dict[str, Any]) -> List[str]:
    """What the estimate assumed for numerics keys the user left out, said when the precision itself (fp8) is left
    out; an imported config always states it, and its other numerics flags are as written."""
    if "fp8" in given:
        return []
    left = [k for k in ("fp8", "adam_bf16_states", "grad_reduce_bf16") if k not in given]
    said = {"fp8": "bf16 GEMMs (fp8=none)", "adam_bf16_states": "fp32 Adam states",
            "grad_reduce_bf16": "fp32 gradient reduction"}
    return ["numerics not given, priced at the defaults: " + ", ".join(said[k] for k in left)]


def precision_label(fp8: str, recipe: Optional[str], gpu_id: str) -> str:
    """The GEMM precision of a strategy as a plans table shows it: 'bf16', 'nvfp4', or 'fp8' with its recipe (the one
    written, else the GPU's default, autoplan/validate.py effective_fp8_recipe) and the format when it is not
    hybrid, e.g. 'fp8 delayed', 'fp8 e4m3 tensorwise'."""
    from autoplan.validate import effective_fp8_recipe

    if fp8 == "none":
        return "bf16"
    if recipe == "nvfp4":
        return "nvfp4"
    return " ".join(["fp8"] + ([fp8] if fp8 != "hybrid" else []) + [effective_fp8_recipe(recipe, gpu_id)])
