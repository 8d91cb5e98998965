"""An MoE layer's expert block: the router, the grouped expert GEMMs (one per local expert), shared experts, a
latent MoE's projections, the permute / unpermute and activation traffic, Megatron's unfused expert extras, and
the activations, routing indices and dispatcher buffers it holds. Built on the dense layer's MLP
(`layers/dense.py`) for the shared experts."""
from __future__ import annotations

import numpy as np

from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.layers.base import (BF16, FP32, Layouts, Shard, dropout_mask_bytes, gemm_input_bytes,
                                            gemm_time, module_layouts, scoped)
from autoplan.costmodel.layers.dense import mlp_activation_bytes, mlp_gemm_time
from autoplan.costmodel.layout import QUANTISED_BYTES
from autoplan.costmodel.params import norms_per_layer
from autoplan.model import ModelSpec


# Memory-bound kernels of one MoE layer per CUDA-graph part (the attention half's norms, rotary and residual add; the
# router's top-k, softmax and auxiliary loss; the dispatcher's count and sort maps; permute, unpermute and the expert
# activation), read off Megatron's layer code paths (transformer_layer.py, moe/router.py, moe/token_dispatcher.py),
# fused kernels counted once. A hybrid's MoE layer has no attention half.
MOE_KERNELS = (("attn", 5), ("moe_router", 4), ("moe_preprocess", 3), ("moe", 6))
HYBRID_MOE_KERNELS = (("moe_router", 4), ("moe_preprocess", 3), ("moe", 5))


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
    if m.moe_latent_size:  # at the precision the model's per-module recipe gives them (base.module_layouts)
        proj = module_layouts(m, lay, "latent_proj")
        shared = shared + gemm_time(sh.tokens, m.moe_latent_size / lay.tp, m.hidden_size, proj, hw, cal) + \
            gemm_time(sh.tokens, m.hidden_size, m.moe_latent_size / lay.tp, proj, hw, cal)
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
    unfused = ~lay.te_op_fuser
    return np.where(unfused, passes * BF16 * copies, 0.0) * share, np.where(unfused, ops, 0.0) * share


def routing_weight_bytes(copies):
    """The routing probabilities the experts' weighting saves for backward, one fp32 per routed copy. Megatron
    weights the copies inside the expert activation (megatron/core/transformer/moe/experts.py TEGroupedMLP.forward
    `bias_act_func(fc1_output, bias, permuted_probs)`) and the token dispatchers unpermute without probabilities
    (transformer/moe/token_dispatcher.py `unpermute(...)`, no `probs=`), so the experts' output is not held."""
    return FP32 * copies


def weighted_activation_bytes(m: ModelSpec, lay: Layouts, copies, f):
    """Beyond its input and the probabilities, what the weighted expert activation saves for backward, bytes.
    Gated experts run the fused `weighted_bias_swiglu_impl` (fusions/fused_bias_swiglu.py WeightedSwiGLUFunction
    `ctx.save_for_backward(input_for_backward, weights)`) and non-gated ones with `lay.fused_weighted_squared_relu`
    `weighted_squared_relu_impl` (fusions/fused_weighted_squared_relu.py WeightedSquaredReLUFunction
    `ctx.save_for_backward(input, weights)`): nothing more. Other non-gated experts take experts.py's unfused branch
    `activation_func(x) * permuted_probs`, whose product saves the bf16 activation output (f wide per copy) for the
    probabilities' gradient. moe_act recompute checkpoints this function, so that output is rebuilt then."""
    unfused = np.logical_and(not m.gated_mlp, ~np.asarray(lay.fused_weighted_squared_relu, bool))
    return np.where(unfused, BF16 * copies * f, 0.0)


def permute_row_id_map_bytes(m: ModelSpec, sh: Shard):
    """The fused permute's row-id map: int32 [tokens, 2E + 1] (TransformerEngine pytorch/triton/permutation.py
    `make_row_id_map`; TE <= 2.5 an int64 [E, tokens], 8E per token, which 4 (2E + 1) covers)."""
    return 4.0 * (2 * m.num_experts + 1) * sh.routed_tokens


def routing_index_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """Index tensors one MoE layer saves for backward, bytes per micro batch, beyond the router's fp32 scores:
    - the fused permute's row-id map (`permute_row_id_map_bytes`, saved in permutation.py
      `_moe_permute_mask_map_setup_context`); the unpermute reuses it;
    - the router's top-k: int64 indices and the fp32 softmax over the k chosen scores per token (megatron/core/
      transformer/moe/moe_utils.py `topk_routing_with_score_function`), 12 bytes per routed copy;
    - with several local experts, the dispatch and combine chunk sorts keep one row-id map each, one int32 per
      routed copy (permutation.py `_moe_chunk_sort_setup_context`; int64 before TE 2.6): 16 bytes per copy."""
    topk = 12.0 * max(m.moe_router_topk, 1) * sh.routed_tokens
    sort_maps = np.where(sh.local_experts > 1, 16.0 * sh.expert_tokens, 0.0)
    return permute_row_id_map_bytes(m, sh) + topk + sort_maps


def dispatcher_state_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """What Megatron's alltoall token dispatcher keeps as attributes of each MoE layer between micro batches, bytes
    per MoE layer (the last micro batch's, held once, not per micro batch in flight): `self.probs` [tokens, E]
    (fp32 with an fp32 router, bf16 otherwise: 4 bytes), `self.routing_map` bool [tokens, E] and
    `self.reversed_local_input_permutation_mapping`, the permute's row-id map (megatron/core/transformer/moe/
    token_dispatcher.py `dispatch_preprocess`)."""
    return (4.0 + 1.0) * m.num_experts * sh.routed_tokens + permute_row_id_map_bytes(m, sh)


def hybridep_buffer_bytes(m: ModelSpec, sh: Shard, lay: Layouts, ranks_per_domain):
    """GPU memory HybridEP (Megatron's `--moe-flex-dispatcher-backend hybridep`) allocates once per rank for its
    communication buffers, bytes.
    HybridEP sizes its buffers for every rank's tokens of the expert-parallel group G (DeepEP hybrid-ep branch,
    csrc/hybrid_ep/buffer/intranode.cu: max tokens = T x G; token buffer T G H x 2 bytes, routing probabilities
    T G (E_local x ranks per NVLink domain) x 4, scaling factors T G (H / 128) x 4, the all-gathered routing map
    E_local G T G x 1), with T the rank's tokens padded to at least 512 and a multiple of 64 (config.cuh). Across
    NVLink domains (internode_doca.cu) dispatch adds T H x 2 + T E_local G x 4 + T (H / 128) x 4 + (N - 1) T
    (2H + 4 E_local r + 4H / 128) and combine 2 (N - 1) T (2H + 4 E_local r), N = the group's domains, r = its ranks
    per domain. Zero without the flex dispatcher or expert parallelism."""
    h = float(m.moe_latent_size or m.hidden_size)
    g = lay.ep.astype(float)
    tokens = sh.routed_tokens
    t = np.ceil(np.maximum(tokens, 512.0) / 64.0) * 64.0
    e_local = np.maximum(sh.local_experts, 1.0)
    r = np.maximum(np.minimum(np.asarray(ranks_per_domain, dtype=float), g), 1.0)
    n = np.ceil(g / r)
    intranode = t * g * (h * BF16 + e_local * r * FP32 + (h / 128) * FP32) + e_local * g * t * g
    dispatch = t * h * BF16 + t * e_local * g * FP32 + t * (h / 128) * FP32 + \
        (n - 1) * t * (2 * h + 4 * e_local * r + 4 * h / 128)
    combine = 2 * (n - 1) * t * (2 * h + 4 * e_local * r)
    internode = np.where(n > 1, dispatch + combine, 0.0)
    return np.where(lay.moe_flex_dispatcher & (lay.ep > 1), intranode + internode, 0.0) if m.is_moe else 0.0 * g



# DeepEP's normal-mode (high-throughput) buffer, as Megatron sizes it. Sources, DeepEP at 567632dd (the last
# commit with the pre-EPv2 layout that Megatron's fused_a2a.py imports; megatron docker/Dockerfile.ci.dev
# DEEPEP_COMMIT pins de0dd118 of that line):
# - csrc/kernels/configs.cuh:3 NUM_MAX_NVL_PEERS 8; :5 NUM_WORKSPACE_BYTES 32 MiB; :7 NUM_BUFFER_ALIGNMENT_BYTES
#   128; :71-77 topk_idx_t int64 unless built with TOPK_IDX_BITS (Megatron's Dockerfile does not set it).
# - csrc/kernels/internode.cu:17-39 get_source_meta_bytes() = sizeof(SourceMeta) = two ints, 8 bytes.
# - csrc/config.hpp:52-74 get_nvl_buffer_size_hint and :76-104 get_rdma_buffer_size_hint (kNumMaxTopK = 128 and
#   kNumMaxScales = 128 at :55-56 and :84-85; the Config constructor at :46 aligns the RDMA recv chunk up to a
#   multiple of the RDMA send chunk).
# - deep_ep/buffer.py:233-260 get_dispatch_config and :263-290 get_combine_config, Config(num_sms, nvl send,
#   nvl recv, rdma send, rdma recv) by rank count; any other rank count asserts.
# - csrc/deep_ep.cpp:146-148 barrier signals and peer pointers (8 x 4 + 8 x 8 + 8 x 8 bytes) are allocated with
#   the NVLink buffer (:182-183); :197 the 32 MiB workspace; :368 the RDMA buffer, from NVSHMEM's symmetric heap.
# Megatron (d98e8a64): megatron/core/transformer/moe/fused_a2a.py:36-69 get_buffer takes, per buffer, the larger
# of the dispatch and combine configs' hints for group.size(), with hidden_bytes = hidden x max(element size, 2)
# (:24-33, so 2 bytes per element for bf16 or FP8 tokens); token_dispatcher.py:1837-1838 passes tp_ep_group, the
# expert-tensor-and-model-parallel group of ETP x EP ranks (process_groups_config.py:244-246); :1288-1292 sets
# num_sms to moe_flex_dispatcher_num_sms or 20 (autoplan emits no SM count, so 20).
_DEEPEP_NVL_PEERS = 8
_DEEPEP_MAX_TOPK = 128
_DEEPEP_MAX_SCALES = 128
_DEEPEP_TOPK_IDX_BYTES = 8
_DEEPEP_SOURCE_META_BYTES = 8
_DEEPEP_INT4_BYTES = 16
_DEEPEP_WORKSPACE_BYTES = 32 * 1024 ** 2
_DEEPEP_PEER_BYTES = _DEEPEP_NVL_PEERS * (4 + 8 + 8)
_DEEPEP_NUM_SMS = 20
# rank count: (dispatch (nvl recv, rdma send, rdma recv), combine (the same)); nvl send chunks do not size buffers.
_DEEPEP_CONFIGS = {
    2: ((256, 6, 128), (256, 6, 128)), 4: ((256, 6, 128), (256, 6, 128)), 8: ((256, 6, 128), (256, 6, 128)),
    16: ((288, 20, 128), (288, 12, 128)), 24: ((288, 8, 128), (288, 8, 128)), 32: ((288, 8, 128), (288, 8, 128)),
    48: ((288, 8, 128), (288, 8, 128)), 64: ((288, 8, 128), (288, 8, 128)), 96: ((480, 12, 128), (480, 8, 128)),
    128: ((560, 12, 128), (560, 8, 128)), 144: ((720, 12, 128), (720, 8, 128)),
    160: ((720, 12, 128), (720, 8, 128)),
}


def _align(x, a):
    return np.ceil(np.asarray(x, dtype=float) / a) * a


def deepep_nvl_buffer_hint(hidden_bytes, num_ranks, nvl_recv_tokens, num_sms=_DEEPEP_NUM_SMS):
    """DeepEP's `Config::get_nvl_buffer_size_hint` (csrc/config.hpp:52-74), bytes, for one config."""
    num_ranks = np.asarray(num_ranks, dtype=float)
    rdma = np.maximum(np.floor(num_ranks / _DEEPEP_NVL_PEERS), 1.0)
    nvl = np.minimum(num_ranks, _DEEPEP_NVL_PEERS)
    ch = num_sms // 2
    per_token = (hidden_bytes + _DEEPEP_SOURCE_META_BYTES + _DEEPEP_MAX_TOPK * _DEEPEP_TOPK_IDX_BYTES
                 + _DEEPEP_MAX_TOPK * FP32 + _DEEPEP_MAX_SCALES * FP32)
    return _align(ch * nvl * (2 * rdma + 3) * 4 + ch * nvl * nvl_recv_tokens * per_token, 128)


def deepep_rdma_buffer_hint(hidden_bytes, num_ranks, rdma_send_tokens, rdma_recv_tokens, num_sms=_DEEPEP_NUM_SMS):
    """DeepEP's `Config::get_rdma_buffer_size_hint` (csrc/config.hpp:76-104), bytes, for one config: zero within
    one NVLink node (num_ranks <= 8)."""
    num_ranks = np.asarray(num_ranks, dtype=float)
    rdma = np.floor(num_ranks / _DEEPEP_NVL_PEERS)
    ch = num_sms // 2
    recv = _align(rdma_recv_tokens, rdma_send_tokens)  # Config constructor, config.hpp:46
    per_token = 2 * (hidden_bytes + _DEEPEP_SOURCE_META_BYTES + _DEEPEP_MAX_TOPK * _DEEPEP_TOPK_IDX_BYTES
                     + _DEEPEP_MAX_TOPK * FP32 + _DEEPEP_MAX_SCALES * FP32 + _DEEPEP_INT4_BYTES)
    b = _align(ch * rdma * (_DEEPEP_NVL_PEERS * 2 + 2) * 2 * 4 + ch * rdma * recv * per_token, 128)
    return np.where(num_ranks > _DEEPEP_NVL_PEERS, b, 0.0)


def deepep_buffer_bytes(m: ModelSpec, lay: Layouts):
    """GPU memory DeepEP (Megatron's `--moe-flex-dispatcher-backend deepep`, the default, and the deprecated
    `--moe-enable-deepep`) allocates once per rank, bytes: the NVLink and RDMA buffers Megatron's get_buffer sizes
    as the larger of DeepEP's dispatch and combine hints for the ETP x EP group (sources above), plus the barrier
    signals and peer pointers allocated with the NVLink buffer and the 32 MiB workspace. Independent of the token
    count. Zero without the flex dispatcher or where the group has a rank count DeepEP has no config for (it
    asserts there, so no DeepEP run of that size exists)."""
    hb = float(m.moe_latent_size or m.hidden_size) * BF16
    g = (lay.ep * lay.etp).astype(float)
    out = np.zeros_like(g)
    for ranks, configs in _DEEPEP_CONFIGS.items():
        nvl = max(float(deepep_nvl_buffer_hint(hb, ranks, c[0])) for c in configs)
        rdma = max(float(deepep_rdma_buffer_hint(hb, ranks, c[1], c[2])) for c in configs)
        out = np.where(g == ranks, nvl + _DEEPEP_PEER_BYTES + _DEEPEP_WORKSPACE_BYTES + rdma, out)
    return np.where(lay.moe_flex_dispatcher, out, 0.0) if m.is_moe else 0.0 * g


def flex_dispatcher_buffer_bytes(m: ModelSpec, sh: Shard, lay: Layouts, ranks_per_domain):
    """GPU memory the flex token dispatcher allocates once per rank for its communication buffers, bytes: the larger
    of its two backends' (HybridEP's, `hybridep_buffer_bytes`, and DeepEP's, `deepep_buffer_bytes`). autoplan
    emits `--moe-flex-dispatcher-backend hybridep`, but an imported Megatron run may use either backend under the
    same switch and the planner does not know which, so memory is priced for the larger. Neither is always the
    larger: HybridEP's grows with the rank's tokens and the group, DeepEP's is fixed by the group size (DeepSeek-V3
    at EP 8: HybridEP about 0.12 GiB at 1024 tokens per rank and 0.48 GiB at 4096, DeepEP 0.34 GiB at both)."""
    return np.maximum(hybridep_buffer_bytes(m, sh, lay, ranks_per_domain), deepep_buffer_bytes(m, lay))


def moe_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    h = m.hidden_size
    region = sh.tokens_sp * h
    f = m.moe_ffn_hidden_size / lay.etp
    copies = sh.expert_tokens  # top-k copies of each token, after dispatch
    routed = (gemm_input_bytes(lay) * copies * h  # permuted expert input (fc1 input)
              + BF16 * copies * (2 if m.gated_mlp else 1) * f  # fc1 output
              + gemm_input_bytes(lay) * copies * f  # activation output (fc2 input)
              + routing_weight_bytes(copies) + weighted_activation_bytes(m, lay, copies, f)
              + FP32 * sh.tokens_sp * m.num_experts  # router logits/probabilities
              + routing_index_bytes(m, sh, lay))
    base = 2 * BF16 * region + dropout_mask_bytes(m, region)  # norm input + router input + dropout mask
    shared = 0.0
    if m.shared_expert_ffn_hidden_size:
        shared = mlp_activation_bytes(m, sh, lay, m.shared_expert_ffn_hidden_size, sh.tokens, lay.tp,
                                      fused_norm=False) - \
            (BF16 * region + dropout_mask_bytes(m, region))  # its norm input and mask are the layer's, in base
    return base + routed + shared
