"""`Layouts`: strategies as a struct of numpy arrays, so one pass of the cost model prices many candidates.

A single strategy is a `Layouts` of length 1; the search builds them straight from the enumerated grid."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Sequence

import numpy as np

from autoplan import cuda_graphs as G
from autoplan import keys as K
from autoplan import recompute as R
from autoplan.strategy import Strategy

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
# Bytes per element of a quantised tensor, scales included, per FP8/FP4 recipe: delayed and per-tensor current
# scaling keep one fp32 scale per tensor (1 byte per element); blockwise keeps an fp32 scale per 1x128 tile
# (DeepSeek-V3 report arXiv:2412.19437 sec. 3.3.1; TransformerEngine Float8BlockScaling); MXFP8 one E8M0 byte per
# 32 elements (OCP Microscaling Formats spec v1.0; TransformerEngine MXFP8Tensor scale_inv); NVFP4 two E2M1 values
# per byte and an E4M3 scale per 16 (TransformerEngine NVFP4Tensor). Weights' 2-D blocks need fewer scales: the
# 1-D figure bounds them from above.
QUANTISED_BYTES = {"delayed": 1.0, "tensorwise": 1.0, "blockwise": 1.0 + 4 / 128, "mxfp8": 1.0 + 1 / 32,
                   "nvfp4": 0.5 + 1 / 16}
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}


@dataclass(frozen=True)
class Layouts:
    """One entry per candidate. Integers unless noted; `first`/`last` = -1 means an even split."""

    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    dp: np.ndarray
    mbs: np.ndarray
    sp: np.ndarray  # bool
    zero: np.ndarray
    recompute: np.ndarray  # 0 none, 1 selective, 2 full
    recompute_block: np.ndarray  # bool: full recompute by block (first n layers of a chunk) vs uniform
    recompute_layers: np.ndarray  # full: block size n (block) or group size (uniform)
    recompute_modules: np.ndarray  # selective: bit mask of autoplan.recompute.MODULES (default core_attn)
    fp8: np.ndarray  # bool
    first: np.ndarray
    last: np.ndarray
    vocab_tp: np.ndarray  # bool: embedding and LM head sharded over tp (Megatron); False: replicated (DeepSpeed AutoTP)
    fused_permute: np.ndarray  # bool: TE fused MoE permute/unpermute (Megatron --moe-permute-fusion); False: DeepSpeed
    deepspeed: np.ndarray  # bool: DeepSpeed ZeRO's communication schedule and buffers (False: Megatron's)
    fp4: Optional[np.ndarray] = None  # bool: NVFP4 GEMMs (fp8_recipe nvfp4); None = none (filled in __post_init__)
    # bool: FP8 with the delayed-scaling recipe (the effective one: the pre-Blackwell default when the recipe is left
    # out); None = none. Set where the GPU is known: layouts_from_strategies(gpu_id=...) and the search space.
    fp8_delayed: Optional[np.ndarray] = None
    # float: bytes per element of one quantised copy (a saved GEMM input, an FP8/FP4 weight copy) under the
    # effective recipe, scales included (QUANTISED_BYTES); None = 1 (filled in __post_init__).
    quant_bytes: Optional[np.ndarray] = None
    # int: how Megatron is told the stage split besides first/last (autoplan/pipeline_split.py): bit 1
    # account_for_embedding, bit 2 account_for_loss (first/last stay -1; costmodel/stages.py derives the end ranks
    # from the layer count); None = 0.
    account: Optional[np.ndarray] = None
    # object: a --pipeline-model-parallel-layout string or None; first/last then hold its end ranks' layer counts.
    layout: Optional[np.ndarray] = None
    # int: CUDA-graph capture scopes, bit mask of autoplan.cuda_graphs.MODULES (Strategy.cuda_graph_modules); None = 0.
    cuda_graph_modules: Optional[np.ndarray] = None
    # One column per switch of autoplan/keys.py, named as the Strategy key and encoded by it (bool, or int for a
    # count); a column left out (None) is off (filled in __post_init__).
    for _name in K.NAMES:
        __annotations__[_name] = "Optional[np.ndarray]"
        locals()[_name] = None
    del _name

    def __post_init__(self) -> None:
        for switch in K.SWITCHES:
            if getattr(self, switch.name) is None:
                object.__setattr__(self, switch.name, np.zeros(len(self.tp), dtype=switch.dtype))
        if self.cuda_graph_modules is None:
            object.__setattr__(self, "cuda_graph_modules", np.zeros(len(self.tp), dtype=np.int64))
        if self.account is None:
            object.__setattr__(self, "account", np.zeros(len(self.tp), dtype=np.int64))
        if self.layout is None:
            object.__setattr__(self, "layout", np.full(len(self.tp), None, dtype=object))
        if self.fp4 is None:
            object.__setattr__(self, "fp4", np.zeros(len(self.tp), dtype=bool))
        if self.fp8_delayed is None:
            object.__setattr__(self, "fp8_delayed", np.zeros(len(self.tp), dtype=bool))
        if self.quant_bytes is None:
            object.__setattr__(self, "quant_bytes", np.ones(len(self.tp)))

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def take(self, index) -> "Layouts":
        """Rows `index` (an int array or boolean mask)."""
        return Layouts(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def _decoder_split(self, i: int) -> bool:
        """Whether row i's first/last are --decoder-first/last-pipeline-num-layers (not a layout's or account_for_*'s
        end ranks)."""
        return self.layout[i] is None and not self.account[i]

    def strategy(self, i: int) -> Strategy:
        """Row i as a Strategy."""
        rc = RECOMPUTE_NAMES[int(self.recompute[i])]
        full = rc == "full"
        return Strategy(
            tp=int(self.tp[i]), pp=int(self.pp[i]), vpp=int(self.vpp[i]), cp=int(self.cp[i]), ep=int(self.ep[i]),
            etp=int(self.etp[i]), dp=int(self.dp[i]), mbs=int(self.mbs[i]), sp=bool(self.sp[i]),
            zero=int(self.zero[i]), recompute=rc,
            recompute_method=("block" if self.recompute_block[i] else "uniform") if full else None,
            recompute_layers=int(self.recompute_layers[i]) if full else None,
            recompute_modules=_modules_field(rc, int(self.recompute_modules[i])),
            fp8="hybrid" if self.fp8[i] else "none", fp8_recipe="nvfp4" if self.fp4[i] else None,
            first_stage_layers=int(self.first[i]) if self.first[i] >= 0 and self._decoder_split(i) else None,
            last_stage_layers=int(self.last[i]) if self.last[i] >= 0 and self._decoder_split(i) else None,
            account_for_embedding=bool(self.account[i] & 1), account_for_loss=bool(self.account[i] & 2),
            pipeline_layout=self.layout[i],
            cuda_graph_modules=G.names_of(int(self.cuda_graph_modules[i])) or None, **K.values_of(self, i),
        )


def _modules_field(recompute: str, bits: int):
    """Strategy.recompute_modules for a row: None for Megatron's default set (and when not selective)."""
    if recompute != "selective" or bits == R.mask(R.DEFAULT):
        return None
    return R.names_of(bits)


def layouts_from_strategies(strategies: Sequence[Strategy], num_gpus: int, engine: str = "megatron",
                            gpu_id: Optional[str] = None) -> Layouts:
    """Stack strategies; dp is derived as world / (tp * pp * cp) when a strategy leaves it out. `engine` decides
    whether the vocabulary is sharded over tp (Megatron's VocabParallelEmbedding) or replicated (DeepSpeed AutoTP
    keeps embedding and LM head whole: deepspeed module_inject/auto_tp.py shards Linear layers only)."""

    def col(fn, dtype=np.int64):
        return np.array([fn(s) for s in strategies], dtype=dtype)

    ends = [_end_ranks(s) for s in strategies]

    return Layouts(
        tp=col(lambda s: s.tp), pp=col(lambda s: s.pp), vpp=col(lambda s: s.vpp), cp=col(lambda s: s.cp),
        ep=col(lambda s: s.ep), etp=col(lambda s: s.etp),
        dp=col(lambda s: s.dp or max(1, num_gpus // (s.tp * s.pp * s.cp))),
        mbs=col(lambda s: s.mbs), sp=col(lambda s: s.sp and s.tp > 1, bool), zero=col(lambda s: s.zero),
        recompute=col(lambda s: RECOMPUTE_CODES[s.recompute]),
        recompute_block=col(lambda s: s.recompute_method == "block", bool),
        recompute_layers=col(lambda s: s.recompute_layers or 0),
        recompute_modules=col(lambda s: R.mask(s.recompute_modules)),
        fp8=col(lambda s: s.uses_fp8, bool),
        first=np.array([first for first, _ in ends], dtype=np.int64),
        last=np.array([last for _, last in ends], dtype=np.int64),
        account=col(lambda s: int(s.account_for_embedding) + 2 * int(s.account_for_loss)),
        layout=col(lambda s: s.pipeline_layout, object),
        vocab_tp=col(lambda s: engine != "deepspeed", bool),
        fused_permute=col(lambda s: engine != "deepspeed", bool),
        deepspeed=col(lambda s: engine == "deepspeed", bool),
        cuda_graph_modules=col(lambda s: G.mask(s.cuda_graph_modules)),
        **K.columns_of(strategies),
        fp4=col(lambda s: s.uses_fp8 and s.fp8_recipe == "nvfp4", bool),
        fp8_delayed=col(lambda s: s.uses_fp8 and _recipe(s, gpu_id) == "delayed", bool),
        quant_bytes=col(lambda s: QUANTISED_BYTES[_recipe(s, gpu_id) or "delayed"], float),
    )


def _end_ranks(s: Strategy):
    """(first, last) layer counts Layouts holds: the explicit ones, a layout string's end ranks, else -1 (even, or
    account_for_*, which costmodel/stages.py resolves with the model's layer count)."""
    if s.pipeline_layout:
        from autoplan.pipeline_split import layout_rank_counts

        counts = layout_rank_counts(s.pipeline_layout, s.pp)
        return counts[0], counts[-1]
    return (-1 if s.first_stage_layers is None else s.first_stage_layers,
            -1 if s.last_stage_layers is None else s.last_stage_layers)


def _recipe(s: Strategy, gpu_id: Optional[str]) -> Optional[str]:
    """The FP8 recipe a strategy runs with on `gpu_id` (validate.effective_fp8_recipe); without a GPU, the one it
    names."""
    from autoplan.validate import effective_fp8_recipe

    return effective_fp8_recipe(s.fp8_recipe, gpu_id) if gpu_id else s.fp8_recipe
