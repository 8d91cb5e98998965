"""Per-rank memory, bytes, vectorised over candidates.

Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198) sec. 4.1 / Table 2 counts 34sbh + 5as^2b per layer (16-bit, dropout masks 1 byte). We keep
its itemisation but size each tensor from the real shapes (GQA/MLA projections, SwiGLU's two FC1 outputs, MoE's
top-k token copies), and use flash attention (no s^2 term; Dao et al. 2022 stores the output and the fp32
log-sum-exp). Sequence parallelism shards the norm/dropout regions by tp (Table 2, row 'sequence parallel').
Weights/grads/optimizer: Megatron-LM megatron/training/theoretical_memory_usage.py: bf16 params (2), fp32 main
grads (4), fp32 master params + Adam m, v (12); the distributed optimizer shards the 12 over DP (6 + 12/dp);
experts shard over expert-DP."""
from __future__ import annotations

import numpy as np

from autoplan.costmodel.compute import BF16, Shard, mix_bf16_layers
from autoplan.costmodel.layout import Layouts
from autoplan.costmodel.mamba import hybrid_layer_activation_bytes
from autoplan import cuda_graphs as G
from autoplan.model import ModelSpec
from autoplan.recompute import has

FP32 = 4
FP8 = 1


def gemm_input_bytes(lay: Layouts):
    """Bytes per element of a saved GEMM input: TransformerEngine's Linear / LayerNormLinear / GroupedLinear save
    the quantised input (not the bf16 one) for the weight-gradient GEMM when FP8/FP4 is on
    (transformer_engine/pytorch/module/linear.py `ctx.save_for_backward(inputmat, ...)` after quantisation), its
    scales included (`lay.quant_bytes`: 1 for per-tensor scaling, + 1/32 for MXFP8, 0.5625 for NVFP4)."""
    return np.where(lay.fp8, lay.quant_bytes, BF16)


def norm_linear_input_bytes(lay: Layouts):
    """Bytes per element of the normalised input a fused norm + linear (TransformerEngine LayerNormLinear: Megatron's
    QKV, dense FC1 and Mamba in_proj) saves for its weight gradient: the local, pre-gather shard, as
    `gemm_input_bytes`, except under NVFP4 with sequence parallelism, where it keeps both its row- and column-wise
    copies (transformer_engine/pytorch/module/layernorm_linear.py forward: `ln_out.update_usage(rowwise_usage=False)`
    only for MXFP8 / blockwise storage or without the all-gather; NVFP4 needs the column-wise copy, its quantizer
    not supporting a row-wise-only gather), 2 x 0.5625 bytes; TE 2.8-2.20 alike."""
    return np.where(lay.fp4 & lay.sp, 2.0 * lay.quant_bytes, gemm_input_bytes(lay))


def qkv_input_bytes(m: ModelSpec, lay: Layouts):
    """Bytes per element of the saved QKV input (the input-norm output): a fused norm + linear's
    (`norm_linear_input_bytes`), except MLA, whose down projections are plain linears after a separate norm."""
    return gemm_input_bytes(lay) if m.multi_latent_attention else norm_linear_input_bytes(lay)


def dropout_mask_bytes(m: ModelSpec, elements):
    """One byte per element of a hidden-dropout mask (Korthikanti Table 2); none at p = 0: torch's dropout
    returns its input unchanged when p = 0 and saves no mask (torch/nn/functional.py `dropout`,
    aten native_dropout). Attention dropout stores no mask under flash attention (Dao et al. 2022 sec. 3.1:
    regenerated from the RNG state)."""
    return elements if m.hidden_dropout > 0 else 0.0 * elements


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
    return norm_in + qkv_in + qkv + attention_output_bytes(m, sh, lay) + softmax_stats_bytes(sh) + dropout_mask


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


def routing_weight_bytes(copies):
    """The routing probabilities the experts' weighting saves for backward, one fp32 per routed copy. Megatron
    weights the copies inside the expert activation (megatron/core/transformer/moe/experts.py TEGroupedMLP.forward
    `bias_act_func(fc1_output, bias, permuted_probs)`) and the token dispatchers unpermute without probabilities
    (transformer/moe/token_dispatcher.py `unpermute(...)`, no `probs=`), so the experts' output is not held."""
    return FP32 * copies


def weighted_activation_bytes(m: ModelSpec, lay: Layouts, copies, f):
    """Beyond its input and the probabilities, what the weighted expert activation saves for backward, bytes.
    Gated experts run the fused `weighted_bias_swiglu_impl` (fusions/fused_bias_swiglu.py WeightedSwiGLUFunction
    `ctx.save_for_backward(input_for_backward, weights)`) and non-gated ones with `lay.fused_sq_relu`
    `weighted_squared_relu_impl` (fusions/fused_weighted_squared_relu.py WeightedSquaredReLUFunction
    `ctx.save_for_backward(input, weights)`): nothing more. Other non-gated experts take experts.py's unfused branch
    `activation_func(x) * permuted_probs`, whose product saves the bf16 activation output (f wide per copy) for the
    probabilities' gradient. moe_act recompute checkpoints this function, so that output is rebuilt then."""
    unfused = np.logical_and(not m.gated_mlp, ~np.asarray(lay.fused_sq_relu, bool))
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


def flex_dispatcher_buffer_bytes(m: ModelSpec, sh: Shard, lay: Layouts, ranks_per_domain):
    """GPU memory the flex token dispatcher allocates once per rank for its communication buffers, bytes: HybridEP's
    (the larger of Megatron's two flex backends; DeepEP's NVLink and RDMA buffers are 0.2-0.7 GiB at these sizes).
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
    return np.where(lay.moe_flex & (lay.ep > 1), intranode + internode, 0.0) if m.is_moe else 0.0 * g


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


def selective_dropped_bytes(m: ModelSpec, sh: Shard, lay: Layouts, moe: bool):
    """Bytes of one layer's saved activations that selective recompute rebuilds instead of holding, for the
    modules in `lay.recompute_modules` (autoplan/recompute.py; each tensor as sized above, dropped when any module
    that covers it is on; megatron/core/transformer/transformer_layer.py, moe/moe_layer.py, moe/experts.py)."""
    on = lambda *names: has(lay.recompute_modules, *names)  # noqa: E731
    h = m.hidden_size
    region = sh.tokens_sp * h
    g_in = gemm_input_bytes(lay)
    # core_attn (Korthikanti sec. 4.2) checkpoints core attention: its inputs q, k, v stay saved and its output is
    # still saved as the input of linear_proj (megatron/core/transformer/attention.py
    # `_checkpointed_attention_forward`), so with flash attention only the softmax statistics are dropped
    # (Korthikanti Table 2 also keeps 11sbh of attention under selective).
    # Under delayed-scaling FP8, linear_proj keeps its own FP8 copy, so the checkpoint drops the bf16 output too.
    dropped = np.where(on("core_attn"), softmax_stats_bytes(sh) + np.where(lay.fp8_delayed, BF16, 0.0)
                       * attention_output_elements(m, sh), 0.0)
    dropped = dropped + np.where(on("layernorm"), qkv_input_bytes(m, lay) * region, 0.0)  # = QKV input
    if m.multi_latent_attention:
        dropped = dropped + np.where(on("mla_up_proj"), mla_qkv_bytes(m, sh), 0.0)
    if not moe:  # dense MLP: "mlp" keeps only the block input (the pre-MLP norm is fused into FC1)
        gate_up = (2 if m.gated_mlp else 1) * m.ffn_hidden_size / lay.tp
        fc1_in = norm_linear_input_bytes(lay) * region
        inner = BF16 * sh.tokens * gate_up + g_in * sh.tokens * m.ffn_hidden_size / lay.tp
        return dropped + np.where(on("layernorm", "mlp"), fc1_in, 0.0) + np.where(on("mlp"), inner, 0.0)
    f = m.moe_ffn_hidden_size / lay.etp
    copies = sh.expert_tokens
    act_out = g_in * copies * f + weighted_activation_bytes(m, lay, copies, f)
    routed_rest = (g_in * copies * h + BF16 * copies * (2 if m.gated_mlp else 1) * f
                   + routing_weight_bytes(copies) + FP32 * sh.tokens_sp * m.num_experts
                   + routing_index_bytes(m, sh, lay))
    dropped = dropped + np.where(on("layernorm"), BF16 * region, 0.0)  # pre-MLP norm output = router input
    dropped = dropped + np.where(on("moe_act", "moe"), act_out, 0.0) + np.where(on("moe"), routed_rest, 0.0)
    if m.shared_expert_ffn_hidden_size:
        fs = m.shared_expert_ffn_hidden_size / lay.tp
        # As held (mlp_activation_bytes, fused_norm=False): the fc1 input is the local shard under SP.
        shared = g_in * region + BF16 * sh.tokens * (2 if m.gated_mlp else 1) * fs + g_in * sh.tokens * fs
        dropped = dropped + np.where(on("shared_experts", "moe"), shared, 0.0)
    return dropped


def norm_statistics_bytes(m: ModelSpec, sh: Shard):
    """The fp32 statistics each pre-norm of a layer saves per (sequence-parallel local) token: RMSNorm's 1/rms,
    LayerNorm's mean and 1/std (TransformerEngine LayerNormLinear / TENorm save `rsigma` (and `mu`)); two norms per
    transformer layer, one per hybrid layer. The sandwich norms' statistics are in `sandwich_norm_bytes`."""
    stats = 1 if m.normalization == "rmsnorm" else 2
    return (1 if m.is_hybrid else 2) * stats * FP32 * sh.tokens_sp


def layer_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts, moe: bool):
    """(no recompute, selective recompute, full-recompute checkpoint) bytes for one layer and micro batch."""
    if m.bf16_first_layers + m.bf16_last_layers and np.any(lay.fp8):  # bf16 layers save 2-byte GEMM inputs
        none, sel, ckpt = mix_bf16_layers(m, lay, lambda low: _layer_activation_bytes(m, sh, low, moe))
    else:
        none, sel, ckpt = _layer_activation_bytes(m, sh, lay, moe)
    stats = norm_statistics_bytes(m, sh)
    return none + stats, sel + stats, ckpt


def _layer_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts, moe: bool):
    if m.is_hybrid:  # Mamba / attention hybrids: per layer kind, autoplan/costmodel/mamba.py
        return hybrid_layer_activation_bytes(m, sh, lay, moe)
    attn_none = attention_activation_bytes(m, sh, lay)
    mlp = moe_activation_bytes(m, sh, lay) if moe else \
        mlp_activation_bytes(m, sh, lay, m.ffn_hidden_size, sh.tokens, lay.tp)
    checkpoint = BF16 * sh.tokens_sp * m.hidden_size  # the layer input (Korthikanti sec. 4.1, 2sbh/t with SP)
    none = attn_none + mlp + sandwich_norm_bytes(m, sh)
    return none, none - selective_dropped_bytes(m, sh, lay, moe), checkpoint


def logits_bytes(m: ModelSpec, sh: Shard, lay: Layouts):
    """Last stage, one micro batch, the larger of the two moments the logits live. Megatron's vocab-parallel cross
    entropy (megatron/core/tensor_parallel/cross_entropy.py and the jit-fused
    megatron/core/fusions/fused_cross_entropy.py alike) upcasts the bf16 logits to an fp32 copy that becomes the
    saved softmax in place (`calculate_logits_max` .float(), `torch.exp(..., out=exp_logits)`): bf16 + fp32 at the
    end of forward; backward turns the softmax into the gradient in place and hands back a bf16 copy: fp32 + bf16.
    6 bytes per logit either way. TransformerEngine's fused cross entropy (Megatron --cross-entropy-fusion-impl te,
    transformer_engine/pytorch/cross_entropy.py) computes the loss in fp32 registers and writes the gradient into
    the bf16 logits during forward, which is all it saves: 2 bytes per logit. Final-logit soft-capping
    (cap * tanh(logits / cap), HF modeling_gemma2.py Gemma2ForCausalLM.forward) holds one more bf16 copy: tanh saves
    its output for backward (torch tools/autograd/derivatives.yaml `tanh: tanh_backward(grad, result)`)."""
    per_logit = np.where(lay.te_cross_entropy, BF16, BF16 + FP32) + (BF16 if m.logit_softcapping else 0)
    return per_logit * sh.tokens * m.vocab_size / np.where(lay.vocab_tp, lay.tp, 1)


def embedding_activation_bytes(m: ModelSpec, sh: Shard):
    """Embedding dropout mask and the int64 token ids (Megatron theoretical_memory_usage: 8sb + sbh). The bf16
    embedding output is not held by the embedding (its backward needs only the ids,
    megatron/core/tensor_parallel/layers.py VocabParallelEmbedding); it is the first layer's saved input, which
    that layer's norm input already counts."""
    return dropout_mask_bytes(m, sh.tokens_sp * m.hidden_size) + 8 * sh.tokens


def optimizer_bytes_per_param(lay: Layouts):
    """Adam state bytes per parameter: fp32 master copy + fp32 m + fp32 v = 12 (Megatron
    theoretical_memory_usage.py). With the precision-aware optimizer and bf16 moments (`lay.adam_bf16`:
    --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16) TE's FusedAdam allocates m and v
    in bf16 (megatron/core/optimizer/__init__.py passes `exp_avg_dtype` / `exp_avg_sq_dtype` to TE FusedAdam), 2
    bytes each; the master copy stays fp32, 4 bytes, counted whole: the distributed optimizer keeps it itself under
    FP8 (distrib_optimizer.py `_build_model_and_main_param_groups`, `shard_main_param = ....float()` unless
    `use_precision_aware_optimizer_no_fp8_or_ds_fp8`), and where TE holds it instead its 16-bit remainder
    (`store_param_remainders`) would be 2 bytes, so 4 is an upper bound there. 4 + 2 + 2 = 8."""
    return np.where(lay.adam_bf16, FP32 + 2 * BF16, 3.0 * FP32)


# Per token of one micro batch, the batch tensors a full-iteration graph copies into its static buffers: token ids,
# labels and position ids (int64) and the loss mask (fp32) (megatron/core/full_cuda_graph.py StaticBufferLoader).
FULL_GRAPH_BATCH_BYTES_PER_TOKEN = 8 + 8 + 8 + 4


def cuda_graph_static_bytes(m: ModelSpec, sh: Shard, lay: Layouts, seq_len: int, chunk_layers, copies,
                            num_microbatches):
    """Static buffers CUDA graphs keep besides the activations, bytes. Per-layer graphs (TransformerEngine impl):
    each captured layer keeps its own static input, the bf16 hidden states (megatron/core/transformer/module.py
    `get_layer_static_inputs`), and, when its attention is captured, a bool causal mask of mbs x s/cp x s
    (transformer_layer.py `get_layer_static_inputs`); a buffer is reused once its micro batch's backward ran
    (cuda_graphs.py), so each of a model chunk's `chunk_layers` layers holds one set per micro batch in flight
    (`copies`, as its activations). Counted beside the activations although the graph may save its static input
    in place of the layer input (an upper bound). Full iteration: a static copy of every micro batch's input
    tensors (full_cuda_graph.py StaticBufferLoader)."""
    bits = lay.cuda_graph
    per_layer = np.any([G.captured(bits, p) for p in ("attn", "mlp", "moe_router", "mamba")], axis=0)
    attn_layers = chunk_layers * (m.layer_count("*") / max(m.num_layers, 1) if m.is_hybrid else 1.0)
    per_layer_kind = ~G.captured(bits, "rest")  # not full_iteration
    hidden = BF16 * sh.tokens_sp * m.hidden_size
    mask = lay.mbs * (seq_len / lay.cp) * seq_len  # 1 byte per bool
    layer_buffers = copies * (chunk_layers * hidden + np.where(G.captured(bits, "attn"), attn_layers * mask, 0.0))
    full = num_microbatches * lay.mbs * seq_len * FULL_GRAPH_BATCH_BYTES_PER_TOKEN
    return np.where(per_layer & per_layer_kind, layer_buffers, 0.0) + np.where(G.captured(bits, "rest"), full, 0.0)


def optimizer_step_grad_copy_bytes(params_dense, params_expert, lay: Layouts, edp):
    """The fp32 copy of the gradients Megatron's optimizer step makes from a bf16 grad buffer, bytes, alive only
    during the step (released by the next `zero_grad(set_to_none=True)`): the distributed optimizer's
    `_copy_model_grads_to_main_grads` (optimizer/distrib_optimizer.py: `shard_main_param.grad =
    shard_model_grad.float()`) for the rank's shard, unless the precision-aware optimizer reads the bf16 grad
    directly (bf16 Adam moments without FP8 or with delayed FP8: optimizer_config.py
    `use_precision_aware_optimizer_no_fp8_or_ds_fp8`); without it (zero 0) `main_param.grad =
    model_param.main_grad.float()` (optimizer/optimizer.py) for every parameter. An fp32 grad buffer is copied to
    no new tensor (`.float()` of an fp32 tensor is itself). Megatron-FSDP: always (below). DeepSpeed: not priced
    here."""
    dp = lay.dp * lay.cp
    shard = params_dense / dp + params_expert / edp
    precision_aware = lay.adam_bf16 & (~lay.fp8 | lay.fp8_delayed)
    distributed = np.where(lay.grad_bf16 & ~precision_aware, FP32 * shard, 0.0)
    plain = np.where(lay.grad_bf16, FP32 * (params_dense + params_expert), 0.0)
    # Megatron-FSDP keeps its grad shard in the parameter dtype (bf16) and casts it to fp32 at the step
    # (megatron_fsdp param_and_grad_buffer.py `update_main_grads`: `optimizer_grad.to(param.dtype)`).
    fsdp = FP32 * shard
    copy = np.where(lay.zero == 0, plain, np.where(lay.zero == 1, distributed, fsdp))
    return np.where(lay.deepspeed, 0.0, copy)


def state_bytes(params_dense, params_expert, lay: Layouts, edp, fp8):
    """(weights, grads, optimizer) bytes per rank for `params_dense` TP/DP-replicated-sharded and
    `params_expert` EP-sharded local parameters. ZeRO-2/3 follow Rajbhandari et al. 2020 (ZeRO), sec. 5."""
    dp = lay.dp * lay.cp  # Megatron shards the optimizer over the data-parallel x context-parallel group
    total = params_dense + params_expert
    weights = np.where(lay.zero >= 3, BF16 * (params_dense / dp + params_expert / edp), BF16 * total)
    grad_size = np.where(lay.grad_bf16, BF16, FP32)  # main-grad buffer dtype
    grads = np.where(lay.zero >= 2, grad_size * (params_dense / dp + params_expert / edp), grad_size * total)
    per_param = optimizer_bytes_per_param(lay)
    optimizer = np.where(lay.zero >= 1, per_param * (params_dense / dp + params_expert / edp), per_param * total)
    # FP8: TransformerEngine keeps an fp8 copy of each GEMM weight and, on Hopper, its transpose (MXFP8 / NVFP4:
    # row- and column-wise copies), each `lay.quant_bytes` per element with its scales. Under ZeRO-3 / FSDP only the local shard persists (gathered copies are per layer).
    # FP8 primary weights (--fp8-param-gather) make those FP8 tensors the parameters themselves: no bf16 copy is
    # kept (megatron/core/fp8_utils.py `get_fp8_context(is_init=True)` builds the TE modules under TE's quantized
    # model init when `config.fp8_param` is set; the
    # distributed optimizer's fp32 main params are the only high-precision copy, counted in `optimizer`).
    # Sharded FP8 copies only when they are the parameters (fp8_param) or under DeepSpeed: with bf16 parameters,
    # TransformerEngine's Linear caches each layer's full FP8 weight (`_fp8_workspaces["weight"]`, kept unless
    # FSDP2), so under Megatron-FSDP every layer's tp-local FP8 copy persists.
    sharded = (lay.zero >= 3) & (lay.fp8_param | lay.deepspeed)
    local = np.where(sharded, params_dense / dp + params_expert / edp, total)
    weights = np.where(fp8 & lay.fp8_param, 0.0, weights) + np.where(fp8, 2.0 * lay.quant_bytes * local, 0.0)
    return weights, grads, optimizer
