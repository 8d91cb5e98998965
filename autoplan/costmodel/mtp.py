"""Multi-token prediction (MTP) depths of any decoder (Megatron --mtp-num-layers; for a hybrid with
--mtp-hybrid-override-pattern; DeepSeek-V3 technical report, arXiv:2412.19437, sec. 2.2). Each depth, on the last
pipeline stage (megatron/core/transformer/multi_token_prediction.py MultiTokenPredictionLayer): RMSNorm of the
hidden state (hnorm) and of the next tokens' embedding (enorm), the projection eh_proj [h; emb] (2h -> h), the
depth's layers (`ModelSpec.mtp_depth_pattern`: a hybrid's pattern, else one layer of the model's kind), a final norm, then the shared LM head and its cross entropy.
With `mtp_shared_weights` (mtp_use_repeated_layer) every depth runs the same layer weights."""
from __future__ import annotations

import numpy as np

from autoplan.costmodel import compute as C
from autoplan.costmodel import mamba
from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.layout import Layouts
from autoplan.model import ModelSpec


def mtp_params(m: ModelSpec):
    """(tp-sharded, replicated, expert) parameters of the MTP depths: eh_proj and the layers per depth (once when
    shared), three norms per depth. The LM head is the model's own."""
    if not m.mtp_num_layers:
        return 0, 0, 0
    weight_sets = 1 if m.mtp_shared_weights else m.mtp_num_layers
    sharded = replicated = expert = 0
    for symbol in m.mtp_depth_pattern:
        s, r, e = mamba.symbol_params(m, symbol)
        sharded, replicated, expert = sharded + s, replicated + r, expert + e
    h = m.hidden_size
    return (weight_sets * (sharded + 2 * h * h), weight_sets * replicated + m.mtp_num_layers * 3 * h,
            weight_sets * expert)


def mtp_forward_time(m: ModelSpec, sh: C.Shard, lay: Layouts, hw: Hardware, cal: Calibration, head_fwd):
    """Forward seconds of every MTP depth of one micro batch on the last stage; `head_fwd` is the LM head and
    loss forward, which each depth runs again."""
    if not m.mtp_num_layers:
        return 0.0
    seq = sh.tokens * lay.cp / lay.mbs  # the sequence length the shard was cut from
    layers = sum(mamba.symbol_time(m, sh, lay, seq, hw, cal, k).fwd for k in m.mtp_depth_pattern)
    cal = C.scoped(cal, lay, "rest")  # eh_proj and the depth's norms sit outside the per-layer graph scopes
    eh_proj = C.gemm_time(sh.tokens, m.hidden_size / lay.tp, 2 * m.hidden_size, lay, hw, cal)
    norms = C.elementwise_time(3 * 2 * C.BF16 * sh.tokens_sp * m.hidden_size, hw, cal, 3)
    return m.mtp_num_layers * (layers + eh_proj + norms + head_fwd)


def mtp_activation_bytes(m: ModelSpec, sh: C.Shard, lay: Layouts, logits_one):
    """Bytes the MTP depths hold for backward on the last stage: per depth its layers' activations, the
    eh_proj input (2h per token) and one more set of logits (`logits_one`, as the main head holds)."""
    if not m.mtp_num_layers:
        return 0.0 * sh.tokens
    from autoplan.costmodel.memory import gemm_input_bytes

    layers = sum(mamba.symbol_activation_bytes(m, sh, lay, k) for k in m.mtp_depth_pattern)
    eh_in = gemm_input_bytes(lay) * sh.tokens * 2 * m.hidden_size
    return m.mtp_num_layers * (layers + eh_in + logits_one) + 0.0 * np.asarray(sh.tokens)
