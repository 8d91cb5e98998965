"""Which layers each pipeline rank holds (vectorised). Megatron splits decoder layers evenly over pp ranks, or
puts `--decoder-first/last-pipeline-num-layers` on the end ranks and splits the rest evenly
(megatron/core/transformer/transformer_block.py `get_num_layers_to_build`), or counts the embedding and the loss as
one layer each (account_for_*: the end ranks hold one layer fewer), or follows a layout string whose end ranks
`Layouts.first/last` hold (autoplan/pipeline_split.py). With interleaving a rank holds vpp
chunks; for counting layer kinds we take a rank's layers as one contiguous range, which is exact without
interleaving and places the leading dense layers (first_k_dense) on rank 0 either way."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoplan.costmodel.layout import Layouts
from autoplan.model import ModelSpec


@dataclass(frozen=True)
class StageLayers:
    layers: np.ndarray  # decoder layers on the rank
    moe: np.ndarray  # of which MoE layers
    window: np.ndarray  # of which sliding-window layers
    window_moe: np.ndarray  # sliding-window MoE layers
    dsa: np.ndarray  # of which with a DSA lightning indexer of their own (an upper bound with interleaving)
    first: np.ndarray  # bool: holds the embedding
    last: np.ndarray  # bool: holds the LM head and loss


def _prefix(flags) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(flags, dtype=np.int64))])


def layer_flags(m: ModelSpec):
    """(is_moe, is_window) per layer. gpt-oss alternates sliding and full attention, starting with sliding."""
    moe = np.array([m.is_moe_layer(i) for i in range(m.num_layers)], dtype=bool)
    window = np.zeros(m.num_layers, dtype=bool)
    if m.sliding_window and m.num_sliding_window_layers:
        stride = max(1, m.num_layers // m.num_sliding_window_layers)
        idx = np.arange(0, m.num_layers, stride)[: m.num_sliding_window_layers]
        window[idx] = True
    return moe, window


def end_ranks(m: ModelSpec, lay: Layouts):
    """(first, last) layer counts of the end ranks, -1 where they hold the middle ranks' count. account_for_*
    (transformer_block.py): (num_layers + e + l) / pp per rank, the first rank e and the last l fewer."""
    first, last = lay.first, lay.last
    if np.any(lay.account):
        e, loss = (lay.account & 1) > 0, (lay.account & 2) > 0
        per = (m.num_layers + e + loss) // np.maximum(lay.pp, 1)
        first = np.where(lay.account > 0, per - e, first)
        last = np.where(lay.account > 0, per - loss, last)
    return first, last


def middle_layers(m: ModelSpec, lay: Layouts):
    """Layers per rank that is neither an explicitly sized first nor last rank (float; validated integral)."""
    return _middle_layers(m, lay, *end_ranks(m, lay))


def _middle_layers(m: ModelSpec, lay: Layouts, first, last):
    has_first = first >= 0
    has_last = (last >= 0) & (lay.pp > 1)
    n_mid = lay.pp - has_first - has_last
    rest = m.num_layers - np.where(has_first, first, 0) - np.where(has_last, last, 0)
    return np.where(n_mid > 0, rest / np.maximum(n_mid, 1), 0.0)


def stage_layers(m: ModelSpec, lay: Layouts, stage: np.ndarray) -> StageLayers:
    first, last = end_ranks(m, lay)
    mid = _middle_layers(m, lay, first, last)
    is_first = stage == 0
    is_last = stage == lay.pp - 1
    layers = np.where(is_first & (first >= 0), first,
                      np.where(is_last & (last >= 0) & (lay.pp > 1), last, mid))
    first_size = np.where(first >= 0, first, mid)
    start = np.where(is_first, 0, first_size + (stage - 1) * mid)
    start_i = np.clip(np.rint(start).astype(np.int64), 0, m.num_layers)
    end_i = np.clip(np.rint(start + layers).astype(np.int64), 0, m.num_layers)
    moe_f, win_f = layer_flags(m)
    cm, cw, cwm = _prefix(moe_f), _prefix(win_f), _prefix(moe_f & win_f)
    layers = (end_i - start_i).astype(float)
    return StageLayers(
        layers=layers,
        moe=(cm[end_i] - cm[start_i]).astype(float),
        window=(cw[end_i] - cw[start_i]).astype(float),
        window_moe=(cwm[end_i] - cwm[start_i]).astype(float),
        dsa=_indexer_layers(m, lay, start_i, end_i, layers),
        first=is_first,
        last=is_last,
    )


def _indexer_layers(m: ModelSpec, lay: Layouts, start_i, end_i, layers) -> np.ndarray:
    """Layers with a DSA lightning indexer of their own on each rank. Exact for a contiguous range (vpp 1). With
    interleaving a rank holds vpp separate chunks: in each, the indexer layers of the periodic part (one in every
    dsa_indexer_topk_freq) number at most one more than the chunk's even share, and the leading run of indexer
    layers (the first max(offset, 1)) may sit in another rank's chunk than the contiguous range puts it, so the
    count of the contiguous range plus vpp plus that run less one bounds the rank's from above (memory is never
    under-counted)."""
    if not m.dsa_index_heads:
        return np.zeros_like(layers)
    flags = np.array([m.dsa_computes_topk(i) for i in range(m.num_layers)], dtype=bool)
    prefix = _prefix(flags)
    count = (prefix[end_i] - prefix[start_i]).astype(float)
    if m.dsa_indexer_topk_freq > 1:
        lead = max(m.dsa_indexer_skip_topk_offset, 1) - 1
        count = np.minimum(count + np.where(lay.vpp > 1, lay.vpp + lead, 0), layers)
    return count

