"""Megatron-LM's selective-recompute modules (`--recompute-granularity selective --recompute-modules ...`,
megatron/core/transformer/transformer_config.py `recompute_modules`) and their encoding as a bit mask.

What each module rebuilds in backward instead of holding (megatron/core/transformer/transformer_layer.py,
attention.py, moe/experts.py, multi_latent_attention.py):
- core_attn: the core attention (with flash attention only its softmax statistics are dropped; Megatron's default);
- layernorm: the input and pre-MLP norms, so their outputs (the QKV / FC1 / router inputs) are not held;
- moe_act: the routed experts' activation function, so its output (the FC2 input) is not held;
- mla_up_proj: MLA's up projections, so the per-head q, k, v are not held;
- mlp: the dense MLP block of dense layers, all but its input;
- moe: the MoE block (router, dispatch, experts, combine), all but its input;
- shared_experts: the shared experts' MLP, all but its input."""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import numpy as np

MODULES: Tuple[str, ...] = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe", "shared_experts")
BIT = {name: 1 << i for i, name in enumerate(MODULES)}
DEFAULT: Tuple[str, ...] = ("core_attn",)  # Megatron's default when the modules are not given
SHORT = {"core_attn": "attn", "layernorm": "ln", "moe_act": "act", "mla_up_proj": "mla", "mlp": "mlp", "moe": "moe",
         "shared_experts": "shexp"}


def canonical(names: Optional[Iterable[str]]) -> Tuple[str, ...]:
    """Sorted in MODULES order, without repeats; None -> Megatron's default."""
    if names is None:
        return DEFAULT
    chosen = set(names)
    return tuple(m for m in MODULES if m in chosen)


def mask(names: Optional[Iterable[str]]) -> int:
    return sum(BIT[m] for m in canonical(names))


def has(bits, *names: str) -> np.ndarray:
    """Per candidate: whether any of `names` is among the modules of the bit masks `bits`."""
    return np.bitwise_and(bits, mask(names)) > 0


def names_of(bits: int) -> Tuple[str, ...]:
    return tuple(m for m in MODULES if bits & BIT[m])


def ladder(is_moe: bool, mla: bool) -> Tuple[Tuple[str, ...], ...]:
    """The selective settings the search tries, from the least to the most recompute time, the second holding a
    subset of the first's memory: Megatron's default, then the cheap modules (norms and the expert activation,
    with MLA's up projections: what Megatron-Bridge's MoE recipes use). Whole MLP/MoE blocks cost about as much
    as full recompute of those layers and are left to `--fix recompute_modules=...`."""
    cheap = ["core_attn", "layernorm"] + (["moe_act"] if is_moe else []) + (["mla_up_proj"] if mla else [])
    return DEFAULT, canonical(cheap)
