"""Token mixers beyond plain softmax attention, priced inside a standard decoder layer (ModelSpec fields of
autoplan/hf_recent.py and hf_config.py): FLOPs, forward time on one rank and the activations saved for backward.

- Gated DeltaNet linear attention (Qwen3-Next `linear_attention` layers; Yang, Kautz & Hatamizadeh 2024, "Gated
  Delta Networks", arXiv:2412.06464, sec. 3.2, the chunkwise WY algorithm; Megatron-LM megatron/core/ssm/
  gated_delta_net.py, which runs it through fla's `chunk_gated_delta_rule`, fla/ops/gated_delta_rule/chunk.py):
  a fused in_proj h -> [q, k, v, z, b, a] split over tp by heads, a depthwise causal conv1d and SiLU over q, k, v,
  the chunked delta rule, a gated RMSNorm per value head, out_proj back to h. Q and K heads are repeated to the
  value heads before the kernel (modeling_qwen3_next.py `repeat_interleave`), so it runs on the value heads.
- Gated attention (Qwen3-Next full-attention layers): q_proj also emits one gate per head and dim; the attention
  output is multiplied by its sigmoid before o_proj (modeling_qwen3_next.py Qwen3NextAttention).
- Chunked attention (Llama-4 RoPE layers, modeling_llama4.py chunked causal mask): each query attends to the
  earlier keys of its own chunk, on average (chunk + 1) / 2 keys once the sequence spans whole chunks.
- DeepSeek Sparse Attention (DeepSeek-V3.2, arXiv:2512.02556 sec. 2.1): a lightning indexer scores every earlier
  key and each query attends to the `index_topk` best. Megatron-LM's training path (megatron-core 0.16.1
  megatron/core/transformer/experimental_attention_variant/dsa.py) is unfused: `_compute_index_scores` builds fp32
  [s, b, index_heads, s] scores, `unfused_dsa_fn` fp32 [b, heads/tp, s, s] attention scores masked to the top-k
  before the softmax, and `compute_dsa_indexer_loss` a second fp32 copy for the indexer's KL loss. Time and memory
  are priced for that code, on the full s x s grid; the model FLOPs count the sparse attention the paper describes
  (top-k keys per query, the indexer over every earlier key).
- A parallel Mamba-2 mixer (Falcon-H1): priced as the Mamba layer of autoplan/costmodel/layers/mamba.py beside the
  attention, on the same normed input."""
from __future__ import annotations

import numpy as np

from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.layers.base import (BF16, FP32, LayerTime, Layouts, Shard, elementwise_time, gemm_input_bytes,
                                            gemm_time, norm_linear_input_bytes)
from autoplan.costmodel.layers.dense import attention_core_time
from autoplan.costmodel.layers.mamba import mamba_activation_bytes, mamba_mixer_time
from autoplan.costmodel.params import dsa_indexer_share, gdn_conv_channels, gdn_key_dim, gdn_value_dim
from autoplan.model import ModelSpec

GDN_CHUNK = 64  # fla/ops/gated_delta_rule/chunk.py: chunk size BT = 64
INT64 = 8  # torch.topk returns int64 indices


# ---------------------------------------------------------------- shares of the layers

def layer_shares(m: ModelSpec):
    """(Gated DeltaNet, chunked-attention, full-attention) shares of the layers; sliding windows are handled by
    the stage flags (costmodel/stages.py)."""
    n = m.num_layers
    linear = m.linear_attention_layers / n
    chunked = m.num_chunked_attention_layers / n
    return linear, chunked, 1.0 - linear - chunked


def has_mixers(m: ModelSpec) -> bool:
    return bool(m.linear_attention_layers or m.num_chunked_attention_layers or m.parallel_mamba or m.dsa_index_heads
                or m.attention_output_gate)


def chunked_keys(chunk: int, seq_len: int) -> float:
    """Mean keys per query under chunked causal attention: (c + 1) / 2 in each whole chunk of c tokens, the
    partial last chunk likewise."""
    c = min(chunk, seq_len)
    full, rest = divmod(seq_len, c)
    return (full * c * (c + 1) / 2 + rest * (rest + 1) / 2) / seq_len


def dsa_keys(topk: int, seq_len: int) -> float:
    """Mean keys per query under DSA: query i attends to min(i + 1, topk) keys (arXiv:2512.02556 sec. 2.1)."""
    k = min(topk, seq_len)
    return (k * (k + 1) / 2 + (seq_len - k) * k) / seq_len


# ---------------------------------------------------------------- FLOPs (model FLOPs, forward, per token)

def gdn_scan_flops_per_token(m: ModelSpec, heads) -> float:
    """Forward FLOPs of the chunkwise gated delta rule per token on `heads` value heads (arXiv:2412.06464 sec. 3.2;
    chunk C, key dim dk, value dim dv): the chunk's K K^T (2 C dk), the WY terms W = A K and U = A V (2 C dk and
    2 C dv), the state terms W S, K^T U and Q S (2 dk dv each) and the intra-chunk Q K^T and its product with U
    (2 C dk and 2 C dv), as the kernels compute them (full C x C tiles)."""
    c, dk, dv = GDN_CHUNK, m.gdn_key_head_dim, m.gdn_value_head_dim
    return heads * (6.0 * c * dk + 4.0 * c * dv + 6.0 * dk * dv)


def gdn_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of one Gated DeltaNet mixer per token: in_proj, the conv1d, the scan, out_proj."""
    h = m.hidden_size
    proj = 2.0 * h * (2 * gdn_key_dim(m) + 2 * gdn_value_dim(m) + 2 * m.gdn_num_value_heads) + \
        2.0 * gdn_value_dim(m) * h
    conv = 2.0 * gdn_conv_channels(m) * m.gdn_conv_kernel
    return proj + conv + gdn_scan_flops_per_token(m, m.gdn_num_value_heads)


def dsa_indexer_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of the lightning indexer per token: wq_b, wk and weights_proj, and its scores against every
    earlier key (2 heads d_I per key, s / 2 keys on average; arXiv:2512.02556 sec. 2.1, O(L^2) indexer)."""
    heads, d = m.dsa_index_heads, m.dsa_index_head_dim
    proj = 2.0 * (m.q_lora_rank * heads * d + m.hidden_size * d + m.hidden_size * heads)
    return proj + 2.0 * heads * d * seq_len / 2.0


def gate_flops_per_token(m: ModelSpec) -> float:
    """The output gate's share of q_proj (gated attention): h x heads x d more weights."""
    return 2.0 * m.hidden_size * m.num_attention_heads * m.kv_channels if m.attention_output_gate else 0.0


# ---------------------------------------------------------------- time

def gdn_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration):
    """(GEMM, scan, elementwise) forward seconds of one Gated DeltaNet layer on a rank: the fused in_proj (norm
    fused in, column-parallel) and out_proj (row-parallel) GEMMs; the chunked scan at the longer of its FLOPs at
    flash attention's forward efficiency (assumed, as for the SSD scan in layers/mamba.py) and its HBM bytes (q, k,
    v and the output in bf16; the fp32 chunk matrix A written and read; fp32 chunk states heads x dk x dv written
    and read per chunk), six kernel launches (fla chunk_gated_delta_rule_fwd: cumsum, A, solve, WY, states,
    output); the conv1d, gated norm, the layer's norm and residual in HBM."""
    T, h = sh.tokens, m.hidden_size
    heads = m.gdn_num_value_heads / lay.tp
    in_width = (2 * gdn_key_dim(m) + 2 * gdn_value_dim(m) + 2 * m.gdn_num_value_heads) / lay.tp
    v_local = gdn_value_dim(m) / lay.tp
    gemm = gemm_time(T, in_width, h, lay, hw, cal, norm_fused_input=True) + \
        gemm_time(T, h, v_local, lay, hw, cal, dy_rows=sh.tokens_sp)
    dk, dv, c = m.gdn_key_head_dim, m.gdn_value_head_dim, GDN_CHUNK
    flops = T * gdn_scan_flops_per_token(m, heads)
    scan_bytes = T * heads * (BF16 * (2 * dk + 2 * dv) + 2 * FP32 * c + 2 * FP32 * dk * dv / c)
    scan = np.maximum(flops / (hw.peak_flops_bf16 * cal.attention_eff_fwd),
                      scan_bytes / (hw.hbm_bytes_per_s * cal.hbm_eff)) + 6 * cal.kernel_overhead_s
    conv = 2 * BF16 * T * gdn_conv_channels(m) / lay.tp
    gated_norm = 3 * BF16 * T * v_local
    layer = (2 + 3) * BF16 * sh.tokens_sp * h
    return gemm, scan, elementwise_time(conv + gated_norm + layer, hw, cal, 6)


def sequence_keys(sh: Shard, lay: Layouts):
    """Keys each query of the rank sees: the whole sequence (mbs x s / cp tokens per rank, s keys under CP)."""
    return sh.tokens * lay.cp / lay.mbs


def dsa_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration):
    """((indexer GEMM, core, elementwise), (attention core, elementwise)) forward seconds of DSA on a rank as
    megatron-core 0.16.1 runs it (module docstring): the indexer's projections (not tensor-parallel; the input
    gathered); its fp32 scores over the full [s, heads_I, s] grid and the unfused attention's fp32 [heads/tp, s, s]
    scores and their product with V, as GEMMs (priced at the bf16 GEMM rate: optimistic where fp32 matmuls run
    without TF32); and the HBM passes over the s x s tensors (index: ReLU, weighting, head sum, mask, top-k;
    attention: scale, two masks, softmax, bf16 cast; the KL loss's second softmax), each a read and a write of
    4-byte elements. The first part is the indexer's and its loss's, which a layer reusing another's top-k does not
    run (core_v0.19.0 dsa.py: `skip_topk` layers take the source layer's indices, and `use_indexer_loss` needs
    `computes_topk`); the second every DSA layer runs."""
    T = sh.tokens
    keys = sequence_keys(sh, lay)
    heads_i, d_i = m.dsa_index_heads, m.dsa_index_head_dim
    gathered = T * lay.tp / np.where(lay.sp, 1.0, lay.tp)  # SP inputs are gathered to full tokens
    gemm = gemm_time(gathered, heads_i * d_i, m.q_lora_rank, lay, hw, cal) + \
        gemm_time(gathered, d_i + heads_i, m.hidden_size, lay, hw, cal)
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim
    rate = hw.peak_flops_bf16 * hw.gemm_eff_bf16 * cal.gemm_scale
    index_core = 2.0 * T * keys * heads_i * d_i / rate + cal.kernel_overhead_s
    attn_core = 2.0 * T * keys * sh.heads * (2 * qk + m.v_head_dim) / rate + 3 * cal.kernel_overhead_s
    grid = T * keys
    index_passes = 2 * FP32 * grid * (3 * heads_i + 4) + 2 * FP32 * grid * sh.heads  # + the KL loss's softmax
    attn_passes = 2 * FP32 * grid * sh.heads * 5
    return ((gemm, index_core, elementwise_time(index_passes, hw, cal, 8)),
            (attn_core, elementwise_time(attn_passes, hw, cal, 8)))


def mixer_layer_time(m: ModelSpec, sh: Shard, lay: Layouts, seq_len: int, hw: Hardware, cal: Calibration,
                     attn_gemm, attn_core, elementwise):
    """(attention GEMMs, core attention, scan, elementwise) forward seconds of one layer's token mixing as the
    mean over the model's layers (exact when a rank holds all layers, as for hybrids in layers/mamba.py):
    `attn_gemm`, `attn_core`, `elementwise` are the plain attention layer's, replaced or extended here."""
    linear, chunked, full = layer_shares(m)
    scan = 0.0 * sh.tokens
    if m.attention_output_gate:  # the gate's GEMM columns and the sigmoid product (read 2, write 1)
        attn_gemm = attn_gemm + gemm_time(sh.tokens, sh.heads * m.kv_channels, m.hidden_size, lay, hw, cal)
        elementwise = elementwise + elementwise_time(3 * BF16 * sh.tokens * sh.heads * m.kv_channels, hw, cal, 1)
    if m.dsa_index_heads:
        (g, ci, ei), (ca, ea) = dsa_time(m, sh, lay, hw, cal)
        indexed = dsa_indexer_share(m)  # the layers that run their own indexer
        attn_gemm, attn_core = attn_gemm + indexed * g, indexed * ci + ca
        elementwise = elementwise + indexed * ei + ea
    if chunked:
        window_core = attention_core_time(m, sh, lay, seq_len, hw, cal,
                                          window=chunked_keys(m.attention_chunk_size, seq_len))
        attn_core = full * attn_core + chunked * window_core
    elif linear:
        attn_core = full * attn_core
    if linear:
        g, s, e = gdn_time(m, sh, lay, hw, cal)
        attn_gemm = (1 - linear) * attn_gemm + linear * g
        elementwise = (1 - linear) * elementwise + linear * e
        scan = scan + linear * s
    if m.parallel_mamba:
        mixer = mamba_mixer_time(m, sh, lay, hw, cal)
        attn_gemm, scan = attn_gemm + mixer.gemm, scan + mixer.scan
        elementwise = elementwise + mixer.elementwise
    return attn_gemm, attn_core, scan, elementwise


def with_mixers(m: ModelSpec, sh: Shard, lay: Layouts, seq_len: int, hw: Hardware, cal: Calibration,
                t: LayerTime) -> LayerTime:
    if not has_mixers(m):
        return t
    gemm, core, scan, elem = mixer_layer_time(m, sh, lay, seq_len, hw, cal, t.attn_gemm, t.attn_core, t.elementwise)
    return LayerTime(gemm, core, t.mlp_gemm, elem, t.scan + scan)


# ---------------------------------------------------------------- memory

def gdn_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """Bytes one Gated DeltaNet mixer saves with no recompute (megatron/core/ssm/gated_delta_net.py; fla/ops/
    gated_delta_rule/chunk.py ChunkGatedDeltaRuleFunction `save_for_backward(q, q_rstd, k, k_rstd, v, g, beta, A,
    initial_state)`): the pre-norm input and in_proj's input (norm fused), in_proj's output [q, k, v, z, b, a],
    the conv1d + SiLU output q, k, v, fp32 g and beta per value head, fp32 rstd of the L2-normed q and k, the fp32
    chunk matrix A (C per token and head), the scan output and the gated norm's fp32 statistics, and out_proj's
    input."""
    region = sh.tokens_sp * m.hidden_size
    T, tp = sh.tokens, lay.tp
    heads = m.gdn_num_value_heads / tp
    in_width = (2 * gdn_key_dim(m) + 2 * gdn_value_dim(m) + 2 * m.gdn_num_value_heads) / tp
    v_local = gdn_value_dim(m) / tp
    return (BF16 * region + norm_linear_input_bytes(lay) * region
            + BF16 * T * in_width
            + BF16 * T * gdn_conv_channels(m) / tp
            + FP32 * T * heads * (2 + 2 + GDN_CHUNK)
            + BF16 * T * v_local + FP32 * T * heads
            + gemm_input_bytes(lay) * T * v_local)


def dsa_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """Bytes DSA saves beyond MLA's, per layer and micro batch, as megatron-core 0.16.1 trains it (dsa.py), in a
    layer that runs its own indexer: the indexer's and its loss's (`dsa_indexer_activation_bytes`), the int64
    top-k indices, the attention's fp32 softmax [heads/tp, s, s] and its bf16 copy for the product with V. With
    CP, keys stay the whole sequence. A layer that reuses another's top-k saves all but the indexer's part (its
    indices are the source layer's tensor; counted anyway)."""
    T, keys = sh.tokens, sequence_keys(sh, lay)
    grid = T * keys
    indices = INT64 * T * np.minimum(m.dsa_index_topk, keys)
    attention = (FP32 + BF16) * grid * sh.heads
    return dsa_indexer_activation_bytes(m, sh, lay) + indices + attention


def dsa_indexer_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """The part of `dsa_activation_bytes` only a layer with its own indexer saves: the indexer's ReLU output fp32
    [s, heads_I, s] (kept by the head weighting for backward) and its fp32 q copy, the indexer loss's fp32 softmax
    [heads/tp, s, s] and its [s, s] fp32 terms (index softmax, target, the two logs)."""
    T, keys = sh.tokens, sequence_keys(sh, lay)
    grid = T * keys
    heads_i = m.dsa_index_heads
    indexer = FP32 * grid * heads_i + FP32 * T * heads_i * m.dsa_index_head_dim
    loss = FP32 * grid * sh.heads + 4 * FP32 * grid
    return indexer + loss


def gate_activation_bytes(m: ModelSpec, sh: Shard):
    """Gated attention: the gate (q_proj's second half) and its sigmoid, saved for the product's backward, bf16."""
    if not m.attention_output_gate:
        return 0.0 * sh.tokens
    return 2 * BF16 * sh.tokens * sh.heads * m.kv_channels


def mixer_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts, attention):
    """Bytes one layer's token mixing saves with no recompute, given the plain attention's (`attention`): with
    Gated DeltaNet layers the larger of the two kinds (a pipeline stage may hold only the larger; memory is never
    under-counted), plus the parallel Mamba mixer, DSA's tensors and the output gate."""
    if not has_mixers(m):
        return attention
    attention = attention + gate_activation_bytes(m, sh)
    if m.dsa_index_heads:
        attention = attention + dsa_activation_bytes(m, sh, lay)
    if m.linear_attention_layers:
        attention = np.maximum(attention, gdn_activation_bytes(m, sh, lay))
    if m.parallel_mamba:
        # The Mamba mixer reads the same normed input: its pre-norm input and in_proj input are the attention's.
        region = sh.tokens_sp * m.hidden_size
        attention = attention + mamba_activation_bytes(m, sh, lay) - BF16 * region - \
            norm_linear_input_bytes(lay) * region
    return attention
