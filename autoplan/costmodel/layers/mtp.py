"""Multi-token prediction (MTP) depths of any decoder (Megatron --mtp-num-layers; for a hybrid with
--mtp-hybrid-override-pattern; DeepSeek-V3 technical report, arXiv:2412.19437, sec. 2.2). Each depth, on the last
pipeline stage (megatron/core/transformer/multi_token_prediction.py MultiTokenPredictionLayer): RMSNorm of the
hidden state (hnorm) and of the next tokens' embedding (enorm), the projection eh_proj [h; emb] (2h -> h), the
depth's layers (`ModelSpec.mtp_depth_pattern`: a hybrid's pattern, else one layer of the model's kind), a final norm, then the shared LM head and its cross entropy.
With `mtp_shared_weights` (mtp_use_repeated_layer) every depth runs the same layer weights."""
from __future__ import annotations

import numpy as np

from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.layers.base import (BF16, Layouts, Shard, elementwise_time, gemm_input_bytes, gemm_time,
                                            module_layouts, scoped)
from autoplan.costmodel.layers.mamba import symbol_activation_bytes, symbol_time
from autoplan.model import ModelSpec


def mtp_forward_time(m: ModelSpec, sh: Shard, lay: Layouts, hw: Hardware, cal: Calibration, head_fwd):
    """Forward seconds of every MTP depth of one micro batch on the last stage; `head_fwd` is the LM head and
    loss forward, which each depth runs again."""
    if not m.mtp_num_layers:
        return 0.0
    seq = sh.tokens * lay.cp / lay.mbs  # the sequence length the shard was cut from
    lay = module_layouts(m, lay, "mtp")  # every module of the depths at the per-module recipe's precision
    layers = sum(symbol_time(m, sh, lay, seq, hw, cal, k).fwd for k in m.mtp_depth_pattern)
    cal = scoped(cal, lay, "rest")  # eh_proj and the depth's norms sit outside the per-layer graph scopes
    eh_proj = gemm_time(sh.tokens, m.hidden_size / lay.tp, 2 * m.hidden_size, lay, hw, cal)
    norms = elementwise_time(3 * 2 * BF16 * sh.tokens_sp * m.hidden_size, hw, cal, 3)
    return m.mtp_num_layers * (layers + eh_proj + norms + head_fwd)


def mtp_activation_bytes(m: ModelSpec, sh: Shard, lay: Layouts, logits_one):
    """Bytes the MTP depths hold for backward on the last stage: per depth its layers' activations, the
    eh_proj input (2h per token) and one more set of logits (`logits_one`, as the main head holds)."""
    if not m.mtp_num_layers:
        return 0.0 * sh.tokens
    lay = module_layouts(m, lay, "mtp")
    layers = sum(symbol_activation_bytes(m, sh, lay, k) for k in m.mtp_depth_pattern)
    eh_in = gemm_input_bytes(lay) * sh.tokens * 2 * m.hidden_size
    return m.mtp_num_layers * (layers + eh_in + logits_one) + 0.0 * np.asarray(sh.tokens)
