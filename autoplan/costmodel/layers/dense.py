"""A dense transformer layer: attention (GQA or MLA; core attention at a flash-attention efficiency) and the
dense MLP, their forward time on one rank and the activations they save for backward.

Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198) sec. 4.1 / Table 2, each tensor sized from the real shapes, flash attention's output and fp32
log-sum-exp in place of the s^2 scores (Dao et al. 2022); see `costmodel/memory.py`."""
from __future__ import annotations

import numpy as np

from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.layers.base import (BF16, FP8, FP32, Layouts, Shard, dropout_mask_bytes, gemm_input_bytes,
                                            gemm_time, module_layouts, norm_linear_input_bytes)
from autoplan.model import ModelSpec


# Memory-bound kernels of one dense layer per CUDA-graph part (norms, rotary, residual adds, activation), read off
# Megatron's layer code path (transformer_layer.py), fused kernels counted once.
DENSE_KERNELS = (("attn", 5), ("mlp", 5))


def attention_gemm_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration):
    """QKV (or MLA's projections) and the output projection. linear_qkv and linear_proj run at the precision the
    model's per-module recipe gives "attention_linear" (base.module_layouts); MLA's projections other than
    linear_proj have other module names and keep the run's."""
    T, h = sh.tokens, m.hidden_size
    own = module_layouts(m, lay, "attention_linear")
    if m.multi_latent_attention:
        # Megatron MLA: the down projections are replicated across TP; the up projections are column-parallel.
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        t = gemm_time(T, m.kv_lora_rank + m.qk_pos_emb_head_dim, h, lay, hw, cal)
        t = t + gemm_time(T, sh.heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank, lay, hw, cal)
        if m.q_lora_rank:
            t = t + gemm_time(T, m.q_lora_rank, h, lay, hw, cal)
            t = t + gemm_time(T, sh.heads * qk, m.q_lora_rank, lay, hw, cal)
        else:
            t = t + gemm_time(T, sh.heads * qk, h, lay, hw, cal)
        return t + gemm_time(T, h, sh.heads * m.v_head_dim, own, hw, cal, dy_rows=sh.tokens_sp)
    d = m.kv_channels
    qkv = gemm_time(T, (sh.heads + 2 * sh.groups) * d, h, own, hw, cal, norm_fused_input=True)
    return qkv + gemm_time(T, h, sh.heads * d, own, hw, cal, dy_rows=sh.tokens_sp)


def attention_core_time(m: ModelSpec, sh: Shard, lay: Layouts, seq_len: int, hw: Hardware, cal: Calibration,
                        window: int = 0):
    """Causal flash attention forward (bf16 even under FP8 recipes, as in TransformerEngine)."""
    dims = (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim) if m.multi_latent_attention else 2 * m.kv_channels
    # `window` counts the query itself (HF sliding_window = Megatron --window-size left + 1), as in flops.py.
    keys = seq_len / 2.0 if not window else min(float(window), seq_len / 2.0)
    flops = 2.0 * sh.tokens * keys * sh.heads * dims
    return flops / (hw.peak_flops_bf16 * attention_efficiency(m, cal) * hw.attention_scale) + cal.kernel_overhead_s


def attention_efficiency(m: ModelSpec, cal: Calibration) -> float:
    """Flash-attention forward efficiency for the model's head dim: `attention_eff_fwd` holds at head dim 128;
    smaller heads do less work per K/V tile load (FlashAttention-3, Shah et al. 2024, Fig. 5: H100 causal
    forward ~0.75x at head dim 64 and ~1.15x at 256 relative to 128), modelled as d / (d + d0)."""
    d = (m.qk_head_dim + m.qk_pos_emb_head_dim) if m.multi_latent_attention else m.kv_channels
    d0 = cal.attention_head_dim_half
    return cal.attention_eff_fwd * (d / (d + d0)) / (128.0 / (128.0 + d0))


def mlp_gemm_time(m: ModelSpec, ffn, tokens, lay: Layouts, hw: Hardware, cal: Calibration, shards,
                  norm_fused_input=True, tokens_sp=None):
    """FC1 + FC2. FC1 takes the layer's pre-MLP norm fused in (TELayerNormColumnParallelLinear) unless
    `norm_fused_input` is off (a shared expert reads the norm's output beside the router); FC2 (row-parallel) casts
    the output gradient of its `tokens_sp` tokens (compute.cast_bytes)."""
    up = (2 if m.gated_mlp else 1) * ffn / shards
    fc1 = gemm_time(tokens, up, m.hidden_size, lay, hw, cal, norm_fused_input=norm_fused_input)
    return fc1 + gemm_time(tokens, m.hidden_size, ffn / shards, lay, hw, cal, dy_rows=tokens_sp)


def qkv_input_bytes(m: ModelSpec, lay: Layouts):
    """Bytes per element of the saved QKV input (the input-norm output): a fused norm + linear's
    (`norm_linear_input_bytes`), except MLA, whose down projections are plain linears after a separate norm."""
    return gemm_input_bytes(lay) if m.multi_latent_attention else \
        norm_linear_input_bytes(module_layouts(m, lay, "attention_linear"))


def mla_qkv_bytes(m: ModelSpec, sh: Shard):
    """MLA's per-head q, k, v (the up projections' outputs), bf16."""
    return BF16 * sh.tokens * sh.heads * (2 * (m.qk_head_dim + m.qk_pos_emb_head_dim) + m.v_head_dim)


def softmax_stats_bytes(sh: Shard):
    """Flash attention's fp32 log-sum-exp per token and head (Dao et al. 2022)."""
    return FP32 * sh.tokens * sh.heads


def attention_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """Bytes the attention block of one layer holds with no recompute."""
    h = m.hidden_size
    region = sh.tokens_sp * h  # elements of a [s/tp or s, b, h] tensor
    norm_in = BF16 * region
    qkv_in = qkv_input_bytes(m, lay) * region  # norm output, saved sharded under SP and re-gathered in backward
    if m.multi_latent_attention:
        # Down-projected latents (saved for the up-projection wgrad) and the per-head q, k, v.
        latents = BF16 * sh.tokens * (m.kv_lora_rank + m.qk_pos_emb_head_dim + (m.q_lora_rank or 0))
        qkv = mla_qkv_bytes(m, sh) + latents
    else:
        qkv = BF16 * sh.tokens * (sh.heads + 2 * sh.groups) * m.kv_channels
    dropout_mask = dropout_mask_bytes(m, region)  # after the output projection
    return norm_in + qkv_in + qkv + qk_norm_bytes(m, sh) + attention_output_bytes(m, sh, lay) + \
        softmax_stats_bytes(sh) + dropout_mask


def qk_norm_bytes(m: ModelSpec, sh: Shard):
    """What a q/k norm adds to the saved tensors: it keeps its input, the QKV projection's q and k (views of the
    QKV output already counted), so the normed, rotated q and k that flash attention saves are a second bf16 copy,
    plus the norm's fp32 1/rms per head (per-head norm, Qwen3 / Megatron --qk-layernorm) or per token (a norm over
    the whole projection, OLMo-2 / MiniMax-M2) (megatron/core/transformer/attention.py
    get_query_key_value_tensors: q_layernorm / k_layernorm on the split linear_qkv output, then RoPE)."""
    if not m.qk_layernorm or m.multi_latent_attention:
        return 0.0 * sh.tokens
    stats = (sh.heads + sh.groups) if m.qk_norm_scope == "head" else 2.0
    return BF16 * sh.tokens * (sh.heads + sh.groups) * m.kv_channels + FP32 * sh.tokens * stats


def attention_output_elements(m: ModelSpec, sh: Shard):
    """Elements of core attention's output for one layer and micro batch (heads x value dim per token)."""
    return sh.tokens * sh.heads * (m.v_head_dim if m.multi_latent_attention else m.kv_channels)


def attention_output_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """Core attention's output: saved bf16 by flash attention for its backward and, as linear_proj's input, once
    more as linear_proj's own FP8 copy under delayed scaling: Megatron makes linear_proj save the original input
    only for the other FP8 recipes (megatron/core/transformer/attention.py and multi_latent_attention.py
    `set_save_original_input(self.linear_proj)` when `fp8_recipe != 'delayed'`, TE >= 2.6: "linear_proj also
    saves the quantized tensor of this output")."""
    return (BF16 + np.where(lay.fp8_delayed, FP8, 0.0)) * attention_output_elements(m, sh)


def cp_forward_working_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """Bytes a context-parallel ring attention (TransformerEngine AttnFuncWithCPAndKVP2P, Megatron's default
    --cp-comm-type p2p) holds during one layer's forward, beyond what the layer saves: every received K/V chunk
    (`p2p_comm_buffers`, one per ring step, none freed before the forward returns, the first a copy of the local
    K/V) and the per-step outputs and fp32 log-sum-exps (`out_per_step`, `softmax_lse_per_step`) kept for the final
    correction (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py; TE 1.12-2.20
    alike): cp x (K/V chunk + output + lse) + one K/V copy + lse, per local token. Zero without CP."""
    if m.multi_latent_attention:
        kv = BF16 * sh.heads * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim)
        v_dim = m.v_head_dim
    else:
        kv = BF16 * 2 * sh.groups * m.kv_channels
        v_dim = m.kv_channels
    per_step = kv + BF16 * sh.heads * v_dim + FP32 * sh.heads
    return np.where(lay.cp > 1, sh.tokens * (lay.cp * per_step + kv + FP32 * sh.heads), 0.0)


def mlp_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts, ffn: int, tokens, shards, fused_norm: bool = True):
    """`fused_norm`: FC1 fuses the pre-MLP norm (the dense MLP's LayerNormLinear); a MoE layer's shared experts take
    the norm output through a plain linear."""
    h = m.hidden_size
    region = sh.tokens_sp * h
    gate_up = (2 if m.gated_mlp else 1) * ffn / shards
    fc1_in = norm_linear_input_bytes(lay) if fused_norm else gemm_input_bytes(lay)
    return (BF16 * region  # norm input
            + fc1_in * region  # fc1 input (norm output)
            + BF16 * tokens * gate_up  # fc1 output (gate and up for SwiGLU)
            + gemm_input_bytes(lay) * tokens * ffn / shards  # activation output = fc2 input
            + dropout_mask_bytes(m, region))


def sandwich_norm_bytes(m: ModelSpec, sh: Shard):
    """The inputs the two extra norms of a `sandwich_norm` layer save for their backward: the attention block's and
    the MLP block's outputs before they join the residual (HF modeling_gemma2.py Gemma2DecoderLayer
    post_attention_layernorm / post_feedforward_layernorm, modeling_glm4.py post_self_attn_layernorm /
    post_mlp_layernorm), each a bf16 [s/tp (SP), b, h] tensor as the pre-norm inputs are (Korthikanti et al. 2022
    sec. 4.1, 2sbh per norm input), plus the fp32 statistics per token (RMSNorm 1/rms; LayerNorm mean, 1/std).
    Their outputs feed only the residual add, which saves nothing, so no selective module drops these bytes (kept
    under every one: an upper bound where a recompute module would rebuild the norm with its block)."""
    if not m.sandwich_norm:
        return 0.0 * sh.tokens_sp
    stats = 1 if m.normalization == "rmsnorm" else 2
    return 2 * (BF16 * sh.tokens_sp * m.hidden_size + stats * FP32 * sh.tokens_sp)
