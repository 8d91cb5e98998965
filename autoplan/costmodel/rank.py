"""One pipeline rank's time and memory, vectorised: `rank_cost` prices (candidate, pipeline-rank) pairs, which
`estimate.evaluate` reduces per candidate.

Pipeline schedule (Narayanan et al. SC'21, sec. 2.2): with m micro batches, p ranks and v chunks per rank,
1F1B takes m * t_max + (sum_s t_s - t_max) / v, i.e. the bubble (p - 1)/(v m) of a balanced pipeline; the
slowest rank governs and the others contribute to warm-up and cool-down. In-flight micro batches per rank follow
Megatron's schedules.py: warm-up = (p - s - 1) * 2 + (v - 1) * p for interleaving, p - s - 1 without."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import numpy as np

from autoplan import cuda_graphs as G
from autoplan import recompute as R
from autoplan.costmodel import compute as C
from autoplan.costmodel import memory as M
from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.collectives import collective_time, flex_all_to_all_time
from autoplan.costmodel.hardware import GIB, Hardware
from autoplan.costmodel.layout import Layouts
from autoplan.costmodel.layers.mtp import mtp_activation_bytes
from autoplan.costmodel.layers.mixers import dsa_indexer_activation_bytes
from autoplan.costmodel.params import dsa_indexer_params, embedding_params, head_params, layer_params, mtp_params
from autoplan.costmodel.stages import stage_layers
from autoplan.model import ModelSpec
from autoplan.workload import Workload

TIME_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "offload", "bubble", "dp_comm",
             "optimizer")
MEMORY_KEYS = ("weights", "grads", "optimizer", "activations", "logits", "transient", "cuda_context", "nccl",
               "fragmentation", "cuda_graphs")


@dataclass(frozen=True)
class RankCost:
    """Per (candidate, rank) figures: seconds per micro batch and bytes."""

    fwd_bwd: np.ndarray  # compute of one micro batch (fwd + bwd, no recompute)
    recompute: np.ndarray
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    p2p: np.ndarray
    dp_exposed: np.ndarray  # per step
    optimizer: np.ndarray  # per step
    memory: Dict[str, np.ndarray]
    offload: np.ndarray = 0.0  # exposed host<->device copies of CPU-offloaded activations, per micro batch
    fwd: np.ndarray = 0.0  # the forward part of fwd_bwd (what a pipeline timeline draws as a forward pass)
    checkpoint_local: np.ndarray = 0.0  # bytes a local (per-rank) checkpoint of the rank writes
    checkpoint_unique: np.ndarray = 0.0  # the rank's bytes of a global, fully parallel distributed checkpoint

    @property
    def per_microbatch(self):
        return self.fwd_bwd + self.recompute + self.tp + self.cp + self.ep + self.p2p + self.offload


def _spans(group_stride, group_size, hw: Hardware):
    """A group of `group_size` ranks spaced `group_stride` apart leaves the NVLink domain when it spans more
    ranks than the domain holds (Megatron rank order tp-cp-ep-dp-pp)."""
    return group_stride * group_size > hw.domain_size


def _per_domain(group_stride, group_size, hw: Hardware):
    """Members of a group (`group_size` ranks spaced `group_stride` apart) inside one NVLink domain."""
    return np.minimum(group_size, np.maximum(hw.domain_size // np.maximum(group_stride, 1), 1))


def rank_cost(m: ModelSpec, hw: Hardware, wl: Workload, lay: Layouts, stage: np.ndarray, cal: Calibration,
              profile=None, checkpoints: bool = True) -> RankCost:
    """Seconds per micro batch and bytes of each (candidate, pipeline rank) row; the checkpoint sizes only with
    `checkpoints` (what goodput needs; a throughput search skips them)."""
    sh = C.shard_of(m, lay, wl.seq_len)
    st = stage_layers(m, lay, stage)
    cpt = _compute(m, hw, wl, lay, sh, st, cal, profile)
    tp_all, tp_exposed = _tp_comm(m, hw, lay, sh, st, cal)
    cp_exposed = _cp_comm(m, hw, lay, sh, st, cal, cpt.dense_core)
    ep_exposed = _ep_comm(m, hw, lay, sh, st, cal, cpt, a2a_paired_fraction(wl, lay, stage))
    p2p = _p2p(m, hw, lay, sh)
    recompute = _recompute_time(lay, st, cpt, tp_all, ep_exposed, _selective_extra(m, hw, lay, sh, st, cal))
    embedding, head = _vocab_parts(m, lay, st)
    vocab = embedding + head
    params_dense, params_expert, edp = _rank_params(m, hw, lay, st, vocab)
    dp_exposed, optimizer = _dp_and_optimizer(hw, wl, lay, cal, cpt, recompute, params_dense, params_expert, edp,
                                              st, vocab)
    flex_buffers = M.flex_dispatcher_buffer_bytes(m, sh, lay, _per_domain(lay.etp, lay.ep, hw))
    layer_bytes = layer_saved_bytes(m, sh, lay, st)
    memory = rank_memory(m, lay, st, sh, stage, wl, params_dense, params_expert, edp, cal, layer_bytes, vocab,
                         flex_buffers, head)
    offload = _offload_exposed(hw, lay, st, cpt, layer_bytes)
    return RankCost(cpt.fwd + cpt.bwd, recompute, tp_exposed, cp_exposed, ep_exposed, p2p, dp_exposed, optimizer,
                    memory, offload, cpt.fwd,
                    *(M.checkpoint_bytes(params_dense, params_expert, lay, edp) if checkpoints else (0.0, 0.0)))


def _offload_exposed(hw: Hardware, lay: Layouts, st, cpt: _Compute, layer_bytes):
    """Exposed seconds per micro batch of CPU activation offload (Megatron --cpu-offloading-num-layers, pp = 1).
    TransformerEngine copies a layer's saved tensors to the host on a side stream while the next layer computes,
    and brings them back one layer ahead in backward (transformer_engine/pytorch/cpu_offload.py, the
    double-buffered offload handler): each offloaded layer exposes what its copy takes beyond one layer's forward,
    and again beyond one layer's backward, at the profile's host link rate (`host_bandwidth_gbytes_per_s`).
    `layer_bytes`: `layer_saved_bytes`."""
    if not np.any(lay.cpu_offload_layers):
        return 0.0
    none, selective, checkpoint, _ = layer_bytes  # `layer_saved_bytes`
    saved = np.select([lay.recompute == 0, lay.recompute == 1], [none, selective], checkpoint)
    copy = saved / hw.host_bytes_per_s
    layers = np.maximum(st.layers, 1)
    layer_fwd = (cpt.fwd - np.where(st.first, cpt.emb, 0.0) - np.where(st.last, cpt.head, 0.0)) / layers
    layer_bwd = (cpt.bwd - np.where(st.first, cpt.emb, 0.0) - np.where(st.last, 2.0 * cpt.head, 0.0)) / layers
    offloaded = np.minimum(lay.cpu_offload_layers, st.layers)
    return offloaded * (np.maximum(copy - layer_fwd, 0.0) + np.maximum(copy - layer_bwd, 0.0))


@dataclass(frozen=True)
class _Compute:
    """Compute of one micro batch on a rank, s: totals and the parts other terms overlap with."""

    fwd: np.ndarray  # forward, embedding and head included
    bwd: np.ndarray
    core: np.ndarray  # core attention forward of the rank's layers (what selective recompute repeats)
    dense_core: np.ndarray  # core attention forward of one full-attention layer (what CP overlaps with)
    moe_fwd: np.ndarray  # forward of the rank's MoE layers (what the backward all-to-all hides under)
    moe_bwd: np.ndarray  # backward of the rank's MoE layers (what the forward all-to-all hides under)
    emb: np.ndarray
    head: np.ndarray


def _compute(m: ModelSpec, hw: Hardware, wl: Workload, lay: Layouts, sh, st, cal: Calibration, profile) -> _Compute:
    seq = wl.seq_len
    n_moe, n_dense = st.moe, st.layers - st.moe
    n_win_dense, n_win_moe = st.window - st.window_moe, st.window_moe
    dense = C.layer_time(m, sh, lay, seq, hw, cal, moe=False)
    dense_fwd, dense_bwd = dense.fwd, dense.bwd(cal)
    core = (n_dense - n_win_dense) * dense.attn_core
    moe_fwd = moe_bwd = 0.0
    if m.is_moe:
        moe = C.layer_time(m, sh, lay, seq, hw, cal, moe=True)
        moe_fwd, moe_bwd = moe.fwd, moe.bwd(cal)
        core = core + (n_moe - n_win_moe) * moe.attn_core
    if profile is not None:
        dense_fwd, dense_bwd, moe_fwd, moe_bwd = apply_profile(profile, m, lay, seq, (dense_fwd, dense_bwd,
                                                                                    moe_fwd, moe_bwd))
    fwd = n_dense * dense_fwd + n_moe * moe_fwd
    bwd = n_dense * dense_bwd + n_moe * moe_bwd
    if m.sliding_window:
        # Replace the core-attention part of window layers.
        w_core = C.attention_core_time(m, sh, lay, seq, hw, C.scoped(cal, lay, "attn"), window=m.sliding_window)
        delta = (w_core - dense.attn_core) * st.window
        fwd, bwd = fwd + delta, bwd + cal.attention_bwd_ratio * delta
        core = core + st.window * w_core
    head = C.head_time(m, sh, lay, hw, cal)
    emb = C.embedding_time(m, sh, lay, hw, cal)
    fwd = fwd + np.where(st.last, head, 0.0) + np.where(st.first, emb, 0.0)
    bwd = bwd + np.where(st.last, 2.0 * head, 0.0) + np.where(st.first, emb, 0.0)
    return _Compute(fwd, bwd, core, dense.attn_core, n_moe * moe_fwd, n_moe * moe_bwd, emb, head)


def _tp_comm(m: ModelSpec, hw: Hardware, lay: Layouts, sh, st, cal: Calibration):
    """(all, exposed) TP communication per micro batch. Per layer, the attention and MLP blocks each do one
    all-reduce (or AG + RS with SP) forward and one backward (Shoeybi et al. 2019, Fig. 4; Korthikanti et al. 2022
    Fig. 5); expert-TP gathers the routed tokens of its group."""
    n_moe, n_dense = st.moe, st.layers - st.moe
    act_bytes = C.BF16 * sh.tokens * m.hidden_size  # a full [s/cp, b, h] activation
    ar = collective_time("all_reduce", act_bytes, lay.tp, _spans(1, lay.tp, hw), hw)
    moe_blocks = 1.0 + (1.0 if m.shared_expert_ffn_hidden_size else 0.0) * (lay.tp > 1)
    blocks = 1 if m.is_hybrid else 2  # a hybrid layer is one TP region (Mamba, attention or MLP), not two
    total = 2 * ar * (blocks * n_dense + moe_blocks * n_moe)
    etp_ag = collective_time("all_reduce", sh.expert_tokens / np.maximum(lay.etp, 1) * C.BF16 * m.hidden_size,
                             lay.etp, _spans(1, lay.etp, hw), hw)
    total = total + 2 * etp_ag * n_moe * (lay.etp > 1)
    return total, total * (1.0 - cal.tp_overlap_hidden * lay.tp_comm_overlap)


def _cp_comm(m: ModelSpec, hw: Hardware, lay: Layouts, sh, st, cal: Calibration, attn_core):
    """Exposed context-parallel ring exchange of K and V (cp - 1 steps), overlapped with the attention blocks
    (Liu et al. 2023 Ring Attention; Megatron CP). Backward also returns dK, dV: twice the bytes."""
    if m.multi_latent_attention:
        kv_elems = sh.heads * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim)
    else:
        kv_elems = 2 * sh.groups * m.kv_channels
    kv_bytes = C.BF16 * sh.tokens * kv_elems
    cp_step = collective_time("send_recv", kv_bytes, np.where(lay.cp > 1, 2, 1), _spans(lay.tp, lay.cp, hw), hw)
    cp_fwd = (lay.cp - 1) * cp_step
    layers_full_attn = st.layers - st.window
    return layers_full_attn * (np.maximum(cp_fwd - attn_core, 0.0)
                               + np.maximum(2 * cp_fwd - cal.attention_bwd_ratio * attn_core, 0.0))


def _a2a_time(m: ModelSpec, hw: Hardware, lay: Layouts, sh, cal: Calibration):
    """Seconds of one expert-parallel all-to-all (a dispatch or a combine) of one micro batch and layer."""
    in_domain = np.minimum(lay.ep, np.maximum(hw.domain_size // lay.etp, 1))
    inter = np.where(lay.ep > 1, (lay.ep - in_domain) / np.maximum(lay.ep - 1, 1), 0.0)
    topk = max(m.moe_router_topk, 1)
    width = m.moe_latent_size or m.hidden_size  # a latent MoE dispatches latent-wide tokens (compute.moe_gemm_time)
    a2a = collective_time("all_to_all", C.BF16 * sh.routed_tokens * topk * width, lay.ep,
                          _spans(lay.etp, lay.ep, hw), hw, inter_fraction=inter)
    # Flex dispatcher (DeepEP / HybridEP): one network copy per (token, destination node), NVLink fan-out there.
    # Inside the domain at the GPU profile's measured rate where it has one (GB200 NVL72: HybridEP's published
    # figures), else calibration.flex_nvlink_eff (DeepEP on H800).
    nvlink_eff = hw.flex_nvlink_eff or cal.flex_nvlink_eff
    flex = flex_all_to_all_time(C.BF16 * sh.routed_tokens * width, topk, lay.ep, in_domain, hw,
                                nvlink_eff, cal.flex_network_eff)
    return np.where(lay.moe_flex_dispatcher, flex, a2a)


def _ep_comm(m: ModelSpec, hw: Hardware, lay: Layouts, sh, st, cal: Calibration, cpt: _Compute, paired):
    """Exposed expert-parallel all-to-all: dispatch + combine forward, and both again backward."""
    a2a = _a2a_time(m, hw, lay, sh, cal)
    one_pass = 2 * a2a * st.moe  # dispatch + combine of one pass (forward or backward)
    # The 1F1B all-to-all overlap runs one micro batch's forward beside another's backward (Megatron
    # `overlap_moe_expert_parallel_comm`, pipeline_parallel/combined_1f1b.py: "EP A2A in forward step is hidden by
    # the attention/mlp computation in the backward step, and vice versa"; DeepSeek-V3 report sec. 3.2.1): the
    # forward all-to-all hides under at most the paired backward's compute and the backward's under the paired
    # forward's. Only paired passes overlap: `paired` is the share outside warm-up and cool-down.
    hidden = np.minimum(cal.a2a_overlap_hidden * one_pass, cpt.moe_bwd) + \
        np.minimum(cal.a2a_overlap_hidden * one_pass, cpt.moe_fwd)
    return 2 * one_pass - np.where(lay.moe_a2a_overlap, paired * hidden, 0.0)


def a2a_paired_fraction(wl: Workload, lay: Layouts, stage):
    """Share of a rank's (micro batch, chunk) passes that combined 1F1B pairs with another's opposite pass.
    Without pipelining the first forward and the last backward run alone (combined_1f1b.py
    `combined_1f1b_schedule_for_no_pipelining`); interleaved, the warm-up forwards and cool-down backwards run
    alone, warm-up = 2 (pp - rank - 1) + (vpp - 1) pp + 1 (schedules.py `get_pp_rank_microbatches`: one extra
    forward with the overlap)."""
    total = num_microbatches(wl, lay) * lay.vpp
    warmup = np.where(lay.pp > 1, (lay.pp - stage - 1) * 2 + (lay.vpp - 1) * lay.pp + 1, 1)
    return 1.0 - np.minimum(warmup, total) / total


def _p2p(m: ModelSpec, hw: Hardware, lay: Layouts, sh):
    """Pipeline point-to-point: one activation forward and one gradient backward per chunk and micro batch
    (interleaving overlaps half of it, Megatron overlap_p2p_comm)."""
    pp_spans = _spans(lay.tp * lay.cp * lay.dp, np.where(lay.pp > 1, 2, 1), hw)
    one = collective_time("send_recv", C.BF16 * sh.tokens_sp * m.hidden_size, np.where(lay.pp > 1, 2, 1),
                          pp_spans, hw)
    return 2 * lay.vpp * one * np.where(lay.vpp > 1, 0.5, 1.0)


def _selective_extra(m: ModelSpec, hw: Hardware, lay: Layouts, sh, st, cal: Calibration):
    """Forward seconds the rank's layers repeat for the selective modules other than core attention."""
    extra = (lay.recompute == 1) & R.has(lay.recompute_modules, *(n for n in R.MODULES if n != "core_attn"))
    if not np.any(extra):
        return 0.0
    dense = C.selective_recompute_time(m, sh, lay, hw, cal, moe=False)
    total = (st.layers - st.moe) * dense
    if m.is_moe:
        total = total + st.moe * C.selective_recompute_time(m, sh, lay, hw, cal, moe=True,
                                                            a2a_fwd=2 * _a2a_time(m, hw, lay, sh, cal))
    return total


def _recompute_time(lay: Layouts, st, cpt: _Compute, tp_all, ep_exposed, selective_extra):
    """Selective: the modules' forward again (core attention by default, autoplan/recompute.py); full: the
    recomputed layers' forward with its communication (Korthikanti et al. 2022 sec. 5)."""
    layers = np.maximum(st.layers, 1)
    layer_fwd = np.where(st.layers > 0, (cpt.fwd - np.where(st.first, cpt.emb, 0) - np.where(st.last, cpt.head, 0))
                         / layers, 0.0)
    comm_fwd = np.where(st.layers > 0, (tp_all / 2 + ep_exposed / 2) / layers, 0.0)
    full = _recomputed_layers(lay, st.layers) * (layer_fwd + comm_fwd)
    core = np.where(R.has(lay.recompute_modules, "core_attn"), cpt.core, 0.0)
    return np.select([lay.recompute == 1, lay.recompute == 2], [core + selective_extra, full], 0.0)


def _vocab_params(m: ModelSpec, lay: Layouts, st):
    """Embedding and LM-head parameters the rank holds (the first stage holds the embedding, the last the head; a
    tied head on a separate last stage keeps its own copy, Megatron shared embedding). Megatron shards the
    vocabulary over tp; DeepSpeed AutoTP replicates embedding and head on every tp rank."""
    embedding, head = _vocab_parts(m, lay, st)
    return embedding + head


def _vocab_parts(m: ModelSpec, lay: Layouts, st):
    """(embedding, LM head) parameters of `_vocab_params`."""
    head_w = head_params(m) - (m.hidden_size if m.normalization == "rmsnorm" else 2 * m.hidden_size)
    head_w = np.where(lay.pp > 1, m.vocab_size * m.hidden_size, head_w) if m.tie_embeddings else head_w
    shards = np.where(lay.vocab_tp, lay.tp, 1)
    return np.where(st.first, embedding_params(m), 0.0) / shards, np.where(st.last, head_w, 0.0) / shards


def _rank_params(m: ModelSpec, hw: Hardware, lay: Layouts, st, vocab):
    """(dense parameters, expert parameters, expert-DP size) held by the rank (theoretical_memory_usage.py split:
    TP-sharded, replicated, expert-sharded); the dense figure includes `vocab` (`_vocab_params`)."""
    n_moe, n_dense = st.moe, st.layers - st.moe
    lp_dense = layer_params(m, False)
    lp_moe = layer_params(m, True) if m.is_moe else lp_dense
    tp_sharded = n_dense * (lp_dense.attention + lp_dense.dense_mlp) + \
        n_moe * (lp_moe.attention + lp_moe.shared_experts)
    replicated = n_dense * lp_dense.norms + n_moe * (lp_moe.norms + lp_moe.router) + st.dsa * dsa_indexer_params(m)
    sharded_mtp, replicated_mtp, expert_mtp = mtp_params(m)  # multi-token prediction lives on the last stage
    tp_sharded = tp_sharded + np.where(st.last, sharded_mtp, 0.0)
    replicated = replicated + np.where(st.last, replicated_mtp, 0.0)
    params_expert = (n_moe * lp_moe.experts + np.where(st.last, expert_mtp, 0.0)) / (lay.ep * lay.etp)
    edp = np.maximum(hw.num_gpus // (lay.etp * lay.ep * lay.pp), 1)
    return tp_sharded / lay.tp + replicated + vocab, params_expert, edp


# DeepSpeed ZeRO defaults (deepspeed/runtime/zero/config.py; integrations/deepspeed.py writes the same values):
# reduce_bucket_size and allgather_bucket_size 5e8 elements, stage3_max_live_parameters and
# stage3_max_reuse_distance 1e9 elements.
DS_BUCKET_ELEMENTS = 5e8
DS_MAX_LIVE_PARAMETERS = 1e9
DS_MAX_REUSE_DISTANCE = 1e9
# Megatron-FSDP defaults (megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py): communication unit
# at least 1e9 elements; the all-gather prefetch fills half of it; the reduce-scatter queue holds unreduced
# full-unit grad buckets until it exceeds that capacity.
FSDP_PREFETCH_ELEMENTS = 5e8
FSDP_RS_QUEUE_ELEMENTS = 1e9


@dataclass(frozen=True)
class _DpGroups:
    """Collectives over the rank's data-parallel groups: dense parameters over dp x cp, expert parameters over the
    expert-DP group (Megatron MoE parallel folding)."""

    hw: Hardware
    dp_group: np.ndarray
    dp_spans: np.ndarray
    dp_per_domain: np.ndarray
    edp: np.ndarray
    edp_spans: np.ndarray
    edp_per_domain: np.ndarray

    def time(self, kind, dense_bytes, expert_bytes, pieces=1.0):
        """Seconds for `pieces` collectives that move `dense_bytes` and `expert_bytes` between them (one per FSDP
        unit or bucket: each pays its own latency)."""
        pieces = np.maximum(pieces, 1.0)
        dense = collective_time(kind, dense_bytes / pieces, self.dp_group, self.dp_spans, self.hw,
                                ranks_per_domain=self.dp_per_domain)
        expert = collective_time(kind, expert_bytes / pieces, self.edp, self.edp_spans, self.hw,
                                 ranks_per_domain=self.edp_per_domain)
        return pieces * (dense + expert)


def _dp_groups(hw: Hardware, lay: Layouts, edp) -> _DpGroups:
    dp_group = lay.dp * lay.cp
    return _DpGroups(hw, dp_group, _spans(lay.tp, dp_group, hw), _per_domain(lay.tp, dp_group, hw),
                     edp, _spans(lay.etp * lay.ep, edp, hw), _per_domain(lay.etp * lay.ep, edp, hw))


def _dp_and_optimizer(hw: Hardware, wl: Workload, lay: Layouts, cal: Calibration, cpt: _Compute, recompute,
                      params_dense, params_expert, edp, st, vocab):
    """(exposed data-parallel communication, optimizer step) per step, s.

    DDP / distributed optimizer (zero 0/1): gradients are reduced once per step, overlapping the last micro batch's
    backward (Megatron overlap_grad_reduce), the last bucket always exposed; Megatron's parameter all-gather
    overlaps the next forward (overlap_param_gather), DeepSpeed's runs after the optimizer step, exposed
    (runtime/zero/stage_1_and_2.py `step` -> `all_gather_dp_groups`). ZeRO-2/3 and Megatron-FSDP: `_sharded_dp`."""
    m_micro = num_microbatches(wl, lay)
    g = _dp_groups(hw, lay, edp)
    # fp32 main grads are reduced in fp32 (Megatron's default for bf16); --grad-reduce-in-bf16 halves it.
    grad_bytes = np.where(lay.grad_reduce_bf16, 2.0, 4.0)
    # --fp8-param-gather gathers the FP8 parameters (1 byte each) instead of bf16 (Megatron arguments.py help).
    gather_bytes = np.where(lay.fp8_param & lay.fp8, 1.0, C.BF16)
    rs = g.time("reduce_scatter", grad_bytes * params_dense, grad_bytes * params_expert)
    ag = g.time("all_gather", gather_bytes * params_dense, gather_bytes * params_expert)
    ar_dp = g.time("all_reduce", grad_bytes * params_dense, grad_bytes * params_expert)
    total_local = np.maximum(params_dense + params_expert, 1.0)
    tail_frac = np.minimum(cal.dp_bucket_params / total_local, 1.0)
    bwd_window = cal.dp_overlap_window * (cpt.bwd + recompute)
    fwd_window = cal.dp_overlap_window * cpt.fwd
    grad_comm = np.where(lay.zero == 0, ar_dp, rs)
    grad_exposed = np.where(lay.overlap_grad_reduce, np.maximum(grad_comm - bwd_window, 0) + tail_frac * grad_comm,
                            grad_comm)
    overlapped_gather = lay.overlap_param_gather & ~lay.deepspeed
    gather_exposed = np.where(overlapped_gather, np.maximum(ag - fwd_window, 0) + tail_frac * ag, ag)
    gather_exposed = np.where(lay.zero == 0, 0.0, gather_exposed)
    sharded = _sharded_dp(lay, cal, cpt, recompute, g, m_micro, params_dense, params_expert, st, vocab,
                          grad_bytes, gather_bytes, ag)
    dp_exposed = np.where(lay.zero >= 2, sharded, grad_exposed + gather_exposed)
    owned = np.where(lay.zero >= 1, params_dense / g.dp_group + params_expert / edp, params_dense + params_expert)
    optimizer = cal.optimizer_bytes_per_param * owned / (hw.hbm_bytes_per_s * cal.hbm_eff)
    return dp_exposed, optimizer


def _sharded_dp(lay: Layouts, cal: Calibration, cpt: _Compute, recompute, g: _DpGroups, m_micro, params_dense,
                params_expert, st, vocab, grad_bytes, gather_bytes, ag_step):
    """Exposed DP seconds per step under ZeRO-2 and ZeRO-3 / Megatron-FSDP, where communication happens every micro
    batch and overlaps only inside it.

    Gradients are reduce-scattered in every micro batch's backward, not once per step: DeepSpeed stage 2/3 reduce
    at every backward (stage_1_and_2.py `reduce_ready_partitions_and_remove_grads`: `if self.partition_gradients
    or ...boundary`; engine.py `allreduce_gradients`: "ZeRO stage >= 2 communicates during non gradient
    accumulation boundaries as well") and wait for the last bucket at the end of each backward
    (`overlapping_partition_gradients_reduce_epilogue`); Megatron-FSDP with optim_grads(_params) sets
    `grad_reduce_every_bprop` (megatron_fsdp.py `_process_post_backward_gradients`).

    ZeRO-3 gathers the parameters of each unit (one transformer layer; Megatron-FSDP fsdp_unit_modules =
    [TransformerLayer], mcore_fsdp_adapter.py) before its forward, prefetching one unit ahead, and releases them
    after (reshard after forward, `_post_forward`); backward gathers them again (`_pre_backward_param_unshard`) and
    reduce-scatters the gradients. The first unit of each pass waits for its gather; forward gathers hide under the
    forward, backward gathers and reductions share the backward (recompute included: the recomputed forward reuses
    the backward's gather, `_post_forward` lazy release). Megatron-FSDP gathers the embedding and output layer
    (not FSDP units) once and keeps them. DeepSpeed keeps parameters reused within stage3_max_reuse_distance
    elements (partitioned_param_coordinator.py `__params_to_release`): the last forward modules, reused first in
    backward after about twice their size of traversal, are not gathered again.
    ZeRO-2 gathers the updated parameters once per step after the optimizer (exposed)."""
    layers = np.maximum(st.layers, 1)
    layer_dense = np.maximum(params_dense - vocab, 0.0)
    rs_layers = g.time("reduce_scatter", grad_bytes * layer_dense, grad_bytes * params_expert, pieces=layers)
    rs_vocab = g.time("reduce_scatter", grad_bytes * vocab, 0.0 * vocab)
    rs_unit = rs_layers / layers
    ag_layers = g.time("all_gather", gather_bytes * layer_dense, gather_bytes * params_expert, pieces=layers)
    ag_vocab = g.time("all_gather", gather_bytes * vocab, 0.0 * vocab)
    ag_unit = ag_layers / layers
    fwd_window = cal.dp_overlap_window * cpt.fwd
    bwd_window = cal.dp_overlap_window * (cpt.bwd + recompute)
    total_local = np.maximum(params_dense + params_expert, 1.0)
    # DeepSpeed: the last reduce bucket of every backward waits (epilogue); Megatron-FSDP: once, after the last one.
    ds_bucket = np.minimum(DS_BUCKET_ELEMENTS / total_local, 1.0) * (rs_layers + rs_vocab)
    # DeepSpeed ZeRO-3: the last ~reuse/2 elements of the forward stay gathered into the backward.
    kept = np.where(lay.deepspeed, np.minimum(0.5 * DS_MAX_REUSE_DISTANCE / total_local, 1.0), 0.0)
    bwd_gather = (1.0 - kept) * (ag_layers + np.where(lay.deepspeed, ag_vocab, 0.0))
    first_bwd_wait = np.where(kept * layers >= 1.0, 0.0, ag_unit)
    fwd_gather = ag_layers + np.where(lay.deepspeed, ag_vocab, 0.0)
    # Overlap only where the engine overlaps: gathers are prefetched with overlap_param_gather (Megatron-FSDP) and
    # always by DeepSpeed (stage3_prefetch_bucket_size); reductions run beside the backward with overlap_grad_reduce
    # (DeepSpeed overlap_comm, the emitted setting); otherwise each waits in line.
    prefetch = lay.overlap_param_gather | lay.deepspeed
    rs_all = rs_layers + rs_vocab
    rs_hidden = np.where(lay.overlap_grad_reduce, rs_all, 0.0)
    fwd_exposed = np.where(prefetch, ag_unit + np.maximum(fwd_gather - ag_unit - fwd_window, 0.0), fwd_gather)
    bwd_comm = np.where(prefetch, np.maximum(bwd_gather - first_bwd_wait, 0.0), 0.0) + rs_hidden
    bwd_exposed = np.where(prefetch, first_bwd_wait, bwd_gather) + np.maximum(bwd_comm - bwd_window, 0.0) + \
        (rs_all - rs_hidden)
    epilogue = np.where(lay.deepspeed, ds_bucket, 0.0)
    transpose = _fp8_transpose_per_micro(lay, cal, g.hw, layer_dense + params_expert)
    zero3 = m_micro * (fwd_exposed + bwd_exposed + epilogue + transpose) + \
        np.where(lay.deepspeed, 0.0, ag_vocab + rs_unit)
    zero2 = m_micro * (np.maximum(rs_hidden - bwd_window, 0.0) + (rs_all - rs_hidden) + ds_bucket) + ag_step
    return np.where(lay.zero >= 3, zero3, zero2)


def _fp8_transpose_per_micro(lay: Layouts, cal: Calibration, hw: Hardware, gathered_params):
    """Seconds of the FP8 weight transposes a Megatron-FSDP backward rebuilds every micro batch: its gathered FP8
    primary weights (per-tensor scaling, TE Float8Tensor) get their transpose made after each backward gather
    (megatron_fsdp.py `all_gather_and_wait_parameters_ready`: `if bwd and is_float8tensor(param):
    fp8_create_transpose_cache(param)`), one byte read and one written per parameter on the compute stream; the
    distributed optimizer makes it once per step after its parameter gather (not counted)."""
    per_tensor = (lay.zero >= 3) & lay.fp8 & lay.fp8_param & (lay.quant_bytes == 1.0) & ~lay.deepspeed
    return np.where(per_tensor, 2.0 * gathered_params / (hw.hbm_bytes_per_s * cal.hbm_eff), 0.0)


def _recomputed_layers(lay: Layouts, layers):
    """Layers whose forward is recomputed under full recompute: all (uniform), or the first n of each chunk
    (block; megatron/core/transformer/transformer_block.py `_checkpointed_forward`)."""
    block = np.minimum(lay.recompute_layers * lay.vpp, layers)
    return np.where(lay.recompute_block, block, layers)


def num_microbatches(wl: Workload, lay: Layouts):
    return np.maximum(wl.global_batch_size // np.maximum(lay.mbs * lay.dp, 1), 1)


def in_flight(lay: Layouts, stage, m_micro):
    """(micro batch, chunk) pairs whose activations rank `stage` holds at its peak (schedules.py warm-up + 1). The
    all-to-all overlap schedules one more forward ahead: interleaved, one extra warm-up micro batch
    (schedules.py `get_pp_rank_microbatches`: `if overlap_moe_expert_parallel_comm: num_warmup_microbatches + 1`);
    without pipelining, micro batch k + 1's forward runs beside micro batch k's backward
    (combined_1f1b.py `combined_1f1b_schedule_for_no_pipelining`), so two are held."""
    warmup = np.where(lay.vpp > 1, (lay.pp - stage - 1) * 2 + (lay.vpp - 1) * lay.pp, lay.pp - stage - 1)
    warmup = warmup + lay.moe_a2a_overlap.astype(int)
    return np.minimum(warmup + 1, m_micro * lay.vpp)


def embedding_in_flight(lay: Layouts, chunks):
    """Of rank 0's `chunks` in-flight (micro batch, chunk) pairs, those of model chunk 0, which holds the
    embedding. Megatron's interleaved schedule runs forward k on chunk (k // pp) % vpp (schedules.py
    `get_model_chunk_id` with microbatch_group_size_per_vp_stage = pp); without interleaving every pair is chunk 0."""
    groups, rest = chunks // lay.pp, chunks % lay.pp
    chunk0 = lay.pp * np.ceil(groups / lay.vpp) + np.where(groups % lay.vpp == 0, rest, 0)
    return np.where(lay.vpp > 1, chunk0, chunks)


def layer_saved_bytes(m: ModelSpec, sh, lay: Layouts, st):
    """(no recompute, selective recompute, full-recompute checkpoint, the larger layer kind's no-recompute) bytes one
    of the rank's layers saves per micro batch: dense and MoE layers mixed by their share on the rank."""
    moe_share = np.where(st.layers > 0, st.moe / np.maximum(st.layers, 1), 0.0)
    dense_none, dense_sel, ckpt = M.layer_activation_bytes(m, sh, lay, moe=False)
    if m.is_moe:
        moe_none, moe_sel, _ = M.layer_activation_bytes(m, sh, lay, moe=True)  # the same layer-input checkpoint
    else:
        moe_none = moe_sel = dense_none
    per_layer_none = (1 - moe_share) * dense_none + moe_share * moe_none
    per_layer_sel = (1 - moe_share) * dense_sel + moe_share * moe_sel
    if m.dsa_indexer_topk_freq > 1:  # the rank's layers that reuse another's DSA top-k save no indexer tensors
        reusing = np.where(st.layers > 0, 1.0 - st.dsa / np.maximum(st.layers, 1), 0.0)
        indexer = dsa_indexer_activation_bytes(m, sh, lay)
        per_layer_none, per_layer_sel = per_layer_none - reusing * indexer, per_layer_sel - reusing * indexer
    worst_layer = np.maximum(dense_none, moe_none) if m.is_moe else dense_none
    return per_layer_none, per_layer_sel, ckpt, worst_layer


def rank_memory(m: ModelSpec, lay: Layouts, st, sh, stage, wl: Workload, params_dense, params_expert, edp,
                cal: Calibration, layer_bytes, vocab=0.0, comm_buffers=0.0, head=0.0) -> Dict[str, np.ndarray]:
    """Bytes per memory key on the rank; `layer_bytes` = `layer_saved_bytes`, `vocab` = its embedding / LM-head
    parameters (`_vocab_params`), `head` the LM head's among them; `comm_buffers` = communication buffers allocated
    once per rank besides NCCL's (the flex dispatcher's)."""
    m_micro = num_microbatches(wl, lay)
    chunks = in_flight(lay, stage, m_micro)
    chunk_layers = st.layers / lay.vpp
    per_layer_none, per_layer_sel, ckpt, worst_layer = layer_bytes
    # Full recompute keeps the layer inputs of recomputed layers (uniform: one per group of n layers) and
    # full activations of the others.
    chunk_recomputed = np.minimum(np.where(lay.recompute_block, lay.recompute_layers, chunk_layers), chunk_layers)
    uniform_ckpts = np.ceil(chunk_layers / np.maximum(lay.recompute_layers, 1))
    full_chunk = np.where(lay.recompute_block,
                          chunk_recomputed * ckpt + (chunk_layers - chunk_recomputed) * per_layer_none,
                          uniform_ckpts * ckpt)
    per_chunk = np.select([lay.recompute == 0, lay.recompute == 1],
                          [chunk_layers * per_layer_none, chunk_layers * per_layer_sel], full_chunk)
    # CPU offload (--cpu-offloading-num-layers, pp = 1): the saved activations of that many layers are copied to
    # host memory in forward and brought back in backward (megatron/core/transformer/transformer_block.py
    # `get_cpu_offload_context`, TransformerEngine cpu_offload.py), so only the other layers' stay resident.
    offloaded = np.minimum(lay.cpu_offload_layers, chunk_layers)
    resident = np.where(chunk_layers > 0, (chunk_layers - offloaded) / np.maximum(chunk_layers, 1), 0.0)
    embedding = embedding_in_flight(lay, chunks) * M.embedding_activation_bytes(m, sh)
    # Megatron's token dispatcher keeps the last micro batch's routing state on each MoE layer (once per layer).
    dispatcher = st.moe * M.dispatcher_state_bytes(m, sh, lay) if m.is_moe else 0.0
    activations = chunks * per_chunk * resident + np.where(st.first, embedding, 0.0) + \
        np.where(lay.deepspeed, 0.0, dispatcher)
    logits_one = M.logits_bytes(m, sh, lay)
    logits = np.where(st.last, logits_one + mtp_activation_bytes(m, sh, lay, logits_one), 0.0)  # + MTP depths
    fsdp_grads = _fsdp_unsharded_grads(lay, st, params_dense, params_expert, vocab, activations, head)
    # Backward working set: gradients of one layer's activations, plus (full recompute) the layer being rebuilt
    # — n layers at once under uniform recompute with groups of n.
    group = np.where((lay.recompute == 2) & ~lay.recompute_block, np.maximum(lay.recompute_layers, 1), 1)
    transient = worst_layer * np.where(lay.recompute == 2, group + 1, 1)
    # A context-parallel layer's forward holds every ring step's K/V chunk and output until it returns.
    transient = np.maximum(transient, M.cp_forward_working_bytes(m, sh, lay))
    # The logits and their gradient are gone before the first layer's backward starts (the output layer's backward
    # consumes them), so on the last stage only the larger of the two is held: the excess of the working set.
    transient = np.where(st.last, np.maximum(transient - logits, 0.0), transient)
    # The optimizer step runs after every activation and logit is freed; its fp32 grad copy (from a bf16 grad
    # buffer) is held then: the peak is the larger of the two moments.
    step_copy = M.optimizer_step_grad_copy_bytes(params_dense, params_expert, lay, edp)
    # A full-iteration CUDA graph keeps the forward-backward's memory in its private pool, which the eager optimizer
    # step cannot reuse (PyTorch docs, CUDA semantics, "Graph memory management": the pool lives as long as the
    # graph), so the step's copy comes on top instead of after the activations are freed.
    full_graph = G.captured(lay.cuda_graph_modules, "rest")
    transient = np.where(full_graph, transient + step_copy, np.maximum(transient, step_copy - activations - logits))
    graph_buffers = M.cuda_graph_static_bytes(m, sh, lay, wl.seq_len, chunk_layers, chunks, m_micro)
    weights, grads, optimizer = M.state_bytes(params_dense, params_expert, lay, edp, lay.fp8)
    weights = weights + M.mxfp8_module_copy_bytes(m, lay)
    weights = weights + _gathered_params(lay, st, params_dense, params_expert, vocab)
    grads = grads + fsdp_grads
    # DeepSpeed's contiguous-gradient reduce bucket (contiguous_gradients, the emitted setting): reduce_bucket_size
    # elements of the parameter dtype (stage_1_and_2.py / stage3.py ipg buffer).
    grads = grads + np.where(lay.deepspeed & (lay.zero >= 1),
                             C.BF16 * np.minimum(DS_BUCKET_ELEMENTS, params_dense + params_expert), 0.0)
    groups = 1 + (lay.tp > 1) + (lay.pp > 1) + (lay.cp > 1) + (lay.ep > 1) + (lay.etp > 1)
    # Caching-allocator fragmentation; expandable segments grow and unmap a segment's pages on demand instead of
    # leaving freed blocks stranded (PyTorch docs, CUDA semantics: "Optimizing memory usage with
    # PYTORCH_CUDA_ALLOC_CONF", expandable_segments), their own allowance (calibration.py).
    fragmentation = np.where(lay.expandable_segments, cal.fragmentation_expandable,
                             cal.fragmentation) * (activations + logits + transient)
    return {
        "weights": weights, "grads": grads, "optimizer": optimizer, "activations": activations,
        "logits": logits, "transient": transient,
        "cuda_context": np.full(np.shape(weights), cal.cuda_context_gib * GIB),
        "nccl": groups * cal.nccl_gib_per_group * GIB + comm_buffers,
        "fragmentation": fragmentation, "cuda_graphs": graph_buffers,
    }


def _zero3_unit(st, params_dense, params_expert, vocab):
    """(layers, parameters of one unit): ZeRO-3 / Megatron-FSDP units are the rank's transformer layers; the
    vocabulary is not a unit."""
    layers = np.maximum(st.layers, 1)
    return layers, (np.maximum(params_dense - vocab, 0.0) + params_expert) / layers


def _fsdp_unsharded_grads(lay: Layouts, st, params_dense, params_expert, vocab, activations, head):
    """Bytes Megatron-FSDP's unsharded gradient buckets add to the peak. Each unit's backward fills a full-unit bf16
    grad bucket (the parameter dtype) that is freed only once the reduce-scatter queue exceeds its capacity
    (param_and_grad_buffer.py `fetch_bucket` / `allocate_bucket_storage`; megatron_fsdp.py
    `suggested_queue_capacity`, at least 1e9 elements, or two units); the output layer's and the embedding's full
    (tp-shard) grad buckets (not FSDP units) are filled first and last. The queue grows by one unit per layer of
    backward while that layer's share of the rank's activations is freed, so the peak is the larger of: the
    output-layer bucket at the start (beside every activation), the full queue once it reaches capacity, less the
    activations freed by then, and the queue plus the embedding's bucket at the end, less all of them. `vocab`:
    the rank's vocabulary parameters; `head`: the LM head's among them."""
    layers, unit = _zero3_unit(st, params_dense, params_expert, vocab)
    capacity = np.maximum(FSDP_RS_QUEUE_ELEMENTS, 2 * unit)
    filled = np.minimum(layers, (capacity + 2 * unit) / np.maximum(unit, 1.0))  # layers of backward to fill it
    queue = C.BF16 * unit * filled
    extra = np.maximum.reduce([C.BF16 * head, queue - activations * filled / layers,
                               queue + C.BF16 * (vocab - head) - activations])
    megatron_fsdp = (lay.zero >= 3) & ~lay.deepspeed
    return np.where(megatron_fsdp, np.maximum(extra, 0.0), 0.0)


def _gathered_params(lay: Layouts, st, params_dense, params_expert, vocab):
    """bf16 bytes of full (tp-shard) parameters ZeRO-3 holds gathered beside its shard. Megatron-FSDP: the unit
    being computed and the ones prefetched (see FSDP_PREFETCH_ELEMENTS), plus the embedding and output layer, which
    are not FSDP units and stay gathered (megatron_fsdp.py: non-unit modules get no release hook). DeepSpeed: up to
    stage3_max_live_parameters elements plus the module in use (partitioned_param_coordinator.py)."""
    layers, unit = _zero3_unit(st, params_dense, params_expert, vocab)
    # Megatron-FSDP prefetches units until the prefetched ones reach half its communication unit size (at least
    # 1e9 elements: megatron_fsdp.py `suggested_communication_unit_size`, `suggested_AG_prefetch_size`;
    # param_and_grad_buffer.py prefetch loop), so small units are gathered several at a time.
    prefetch = np.maximum(FSDP_PREFETCH_ELEMENTS, unit)
    megatron = np.minimum(unit * (1 + np.ceil(prefetch / np.maximum(unit, 1.0))), layers * unit) + vocab
    deepspeed = np.minimum(params_dense + params_expert, DS_MAX_LIVE_PARAMETERS + unit)
    return np.where(lay.zero >= 3, C.BF16 * np.where(lay.deepspeed, deepspeed, megatron), 0.0)


def apply_profile(profile, m: ModelSpec, lay: Layouts, seq, analytic):
    """Measured per-layer (fwd, bwd) times where the profile covers the point; analytic elsewhere (NaN = not
    covered). `analytic` = (dense_fwd, dense_bwd, moe_fwd, moe_bwd)."""
    seq_arr = np.full(len(lay), float(seq))
    out = list(analytic)
    for slot, (kind, mlp_kind) in enumerate((("dense", "mlp"), ("moe", "moe"))):
        if kind == "moe" and not m.is_moe:
            continue
        for p, pass_ in enumerate(("fwd", "bwd")):
            per_dtype = []
            for dtype in ("bf16", "fp8"):
                parts = [profile.layer_time(part, pass_, lay.tp, lay.mbs, seq_arr / lay.cp, dtype, ep=lay.ep)
                         for part in ("attention", mlp_kind)]
                per_dtype.append(parts[0] + parts[1])
            measured = np.where(lay.fp8, per_dtype[1], per_dtype[0])
            idx = 2 * slot + p
            out[idx] = np.where(np.isfinite(measured), measured, out[idx])
    return tuple(out)
