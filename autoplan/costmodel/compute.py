"""Per-layer compute time on one rank for one micro batch, vectorised over candidates: each layer kind's forward
(`layers/dense.py`, `layers/moe.py`, `layers/mamba.py`, `layers/mtp.py`, all on `layers/base.py`), the bf16-layer
mix, the LM head and embedding, and what selective recompute repeats. Backward is derived from the forward
(`LayerTime.bwd`)."""
from __future__ import annotations

from dataclasses import fields

import numpy as np

from autoplan import recompute as R
from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.layers.base import (BF16, REFERENCE_K, LayerTime, Layouts, Shard, cast_bytes,  # noqa: F401
                                            elementwise_time, gemm_time, kernel_costs, mix_bf16_layers,
                                            reduction_efficiency, scoped, shard_of, without_low_precision)
from autoplan.costmodel.layers.dense import (DENSE_KERNELS, attention_core_time, attention_efficiency,  # noqa: F401
                                             attention_gemm_time, mlp_gemm_time)
from autoplan.costmodel.layers.mamba import hybrid_layer_time
from autoplan.costmodel.layers.moe import (BIAS_BWD, BIAS_FWD, CLAMP_BWD, CLAMP_BWD_OPS, CLAMP_FWD,  # noqa: F401
                                           CLAMP_FWD_OPS, HYBRID_MOE_KERNELS, MOE_KERNELS, clamped_glu,
                                           elementwise_bytes, grouped_token_efficiency, moe_gemm_time,
                                           unfused_expert_extras)
from autoplan.costmodel.layers.mixers import with_mixers
from autoplan.costmodel.layers.mtp import mtp_forward_time
from autoplan.costmodel.params import norms_per_layer
from autoplan.model import ModelSpec


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
    return with_mixers(m, sh, lay, seq_len, hw, cal_attn, LayerTime(attn, core, mlp, elem))


def head_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration):
    """LM head GEMM (kept in bf16) + vocab-parallel cross entropy (fp32 logits, a few passes), forward; plus the
    MTP depths (autoplan/costmodel/layers/mtp.py), whose backward the caller takes as twice the forward like the
    head's."""
    no_fp8 = np.zeros_like(lay.fp8)
    cal = scoped(cal, lay, "rest")
    vocab = m.vocab_size / np.where(lay.vocab_tp, lay.tp, 1)
    gemm = gemm_time(sh.tokens, vocab, m.hidden_size, lay, hw, cal, fp8=no_fp8)
    xent = elementwise_time(3 * 4 * sh.tokens * vocab, hw, cal, 6)
    if m.logit_softcapping:  # divide, tanh, multiply over the bf16 logits (r+w each)
        xent = xent + elementwise_time(3 * 2 * BF16 * sh.tokens * vocab, hw, cal, 3)
    if m.mtp_num_layers:  # multi-token-prediction depths run on the last stage, each with the head again
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
    clamped = clamped_glu(m) & ~lay.te_op_fuser
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
