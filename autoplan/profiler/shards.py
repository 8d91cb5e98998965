"""Per-rank sizes of each layer under tensor and expert parallelism (no torch), and the checks on tp/ep.

Sharding follows Megatron-LM: attention heads, query groups, MLP width and vocabulary split over tp
(`megatron/core/transformer/attention.py`, `mlp.py`, `tensor_parallel/layers.py`); query groups fewer than tp are
replicated so each rank holds one (`TransformerConfig`: groups must divide or be a multiple of tp); routed experts
split over ep with expert width split over etp = tp (Megatron's default `expert_tensor_parallel_size`);
the vocabulary is padded to a multiple of 128 * tp (`megatron/training/tokenizer/tokenizer.py`,
`_vocab_size_with_padding`, make-vocab-size-divisible-by 128)."""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import InputError
from autoplan.model import ModelSpec

VOCAB_PAD_MULTIPLE = 128


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class ShardDims:
    """One rank's sizes for a given (tp, ep)."""

    heads: int  # query heads on this rank
    groups: int  # key/value heads on this rank
    ffn: int  # dense MLP inner width on this rank
    vocab: int  # padded vocabulary rows on this rank
    local_experts: int  # routed experts on this rank
    expert_ffn: int  # routed expert inner width on this rank
    shared_ffn: int  # shared-expert inner width on this rank


def check_tp(model: ModelSpec, tp: int) -> None:
    """One-line InputError when `tp` cannot shard the model's heads, groups or MLP."""
    a, g = model.num_attention_heads, model.num_query_groups
    if a % tp:
        raise InputError(f"tp={tp} must divide num_attention_heads={a}; valid tp: {_divisors(a)}")
    if not model.multi_latent_attention and g % tp and tp % g:
        raise InputError(f"num_query_groups={g} must be a multiple or a divisor of tp={tp}; "
                         f"choose tp among the divisors of {a} that divide or are multiples of {g}")
    if model.ffn_hidden_size % tp:
        raise InputError(f"tp={tp} must divide ffn_hidden_size={model.ffn_hidden_size}; "
                         f"valid tp: {_divisors(model.ffn_hidden_size)}")
    if model.is_moe and model.moe_ffn_hidden_size % tp:
        raise InputError(f"tp={tp} (expert tensor parallelism = tp) must divide moe_ffn_hidden_size="
                         f"{model.moe_ffn_hidden_size}; valid tp: {_divisors(model.moe_ffn_hidden_size)}")


def check_ep(model: ModelSpec, ep: int) -> None:
    """One-line InputError when `ep` does not divide the routed experts (or the model is dense)."""
    if ep == 1:
        return
    if not model.is_moe:
        raise InputError(f"ep={ep} needs an MoE model, but {model.name} is dense; use --ep 1")
    if model.num_experts % ep:
        raise InputError(f"ep={ep} must divide num_experts={model.num_experts}; "
                         f"valid ep: {_divisors(model.num_experts)}")


def shard_dims(model: ModelSpec, tp: int, ep: int = 1) -> ShardDims:
    """Per-rank sizes; raises InputError on an invalid tp/ep."""
    check_tp(model, tp)
    check_ep(model, ep)
    groups = model.num_query_groups
    padded_vocab = -(-model.vocab_size // (VOCAB_PAD_MULTIPLE * tp)) * VOCAB_PAD_MULTIPLE * tp
    shared = model.shared_expert_ffn_hidden_size
    return ShardDims(
        heads=model.num_attention_heads // tp,
        groups=groups // tp if groups >= tp else 1,
        ffn=model.ffn_hidden_size // tp,
        vocab=padded_vocab // tp,
        local_experts=model.num_experts // ep if model.is_moe else 0,
        expert_ffn=model.moe_ffn_hidden_size // tp if model.is_moe else 0,
        shared_ffn=-(-shared // tp) if shared else 0,
    )


def tokens_per_local_expert(model: ModelSpec, ep: int, tokens: int) -> int:
    """Balanced routing: the ep ranks' tokens * k spread evenly over the E experts, i.e. ep * tokens * k / E rows
    per expert, so a rank's E/ep experts process tokens * k rows in all (rounded up to whole rows per expert)."""
    local = model.num_experts // ep
    return -(-tokens * model.moe_router_topk // local)
