"""`Layouts`: strategies as a struct of numpy arrays, so one pass of the cost model prices many candidates.

A single strategy is a `Layouts` of length 1; the search builds them straight from the enumerated grid."""
from __future__ import annotations

from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Dict, Optional, Sequence

import numpy as np

from autoplan import keys as K
from autoplan.strategy import Strategy

RECOMPUTE_CODES, RECOMPUTE_NAMES = K.RECOMPUTE_CODES, K.RECOMPUTE_NAMES
# Bytes per element of a quantised tensor, scales included, per FP8/FP4 recipe: delayed and per-tensor current
# scaling keep one fp32 scale per tensor (1 byte per element); blockwise keeps an fp32 scale per 1x128 tile
# (DeepSeek-V3 report arXiv:2412.19437 sec. 3.3.1; TransformerEngine Float8BlockScaling); MXFP8 one E8M0 byte per
# 32 elements (OCP Microscaling Formats spec v1.0; TransformerEngine MXFP8Tensor scale_inv); NVFP4 two E2M1 values
# per byte and an E4M3 scale per 16 (TransformerEngine NVFP4Tensor). Weights' 2-D blocks need fewer scales: the
# 1-D figure bounds them from above.
QUANTISED_BYTES = {"delayed": 1.0, "tensorwise": 1.0, "blockwise": 1.0 + 4 / 128, "mxfp8": 1.0 + 1 / 32,
                   "nvfp4": 0.5 + 1 / 16}


# The engine's columns: whether the vocabulary is sharded over tp (Megatron's VocabParallelEmbedding) or replicated
# (DeepSpeed AutoTP keeps embedding and LM head whole: deepspeed module_inject/auto_tp.py shards Linear layers only),
# TE's fused MoE permute/unpermute (Megatron --moe-permute-fusion; DeepSpeed has none), and DeepSpeed ZeRO's
# communication schedule and buffers (False: Megatron's).
ENGINE_COLUMNS = ("vocab_tp", "fused_permute", "deepspeed")


@dataclass(frozen=True)
class Layouts:
    """One entry per candidate: one column per strategy key, named, typed and encoded as autoplan/keys.py declares
    (`first`/`last` = -1 means an even split), the engine's columns (ENGINE_COLUMNS) and the effective FP8 recipe's
    (`recipe_columns`). A key column that is not `required_column` may be left out (None): it is then the key's
    default (zeros, or None for a string column), filled in __post_init__."""

    __annotations__ = {}
    for _key in K.column_keys():
        if _key.required_column:
            __annotations__[_key.column_name] = "np.ndarray"
    for _name in ENGINE_COLUMNS:
        __annotations__[_name] = "np.ndarray"
    fp4: Optional[np.ndarray] = None  # bool: NVFP4 GEMMs (fp8_recipe nvfp4); None = none
    # bool: FP8 with the delayed-scaling recipe (the effective one: the pre-Blackwell default when the recipe is left
    # out); None = none. Set where the GPU is known: layouts_from_strategies(gpu_id=...) and the search space.
    fp8_delayed: Optional[np.ndarray] = None
    # float: bytes per element of one quantised copy (a saved GEMM input, an FP8/FP4 weight copy) under the
    # effective recipe, scales included (QUANTISED_BYTES); None = 1.
    quant_bytes: Optional[np.ndarray] = None
    for _key in K.column_keys():
        if not _key.required_column:
            __annotations__[_key.column_name] = "Optional[np.ndarray]"
            locals()[_key.column_name] = None
    del _key, _name

    def __post_init__(self) -> None:
        n = len(self.tp)
        for key in K.column_keys():
            if getattr(self, key.column_name) is None:
                fill = np.full(n, None, dtype=object) if key.dtype is object else np.zeros(n, dtype=key.dtype)
                object.__setattr__(self, key.column_name, fill)
        if self.fp4 is None:
            object.__setattr__(self, "fp4", np.zeros(n, dtype=bool))
        if self.fp8_delayed is None:
            object.__setattr__(self, "fp8_delayed", np.zeros(n, dtype=bool))
        if self.quant_bytes is None:
            object.__setattr__(self, "quant_bytes", np.ones(n))

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def take(self, index) -> "Layouts":
        """Rows `index` (an int array or boolean mask)."""
        return Layouts(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def strategy(self, i: int) -> Strategy:
        """Row i as a Strategy (every key decoded from its column, autoplan/keys.py)."""
        return Strategy(**K.values_of(self, i))


def engine_columns(engine: str, n: int) -> Dict[str, np.ndarray]:
    """ENGINE_COLUMNS for n candidates of one engine."""
    return {"vocab_tp": np.full(n, engine != "deepspeed"), "fused_permute": np.full(n, engine != "deepspeed"),
            "deepspeed": np.full(n, engine == "deepspeed")}


def recipe_columns(fp8: np.ndarray, written: np.ndarray, gpu_id: Optional[str]) -> Dict[str, np.ndarray]:
    """The effective FP8 recipe's columns, the one place it is applied: the recipe as written (`written`, the
    `fp8_recipe` column), else the GPU's default (validate.effective_fp8_recipe; without a GPU, the one written).
    `fp4`: NVFP4 GEMMs; `fp8_delayed`: FP8 under delayed scaling; `quant_bytes`: QUANTISED_BYTES of the recipe."""
    from autoplan.validate import effective_fp8_recipe

    fp8 = np.asarray(fp8, dtype=bool)
    recipes = {r: (effective_fp8_recipe(r, gpu_id) if gpu_id else r) for r in set(written.tolist())}
    effective = np.array([recipes[r] for r in written.tolist()], dtype=object) if len(recipes) > 1 else \
        np.full(len(written), next(iter(recipes.values()), None), dtype=object)
    return {"fp4": fp8 & (written == "nvfp4"), "fp8_delayed": fp8 & (effective == "delayed"),
            "quant_bytes": np.array([QUANTISED_BYTES[r or "delayed"] for r in effective.tolist()], dtype=float)}


def layouts_from_strategies(strategies: Sequence[Strategy], num_gpus: int, engine: str = "megatron",
                            gpu_id: Optional[str] = None) -> Layouts:
    """Stack strategies (each key's column as autoplan/keys.py encodes it); dp is derived as world / (tp * pp * cp)
    when a strategy leaves it out. `engine` fills the engine's columns, `gpu_id` the effective FP8 recipe's."""
    rows = [SimpleNamespace(num_gpus=num_gpus, ends=_end_ranks(s)) for s in strategies]
    columns = K.columns_of(strategies, rows)
    return Layouts(**columns, **engine_columns(engine, len(strategies)),
                   **recipe_columns(columns["fp8"], columns["fp8_recipe"], gpu_id))


def _end_ranks(s: Strategy):
    """(first, last) layer counts Layouts holds: the explicit ones, a layout string's end ranks, else -1 (even, or
    account_for_*, which costmodel/stages.py resolves with the model's layer count)."""
    if s.pipeline_layout:
        from autoplan.pipeline_split import layout_rank_counts

        counts = layout_rank_counts(s.pipeline_layout, s.pp)
        return counts[0], counts[-1]
    return (-1 if s.first_stage_layers is None else s.first_stage_layers,
            -1 if s.last_stage_layers is None else s.last_stage_layers)
