"""Hybrid Mamba / attention models (Megatron MambaModel: Nemotron-H, Nemotron-3): parameters, compute time and
activation memory of each layer kind of `ModelSpec.hybrid_layer_pattern`.

Layer kinds (megatron/core/ssm/mamba_hybrid_layer_allocation.py): 'M' a Mamba-2 mixer, '*' self-attention, '-' a
dense MLP, 'E' an MoE block; each is one residual layer with its own pre-norm (megatron/core/ssm/mamba_block.py).
The rest of the cost model sees two layer kinds, "dense" and "MoE" (`ModelSpec.is_moe_layer` is the pattern's
'E'); for a hybrid the dense figures here are the mean over the pattern's M, * and - layers, which is exact for a
rank that holds the whole pattern (pp = 1) and the pattern-wide mix otherwise.

Mamba-2 mixer shapes (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060, sec. 7; megatron/core/ssm/
mamba_mixer.py): d_inner = heads x head_dim; in_proj h -> [z, x, B, C, dt] = 2 d_inner + 2 G N + heads
(column-parallel: heads and groups split over tp); a depthwise causal conv1d of width d_conv over x, B, C; the
chunked SSD scan; a gated RMSNorm over d_inner; out_proj d_inner -> h (row-parallel).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.layers.base import (BF16, FP32, LayerTime, Layouts, Shard, dropout_mask_bytes,
                                            elementwise_time, gemm_input_bytes, gemm_time, kernel_costs,
                                            module_layouts, norm_linear_input_bytes, scoped)
from autoplan.costmodel.layers.dense import (attention_activation_bytes, attention_core_time, attention_gemm_time,
                                             mlp_activation_bytes, mlp_gemm_time, softmax_stats_bytes)
from autoplan.costmodel.layers.moe import (HYBRID_MOE_KERNELS, elementwise_bytes, moe_activation_bytes,
                                           moe_gemm_time, routing_index_bytes, routing_weight_bytes,
                                           unfused_expert_extras, weighted_activation_bytes)
from autoplan.costmodel.params import mamba_conv_channels, mamba_in_proj_width, non_moe_counts
from autoplan.model import ModelSpec
from autoplan.recompute import has




SSD_CHUNK = 128  # megatron/core/ssm/mamba_mixer.py MambaMixer chunk_size default


def ssd_flops_per_token(m: ModelSpec, heads, groups) -> np.ndarray:
    """Forward FLOPs of the chunked SSD scan per token on a rank with `heads` heads and `groups` groups
    (arXiv:2405.21060 sec. 6, chunk length Q): intra-chunk C B^T (2 Q N per group) and its product with x
    (2 Q P per head), the chunk states B^T x and the state-to-output C h (2 N P per head each)."""
    q, n, p = SSD_CHUNK, m.mamba_state_dim, m.mamba_head_dim
    return 2.0 * q * n * groups + 2.0 * q * p * heads + 4.0 * n * p * heads


@dataclass(frozen=True)
class MixerTime:
    gemm: np.ndarray  # in_proj + out_proj, forward
    scan: np.ndarray  # SSD scan, forward
    elementwise: np.ndarray  # conv1d, gated norm, the layer's norm and residual


def ssd_bytes_per_token(m: ModelSpec, heads, groups) -> np.ndarray:
    """HBM bytes per token of the chunked SSD forward (mamba_ssm ops/triton/ssd_combined.py
    `_mamba_chunk_scan_combined_fwd`: chunk_cumsum, chunk_state, state_passing, bmm_chunk, chunk_scan): x read
    twice and y written (bf16); B and C read three times (bf16); the fp32 chunk states (heads x P x N per chunk
    of Q tokens) written by chunk_state, read and written by state_passing, read by chunk_scan; the fp32 C B^T
    scores (groups x Q per token) written and read. The unfused five-kernel SSD is bound by memory bandwidth and
    launch latency rather than FLOPs (PyTorch blog, "Accelerating Mamba2 with kernel fusion", 2025), hence the
    max(FLOPs, bytes) in `mamba_mixer_time` and one launch floor per kernel."""
    p, n, q = m.mamba_head_dim, m.mamba_state_dim, SSD_CHUNK
    x_y = 3 * BF16 * heads * p
    b_c = 3 * 2 * BF16 * groups * n
    states = 4 * FP32 * heads * p * n / q
    scores = 2 * FP32 * groups * q
    return x_y + b_c + states + scores


def mamba_mixer_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration) -> MixerTime:
    """Forward seconds of one Mamba layer on a rank. The SSD scan (Triton kernels) takes the longer of its
    FLOPs at the flash-attention forward efficiency (assumed: no published SSD kernel microbenchmark in
    profiles/) and its HBM traffic (`ssd_bytes_per_token`); the conv1d, the gated RMSNorm and the layer's norm
    and residual are HBM-bound."""
    T, h = sh.tokens, m.hidden_size
    heads = m.mamba_num_heads / lay.tp
    groups = np.maximum(m.mamba_num_groups / lay.tp, 1.0)
    d_local = heads * m.mamba_head_dim
    cal = scoped(cal, lay, "mamba")
    # in_proj takes the layer's norm fused in (TELayerNormColumnParallelLinear in Megatron's Mamba layer spec).
    # out_proj at the precision the model's per-module recipe gives it (base.module_layouts: "mamba_out_proj").
    gemm = gemm_time(T, mamba_in_proj_width(m) / lay.tp, h, lay, hw, cal, norm_fused_input=True) + \
        gemm_time(T, h, d_local, module_layouts(m, lay, "mamba_out_proj"), hw, cal, dy_rows=sh.tokens_sp)
    scan_compute = T * ssd_flops_per_token(m, heads, groups) / (hw.peak_flops_bf16 * cal.attention_eff_fwd)
    scan_memory = T * ssd_bytes_per_token(m, heads, groups) / (hw.hbm_bytes_per_s * cal.hbm_eff)
    scan = np.maximum(scan_compute, scan_memory) + 5 * cal.kernel_overhead_s
    conv = 2 * BF16 * T * mamba_conv_channels(m) / lay.tp  # read + write
    gated_norm = 3 * BF16 * T * d_local  # read y and z, write the normed output
    layer = (2 + 3) * BF16 * sh.tokens_sp * h  # pre-norm (r+w) and residual add (2r+w)
    # Megatron's training path turns the in_proj output [s, b, d] into [b, s, d] and the scan's output back with
    # `.contiguous()` (megatron/core/ssm/mamba_mixer.py `_ssm_training`): real copies once the micro batch is above
    # 1, forward and (their gradients) backward; priced as forward equivalents, 2/3 of a read + write each, since the
    # caller takes backward elementwise work as twice the forward.
    layout = np.where(lay.mbs > 1, 2 * BF16 * T * (mamba_in_proj_width(m) / lay.tp + d_local), 0.0) * 2.0 / 3.0
    copies = np.where(lay.mbs > 1, 4.0 / 3.0, 0.0)
    return MixerTime(gemm, scan, elementwise_time(conv + gated_norm + layer + layout, hw, cal, 6 + copies))


def symbol_time(m: ModelSpec, sh: Shard, lay: Layouts, seq_len: int, hw: Hardware, cal: Calibration,
                symbol: str) -> LayerTime:
    """Forward seconds of one hybrid layer of kind `symbol` (M, *, - or E), its pre-norm and residual included."""
    zero = 0.0 * sh.tokens
    layer_elem = (2 + 3) * BF16 * sh.tokens_sp * m.hidden_size  # pre-norm (r+w) and residual add (2r+w)
    if symbol == "E":
        elem = elementwise_bytes(m, sh, lay, True, attention=False) + layer_elem
        extra_bytes, extra_ops = unfused_expert_extras(m, sh, lay)
        elem_time = elementwise_time(elem + extra_bytes, hw, cal, 0) + \
            kernel_costs(lay, cal, HYBRID_MOE_KERNELS + (("moe", extra_ops),))
        return LayerTime(zero, zero, moe_gemm_time(m, sh, lay, hw, cal), elem_time)
    if symbol == "M":
        mixer = mamba_mixer_time(m, sh, lay, hw, cal)
        return LayerTime(mixer.gemm, zero, zero, mixer.elementwise, mixer.scan)
    if symbol == "*":
        rotary = 2 * (sh.heads + sh.groups) * m.kv_channels * BF16 * sh.tokens \
            if m.position_embedding == "rope" else 0.0
        cal = scoped(cal, lay, "attn")
        return LayerTime(attention_gemm_time(m, sh, lay, hw, cal),
                           attention_core_time(m, sh, lay, seq_len, hw, cal), zero,
                           elementwise_time(layer_elem + rotary, hw, cal, 4))
    act = (3 if m.gated_mlp else 2) * m.ffn_hidden_size / lay.tp * BF16 * sh.tokens
    cal = scoped(cal, lay, "mlp")
    mlp = mlp_gemm_time(m, m.ffn_hidden_size, sh.tokens, lay, hw, cal, lay.tp, tokens_sp=sh.tokens_sp)
    return LayerTime(zero, zero, mlp,
                       elementwise_time(layer_elem + act, hw, cal, 4))


def hybrid_layer_time(m: ModelSpec, sh: Shard, lay: Layouts, seq_len: int, hw: Hardware, cal: Calibration,
                      moe: bool) -> LayerTime:
    """Forward seconds of a hybrid 'E' layer (`moe`), or the mean of the pattern's M, * and - layers."""
    if moe:
        return symbol_time(m, sh, lay, seq_len, hw, cal, "E")
    counts = dict(zip("M*-", non_moe_counts(m)[:3]))
    n = non_moe_counts(m)[3]
    parts = {k: symbol_time(m, sh, lay, seq_len, hw, cal, k) for k, c in counts.items() if c}

    def mean(field):
        return sum(counts[k] * getattr(t, field) for k, t in parts.items()) / n + 0.0 * sh.tokens

    return LayerTime(mean("attn_gemm"), mean("attn_core"), mean("mlp_gemm"), mean("elementwise"), mean("scan"))


def mamba_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """Bytes one Mamba layer holds for backward with no recompute: the pre-norm input, in_proj's input (the norm
    output), its output [z, x, B, C, dt], the conv1d output, the scan output y, the fp32 dt after softplus, the
    gated norm's output (out_proj's input). Megatron trains through the fused `mamba_split_conv1d_scan_combined`
    (mamba_mixer.py, `use_mamba_mem_eff_path` on by default; mamba_ssm ops/triton/ssd_combined.py), which saves
    zxbcdt and the scan output and recomputes the conv output and dt in backward, while the gated RMSNorm after
    it saves its gated input and fp32 1/rms per group: the conv output and fp32 dt counted here are larger than
    those two, so the sum is an upper bound."""
    region = sh.tokens_sp * m.hidden_size
    d_local = m.mamba_d_inner / lay.tp
    heads = m.mamba_num_heads / lay.tp
    return (BF16 * region + norm_linear_input_bytes(lay) * region  # in_proj fuses the norm (LayerNormLinear)
            + BF16 * sh.tokens * mamba_in_proj_width(m) / lay.tp
            + BF16 * sh.tokens * mamba_conv_channels(m) / lay.tp
            + BF16 * sh.tokens * d_local + FP32 * sh.tokens * heads
            + gemm_input_bytes(module_layouts(m, lay, "mamba_out_proj")) * sh.tokens * d_local)


def latent_moe_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """An MoE layer whose routed experts run on the latent width: the memory.py itemisation with the routed
    copies `latent` wide, plus fc1_latent_proj's input and fc2_latent_proj's input."""
    if not m.moe_latent_size:
        return moe_activation_bytes(m, sh, lay)
    g_in = gemm_input_bytes(lay)
    latent, f = m.moe_latent_size, m.moe_ffn_hidden_size / lay.etp
    copies = sh.expert_tokens
    region = sh.tokens_sp * m.hidden_size
    routed = (g_in * copies * latent + BF16 * copies * (2 if m.gated_mlp else 1) * f + g_in * copies * f
              + routing_weight_bytes(copies) + weighted_activation_bytes(m, lay, copies, f)
              + FP32 * sh.tokens_sp * m.num_experts + routing_index_bytes(m, sh, lay))
    # inputs of fc1_latent_proj and fc2_latent_proj, at their per-module precision (base.module_layouts)
    g_proj = gemm_input_bytes(module_layouts(m, lay, "latent_proj"))
    projections = g_proj * region + g_proj * sh.tokens * latent
    base = 2 * BF16 * region + dropout_mask_bytes(m, region)
    shared = 0.0
    if m.shared_expert_ffn_hidden_size:
        shared = mlp_activation_bytes(m, sh, lay, m.shared_expert_ffn_hidden_size, sh.tokens, lay.tp,
                                        fused_norm=False) - (BF16 * region + dropout_mask_bytes(m, region))
    return base + routed + projections + shared


def hybrid_layer_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts, moe: bool):
    """(no recompute, selective recompute, full-recompute checkpoint) bytes of a hybrid 'E' layer (`moe`) or the
    mean of the M, * and - layers. Selective recompute drops what Megatron's modules rebuild in these layers:
    core_attn the softmax statistics of '*' layers, moe_act / moe the expert activation / the routed block of 'E'
    layers (memory.py `selective_dropped_bytes` for those tensors); Mamba layers have no selective module."""
    checkpoint = BF16 * sh.tokens_sp * m.hidden_size
    if moe:
        none = latent_moe_activation_bytes(m, sh, lay)
        g_in = gemm_input_bytes(lay)
        copies = sh.expert_tokens
        f = m.moe_ffn_hidden_size / lay.etp
        act_out = g_in * copies * f + weighted_activation_bytes(m, lay, copies, f)
        routed = none - 2 * BF16 * sh.tokens_sp * m.hidden_size
        dropped = np.where(has(lay.recompute_modules, "moe"), routed,
                           np.where(has(lay.recompute_modules, "moe_act"), act_out, 0.0))
        return none, none - dropped, checkpoint
    n_m, n_a, n_f, n = non_moe_counts(m)
    mamba = mamba_activation_bytes(m, sh, lay) if n_m else 0.0
    attn = attention_activation_bytes(m, sh, lay) if n_a else 0.0
    mlp = mlp_activation_bytes(m, sh, lay, m.ffn_hidden_size, sh.tokens, lay.tp) if n_f else 0.0
    none = (n_m * mamba + n_a * attn + n_f * mlp) / n + 0.0 * sh.tokens
    dropped = np.where(has(lay.recompute_modules, "core_attn"), n_a * softmax_stats_bytes(sh) / n, 0.0)
    return none, none - dropped, checkpoint


def symbol_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts, symbol: str):
    """Bytes one hybrid layer of kind `symbol` holds with no recompute."""
    held = {"E": latent_moe_activation_bytes, "M": mamba_activation_bytes, "*": attention_activation_bytes}
    if symbol in held:
        return held[symbol](m, sh, lay)
    return mlp_activation_bytes(m, sh, lay, m.ffn_hidden_size, sh.tokens, lay.tp)
