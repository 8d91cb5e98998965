"""Model FLOPs per step, as Megatron-LM counts them for its TFLOP/s/GPU log line
(megatron/training/training.py `num_floating_point_operations`): 3 x forward (fwd + dgrad + wgrad), 2 FLOPs per
multiply-add, causal core attention counted at half, GQA/MLA projections, SwiGLU's three matrices, top-k routed
plus shared experts, the LM head; recompute not counted. Sliding-window layers count min(window, seq) keys; the
mixers of layers/mixers.py (Gated DeltaNet, gated, chunked and DeepSeek-sparse attention, a parallel Mamba-2 mixer)
count their own FLOPs, cited there."""
from __future__ import annotations

from autoplan.costmodel.layers.mamba import ssd_flops_per_token
from autoplan.costmodel.layers.mixers import (chunked_keys, dsa_indexer_flops_per_token, dsa_keys,
                                              gate_flops_per_token, gdn_flops_per_token)
from autoplan.costmodel.params import dsa_indexer_share, mamba_in_proj_width
from autoplan.model import ModelSpec


def attention_linear_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of the attention projections for one token (2 x weights used), the output gate of gated
    attention included (layers/mixers.py)."""
    h, a = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        q = h * a * qk if not m.q_lora_rank else m.q_lora_rank * (h + a * qk)
        kv = m.kv_lora_rank * (h + a * (m.qk_head_dim + m.v_head_dim)) + h * m.qk_pos_emb_head_dim
        return 2.0 * (q + kv + a * m.v_head_dim * h)
    q = a * m.kv_channels
    kv = 2 * m.num_query_groups * m.kv_channels
    return 2.0 * (h * (q + kv) + q * h) + gate_flops_per_token(m)


def attention_core_flops_per_token(m: ModelSpec, seq_len: int, window: float = 0) -> float:
    """Forward FLOPs of QK^T and PV for one token of a causal sequence (average over positions); under DSA the
    top-k keys plus the lightning indexer (layers/mixers.py)."""
    a = m.num_attention_heads
    if m.multi_latent_attention:
        dims = m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim
    else:
        dims = 2 * m.kv_channels
    if m.dsa_index_heads:  # the indexer runs in the layers with one of their own (a mean over the layers)
        return 2.0 * a * dims * dsa_keys(m.dsa_index_topk, seq_len) + \
            dsa_indexer_share(m) * dsa_indexer_flops_per_token(m, seq_len)
    # `window` counts the query itself (HF sliding_window = Megatron --window-size left + 1), as the kernel attends.
    keys = seq_len / 2.0 if not window else min(float(window), seq_len / 2.0)
    return 2.0 * a * dims * keys


def mlp_flops_per_token(m: ModelSpec, ffn: int) -> float:
    return 2.0 * (3 if m.gated_mlp else 2) * m.hidden_size * ffn


def layer_flops_per_token(m: ModelSpec, seq_len: int, moe: bool, window: float = 0, linear: bool = False) -> float:
    """Forward FLOPs of one decoder layer per token: its attention (a Gated DeltaNet mixer when `linear`; a
    parallel Mamba-2 mixer beside it when the model has one) and its MLP or MoE block."""
    if linear:
        f = gdn_flops_per_token(m)
    else:
        f = attention_linear_flops_per_token(m) + attention_core_flops_per_token(m, seq_len, window)
    if m.parallel_mamba:
        f += mamba_flops_per_token(m)
    if moe:
        f += m.moe_router_topk * mlp_flops_per_token(m, m.moe_ffn_hidden_size)
        f += mlp_flops_per_token(m, m.shared_expert_ffn_hidden_size) if m.shared_expert_ffn_hidden_size else 0.0
        f += 2.0 * m.hidden_size * m.num_experts  # router
    else:
        f += mlp_flops_per_token(m, m.ffn_hidden_size)
    return f


def mamba_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of one Mamba-2 mixer per token from its real shapes (in_proj h -> 2 d_in + 2 G N + heads,
    out_proj d_in -> h, the SSD scan of layers/mamba.py), for a parallel Mamba mixer (Falcon-H1)."""
    h = m.hidden_size
    return 2.0 * h * mamba_in_proj_width(m) + 2.0 * m.mamba_d_inner * h + \
        float(ssd_flops_per_token(m, m.mamba_num_heads, m.mamba_num_groups))


def hybrid_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token of a Mamba / attention hybrid exactly as Megatron-LM counts them
    (megatron/training/training.py `num_floating_point_operations` -> `hybrid_flops`, with its
    `attn_layer_flops`, `mlp_layer_flops`, `mamba_layer_flops` and `moe_layer_flops`): 3 x forward; a Mamba layer
    counts in_proj as h x (2 d_in + 2 G N + heads) and out_proj as d_in x h with d_in = 2h (that formula's own
    approximation, not heads x head_dim) plus 7 d_in N for the scan; a latent MoE counts its experts at the latent
    width and 4 h latent for the two projections; MTP depths as below."""
    h, s = m.hidden_size, seq_len
    d_in = 2 * h
    mamba = 2 * h * (2 * d_in + 2 * m.mamba_num_groups * m.mamba_state_dim + m.mamba_num_heads) \
        + 7 * d_in * m.mamba_state_dim + 2 * d_in * h
    p = m.kv_channels * m.num_attention_heads / h
    attn = 4 * h * p * (h + h * m.num_query_groups / m.num_attention_heads + s / 2)
    gated = 1.5 if m.gated_mlp else 1.0
    mlp = 4 * m.ffn_hidden_size * gated * h
    moe = 0.0
    if m.is_moe:
        width = m.moe_latent_size or h
        moe = 4 * width * m.moe_ffn_hidden_size * m.moe_router_topk * gated
        moe += 4 * h * m.moe_latent_size if m.moe_latent_size else 0.0
        moe += 4 * h * m.shared_expert_ffn_hidden_size * gated
    # MTP depths: Megatron counts the layers of the unified pattern (main | mtp | mtp ...) and one more LM head
    # per depth (`hybrid_flops` logits term x (1 + mtp_num_layers)); its eh_proj is not counted there.
    count = {k: m.layer_count(k) + m.mtp_num_layers * m.mtp_depth_pattern.count(k) for k in "*-ME"}
    fwd = count["*"] * attn + count["-"] * mlp + count["M"] * mamba + count["E"] * moe + \
        2 * h * m.vocab_size * (1 + m.mtp_num_layers)
    return 3.0 * fwd


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs (fwd + bwd, no recompute) per token for the whole model."""
    if m.is_hybrid:
        return hybrid_flops_per_token(m, seq_len)
    n_window = m.num_sliding_window_layers if m.sliding_window else 0
    n_linear, n_chunked = m.linear_attention_layers, m.num_chunked_attention_layers
    chunk_keys = chunked_keys(m.attention_chunk_size, seq_len) if n_chunked else 0
    fwd = 0.0
    for i in range(m.num_layers):
        moe = m.is_moe_layer(i)
        # gpt-oss alternates sliding and full layers, Qwen3-Next three Gated DeltaNet layers and one attention
        # layer, Llama-4 three chunked and one full: which ones does not change the total.
        window = m.sliding_window if i < n_window else (chunk_keys if i < n_chunked else 0)
        fwd += layer_flops_per_token(m, seq_len, moe, window, linear=i >= m.num_layers - n_linear)
    fwd += 2.0 * m.hidden_size * m.vocab_size  # LM head
    # MTP depths (Megatron training.py transformer_flops): each counts one more layer of the last layer's kind,
    # 2 x (3h + 2h^2) for its norms and eh_proj, and one more LM head: 2 h V x (mtp_num_layers + 1).
    h = m.hidden_size
    depth = layer_flops_per_token(m, seq_len, m.is_moe_layer(m.num_layers - 1), 0) \
        + 2.0 * (3 * h + 2 * h * h) + 2.0 * h * m.vocab_size
    fwd += m.mtp_num_layers * depth
    return 3.0 * fwd


def megatron_reference_flops(m: ModelSpec, batch: int, seq_len: int) -> float:
    """Megatron-LM's closed form for a dense GQA/MHA model without windows (used by tests as the oracle):
    training.py `transformer_flops`, expressed per its comments."""
    h, a, g, d = m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels
    ffn_factor = 3 if m.gated_mlp else 2
    tokens = batch * seq_len
    q = d * a
    self_attn = 3 * 2 * (h * (q + 2 * d * g) + q * h)
    core = 3 * 2 * q / 2 * 2
    mlp = 3 * 2 * ffn_factor * h * m.ffn_hidden_size
    per_layer = tokens * (self_attn + mlp) + batch * seq_len * seq_len * core
    return m.num_layers * per_layer + 3 * 2 * tokens * h * m.vocab_size
