"""Reduce per-rank costs to per-candidate step time and peak memory, and build `Estimate`s."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from autoplan.cluster import ClusterSpec
from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.costmodel.rank import MEMORY_KEYS, TIME_KEYS, num_microbatches, rank_cost
from autoplan.costmodel.flops import model_flops_per_token
from autoplan.costmodel.hardware import GIB, hardware_of
from autoplan.costmodel.layout import Layouts, layouts_from_strategies
from autoplan.costmodel.schedule import pipeline_bubble
from autoplan.costmodel.stages import middle_layers
from autoplan.model import ModelSpec
from autoplan.results import Estimate, StageMemory
from autoplan.strategy import Strategy
from autoplan.workload import Workload


@dataclass(frozen=True)
class Evaluation:
    """Per-candidate results (arrays of length n)."""

    step_time_s: np.ndarray
    peak_mem_bytes: np.ndarray
    capacity_bytes: float
    time_terms: Dict[str, np.ndarray]  # seconds per step, sums to step_time_s
    memory_terms: Dict[str, np.ndarray]  # bytes on the peak rank
    num_microbatches: np.ndarray
    stage_memory: Optional[np.ndarray] = None  # (n, pp) bytes, only when every rank was priced
    stage_terms: Optional[Dict[str, np.ndarray]] = None  # (n, pp) per memory key
    checkpoint_local_bytes: Optional[np.ndarray] = None  # most bytes any rank holds in a local checkpoint
    checkpoint_unique_bytes: Optional[np.ndarray] = None  # most bytes any rank writes of a global checkpoint
    rank_time_s: Optional[np.ndarray] = None  # what the search minimises when not the step time (--objective)

    @property
    def rank_s(self) -> np.ndarray:
        """Seconds per step the search ranks by: the step time, or (goodput) the step time over the useful-time
        fraction."""
        return self.step_time_s if self.rank_time_s is None else self.rank_time_s

    def fits(self, headroom: float = 0.0) -> np.ndarray:
        return self.peak_mem_bytes <= self.capacity_bytes * (1.0 - headroom)


def sampled_stages(model: ModelSpec, lay: Layouts):
    """(ranks priced per candidate, their weights in the sum over ranks, which count for the maxima): first,
    second, second-to-last and last, which bracket the middle ranks' time sum; and the first middle rank whose
    layers are all past the model's leading dense layers (weight 0), where a middle rank's memory peaks: middle
    ranks hold equal layer counts, in-flight micro batches fall with the rank, and the ranks that still hold dense
    layers hold fewer expert parameters and activations."""
    pp = lay.pp
    mid_layers = np.maximum(middle_layers(model, lay), 1.0)
    first_size = np.where(lay.first >= 0, lay.first, mid_layers)
    past_dense = 1 + np.ceil(np.maximum(model.first_k_dense_layers - first_size, 0) / mid_layers).astype(np.int64)
    peak_mid = np.clip(past_dense, np.minimum(1, pp - 1), np.maximum(pp - 2, 0))
    stages = np.stack([np.zeros_like(pp), np.minimum(1, pp - 1), np.maximum(pp - 2, 0), pp - 1, peak_mid], axis=1)
    mid = np.maximum(pp - 2, 0) / 2.0
    weights = np.stack([np.ones_like(mid), mid, mid, (pp > 1).astype(float), np.zeros_like(mid)], axis=1)
    counted = weights > 0
    counted[:, 4] = True
    return stages, weights, counted


def all_stages(model: ModelSpec, lay: Layouts):
    width = int(lay.pp.max())
    stages = np.minimum(np.arange(width)[None, :], lay.pp[:, None] - 1)
    weights = (np.arange(width)[None, :] < lay.pp[:, None]).astype(float)
    return stages, weights, weights > 0


def evaluate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, lay: Layouts,
             cal: Calibration = DEFAULT, profile=None, every_rank: bool = False,
             checkpoints: Optional[bool] = None) -> Evaluation:
    """Per-candidate step time and memory (sampled ranks, or `every_rank`); the checkpoint sizes goodput needs with
    `checkpoints` (default: with `every_rank`, the full estimate; a search asks for them under --objective
    goodput)."""
    checkpoints = every_rank if checkpoints is None else checkpoints
    hw = hardware_of(cluster)
    stages, weights, valid = (all_stages if every_rank else sampled_stages)(model, lay)
    n, k = stages.shape
    rows = np.repeat(np.arange(n), k)
    rc = rank_cost(model, hw, workload, lay.take(rows), stages.reshape(-1), cal, profile, checkpoints)

    def grid(x):
        return np.broadcast_to(np.asarray(x, dtype=float), (n * k,)).reshape(n, k)

    per_mb = grid(rc.per_microbatch)
    per_mb_masked = np.where(valid, per_mb, -np.inf)
    crit = np.argmax(per_mb_masked, axis=1)
    t_max = per_mb[np.arange(n), crit]
    t_sum = (per_mb * weights).sum(axis=1)
    m_micro = num_microbatches(workload, lay).astype(float)
    bubble = pipeline_bubble(t_sum, t_max, lay.pp, lay.vpp, m_micro)  # costmodel/schedule.py
    tail = grid(rc.dp_exposed) + grid(rc.optimizer)
    tail_idx = np.argmax(np.where(valid, tail, -np.inf), axis=1)
    pick = np.arange(n)

    def at(x, idx):
        return grid(x)[pick, idx]

    time_terms = {
        "compute": m_micro * at(rc.fwd_bwd, crit),
        "recompute": m_micro * at(rc.recompute, crit),
        "tp_comm": m_micro * at(rc.tp, crit),
        "cp_comm": m_micro * at(rc.cp, crit),
        "ep_comm": m_micro * at(rc.ep, crit),
        "pp_comm": m_micro * at(rc.p2p, crit),
        "offload": m_micro * at(rc.offload, crit),
        "bubble": bubble,
        "dp_comm": at(rc.dp_exposed, tail_idx),
        "optimizer": at(rc.optimizer, tail_idx),
    }
    step = sum(time_terms[key] for key in TIME_KEYS)
    mem_grid = {key: grid(rc.memory[key]) for key in MEMORY_KEYS}
    total = sum(mem_grid.values())
    total_masked = np.where(valid, total, -np.inf)
    peak_idx = np.argmax(total_masked, axis=1)
    return Evaluation(
        step_time_s=step,
        peak_mem_bytes=total[pick, peak_idx],
        capacity_bytes=hw.capacity_bytes,
        time_terms=time_terms,
        memory_terms={key: v[pick, peak_idx] for key, v in mem_grid.items()},
        num_microbatches=m_micro.astype(int),
        stage_memory=total if every_rank else None,
        stage_terms=mem_grid if every_rank else None,
        checkpoint_local_bytes=np.where(valid, grid(rc.checkpoint_local), 0.0).max(axis=1) if checkpoints else None,
        checkpoint_unique_bytes=np.where(valid, grid(rc.checkpoint_unique), 0.0).max(axis=1) if checkpoints else None,
    )


def estimate(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, workload: Workload, *,
             cal: Calibration = DEFAULT, profile=None, headroom: float = 0.0,
             notes: Optional[List[str]] = None, engine: str = "megatron") -> Estimate:
    """Predict one strategy, pricing every pipeline rank. `engine` matters where engines lay out the same
    strategy differently (DeepSpeed AutoTP replicates the vocabulary)."""
    lay = layouts_from_strategies([strategy], cluster.num_gpus, engine=engine, gpu_id=cluster.gpu.id)
    ev = evaluate(model, cluster, workload, lay, cal, profile, every_rank=True)
    return estimate_from(ev, 0, model, cluster, workload, lay, headroom=headroom, notes=notes,
                         profile=profile)


def estimate_from(ev: Evaluation, i: int, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                  lay: Layouts, *, headroom: float = 0.0, notes=None, profile=None) -> Estimate:
    """The Estimate of candidate i of an Evaluation."""
    step = float(ev.step_time_s[i])
    tokens_per_s = workload.tokens_per_step / step
    per_gpu = tokens_per_s / cluster.num_gpus
    flops_per_gpu = model_flops_per_token(model, workload.seq_len) * per_gpu
    peak = cluster.gpu.peak_tflops["bf16"] * 1e12
    time_breakdown = {k: float(v[i]) for k, v in ev.time_terms.items()}
    memory = {k: float(v[i]) / GIB for k, v in ev.memory_terms.items()}
    stage_memory = []
    if ev.stage_memory is not None:
        pp = int(lay.pp[i])
        from autoplan.costmodel.stages import stage_layers

        layers = stage_layers(model, lay.take(np.full(pp, i)), np.arange(pp)).layers
        for s in range(pp):
            stage_memory.append(StageMemory(
                stage=s, num_layers=int(layers[s]), total_gib=float(ev.stage_memory[i, s]) / GIB,
                breakdown_gib={k: float(v[i, s]) / GIB for k, v in ev.stage_terms.items()}))
    bottleneck = max(time_breakdown, key=time_breakdown.get)
    sources = {k: "analytic" for k in time_breakdown}
    if profile is not None:  # "measured" only where a measured point priced a layer of this candidate
        from autoplan.costmodel.measured import measured_compute

        if measured_compute(profile, model, lay.take(np.array([i])), workload.seq_len)[0]:
            source = f"measured:{getattr(profile, 'path', None) or 'profile'}"
            sources["compute"] = source
            if time_breakdown.get("recompute", 0.0) > 0:
                sources["recompute"] = source  # the recomputed forward passes use the same layer times
    return Estimate(
        **_goodput_fields(ev, i, cluster, tokens_per_s),
        step_time_s=step, tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=per_gpu,
        model_tflops_per_gpu=flops_per_gpu / 1e12, mfu=flops_per_gpu / peak,
        peak_mem_gib=float(ev.peak_mem_bytes[i]) / GIB,
        fits=bool(ev.peak_mem_bytes[i] <= ev.capacity_bytes * (1.0 - headroom)),
        time_breakdown=time_breakdown, memory_breakdown=memory, stage_memory=stage_memory,
        capacity_gib=ev.capacity_bytes / GIB, num_microbatches=int(ev.num_microbatches[i]),
        dp=int(lay.dp[i]), bottleneck=bottleneck, sources=sources,
        notes=list(notes or []) + model.window_note(workload.seq_len),
    )


def _goodput_fields(ev: Evaluation, i: int, cluster: ClusterSpec, tokens_per_s: float) -> dict:
    """The Estimate's goodput fields of candidate i (costmodel/goodput.py), or none when the evaluation holds no
    checkpoint sizes."""
    if ev.checkpoint_local_bytes is None:
        return {}
    from autoplan.costmodel.goodput import cluster_goodput

    sl = slice(i, i + 1)
    g = cluster_goodput(cluster, ev.step_time_s[sl], ev.checkpoint_local_bytes[sl], ev.checkpoint_unique_bytes[sl])
    fraction = float(g.useful_fraction[0])
    return dict(goodput_tokens_per_s=tokens_per_s * fraction, useful_fraction=fraction,
                checkpoint_method=cluster.resilience.ckpt_method, checkpoint_interval_s=float(g.interval_s[0]),
                checkpoint_interval_steps=int(g.interval_steps[0]), checkpoint_stall_s=float(g.stall_s[0]),
                checkpoint_overlap_s=float(g.overlap_s[0]), checkpoint_persist_s=float(g.persist_s[0]),
                checkpoint_gib_per_rank=float(g.ckpt_bytes_per_rank[0]) / GIB, restart_s=float(g.restart_s[0]),
                lost_work_s=float(g.lost_work_s[0]), expected_job_mtbf_s=g.job_mtbf_s)
