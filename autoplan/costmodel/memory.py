"""Per-rank memory, bytes, vectorised over candidates.

Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198) sec. 4.1 / Table 2 counts 34sbh + 5as^2b per layer (16-bit, dropout masks 1 byte). We keep
its itemisation but size each tensor from the real shapes (GQA/MLA projections, SwiGLU's two FC1 outputs, MoE's
top-k token copies), and use flash attention (no s^2 term; Dao et al. 2022 stores the output and the fp32
log-sum-exp). Sequence parallelism shards the norm/dropout regions by tp (Table 2, row 'sequence parallel').
Weights/grads/optimizer: Megatron-LM megatron/training/theoretical_memory_usage.py: bf16 params (2), fp32 main
grads (4), fp32 master params + Adam m, v (12); the distributed optimizer shards the 12 over DP (6 + 12/dp);
experts shard over expert-DP.
Each layer kind's saved tensors are itemised in its module under `layers/`; this module sums a layer's, drops
what selective recompute rebuilds, and adds the logits, embedding, CUDA-graph buffers and the model state."""
from __future__ import annotations

import numpy as np

from autoplan import cuda_graphs as G
from autoplan.costmodel.layers.base import (BF16, FP8, FP32, Layouts, Shard, dropout_mask_bytes,  # noqa: F401
                                            gemm_input_bytes, mix_bf16_layers, norm_linear_input_bytes)
from autoplan.costmodel.layers.dense import (attention_activation_bytes, attention_output_bytes,  # noqa: F401
                                             attention_output_elements, cp_forward_working_bytes, mla_qkv_bytes,
                                             mlp_activation_bytes, qkv_input_bytes, sandwich_norm_bytes,
                                             softmax_stats_bytes)
from autoplan.costmodel.layers.mamba import hybrid_layer_activation_bytes
from autoplan.costmodel.layers.mixers import mixer_activation_bytes
from autoplan.costmodel.layers.moe import (dispatcher_state_bytes, flex_dispatcher_buffer_bytes,  # noqa: F401
                                           moe_activation_bytes, permute_row_id_map_bytes, routing_index_bytes,
                                           routing_weight_bytes, weighted_activation_bytes)
from autoplan.model import ModelSpec
from autoplan.recompute import has


def selective_dropped_bytes(m: ModelSpec, sh: Shard, lay: Layouts, moe: bool):
    """Bytes of one layer's saved activations that selective recompute rebuilds instead of holding, for the
    modules in `lay.recompute_modules` (autoplan/recompute.py; each tensor as sized in layers/dense.py and
    layers/moe.py, dropped when any module that covers it is on; megatron/core/transformer/transformer_layer.py,
    moe/moe_layer.py, moe/experts.py)."""
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
    if m.is_hybrid:  # Mamba / attention hybrids: per layer kind, autoplan/costmodel/layers/mamba.py
        return hybrid_layer_activation_bytes(m, sh, lay, moe)
    attn_none = mixer_activation_bytes(m, sh, lay, attention_activation_bytes(m, sh, lay))
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
    theoretical_memory_usage.py). With the precision-aware optimizer and bf16 moments (`lay.adam_bf16_states`:
    --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16) TE's FusedAdam allocates m and v
    in bf16 (megatron/core/optimizer/__init__.py passes `exp_avg_dtype` / `exp_avg_sq_dtype` to TE FusedAdam), 2
    bytes each; the master copy stays fp32, 4 bytes, counted whole: the distributed optimizer keeps it itself under
    FP8 (distrib_optimizer.py `_build_model_and_main_param_groups`, `shard_main_param = ....float()` unless
    `use_precision_aware_optimizer_no_fp8_or_ds_fp8`), and where TE holds it instead its 16-bit remainder
    (`store_param_remainders`) would be 2 bytes, so 4 is an upper bound there. 4 + 2 + 2 = 8.
    DeepSpeed with bf16 master weights (`lay.bf16_master_weights`, bf16.bf16_master_weights_and_grads): ZeRO's
    master partition is allocated in bf16 (runtime/zero/stage_1_and_2.py `weights_partition ... .to(dtype=
    self.master_weights_and_grads_dtype)`, stage3.py `fp32_partitioned_groups_flat` in the same dtype), 2 bytes; with
    bf16.bf16_optimizer_states (`adam_bf16_states`) Adam's moments, created like the master partition they update,
    are bf16 too: 2 + 2 + 2 = 6."""
    master = np.where(lay.bf16_master_weights, BF16, FP32)
    return master + np.where(lay.adam_bf16_states, 2 * BF16, 2 * FP32)


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
    bits = lay.cuda_graph_modules
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
    precision_aware = lay.adam_bf16_states & (~lay.fp8 | lay.fp8_delayed)
    distributed = np.where(lay.grad_reduce_bf16 & ~precision_aware, FP32 * shard, 0.0)
    plain = np.where(lay.grad_reduce_bf16, FP32 * (params_dense + params_expert), 0.0)
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
    # Main-grad buffer dtype; DeepSpeed's partitioned gradients (ZeRO-2/3) take the master weights' dtype
    # (stage_1_and_2.py initialize_optimizer_states: the partition's .grad in `single_partition_of_fp32_groups`'
    # dtype; stage3.py likewise), bf16 with bf16_master_weights.
    grad_size = np.where(lay.grad_reduce_bf16 | (lay.bf16_master_weights & (lay.zero >= 2)), BF16, FP32)
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


def mxfp8_module_copy_bytes(m: ModelSpec, lay: Layouts):
    """What the weight copies of the modules a per-module recipe runs in MXFP8 (`ModelSpec.mxfp8_modules`) add to
    `state_bytes`, which counts every GEMM weight's two quantised copies at the run's `lay.quant_bytes`: 2 x
    (MXFP8 - the run's bytes) per element of those modules' weights, every such layer of the model on the rank
    (an upper bound on a pipeline stage or under ZeRO-3), sharded over tp. The bf16 modules' copies, which
    TransformerEngine does not make, stay counted (an upper bound too)."""
    from autoplan.costmodel import params as P
    from autoplan.costmodel.layout import QUANTISED_BYTES

    moe_layers = m.layer_count("E") if m.is_hybrid else m.num_layers
    attn_layers = m.layer_count("*") if m.is_hybrid else m.num_layers
    per_module = {"mamba_out_proj": m.layer_count("M") * m.mamba_d_inner * m.hidden_size,
                  "attention_linear": attn_layers * P.attention_params(m),
                  "latent_proj": moe_layers * P.latent_projection_params(m),
                  "mtp": sum(P.mtp_params(m))}
    elements = sum(per_module[k] for k in m.mxfp8_modules) / lay.tp
    if "attention_linear" in m.mxfp8_modules:  # a DSA indexer is whole on every tp rank (params.dsa_indexer_params)
        elements = elements + attn_layers * P.dsa_indexer_params(m)
    extra = 2.0 * np.maximum(QUANTISED_BYTES["mxfp8"] - lay.quant_bytes, 0.0) * elements
    return np.where(lay.fp8, extra, 0.0)


def checkpoint_bytes(params_dense, params_expert, lay: Layouts, edp):
    """(local, unique) checkpoint bytes of a rank, from `state_bytes` (bf16 weights, fp32 master copy and Adam moments
    of the layout; no gradients, no FP8 weight caches, which a checkpoint does not hold).
    local: everything the rank holds, what a local (per-rank) checkpoint writes (Megatron --non-persistent-ckpt-type
    local saves each rank's own sharded state dict: megatron/training/checkpointing.py, `LocalCheckpointManager`).
    unique: the rank's share of a global distributed checkpoint, replicated tensors split over their replicas
    (fully parallel save, Megatron's default: CheckpointConfig.fully_parallel_save "Disable applying full save
    parallelization across DP"): the weights are replicated over the data-parallel group unless ZeRO-3 / FSDP
    shards them, the optimizer state unless the distributed optimizer (zero >= 1) does; dense parameters over
    dp x cp, expert parameters over the expert-data-parallel group `edp`."""
    no_fp8 = np.zeros(len(lay), dtype=bool)
    w_dense, _, o_dense = state_bytes(params_dense, 0.0, lay, edp, no_fp8)
    w_expert, _, o_expert = state_bytes(0.0, params_expert, lay, edp, no_fp8)
    local = w_dense + o_dense + w_expert + o_expert
    dp = lay.dp * lay.cp
    weight_copies = lambda group: np.where(lay.zero >= 3, 1, group)  # noqa: E731
    optimizer_copies = lambda group: np.where(lay.zero >= 1, 1, group)  # noqa: E731
    unique = (w_dense / weight_copies(dp) + o_dense / optimizer_copies(dp)
              + w_expert / weight_copies(edp) + o_expert / optimizer_copies(edp))
    return local, unique
