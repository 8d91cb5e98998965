"""Per-layer compute time on one rank for one micro batch, vectorised over candidates.

GEMM shapes follow Megatron-LM's tensor-parallel layers (Shoeybi et al. 2019, sec. 3: column-parallel QKV/FC1,
row-parallel output/FC2) and MoE parallel folding (Liu et al. 2025, arXiv:2504.14960: experts sharded by ep x etp,
tokens routed by all-to-all). Times: GEMMs at a shape-dependent efficiency, core attention at a flash-attention
efficiency, elementwise work at HBM bandwidth, plus a per-kernel launch floor."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.layout import QUANTISED_BYTES, Layouts
from autoplan.costmodel.params import norms_per_layer
from autoplan import cuda_graphs as G
from autoplan import recompute as R
from autoplan.model import ModelSpec

BF16 = 2  # bytes


@dataclass(frozen=True)
class Shard:
    """Per-rank sizes derived from a layout (arrays over candidates)."""

    tokens: np.ndarray  # tokens through a layer on this rank, one micro batch: mbs * seq / cp
    tokens_sp: np.ndarray  # tokens held between TP regions (tokens / tp with sequence parallel)
    heads: np.ndarray  # query heads per rank
    groups: np.ndarray  # KV heads per rank (replicated when groups < tp)
    expert_tokens: np.ndarray  # routed token copies computed by this rank's experts
    local_experts: np.ndarray
    routed_tokens: np.ndarray  # tokens this rank's router sees and dispatches: its own, sharded over tp


def shard_of(m: ModelSpec, lay: Layouts, seq_len: int) -> Shard:
    tokens = lay.mbs * seq_len / lay.cp
    tokens_sp = np.where(lay.sp, tokens / lay.tp, tokens)
    heads = m.num_attention_heads / lay.tp
    groups = np.maximum(m.num_query_groups / lay.tp, 1.0)
    # Each rank routes its own (SP-sharded) tokens; with etp > 1 the expert-TP group gathers them.
    routed_tokens = np.where(lay.tp > 1, tokens / lay.tp, tokens)
    if m.is_moe:
        expert_tokens = routed_tokens * m.moe_router_topk * lay.etp
        local_experts = m.num_experts / lay.ep
    else:
        expert_tokens = np.zeros_like(tokens)
        local_experts = np.zeros_like(tokens)
    return Shard(tokens, tokens_sp, heads, groups, expert_tokens, local_experts, routed_tokens)


def gemm_time(mm, nn, kk, lay: Layouts, hw: Hardware, cal: Calibration, fp8=None, eff_scale=1.0,
              norm_fused_input=False, dy_rows=None):
    """Seconds of one (mm x kk) @ (kk x nn) GEMM: compute at a size-dependent efficiency, HBM roofline, the FP8 /
    FP4 casts of its operands (`cast_bytes`: `norm_fused_input`, `dy_rows`), launch floor."""
    mm, nn, kk = (np.asarray(x, dtype=float) for x in (mm, nn, kk))
    flops = 2.0 * mm * nn * kk
    use_fp8 = lay.fp8 if fp8 is None else fp8
    use_fp4 = lay.fp4 & np.asarray(use_fp8, dtype=bool)  # NVFP4 runs the GEMMs an FP8 recipe would
    peak = np.where(use_fp8, hw.peak_flops_fp8 * hw.gemm_eff_fp8, hw.peak_flops_bf16 * hw.gemm_eff_bf16)
    peak = np.where(use_fp4, hw.peak_flops_fp4 * hw.gemm_eff_fp4 * (1 - cal.fp4_overhead), peak)
    harmonic = 3.0 / (1.0 / np.maximum(mm, 1) + 1.0 / np.maximum(nn, 1) + 1.0 / np.maximum(kk, 1))
    size_eff = harmonic / (harmonic + cal.gemm_half_dim)
    size_eff = size_eff * np.where(use_fp8, reduction_efficiency(mm, nn, kk, cal.lowp_gemm_half_k), 1.0)
    t_compute = flops / (peak * cal.gemm_scale * size_eff * eff_scale)
    t_memory = BF16 * (mm * kk + kk * nn + mm * nn) / (hw.hbm_bytes_per_s * cal.hbm_eff)
    t_cast = np.where(use_fp8, cast_bytes(mm, nn, kk, lay.quant_bytes, norm_fused_input, dy_rows), 0.0) / \
        (hw.hbm_bytes_per_s * cal.hbm_eff)
    return np.maximum(t_compute, t_memory) + t_cast + cal.kernel_overhead_s


def cast_bytes(mm, nn, kk, quant_bytes, norm_fused_input=False, dy_rows=None):
    """HBM bytes of the FP8 / FP4 casts of one GEMM's operands, as a forward equivalent (a third of the forward +
    backward total: the caller prices backward as twice the forward). TransformerEngine's Linear quantises its
    input x (mm x kk) in the forward and the output gradient dy (mm x nn) in the backward, each read in bf16 and
    written twice at the recipe's bytes per element (`quant_bytes`, scales included): row-wise for the forward /
    input-gradient GEMM and column-wise for the weight-gradient GEMM (transformer_engine/pytorch/module/linear.py:
    the input and grad-output quantizers set both usages; Hopper's FP8 GEMMs need the transposed copy, Blackwell's
    MXFP8 / NVFP4 blocks run along the reduction dimension). Weights are cast once per step and cached across micro
    batches (`is_first_microbatch`), so they are left out; so is per-tensor current scaling's separate amax pass.
    A norm fused into the GEMM's input (LayerNormLinear) writes x already quantised: only dy is cast then. A
    row-parallel GEMM under sequence parallelism casts its rank's shard of dy before the all-gather (`dy_rows`, the
    sequence-parallel tokens; TransformerEngine gathers the quantised gradient)."""
    per_element = BF16 + 2.0 * np.asarray(quant_bytes, dtype=float)
    x_elements = 0.0 if norm_fused_input else mm * kk
    dy_elements = (mm if dy_rows is None else dy_rows) * nn
    return per_element * (x_elements + dy_elements) / 3.0


REFERENCE_K = 8192.0  # reduction dimension at which reduction_efficiency is 1 (GPU profiles' MAMF shapes are large)


def reduction_efficiency(mm, nn, kk, half_k: float):
    """Rate of a low-precision GEMM's forward, its input gradient and its weight gradient relative to k = 8192,
    as one forward-equivalent factor (the caller prices backward as twice the forward): each of the three GEMMs
    reduces over its own dimension (forward kk, input gradient nn, weight gradient mm) and runs at
    d / (d + half_k) normalised at REFERENCE_K (calibration.lowp_gemm_half_k), so the factor is the harmonic mean
    of the three."""
    ref = REFERENCE_K / (REFERENCE_K + half_k)

    def slowdown(d):
        d = np.maximum(np.asarray(d, dtype=float), 1.0)
        return ref * (d + half_k) / d

    return 3.0 / (slowdown(kk) + slowdown(nn) + slowdown(mm))


def elementwise_time(num_bytes, hw: Hardware, cal: Calibration, kernels):
    return num_bytes / (hw.hbm_bytes_per_s * cal.hbm_eff) + kernels * cal.kernel_overhead_s


def scoped(cal: Calibration, lay: Layouts, part: str) -> Calibration:
    """`cal` with the per-op cost of the ops of `part` (a key of autoplan.cuda_graphs.COVERED_BY): the host's
    dispatch of each op (`kernel_overhead_s`) unless the candidate captures that part in a CUDA graph, whose replay
    launches its kernels with no host work (`graph_kernel_s`)."""
    if not np.any(lay.cuda_graph):
        return cal
    return replace(cal, kernel_overhead_s=np.where(G.captured(lay.cuda_graph, part), cal.graph_kernel_s,
                                                   cal.kernel_overhead_s))


def kernel_costs(lay: Layouts, cal: Calibration, counts) -> np.ndarray:
    """Fixed cost of `counts` ((part, kernels) pairs) of memory-bound kernels, each at its part's per-op cost."""
    return sum(k * scoped(cal, lay, part).kernel_overhead_s for part, k in counts)


# Memory-bound kernels of one layer per CUDA-graph part (norms, rotary, residual adds, activation; the router's
# top-k, softmax and auxiliary loss; the dispatcher's count and sort maps; permute, unpermute and the expert
# activation). Counts read off Megatron's layer code paths (transformer_layer.py, moe/router.py,
# moe/token_dispatcher.py), fused kernels counted once.
DENSE_KERNELS = (("attn", 5), ("mlp", 5))
MOE_KERNELS = (("attn", 5), ("moe_router", 4), ("moe_preprocess", 3), ("moe", 6))
HYBRID_MOE_KERNELS = (("moe_router", 4), ("moe_preprocess", 3), ("moe", 5))


@dataclass(frozen=True)
class LayerTime:
    """Forward seconds of one decoder layer, by part; backward is derived (2x GEMMs, attention ratio)."""

    attn_gemm: np.ndarray
    attn_core: np.ndarray
    mlp_gemm: np.ndarray
    elementwise: np.ndarray
    scan: np.ndarray = 0.0  # Mamba-2 SSD scan of hybrid models (autoplan/costmodel/mamba.py)

    @property
    def fwd(self):
        return self.attn_gemm + self.attn_core + self.mlp_gemm + self.elementwise + self.scan

    def bwd(self, cal: Calibration):
        # dgrad + wgrad: two GEMMs per forward GEMM; flash backward ~attention_bwd_ratio x forward; the SSD scan's
        # backward kernels are tiled like flash attention's and take the same ratio (assumed).
        return 2.0 * (self.attn_gemm + self.mlp_gemm + self.elementwise) + \
            cal.attention_bwd_ratio * (self.attn_core + self.scan)


def attention_gemm_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration):
    T, h = sh.tokens, m.hidden_size
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
        return t + gemm_time(T, h, sh.heads * m.v_head_dim, lay, hw, cal, dy_rows=sh.tokens_sp)
    d = m.kv_channels
    qkv = gemm_time(T, (sh.heads + 2 * sh.groups) * d, h, lay, hw, cal, norm_fused_input=True)
    return qkv + gemm_time(T, h, sh.heads * d, lay, hw, cal, dy_rows=sh.tokens_sp)


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


def grouped_token_efficiency(per_expert_tokens, cal: Calibration):
    """Efficiency of a grouped expert GEMM against its rows per expert, m / (m + grouped_gemm_half_tokens),
    normalised to 1 at m = 8192. Each expert's GEMM is tiled on its own, so its weights are streamed once per
    expert and the last row-tile of every expert runs part-empty; both weigh more as m shrinks (MegaBlocks,
    Gale et al. 2023, sec. 5.1 and Fig. 6: grouped/batched expert GEMM throughput falls with tokens per expert)."""
    m0 = cal.grouped_gemm_half_tokens
    m = np.maximum(np.asarray(per_expert_tokens, dtype=float), 1.0)
    return (m / (m + m0)) / (8192.0 / (8192.0 + m0))


def moe_gemm_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration):
    """Grouped expert GEMMs (balanced routing: tokens*k/E per expert; one GEMM per local expert, as
    TransformerEngine's GroupedLinear runs them), router, shared experts. A latent MoE
    (Megatron --moe-latent-size) projects each token h -> latent before dispatch and back after the combine, and
    its experts run on the latent width (HF modeling_nemotron_h.py NemotronHMoE.forward: gate on the hidden
    state, fc1_latent_proj, experts, fc2_latent_proj)."""
    per_expert = sh.expert_tokens / np.maximum(sh.local_experts, 1)
    f = m.moe_ffn_hidden_size / lay.etp
    up = (2 if m.gated_mlp else 1) * f
    width = m.moe_latent_size or m.hidden_size
    eff = cal.grouped_gemm_eff * grouped_token_efficiency(per_expert, cal)
    cal_router, cal = scoped(cal, lay, "moe_router"), scoped(cal, lay, "moe")
    # TransformerEngine's grouped GEMM issues one cuBLASLt GEMM per local expert on 4 streams
    # (transformer_engine/common/gemm/cublaslt_gemm.cu `multi_stream_cublas_gemm`), so each expert's GEMM pays its
    # own per-op cost (calibration.kernel_overhead_s; the measured per-expert issue time is its cross-check).
    experts = (gemm_time(per_expert, up, width, lay, hw, cal, eff_scale=eff) +
               gemm_time(per_expert, width, f, lay, hw, cal, eff_scale=eff)) * sh.local_experts
    router = gemm_time(sh.tokens_sp, m.num_experts, m.hidden_size, lay, hw, cal_router, fp8=np.zeros_like(lay.fp8))
    shared = 0.0
    if m.shared_expert_ffn_hidden_size:
        shared = mlp_gemm_time(m, m.shared_expert_ffn_hidden_size, sh.tokens, lay, hw, cal, lay.tp,
                               norm_fused_input=False, tokens_sp=sh.tokens_sp)
    if m.moe_latent_size:
        shared = shared + gemm_time(sh.tokens, m.moe_latent_size / lay.tp, m.hidden_size, lay, hw, cal) + \
            gemm_time(sh.tokens, m.hidden_size, m.moe_latent_size / lay.tp, lay, hw, cal)
    return experts + router + shared


def elementwise_bytes(m: ModelSpec, sh: Shard, lay: Layouts, moe: bool, attention: bool = True):
    """Forward HBM traffic of norms, residual adds, rotary and activation functions for one layer, bytes.
    `attention=False` leaves out the attention half (a hybrid model's MoE layer, autoplan/costmodel/mamba.py)."""
    h = m.hidden_size
    norms = norms_per_layer(m)  # + the post-attention / post-MLP norms under sandwich_norm
    norms_and_residuals = (norms * 2 * h + 2 * 3 * h) * BF16 * sh.tokens_sp  # norms (r+w), 2 adds (2r+w)
    qk_dim = (m.qk_pos_emb_head_dim if m.multi_latent_attention else m.kv_channels)
    rotary = 2 * (sh.heads + sh.groups) * qk_dim * BF16 * sh.tokens
    if not attention:
        norms_and_residuals, rotary = 0.0 * sh.tokens, 0.0
    if moe:
        h = m.moe_latent_size or h  # routed copies of a latent MoE are latent wide
        f = m.moe_ffn_hidden_size / lay.etp
        act = (3 if m.gated_mlp else 2) * f * BF16 * sh.expert_tokens
        # Permute + unpermute. TE's fused kernels (transformer_engine/pytorch/permutation.py moe_permute /
        # moe_unpermute, Megatron --moe-permute-fusion) read each token once and write its top-k copies, then
        # read the copies and write one merged token; unfused (torch index_select / scatter_add) every copy is
        # read and written twice.
        source_tokens = sh.expert_tokens / max(m.moe_router_topk, 1)
        fused = 2 * h * BF16 * (sh.expert_tokens + source_tokens)
        permute = np.where(lay.fused_permute, fused, 4 * h * BF16 * sh.expert_tokens)
        if m.shared_expert_ffn_hidden_size:
            act = act + (3 if m.gated_mlp else 2) * m.shared_expert_ffn_hidden_size / lay.tp * BF16 * sh.tokens
        return norms_and_residuals + rotary + act + permute
    act = (3 if m.gated_mlp else 2) * m.ffn_hidden_size / lay.tp * BF16 * sh.tokens
    return norms_and_residuals + rotary + act


# Element passes (2 bytes each) per routed copy and ops per MoE layer of Megatron's unfused expert path, forward +
# backward (`unfused_expert_extras`).
CLAMP_FWD, CLAMP_BWD, CLAMP_FWD_OPS, CLAMP_BWD_OPS = 8, 10, 4, 3  # x f: 2 clamps + cat, their gradients; + H2D
BIAS_FWD, BIAS_BWD = 7, 6  # x the output width: bias x probability, add, cat (+ cast) forward; dbias, dprob backward


def clamped_glu(m: ModelSpec) -> bool:
    """Whether the experts run gpt-oss's clamped GLU (ModelSpec.swiglu_limit on a gated MLP)."""
    return bool(m.swiglu_limit and m.gated_mlp)


def unfused_expert_extras(m: ModelSpec, sh: Shard, lay: Layouts, forward_only: bool = False):
    """(bytes, kernels) of one MoE layer's forward, as forward equivalents (a third of the forward + backward total:
    the caller prices backward as twice the forward; `forward_only`: the forward alone, what a recompute repeats),
    that Megatron's TEGroupedMLP runs around the grouped GEMMs for gpt-oss-style experts and not for plain SwiGLU
    ones (megatron/core/transformer/moe/experts.py, megatron/core/fusions/fused_bias_geglu.py):
    - clamped GLU (ModelSpec.swiglu_limit): `weighted_bias_quick_geglu_impl` clamps gate and linear halves and
      concatenates them eagerly, outside the compiled activation, and builds the linear offset as a device tensor
      on every call: forward 2 clamps + cat over the [copies, 2f] FC1 output (8 passes of f), backward their
      gradients (10 passes);
    - expert biases (ModelSpec.add_bias_linear): FC2 runs with skip_bias_add and `_apply_bias` adds bias x routing
      probability for each local expert in a Python loop, then concatenates: forward 2 ops per local expert plus
      the cat and cast, backward the bias and probability gradients, 4 ops per local expert; under MXFP8 FC1's bias
      gradient is quantised once per local expert (transformer_engine/pytorch/module/grouped_linear.py
      `bgrad_quantize`).
    TransformerEngine's op fuser (Strategy.te_op_fuser) runs bias, clamp and weighting inside its fused grouped MLP:
    nothing extra."""
    if not m.is_moe or not (m.swiglu_limit or m.add_bias_linear):
        return 0.0, 0.0
    copies, f = sh.expert_tokens, m.moe_ffn_hidden_size / lay.etp
    width = m.moe_latent_size or m.hidden_size
    clamped = clamped_glu(m)
    experts = sh.local_experts
    mxfp8 = lay.fp8 & (lay.quant_bytes == QUANTISED_BYTES["mxfp8"])
    clamp_passes = CLAMP_FWD + (0 if forward_only else CLAMP_BWD)
    bias_passes = BIAS_FWD + (0 if forward_only else BIAS_BWD)
    passes = (clamp_passes * f if clamped else 0.0) + (bias_passes * width if m.add_bias_linear else 0.0)
    clamp_ops = CLAMP_FWD_OPS + (0 if forward_only else CLAMP_BWD_OPS)
    bias_ops = 2 * experts + 2 + (0 if forward_only else (4 + mxfp8) * experts)
    ops = (clamp_ops if clamped else 0) + (bias_ops if m.add_bias_linear else 0)
    share = 1.0 if forward_only else 1.0 / 3.0
    unfused = ~lay.op_fuser
    return np.where(unfused, passes * BF16 * copies, 0.0) * share, np.where(unfused, ops, 0.0) * share


def without_low_precision(lay: Layouts) -> Layouts:
    """`lay` with every GEMM in bf16 (the layers an FP8/FP4 recipe leaves in bf16)."""
    return replace(lay, fp8=np.zeros_like(lay.fp8), fp4=np.zeros_like(lay.fp4))


def mix_bf16_layers(m: ModelSpec, lay: Layouts, per_layer):
    """`per_layer(layouts)` (a tuple of per-candidate arrays) averaged over the layers an FP8/FP4 recipe runs in low
    precision and those `ModelSpec.bf16_first_layers/bf16_last_layers` keep in bf16, by their share of the model.
    That is exact on a rank holding every layer (pp = 1); a pipeline stage's own share is not known here, so there
    the larger of the two is taken (for memory, an upper bound)."""
    low, high = per_layer(lay), per_layer(without_low_precision(lay))
    f = m.bf16_layer_fraction
    return tuple(np.where(lay.pp == 1, (1 - f) * a + f * b, np.maximum(a, b)) for a, b in zip(low, high))


def layer_time(m: ModelSpec, sh: Shard, lay: Layouts, seq_len: int, hw: Hardware, cal: Calibration, moe: bool,
               window: int = 0) -> LayerTime:
    """Forward seconds of one layer. With `ModelSpec.bf16_first_layers/bf16_last_layers`, the model-wide share of
    bf16 layers is mixed in (exact when a rank holds every layer; a pipeline stage's own share otherwise differs)."""
    f = m.bf16_layer_fraction
    low = _layer_time(m, sh, lay, seq_len, hw, cal, moe, window)
    if not f or not np.any(lay.fp8):
        return low
    high = _layer_time(m, sh, without_low_precision(lay), seq_len, hw, cal, moe, window)
    return LayerTime(*((1 - f) * getattr(low, k.name) + f * getattr(high, k.name) for k in fields(LayerTime)))


def _layer_time(m: ModelSpec, sh: Shard, lay: Layouts, seq_len: int, hw: Hardware, cal: Calibration, moe: bool,
                window: int = 0) -> LayerTime:
    if m.is_hybrid:
        from autoplan.costmodel.mamba import hybrid_layer_time  # mamba.py builds on this module

        return hybrid_layer_time(m, sh, lay, seq_len, hw, cal, moe)
    cal_attn = scoped(cal, lay, "attn")
    attn = attention_gemm_time(m, sh, lay, hw, cal_attn)
    core = attention_core_time(m, sh, lay, seq_len, hw, cal_attn, window)
    if moe:
        mlp = moe_gemm_time(m, sh, lay, hw, cal)
    else:
        mlp = mlp_gemm_time(m, m.ffn_hidden_size, sh.tokens, lay, hw, scoped(cal, lay, "mlp"), lay.tp,
                            tokens_sp=sh.tokens_sp)
    extra_norms = norms_per_layer(m) - 2  # sandwich norms: one more kernel in each half
    counts = (MOE_KERNELS if moe else DENSE_KERNELS) + (("attn", extra_norms / 2), ("moe" if moe else "mlp",
                                                                                   extra_norms / 2))
    extra_bytes, extra_ops = unfused_expert_extras(m, sh, lay) if moe else (0.0, 0.0)
    elem = elementwise_time(elementwise_bytes(m, sh, lay, moe) + extra_bytes, hw, cal, 0) + \
        kernel_costs(lay, cal, counts + (("moe", extra_ops),))
    return LayerTime(attn, core, mlp, elem)


def head_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration):
    """LM head GEMM (kept in bf16) + vocab-parallel cross entropy (fp32 logits, a few passes), forward; plus the
    MTP depths (autoplan/costmodel/mtp.py), whose backward the caller takes as twice the forward like the head's."""
    no_fp8 = np.zeros_like(lay.fp8)
    cal = scoped(cal, lay, "rest")
    vocab = m.vocab_size / np.where(lay.vocab_tp, lay.tp, 1)
    gemm = gemm_time(sh.tokens, vocab, m.hidden_size, lay, hw, cal, fp8=no_fp8)
    xent = elementwise_time(3 * 4 * sh.tokens * vocab, hw, cal, 6)
    if m.logit_softcapping:  # divide, tanh, multiply over the bf16 logits (r+w each)
        xent = xent + elementwise_time(3 * 2 * BF16 * sh.tokens * vocab, hw, cal, 3)
    if m.mtp_num_layers:  # multi-token-prediction depths run on the last stage, each with the head again
        from autoplan.costmodel.mtp import mtp_forward_time  # mtp.py builds on this module

        return gemm + xent + mtp_forward_time(m, sh, lay, hw, cal, gemm + xent)
    return gemm + xent


def embedding_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration):
    """Embedding lookup: write tokens x h (memory bound)."""
    return elementwise_time(2 * BF16 * sh.tokens * m.hidden_size, hw, cal, 0) + kernel_costs(lay, cal, (("rest", 2),))


def selective_recompute_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration, moe: bool,
                             a2a_fwd=0.0):
    """Forward seconds one layer repeats in backward for the selective modules in `lay.recompute_modules`
    (autoplan/recompute.py), core attention excepted (the caller adds it, window-aware): norms, the expert
    activation, MLA's up projections, the dense MLP, the MoE block with its forward dispatch and combine
    (`a2a_fwd`), the shared experts. Parts no candidate uses are not priced."""
    def part(names, seconds):
        flag = R.has(lay.recompute_modules, *names)
        return np.where(flag, seconds(), 0.0) if np.any(flag) else 0.0

    h = m.hidden_size
    gated = 3 if m.gated_mlp else 2
    # Each rebuilt op pays its own part's per-op cost (captured in a CUDA graph or dispatched by the host).
    cal_attn, cal_mlp, cal_moe = scoped(cal, lay, "attn"), scoped(cal, lay, "mlp"), scoped(cal, lay, "moe")
    t = part(["layernorm"], lambda: elementwise_time(2 * 2 * BF16 * sh.tokens_sp * h, hw, cal_attn, 2))  # 2 norms
    if m.multi_latent_attention:
        def up():
            s = gemm_time(sh.tokens, sh.heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank, lay, hw, cal_attn)
            if m.q_lora_rank:
                s = s + gemm_time(sh.tokens, sh.heads * (m.qk_head_dim + m.qk_pos_emb_head_dim), m.q_lora_rank,
                                  lay, hw, cal_attn)
            return s
        t = t + part(["mla_up_proj"], up)
    if not moe:
        return t + part(["mlp"], lambda: mlp_gemm_time(m, m.ffn_hidden_size, sh.tokens, lay, hw, cal_mlp, lay.tp,
                                                       tokens_sp=sh.tokens_sp)
                        + elementwise_time(gated * m.ffn_hidden_size / lay.tp * BF16 * sh.tokens, hw, cal_mlp, 1))
    f = m.moe_ffn_hidden_size / lay.etp
    whole = R.has(lay.recompute_modules, "moe")
    # gpt-oss's clamped GLU repeats its eager clamps, cat and device scalar too (unfused_expert_extras): CLAMP_FWD
    # more passes and CLAMP_FWD_OPS more ops beside the fused activation.
    clamped = clamped_glu(m) & ~lay.op_fuser
    act = part(["moe_act"], lambda: elementwise_time(
        (gated + np.where(clamped, CLAMP_FWD, 0)) * f * BF16 * sh.expert_tokens, hw, cal_moe,
        np.where(clamped, 1 + CLAMP_FWD_OPS, 1)))
    shared = 0.0
    if m.shared_expert_ffn_hidden_size:
        fs = m.shared_expert_ffn_hidden_size
        shared = part(["shared_experts"], lambda: mlp_gemm_time(m, fs, sh.tokens, lay, hw, cal_moe, lay.tp,
                                                                norm_fused_input=False, tokens_sp=sh.tokens_sp)
                      + elementwise_time(gated * fs / lay.tp * BF16 * sh.tokens, hw, cal_moe, 1))
    def moe_block():
        extra_bytes, extra_ops = unfused_expert_extras(m, sh, lay, forward_only=True)
        return moe_gemm_time(m, sh, lay, hw, cal) + a2a_fwd + \
            elementwise_time(elementwise_bytes(m, sh, lay, True) + extra_bytes, hw, cal_moe, 8 + extra_ops)
    block = part(["moe"], moe_block)
    return t + np.where(whole, block, act + shared)
