"""CUDA-graph capture scopes (Megatron-LM `--cuda-graph-impl` / `--cuda-graph-modules`, formerly
`--cuda-graph-scope`; megatron/core/transformer/enums.py `CudaGraphModule`) and their encoding as a bit mask.

What each name captures, so that its ops are replayed from a graph instead of dispatched one by one from the host
(megatron/core/transformer/cuda_graphs.py, transformer_layer.py, moe/moe_layer.py):
- full_iteration: the whole forward-backward of every micro batch (Megatron `--cuda-graph-impl full_iteration`,
  megatron/core/full_cuda_graph.py): every op of the step, embedding and loss included;
- attn: a layer's attention half (input norm, QKV, core attention, output projection, residual);
- mlp: a dense layer's MLP half (pre-MLP norm, FC1, activation, FC2, residual);
- moe: a MoE layer's whole MoE half (router, dispatch, experts, combine); the engine allows it only where the
  token counts are static (drop-and-pad);
- moe_router: the router (gating GEMM, top-k, softmax, auxiliary loss);
- moe_preprocess: the dispatcher's preprocessing (per-expert token counts and the permutation maps);
- mamba: a Mamba layer's mixer (in/out projections, conv1d, SSD scan, gated norm)."""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import numpy as np

MODULES: Tuple[str, ...] = ("full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
FULL_ITERATION: Tuple[str, ...] = ("full_iteration",)  # the whole-step graph, which takes no other module
BIT = {name: 1 << i for i, name in enumerate(MODULES)}
SHORT = {"full_iteration": "full", "attn": "attn", "mlp": "mlp", "moe": "moe", "moe_router": "router",
         "moe_preprocess": "prep", "mamba": "mamba"}
# A part of the model is replayed from a graph when any of these names is captured: the whole iteration holds
# every part, the MoE block holds its router and preprocessing.
COVERED_BY = {"attn": ("attn",), "mlp": ("mlp",), "moe": ("moe",), "moe_router": ("moe", "moe_router"),
              "moe_preprocess": ("moe", "moe_preprocess"), "mamba": ("mamba",), "rest": ()}


def canonical(names: Optional[Iterable[str]]) -> Tuple[str, ...]:
    """In MODULES order without repeats; None -> () (no CUDA graphs)."""
    chosen = set(names or ())
    return tuple(m for m in MODULES if m in chosen)


def mask(names: Optional[Iterable[str]]) -> int:
    return sum(BIT[m] for m in canonical(names))


def is_full_iteration(names: Optional[Iterable[str]]) -> bool:
    """Whether a module set is the full-iteration graph (alone, as Megatron takes it)."""
    return tuple(names or ()) == FULL_ITERATION


def names_of(bits: int) -> Tuple[str, ...]:
    return tuple(m for m in MODULES if bits & BIT[m])


def captured(bits, part: str) -> np.ndarray:
    """Per candidate: whether the ops of `part` (a key of COVERED_BY; "rest" = embedding, loss and anything outside
    the per-layer scopes) run from a CUDA graph under the scope masks `bits`."""
    covering = mask(FULL_ITERATION + COVERED_BY[part])
    return np.bitwise_and(np.asarray(bits, dtype=np.int64), covering) > 0
