"""Search: placement (colocated, or split with a training/rollout GPU ratio) x training layout x offload x rollout
layout, each combination priced phase by phase and ranked by samples per second.

The rollout phase is the slowest engine's generation (rollout.simulate: every engine drains its own share of
the long tail, and the trainer waits for the last); the engines' mean is reported beside it
(rollout_engine_mean_s; the slowest, rollout_slowest_engine_s, is the phase on-policy and one-step-off steps wait
for).

Step time by mode (verl docs/advance/one_step_off.md: "colocate sync: step = gen + old_log_prob + update_actor;
one-step-overlap async: step = wait_prev_gen + old_log_prob + update_actor"):
- on-policy: rollout + ref + old_log_prob + reward + refit + switch + train, one after the other (switch: a
  colocated step's weights moved between GPU and host around the rollout, `_side`; 0 on split pools);
- one-step-off (split only): the rollout of step n+1 runs while step n trains, so step = max(rollout, ref +
  old_log_prob + reward + train) + refit;
- async (split only; verl fully-async with partial rollout, slime --partial-rollout): the rollout streams, so its
  long tail carries over into the next step and it costs its steady-state time; step = max(rollout at full batch,
  ref + reward + train) + refit, the actor's log-probs coming from the engine; with a staleness bound
  (job.staleness, verl fully-async staleness_threshold) the version is autoplan/rl/stream.py's: the rollouter runs
  at most that far ahead, the trainer waits for each local update's prompts, and at staleness 0 the last local
  update waits for the slowest engine's tail (details["trainer_wait_s"]: the trainer's waits)."""
from __future__ import annotations

import itertools

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from autoplan.cluster import ClusterSpec
from autoplan.costmodel.hardware import GIB, hardware_of
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.rl import memory as M
from autoplan.rl import refit as F
from autoplan.rl import rollout as R
from autoplan.rl import stream as ST
from autoplan.rl.spec import OFFLOADS, Placement, RLJob, RolloutLayout
from autoplan.rl.train import TrainPhases, candidate_strategies, packed_mbs, price_training, swap_seconds
from autoplan.strategy import Strategy

UTILIZATIONS = (0.5, 0.6, 0.7, 0.8, 0.9)
TRAIN_KEEP = 4  # fastest fitting training layouts kept per offload setting


@dataclass
class Fixed:
    """What the user fixed: training strategy keys (and offload), rollout keys, placement."""

    train: Dict[str, object] = field(default_factory=dict)
    offload: Optional[str] = None
    rollout: Dict[str, object] = field(default_factory=dict)
    placement: Optional[Placement] = None
    engine: str = "vllm"


@dataclass
class RLPlan:
    placement: Placement
    strategy: Strategy
    offload: str
    rollout: RolloutLayout
    phases: Dict[str, float]
    step_time_s: float
    samples_per_s: float
    peak_mem_gib: float
    memory_gib: Dict[str, float]
    host_mem_gib: float
    fits: bool
    details: Dict[str, object]

    def to_dict(self, job: RLJob) -> Dict[str, object]:
        train = {**self.strategy.to_dict(), "offload": self.offload}
        return {
            "placement": self.placement.to_dict(),
            "train": train,
            "rollout": self.rollout.to_dict(),
            "estimate": {
                "step_time_s": self.step_time_s,
                "phase_times_s": dict(self.phases),
                "samples_per_s": self.samples_per_s,
                "samples_per_s_per_gpu": self.samples_per_s / self.placement.gpus,
                "peak_mem_gib": self.peak_mem_gib,
                "memory_gib": dict(self.memory_gib),
                "host_mem_gib": self.host_mem_gib,
                "host_mem_capacity_gib": job.host_mem_gib,
                "fits": self.fits,
                **self.details,
            },
        }


def placements(gpus: int, gpus_per_node: int, job: RLJob, fixed: Fixed) -> List[Placement]:
    """Colocated (on-policy only), and every split the frameworks can place: the same number of training GPUs on
    every node (verl's trainer.n_gpus_per_node / rollout.n_gpus_per_node over all nodes, e.g. its 12 + 4 runs on
    2 nodes), or whole nodes for each pool."""
    if fixed.placement is not None:
        return [fixed.placement]
    out = [Placement(kind="colocated", gpus=gpus, train_gpus=gpus)] if job.mode == "on-policy" else []
    nodes = max(1, gpus // gpus_per_node)
    per_node = [nodes * k for k in range(1, min(gpus_per_node, gpus))] if gpus % gpus_per_node == 0 or \
        gpus < gpus_per_node else []
    whole = [gpus_per_node * k for k in range(1, nodes)]
    for t in sorted(set(per_node) | set(whole)):
        if 0 < t < gpus:
            out.append(Placement(kind="split", gpus=gpus, train_gpus=t))
    return out


def rollout_layouts(model: ModelSpec, gpus: int, fixed: Fixed) -> List[RolloutLayout]:
    """tp dividing the attention heads, dp (attention groups) for MoE models, ep over the engine's GPUs, engines
    filling the pool; every utilisation in UTILIZATIONS. Keys the user fixed are held."""
    f = fixed.rollout
    if "tp" in f and not R.state_tp_ok(model, f["tp"]):
        heads = (f"its {model.gdn_num_key_heads} key and {model.gdn_num_value_heads} value heads"
                 if model.linear_attention_layers else f"its {model.mamba_num_heads} Mamba heads and conv channels")
        raise InputError(f"--rollout tp={f['tp']} does not split {model.name}'s recurrent mixers (vLLM and SGLang "
                         f"divide their heads tp ways); pick a tp dividing {heads}")
    tps = sorted({t for t in (1, 2, 4, 8, 16, 32, 64)
                  if model.num_attention_heads % t == 0 and R.state_tp_ok(model, t)} | (
        {f["tp"]} if "tp" in f else set()))
    dps = (1, 2, 4, 8) if model.is_moe else (1,)
    # SGLang's radix cache decides a hybrid's state slots per running request (`SglangHybridPools`); it changes
    # nothing else the rollout model prices (prefill is priced per response, as without prefix sharing), so it is
    # searched only there (and kept off only where it admits more requests: `search`)
    radixes = (f["radix_cache"],) if "radix_cache" in f else (True, False) if (
        fixed.engine == "sglang" and R.state_layers(model)) else (True,)
    out = []
    for tp in tps:
        for dp in sorted(set(dps) | ({f["dp"]} if "dp" in f else set())):
            size = tp * dp
            if size > gpus or gpus % size:
                continue
            eps = {size, 1} if model.is_moe else {1}
            for ep in sorted(eps | ({f["ep"]} if "ep" in f else set())):
                if size % ep:
                    continue
                for util, radix in itertools.product(
                        (f["gpu_memory_utilization"],) if "gpu_memory_utilization" in f else UTILIZATIONS, radixes):
                    values = {"engine": fixed.engine, "tp": tp, "dp": dp, "ep": ep, "engines": gpus // size,
                              "gpu_memory_utilization": util, "cuda_graphs": f.get("cuda_graphs", True),
                              "radix_cache": radix}
                    if any(values[k] != v for k, v in f.items()):
                        continue
                    out.append(RolloutLayout(**values))
    return out


def _train_candidates(model: ModelSpec, cluster: ClusterSpec, job: RLJob, fixed: Fixed):
    from autoplan.rl.train import workload_of
    from autoplan.strategy import strategy_from_mapping
    from autoplan.validate import first_broken_rule

    wl = workload_of(job)
    if fixed.train:
        values = {"cp": 1, "mbs": 1, "zero": 1, "etp": 1, "recompute": "full", **fixed.train}
        values.setdefault("sp", values.get("tp", 1) > 1)
        pp = int(values.get("pp", 1))
        if pp > 1 and model.num_layers % pp and "last_stage_layers" not in values and "first_stage_layers" not in \
                values:
            values["last_stage_layers"] = model.num_layers - (pp - 1) * (model.num_layers // pp)
        if "tp" in values and "pp" in values and ("ep" in values or not model.is_moe):
            try:
                strategies = [strategy_from_mapping(values)]
            except ValueError as e:
                raise InputError(f"--train-strategy: {str(e).splitlines()[0]}") from None
        else:
            strategies = [s for s in candidate_strategies(model, cluster.num_gpus, cluster.gpu.gpus_per_node)
                          if all(getattr(s, k, None) == v for k, v in fixed.train.items())]
    else:
        strategies = candidate_strategies(model, cluster.num_gpus, cluster.gpu.gpus_per_node)
    if job.micro_batch_tokens is not None and "mbs" not in fixed.train:
        # Packing sets the micro-batch, so layouts that differ only in it become one.
        strategies = list(dict.fromkeys(
            s.model_copy(update={"mbs": packed_mbs(job, cluster.num_gpus // (s.tp * s.pp * s.cp), s.cp)})
            for s in strategies))
    legal = [s for s in strategies if first_broken_rule(model, cluster, wl, s) is None]
    if fixed.train and not legal:
        given = ",".join(f"{k}={v}" for k, v in fixed.train.items())
        rule = None
        try:
            probe = strategies[0] if strategies else strategy_from_mapping(
                {"pp": 1, "ep": 1, "cp": 1, "mbs": 1, "zero": 1, "etp": 1, "recompute": "full", **fixed.train})
            rule = first_broken_rule(model, cluster, wl, probe)
        except ValueError as e:
            rule = str(e).splitlines()[0]
        raise InputError(f"--train-strategy {given} on {cluster.num_gpus} training GPUs: "
                         f"{rule or 'no layout the search tries has these keys; give tp, pp and ep together'}")
    return legal


def _offloads(placement: Placement, fixed: Fixed) -> Sequence[str]:
    if fixed.offload is not None:
        return (fixed.offload,)
    return OFFLOADS if placement.kind == "colocated" else ("none", "optimizer")


def search(model: ModelSpec, cluster: ClusterSpec, job: RLJob, fixed: Fixed, top_k: int = 5,
           critic: Optional[ModelSpec] = None):
    """(plans best first, whether any fits). Plans that do not fit are kept only when nothing fits (fits=false).
    PPO trains a critic (`critic`, default the actor's shape, as verl initialises it from the actor) on the
    training layout beside the actor."""
    hw = hardware_of(cluster)
    gpn = cluster.gpu.gpus_per_node
    plans: List[RLPlan] = []
    refused: Optional[InputError] = None
    for pl in placements(cluster.num_gpus, gpn, job, fixed):
        if pl.kind == "colocated" and job.mode != "on-policy":
            raise InputError(f"--mode {job.mode} overlaps rollout and training, which needs two GPU pools; use "
                             f"--placement split:TRAIN_GPUS or --mode on-policy")
        train_cluster = cluster.model_copy(update={"num_gpus": pl.train_gpus})
        try:
            strategies = _train_candidates(model, train_cluster, job, fixed)
        except InputError as e:  # a given layout may not tile every pool size the search tries
            if fixed.placement is not None:
                raise
            refused = refused or e
            continue
        critic_model = (critic or model) if job.algo == "ppo" else None
        if critic_model is not None:
            strategies = _legal_for(critic_model, train_cluster, job, strategies)
        offs = list(_offloads(pl, fixed))
        if not strategies:
            continue
        rows = [(s, o) for o in offs for s in strategies]
        tp = price_training(model, train_cluster, job, [s for s, _ in rows], [o for _, o in rows])
        cp = price_training(critic_model, train_cluster, job, [s for s, _ in rows], [o for _, o in rows]) \
            if critic_model is not None else None
        keep = _best_training(tp, rows, hw.capacity_bytes, job)
        layouts = rollout_layouts(model, pl.rollout_gpus, fixed)
        if not layouts and fixed.rollout:
            given = ",".join(f"{k}={v}" for k, v in fixed.rollout.items())
            raise InputError(f"--rollout {given} does not tile the {pl.rollout_gpus} rollout GPUs of placement "
                             f"{pl.kind}:{pl.train_gpus}: tp*dp*engines must equal {pl.rollout_gpus}, tp divide "
                             f"the {model.num_attention_heads} attention heads and ep divide tp*dp")
        sims = {lay: R.simulate(model, lay, hw, job) for lay in layouts}
        # SGLang without its radix cache loses the prompt prefix the samples of a prompt share, which the rollout
        # model does not price (it prefills every response's prompt); so that setting is offered only where it
        # runs more requests at once than the same layout with the cache
        with_cache = {lay: lay.model_copy(update={"radix_cache": True}) for lay in layouts if not lay.radix_cache}
        layouts = [lay for lay in layouts if lay.radix_cache or with_cache[lay] not in sims
                   or sims[lay].batch > sims[with_cache[lay]].batch]
        for i in keep:
            s, off = rows[i]
            for lay in layouts:
                plans.append(_assemble(model, cluster, hw, job, pl, s, off, lay, sims[lay], tp, cp, i))
    if not plans and refused is not None:
        raise refused
    if not plans:
        raise InputError("no training layout is legal for this model on these GPU counts; pass --gpus with a "
                         "multiple of the GPUs per node or --train-strategy")
    fitting = [p for p in plans if p.fits]
    pool = fitting if fitting else plans
    pool.sort(key=lambda p: (-p.samples_per_s if math.isfinite(p.samples_per_s) else math.inf, p.peak_mem_gib))
    return _distinct(pool, top_k), bool(fitting)


def _legal_for(model: ModelSpec, cluster: ClusterSpec, job: RLJob, strategies) -> list:
    from autoplan.rl.train import workload_of
    from autoplan.validate import first_broken_rule

    wl = workload_of(job)
    return [s for s in strategies if first_broken_rule(model, cluster, wl, s) is None]


@dataclass(frozen=True)
class _Side:
    """One trained model (actor or critic) of one candidate: its update and log-prob pass, GPU memory while
    training and while a colocated engine generates, host RAM per rank."""

    train_s: float
    log_prob_s: float
    ref_s: float  # the reference model's log-prob pass (the actor's shape)
    switch_s: float
    peak_bytes: float
    resident_bytes: float
    host_bytes: float


def _side(tp: TrainPhases, i: int, off: str, colocated: bool, cluster: ClusterSpec) -> _Side:
    """A colocated model's states move between GPU and host inside the phases verl times them in (verl
    verl/workers/megatron_workers.py at b178a3cd; fsdp_workers.py alike): update_actor loads the weights, gradients
    and optimizer it offloaded and offloads them again (lines 742-779), each log-prob pass loads and offloads the
    weights (compute_log_prob lines 864-903, compute_ref_log_prob 838-856), and the switch to rollout mode loads
    the weights to sync them into the engine and offloads them after (rollout_mode lines 682 and 732): the
    `switch` of a step, timed inside verl's "gen" and outside "generate_sequences"."""
    swapped = {"all": tp.weights_bytes[i] + tp.grads_bytes[i],
               "swap": tp.weights_bytes[i] + tp.grads_bytes[i] + tp.optimizer_bytes[i]}.get(off, 0.0)
    moved = colocated and off in ("all", "swap")
    swap = float(swap_seconds(np.array(swapped), cluster)) if colocated else 0.0
    weights = float(swap_seconds(np.array(tp.weights_bytes[i]), cluster))
    # a colocated reference model always sits on the host between its passes (emit_verl: ref param_offload)
    return _Side(train_s=float(tp.train[i]) + float(tp.cpu_adam[i]) + swap,
                 log_prob_s=float(tp.log_prob[i]) + (weights if moved else 0.0),
                 ref_s=float(tp.log_prob[i]) + (weights if colocated else 0.0), switch_s=weights if moved else 0.0,
                 peak_bytes=float(tp.peak_bytes[i]),
                 resident_bytes=M.resident_during_rollout(tp, i, off),
                 host_bytes=M.host_bytes_per_rank(tp, i, off, False, False, 0.0))


def _distinct(plans: List[RLPlan], top_k: int) -> List[RLPlan]:
    out, seen = [], set()
    for p in plans:
        # one plan per layout: settings that differ only in the engine's memory share are one choice
        key = (p.placement.kind, p.placement.train_gpus, p.strategy.key(), p.offload,
               p.rollout.model_copy(update={"gpu_memory_utilization": 0.0}))
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
        if len(out) == top_k:
            break
    return out


def _best_training(tp: TrainPhases, rows, capacity: float, job: RLJob) -> List[int]:
    """The fastest TRAIN_KEEP training rows per offload setting that fit the GPU while training (all rows when
    none fits, so that the answer can say by how much)."""
    cost = tp.train + tp.cpu_adam + (2.0 if job.use_ref else 1.0) * tp.log_prob
    out = []
    for off in dict.fromkeys(o for _, o in rows):
        idx = [i for i, (_, o) in enumerate(rows) if o == off]
        fit = [i for i in idx if tp.peak_bytes[i] <= capacity]
        chosen = fit if fit else idx
        out += sorted(chosen, key=lambda i: cost[i])[:TRAIN_KEEP]
    return out


def _assemble(model, cluster, hw, job: RLJob, pl: Placement, s: Strategy, off: str, lay: RolloutLayout,
              sim: R.RolloutTime, tp: TrainPhases, cp: Optional[TrainPhases], i: int) -> RLPlan:
    colocated = pl.kind == "colocated"
    actor = _side(tp, i, off, colocated, cluster)
    log_prob = actor.log_prob_s
    critic = _side(cp, i, off, colocated, cluster) if cp is not None else None
    train = actor.train_s + (critic.train_s if critic else 0.0)
    reward = critic.log_prob_s if critic else 0.0  # PPO: the critic's value pass; GRPO: rule-based reward
    method = "ipc" if colocated else "broadcast"
    pp_net = s.pp > 1 and s.tp * s.pp > cluster.gpu.gpus_per_node
    refits = {m: F.refit_seconds(model, lay, hw, m, s.tp, s.pp, s.ep, pp_net)
              for m in (("ipc",) if colocated else ("broadcast", "shard"))}
    rollout = sim.throughput_seconds if job.mode == "async" else sim.seconds
    # async: the trainer takes the rollout engine's log-probs (verl fully-async use_rollout_log_probs: True, v0.7.0
    # recipe/fully_async_policy/config; its published table shows no old_log_prob), so the actor pass is skipped
    old_lp = 0.0 if job.mode == "async" else log_prob
    # switch (colocated): the actor's weights come back for the sync and go again (_side), and an engine that keeps
    # its weights on the host while asleep (rollout.WEIGHTS_ON_HOST_ASLEEP) copies them out at sleep and back at
    # wake; its KV cache is freed and mapped again, which copies nothing. Split pools never switch.
    engine_w = R.engine_weights(model, lay).total
    engine_host = engine_w if R.WEIGHTS_ON_HOST_ASLEEP[lay.engine] else 0.0
    switch = actor.switch_s + (float(swap_seconds(np.array(engine_host), cluster)) if colocated else 0.0)
    phases = {"rollout": float(rollout), "ref": actor.ref_s if job.use_ref else 0.0, "old_log_prob": old_lp,
              "reward": reward, "refit": refits[method], "switch": switch, "train": train}
    trainer_side = phases["ref"] + phases["old_log_prob"] + phases["reward"] + phases["train"]
    trainer_wait = None
    if job.mode == "on-policy":
        step = sum(phases.values())
    elif job.mode == "async" and job.staleness is not None:
        # the rollouter's lead bounded (verl fully-async staleness_threshold) and the trainer's local updates
        # (require_batches mini-batches each): autoplan/rl/stream.py
        per = job.require_batches or job.mini_batches
        v = ST.version(job.prompts, max(1, job.mini_batches // per), job.staleness, sim.throughput_seconds,
                       sim.seconds, trainer_side, phases["refit"] + phases["switch"])
        step, trainer_wait = v.seconds, v.trainer_wait_s
    else:
        step = max(phases["rollout"], trainer_side) + phases["refit"] + phases["switch"]
    if trainer_wait is None:
        trainer_wait = max(0.0, phases["rollout"] - trainer_side) if job.mode != "on-policy" else 0.0
    rollout_bytes = R.rollout_gpu_bytes(model, lay, hw)
    resident = (actor.resident_bytes + (critic.resident_bytes if critic else 0.0)) if colocated else 0.0
    train_peak = actor.peak_bytes
    if critic:  # each trains while the other keeps what its offload setting leaves on the GPU
        train_peak = max(actor.peak_bytes + critic.resident_bytes, critic.peak_bytes + actor.resident_bytes)
    mem = {"train": train_peak / GIB, "rollout": (rollout_bytes + resident) / GIB}
    if colocated:
        runtime = sum(R.engine_runtime_bytes(model, lay, hw).values())
        refit_gpu = M.refit_bytes(tp, i, off, engine_w, runtime, F.BUCKET_BYTES)
        if critic:  # the critic keeps what its offload setting leaves
            refit_gpu += critic.resident_bytes
        mem["refit"] = refit_gpu / GIB
    peak = max(mem.values())
    host_rank = M.host_bytes_per_rank(tp, i, off, colocated, job.use_ref, engine_host) + (
        critic.host_bytes if critic else 0.0)
    ranks = min(cluster.gpu.gpus_per_node, pl.train_gpus)
    host = host_rank * ranks / GIB
    longest = job.prompt_len + job.max_response_len
    shortfall = R.cache_shortfall(model, lay, hw, longest)
    kv_ok = shortfall is None
    fits = (peak <= hw.capacity_bytes / GIB and host <= job.host_mem_gib and kv_ok and sim.batch > 0
            and math.isfinite(step))
    details = {"rollout_batch_per_engine": sim.batch, "kv_tokens_per_engine": float(sim.kv_tokens),
               "rollout_drain_s": float(sim.drain_seconds), "rollout_engine_mean_s": float(sim.mean_seconds),
               "rollout_slowest_engine_s": float(sim.seconds), "trainer_wait_s": float(trainer_wait),
               "refit_method": method,
               "refit_s_by_method": refits, "timeline": _timeline(phases, job.mode)}
    if not kv_ok:
        details["why_not"] = shortfall
    sps = job.sequences / step if step > 0 and math.isfinite(step) else 0.0
    return RLPlan(placement=pl, strategy=s, offload=off, rollout=lay, phases=phases, step_time_s=float(step),
                  samples_per_s=sps, peak_mem_gib=peak, memory_gib=mem, host_mem_gib=host, fits=fits,
                  details=details)


def _timeline(phases: Dict[str, float], mode: str) -> List[Dict[str, object]]:
    """Start and end of each phase within a step; for one-step-off/async the rollout (of the next step) runs on
    its own pool from 0, beside the trainer's phases."""
    out, t = [], 0.0
    order = ("rollout", "ref", "old_log_prob", "reward", "train", "refit", "switch") if mode != "on-policy" else \
        ("rollout", "reward", "ref", "old_log_prob", "train", "refit", "switch")
    for name in order:
        d = phases[name]
        if mode != "on-policy" and name == "rollout":
            out.append({"phase": name, "pool": "rollout", "start_s": 0.0, "end_s": d})
            continue
        if mode != "on-policy" and name == "refit":
            t = max(t, phases["rollout"])
        out.append({"phase": name, "pool": "train" if mode != "on-policy" else "all", "start_s": t, "end_s": t + d})
        t += d
    return out
