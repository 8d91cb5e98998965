"""Where the encoder runs, priced with the language model's own per-rank costs (costmodel/rank.py `rank_cost`).

- inherit: Megatron-Bridge's VLM models build the vision tower on the first pipeline stage only (`pre_process`),
  as a Hugging Face module replicated on every TP rank (Megatron-Bridge v0.3.1 models/qwen_vl/modeling_qwen25_vl.py
  line 103, modelling_qwen3_vl/model.py line 100, gemma_vl/modeling_gemma3_vl.py line 94). Stage 0 runs the whole
  encoder for its micro batch, so it carries fewer language-model layers: `first_stage_layers` /
  `last_stage_layers` (Megatron's --decoder-first/last-pipeline-num-layers) are searched for the fastest step.
- disjoint: Megatron-LM's MIMO example puts the encoder on its own ranks [0, encoder_tp x encoder_dp) with pp = cp
  = 1 and the language model from --llm-offset on (examples/mimo/training/args.py `validate_hetero_grid_args`). The
  encoder is one more pipeline stage in front of the language model's: its time per language micro batch (the
  images of mbs x llm_dp samples split over encoder_dp lanes) plus the boundary transfer (encoder output to the
  language ranks over the network, gradients back when something in front trains).

A step: m micro batches at the slowest stage's time, the pipeline fill (costmodel/schedule.py `pipeline_bubble`),
then the exposed data-parallel reduction and the optimizer of the slowest rank, and the encoder's gradient
reduction (see `_price_one`). A frozen language model keeps its
data-gradient pass when something in front of it trains, and drops its weight gradients, their reduction and its
optimizer; Megatron's backward is priced as 2/3 data and weight gradients in equal parts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from autoplan.cluster import ClusterSpec
from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.costmodel.collectives import collective_time
from autoplan.costmodel.hardware import GIB, hardware_of
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.costmodel.rank import MEMORY_KEYS, num_microbatches, rank_cost
from autoplan.costmodel.schedule import pipeline_bubble
from autoplan.pipeline_split import rank_layer_counts
from autoplan.multimodal.encoder_cost import GRAD_BYTES, boundary_bytes, encoder_memory, encoder_time
from autoplan.multimodal.params import projector_params, vision_params
from autoplan.multimodal.spec import Freeze, ImageData, ImageLoad, MultimodalSpec
from autoplan.strategy import Strategy
from autoplan.workload import Workload


@dataclass(frozen=True)
class Placement:
    kind: str  # "inherit" or "disjoint"
    llm: Strategy
    llm_gpus: int
    encoder_tp: int = 0  # disjoint only
    encoder_dp: int = 0
    encoder_recompute: bool = False

    def label(self) -> str:
        s = self.llm
        split = f" first={s.first_stage_layers} last={s.last_stage_layers}" if s.first_stage_layers is not None else ""
        base = f"tp{s.tp} pp{s.pp}{f' ep{s.ep}' if s.ep > 1 else ''} mbs{s.mbs}{split}"
        rc = " enc-rc" if self.encoder_recompute else ""
        if self.kind == "inherit":
            return f"inherit: encoder on stage 0, {base}{rc}"
        return f"disjoint: encoder tp{self.encoder_tp} dp{self.encoder_dp} on {self.encoder_tp * self.encoder_dp} " \
               f"GPUs, LLM {base} on {self.llm_gpus} GPUs{rc}"


@dataclass(frozen=True)
class Priced:
    placement: Placement
    step_s: float  # at the mean image load
    tail_step_s: float  # every sample at the tail load
    stage_s: Tuple[float, ...]  # per micro batch, encoder stage first when disjoint, at the mean load
    encoder_s: float  # encoder per micro batch at the mean load (on its stage)
    layer_s: float  # one language-model layer per micro batch (middle stage / its layers)
    peak_mem_gib: float
    fits: bool
    num_microbatches: int
    memory_gib: Dict[str, float] = field(default_factory=dict)
    llm_fwd_s: Tuple[float, ...] = ()  # language stages: forward and backward seconds per micro batch
    llm_bwd_s: Tuple[float, ...] = ()
    after_s: float = 0.0  # exposed dp reduction + optimizer after the last backward

    @property
    def imbalance(self) -> float:
        """Slowest over fastest stage, minus 1."""
        return max(self.stage_s) / min(self.stage_s) - 1.0


def _llm_ranks(spec: MultimodalSpec, cluster: ClusterSpec, wl: Workload, strategies: List[Strategy], cal):
    """Per (candidate, stage): seconds per micro batch split into (total, forward compute, backward compute), the
    per-step dp and optimizer seconds, and memory terms in bytes."""
    hw = hardware_of(cluster)
    lay = layouts_from_strategies(strategies, cluster.num_gpus, engine="megatron", gpu_id=cluster.gpu.id)
    pp = int(lay.pp.max())
    stages = np.minimum(np.arange(pp)[None, :], lay.pp[:, None] - 1)
    n = len(strategies)
    rows = np.repeat(np.arange(n), pp)
    rc = rank_cost(spec.llm, hw, wl, lay.take(rows), stages.reshape(-1), cal, None)

    def grid(x):
        return np.broadcast_to(np.asarray(x, dtype=float), (n * pp,)).reshape(n, pp)

    return lay, {"per_mb": grid(rc.per_microbatch), "fwd_bwd": grid(rc.fwd_bwd), "fwd": grid(rc.fwd),
                 "dp": grid(rc.dp_exposed), "opt": grid(rc.optimizer),
                 "mem": {k: grid(rc.memory[k]) for k in MEMORY_KEYS}}


def _frozen_llm(per_mb, fwd_bwd, fwd, freeze: Freeze):
    """A frozen language model drops half its backward (the weight gradients)."""
    if not freeze.language_model:
        return per_mb
    return per_mb - (fwd_bwd - fwd) / 2.0


def _step(stage_mb: np.ndarray, m: int, dp: float, opt: float) -> float:
    t_max, t_sum = float(stage_mb.max()), float(stage_mb.sum())
    bubble = float(pipeline_bubble(t_sum, t_max, len(stage_mb), 1, m))
    return m * t_max + bubble + dp + opt


class _EncoderCosts:
    """The encoder's time, memory and collectives within one `price` call, memoised: a search prices thousands of
    placements over a few distinct (image load, samples per lane, encoder TP and DP, recompute) and group shapes,
    and the spec, cluster, freeze and calibration are the same for all of them (Qwen2.5-VL 72B on 64 H100: 27,758
    placements, 13 s before, 6 s after, the same plans)."""

    def __init__(self, spec: MultimodalSpec, cluster: ClusterSpec, freeze: Freeze, cal: Calibration):
        self.spec, self.cluster, self.freeze, self.cal = spec, cluster, freeze, cal
        self.hw = hardware_of(cluster)
        self.trainable = (0 if freeze.vision_model else vision_params(spec.vision)) + \
            (0 if freeze.vision_projection else projector_params(spec.projector))
        self._memo: Dict[tuple, object] = {}

    def _get(self, key: tuple, compute):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def time(self, load: ImageLoad, samples: float, tp: int, recompute: bool):
        return self._get(("time", load, samples, tp, recompute),
                         lambda: encoder_time(self.spec, self.cluster, load, samples, self.freeze, tp=tp,
                                              recompute=recompute, cal=self.cal))

    def memory(self, load: ImageLoad, samples: float, tp: int, dp: int, zero: bool, in_flight: int,
               recompute: bool):
        return self._get(("memory", load, samples, tp, dp, zero, in_flight, recompute),
                         lambda: encoder_memory(self.spec, load, samples, self.freeze, tp=tp, dp=dp,
                                                distributed_optimizer=zero, in_flight=in_flight,
                                                recompute=recompute))

    def collective(self, kind: str, size: float, group: int, spans: bool) -> float:
        return self._get(("collective", kind, size, group, spans),
                         lambda: float(collective_time(kind, size, group, spans, self.hw)))

    def hop(self, load: ImageLoad, lanes: float, encoder_tp: int) -> float:
        """One way of a disjoint grid's boundary transfer: each encoder TP rank sends its share of the encoder
        output for `lanes` samples to the language ranks, over the network."""
        return self.collective("send_recv", boundary_bytes(self.spec, load, lanes) / encoder_tp, 2, True)


def price(spec: MultimodalSpec, cluster: ClusterSpec, wl: Workload, data: ImageData, freeze: Freeze,
          placements: List[Placement], cal: Calibration = DEFAULT, headroom: float = 0.0,
          select: str = "all") -> List[Priced]:
    """Price placements (one call to the language model's cost per group of placements sharing llm_gpus, each of
    its strategies once). The encoder only adds to a rank's memory (to stage 0 on inherit; its own ranks beside the
    language grid on disjoint), so a placement's peak is at least its language-model ranks' own peak; `select`
    "fitting" uses that bound: it leaves out unpriced the placements whose language model alone exceeds the memory
    (none of them could fit), and when none of those priced fits, prices instead, in rising order of that bound,
    only until the bound passes the least peak priced, with and without encoder recompute apart (the placement of
    each that needs the least memory is among those priced)."""
    groups: Dict[int, List[Placement]] = {}
    for p in placements:
        groups.setdefault(p.llm_gpus, []).append(p)
    enc = _EncoderCosts(spec, cluster, freeze, cal)
    frozen = ("grads", "optimizer") if freeze.language_model else ()  # zeroed in _price_one
    entries = []  # (language-model peak bytes, placement, its group's layouts and costs, row, micro batches)
    for llm_gpus, group in groups.items():
        sub = cluster.model_copy(update={"num_gpus": llm_gpus})
        unique: Dict[Strategy, int] = {}
        index = [unique.setdefault(p.llm, len(unique)) for p in group]
        lay, r = _llm_ranks(spec, sub, wl, list(unique), cal)
        micro = num_microbatches(wl, lay)
        llm_peak = sum(v for k, v in r["mem"].items() if k not in frozen).max(axis=1)
        entries += [(float(llm_peak[i]), p, lay, r, i, int(micro[i])) for i, p in zip(index, group)]

    def one(e) -> Priced:
        _, p, lay, r, i, m = e
        return _price_one(spec, wl, data, freeze, p, lay, r, i, m, enc, headroom)

    if select != "fitting":
        return [one(e) for e in entries]
    capacity = enc.hw.capacity_bytes * (1.0 - headroom)
    out = [one(e) for e in entries if e[0] <= capacity]
    if any(p.fits for p in out):
        return out
    # Nothing fits: the least memory needed, with and without encoder recompute apart (`autoplan vlm` may keep only
    # those without).
    out, least = [], {False: float("inf"), True: float("inf")}
    for e in sorted(entries, key=lambda e: e[0]):
        if e[0] > max(least.values()):
            break
        rc = e[1].encoder_recompute
        if e[0] <= least[rc]:
            out.append(one(e))
            least[rc] = min(least[rc], out[-1].peak_mem_gib * GIB)
    return out


def _price_one(spec, wl, data, freeze, p: Placement, lay, r, i, m: int, enc_costs: _EncoderCosts,
               headroom) -> Priced:
    hw = enc_costs.hw
    pp, dp, mbs = int(lay.pp[i]), int(lay.dp[i]), p.llm.mbs
    llm_mb = _frozen_llm(r["per_mb"][i, :pp], r["fwd_bwd"][i, :pp], r["fwd"][i, :pp], freeze)
    trains_front = not (freeze.vision_model and freeze.vision_projection)
    dp_t = 0.0 if freeze.language_model else float(r["dp"][i, :pp].max())
    opt_t = 0.0 if freeze.language_model else float(r["opt"][i, :pp].max())
    mem = {k: r["mem"][k][i, :pp].copy() for k in MEMORY_KEYS}
    if freeze.language_model:
        mem["grads"][:] = 0.0
        mem["optimizer"][:] = 0.0
    zero = p.llm.zero >= 1

    def steps(load: ImageLoad):
        if p.kind == "inherit":
            enc = enc_costs.time(load, mbs, 1, p.encoder_recompute)
            stage = llm_mb.copy()
            stage[0] += enc.total
            return stage, enc.total
        lanes = mbs * dp / p.encoder_dp  # samples per encoder lane per language micro batch
        enc = enc_costs.time(load, lanes, p.encoder_tp, p.encoder_recompute)
        hop = enc_costs.hop(load, lanes, p.encoder_tp) * (2 if trains_front else 1)
        return np.concatenate([[enc.total + hop], llm_mb]), enc.total

    # The encoder's gradients are reduced after its backward, the last pass of a step on its ranks (its buckets
    # cannot overlap a later backward): an fp32 all-reduce over its data-parallel ranks (Bridge recipes
    # grad_reduce_in_fp32), exposed after the inherit plan's last backward; on a disjoint grid it runs beside the
    # language model's own reduction and optimizer, and the longer of the two ends the step.
    trainable = enc_costs.trainable
    if not trainable:
        pass
    elif p.kind == "inherit":
        enc_reduce = enc_costs.collective("all_reduce", trainable * GRAD_BYTES, dp, p.llm.tp * dp > hw.domain_size)
        opt_t += enc_reduce
    else:
        enc_reduce = enc_costs.collective("all_reduce", trainable * GRAD_BYTES / p.encoder_tp, p.encoder_dp,
                                          p.encoder_tp * p.encoder_dp > hw.domain_size)
        opt_t += max(enc_reduce - dp_t - opt_t, 0.0)
    stage_mean, enc_mean = steps(data.mean)
    stage_tail, _ = steps(data.tail)
    step = _step(stage_mean, m, dp_t, opt_t)
    tail = _step(stage_tail, m, dp_t, opt_t)

    # Memory: the encoder's on stage 0 (inherit) or on its own ranks (disjoint), at the tail load.
    if p.kind == "inherit":
        em = enc_costs.memory(data.tail, mbs, 1, dp, zero, pp, p.encoder_recompute)
        for key, val in (("weights", em.weights), ("grads", em.grads), ("optimizer", em.optimizer),
                         ("activations", em.activations)):
            mem[key][0] += val
        totals = sum(mem.values())
        peak = float(totals.max())
        terms = {k: float(v[int(totals.argmax())]) / GIB for k, v in mem.items()}
    else:
        em = enc_costs.memory(data.tail, mbs * dp / p.encoder_dp, p.encoder_tp, p.encoder_dp, zero, pp + 1,
                              p.encoder_recompute)
        # The encoder ranks hold the same CUDA context and NCCL buffers as a language rank, and the same share of
        # allocator fragmentation as the language model's stage 0.
        fixed = mem["cuda_context"][0] + mem["nccl"][0]
        stage0 = sum(v[0] for v in mem.values())
        enc_total = (em.total + fixed) * (1.0 + mem["fragmentation"][0] / max(stage0 - mem["fragmentation"][0], 1.0))
        totals = sum(mem.values())
        peak = float(max(totals.max(), enc_total))
        terms = {k: float(v[int(totals.argmax())]) / GIB for k, v in mem.items()}
        terms["encoder_rank"] = enc_total / GIB
    layers = rank_layer_counts(p.llm, spec.llm.num_layers)
    mid = [s for s in range(pp) if 0 < s < pp - 1] or list(range(pp))
    layer_s = float(np.mean([llm_mb[s] / max(layers[s], 1) for s in mid]))
    share = np.divide(r["fwd"][i, :pp], r["fwd_bwd"][i, :pp], out=np.full(pp, 1.0 / 3.0),
                      where=r["fwd_bwd"][i, :pp] > 0)
    llm_fwd = llm_mb * share
    return Priced(placement=p, step_s=step, tail_step_s=tail, stage_s=tuple(float(x) for x in stage_mean),
                  encoder_s=enc_mean, layer_s=layer_s, peak_mem_gib=peak / GIB,
                  fits=peak <= hw.capacity_bytes * (1.0 - headroom), num_microbatches=m, memory_gib=terms,
                  llm_fwd_s=tuple(float(x) for x in llm_fwd), llm_bwd_s=tuple(float(x) for x in llm_mb - llm_fwd),
                  after_s=dp_t + opt_t)


def stage_splits(num_layers: int, pp: int) -> List[Tuple[Optional[int], Optional[int]]]:
    """(first, last) stage layer counts Megatron can run: middle stages equal (megatron-core 0.16.1
    transformer_config.py: the layers left after the first and last stage must divide evenly among the others);
    (None, None) is the even split when pp divides the layers."""
    out: List[Tuple[Optional[int], Optional[int]]] = []
    if num_layers % pp == 0:
        out.append((None, None))
    if pp < 2:
        return out
    for first in range(1, num_layers):
        for last in range(1, num_layers - first + 1):
            rest = num_layers - first - last
            if pp == 2:
                if rest == 0:
                    out.append((first, last))
            elif rest > 0 and rest % (pp - 2) == 0:
                out.append((first, last))
    return out



def absorbable(p: Priced, num_layers: int) -> Tuple[bool, float]:
    """(whether, ms): stage 0 of an inherit plan absorbs the encoder when the encoder's time per micro batch is at
    most what moving all but one of an even stage's layers off stage 0 frees, (num_layers / pp - 1) layer times;
    past that, stage 0 stays the slowest stage however the layers are split, and every micro batch waits on it."""
    shed = (num_layers / p.placement.llm.pp - 1) * p.layer_s
    return p.encoder_s <= shed, shed


def drawn_loads(data: ImageData, m: int) -> List[ImageLoad]:
    """The image load of each of a pipeline's m micro batches composed as the samples come (no reordering). From
    mean and tail: the top (100 - percentile)% of micro batches at the tail load, spread evenly through the step,
    the others at the load that keeps the mean. From a histogram: each micro batch at its quantile, heavy and light
    interleaved."""
    if data.histogram:
        rows = sorted(data.histogram, key=lambda r: r[0] * r[1])
        total = sum(r[2] for r in rows)
        loads = []
        for j in range(m):
            q, acc = (j + 0.5) / m * total, 0.0
            for r in rows:
                acc += r[2]
                if acc >= q:
                    loads.append(ImageLoad(images_per_sample=r[0], tokens_per_image=r[1]))
                    break
        return loads[0::2] + loads[1::2][::-1]
    q = (100.0 - data.tail_percentile) / 100.0
    heavy = min(max(1, round(q * m)), m) if data.tail.image_tokens > data.mean.image_tokens else 0
    rest_tokens = max((data.mean.image_tokens * m - data.tail.image_tokens * heavy) / max(m - heavy, 1), 0.0)
    scale = rest_tokens / data.mean.image_tokens if data.mean.image_tokens else 0.0
    rest = ImageLoad(images_per_sample=data.mean.images_per_sample * scale,
                     tokens_per_image=data.mean.tokens_per_image)
    slots = {int((k + 0.5) * m / heavy) for k in range(heavy)} if heavy else set()
    return [data.tail if j in slots else rest for j in range(m)]


def drawn_step(spec: MultimodalSpec, cluster: ClusterSpec, data: ImageData, freeze: Freeze, priced: Priced,
               cal: Calibration = DEFAULT) -> float:
    """Step seconds with micro batches composed as drawn (`drawn_loads`): Megatron's 1F1B pass order with each
    micro batch's own encoder time (autoplan/report/timeline.py `simulate`). The mean and tail prices assume every
    micro batch alike; reordering samples so that micro batches carry equal image loads gives the mean price."""
    from autoplan.report.timeline import simulate

    p = priced.placement
    m = priced.num_microbatches
    costs = _EncoderCosts(spec, cluster, freeze, cal)
    trains_front = not (freeze.vision_model and freeze.vision_projection)
    enc_f, enc_b = [], []
    for load in drawn_loads(data, m):
        if p.kind == "inherit":
            e = costs.time(load, p.llm.mbs, 1, p.encoder_recompute)
            hop = 0.0
        else:
            dp = p.llm_gpus // (p.llm.tp * p.llm.pp * p.llm.cp)
            lanes = p.llm.mbs * dp / p.encoder_dp
            e = costs.time(load, lanes, p.encoder_tp, p.encoder_recompute)
            hop = costs.hop(load, lanes, p.encoder_tp)
        enc_f.append(e.fwd + hop)
        enc_b.append(e.bwd + e.tp_comm + (hop if trains_front else 0.0))
    fwd = [[t] * m for t in priced.llm_fwd_s]
    bwd = [[t] * m for t in priced.llm_bwd_s]
    if p.kind == "inherit":
        fwd[0] = [a + b for a, b in zip(fwd[0], enc_f)]
        bwd[0] = [a + b for a, b in zip(bwd[0], enc_b)]
    else:
        fwd, bwd = [enc_f] + fwd, [enc_b] + bwd
    passes = simulate(len(fwd), 1, m, fwd, bwd)
    return max(end for _, end in passes.values()) + priced.after_s
