"""The training-side phases of an RL step, priced by the training cost model (`autoplan.costmodel.estimate
.evaluate`) on the training layout: the policy update (train), the log-probability passes of the actor
(old_log_prob) and of the reference (ref), the critic's values and update for PPO, and the CPU optimizer and the
offload swaps of a colocated step.

A log-probability pass is a forward pass only: one third of the forward-backward compute (the backward pass costs
twice the forward, Narayanan et al. 2021 sec. 3.2's 3x rule the cost model's FLOP counts follow), half of the
per-micro-batch communication (forward and backward each run the same TP/CP/EP collectives and P2P sends), and one
third of the pipeline bubble; no recompute, no gradient sync, no optimizer.

Every optimizer step waits for the slowest data-parallel rank (`rank_imbalance`): the responses have different
lengths, so the ranks' shares of a mini-batch differ, and the gradient reduction and the clipped norm that end the
step synchronise them all. verl at b25bb7d4 (the fully-async recipe's first commit, where its published 7B timings
first appear): the trainer balances the whole batch over the ranks (ray_trainer.py `_balance_batch`, seqlen
partitions whose items keep their batch order, seqlen_balancing.py line 187 `sorted(partition)`), each rank splits
its share into mini-batches in that order (dp_actor.py line 388, `data.split(ppo_mini_batch_size)`, the mini batch
x n / data-parallel groups sequences, fsdp_workers.py lines 234-235) and ends each with `_optimizer_step()` and
`grad_norm.detach().item()` (lines 503-504): a mini-batch's share on one rank is a set of draws of the length
distribution, balanced only over the whole batch. The log-probability pass runs the rank's whole (balanced) share
and gets no such term."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import List, Sequence

import numpy as np

from autoplan.cluster import ClusterSpec
from autoplan.costmodel.estimate import Evaluation, evaluate
from autoplan.costmodel.hardware import hardware_of
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.model import ModelSpec
from autoplan.rl.rollout import length_scale
from autoplan.rl.spec import RLJob
from autoplan.strategy import Strategy
from autoplan.workload import Workload, make_workload

# CPU Adam (Megatron --optimizer-cpu-offload, HybridDeviceOptimizer in megatron/core/optimizer/cpu_offloading/): the
# update reads fp32 param, grad, m, v and writes param, m, v: 28 bytes of host DRAM traffic per parameter; a node
# with two Xeon Platinum 8480+ has 2 sockets x 8 channels DDR5-4800 x 38.4 GB/s = 614 GB/s (Intel ARK), shared by its
# ranks. The states themselves: fp32 master param, fp32 grad, m, v = 16 bytes per parameter on the host.
CPU_ADAM_BYTES_PER_PARAM = 28
HOST_DRAM_BYTES_PER_S = 614e9
CPU_ADAM_STATE_BYTES_PER_PARAM = 16


def workload_of(job: RLJob) -> Workload:
    """Training sees every response with its prompt, without padding (verl use_remove_padding, Megatron packed
    sequences): prompts x samples sequences of prompt + mean response tokens."""
    return make_workload(job.mean_seq_len, job.sequences)


def packed_mbs(job: RLJob, dp: int, cp: int) -> int:
    """Sequences per micro-batch when they are packed by length (`job.micro_batch_tokens`): a micro-batch of one
    sequence-parallel group holds at most micro_batch_tokens x its size tokens (verl dp_actor.py line 383 at
    503ea75f, `max_token_len = ppo_max_token_len_per_gpu * ulysses_sequence_parallel_size`, line 552 at b178a3cd;
    slime backends/megatron_utils/data.py `max_tokens_per_gpu * cp_size`), so at mean length it packs
    micro_batch_tokens * cp // (prompt + mean response) sequences. The count is the largest divisor of a rank's
    sequences per optimizer step not above that (the cost model splits a rank's batch into equal micro-batches;
    verl's rearrange_micro_batches makes ceil(tokens / cap) of them), at least 1; without packing, 1."""
    if job.micro_batch_tokens is None or dp < 1:  # dp < 1: the layout does not tile the pool (the rules refuse it)
        return 1
    fit = max(1, job.micro_batch_tokens * cp // job.mean_seq_len)
    per_rank, rest = divmod(job.sequences, job.mini_batches * dp)
    if rest or per_rank < 1:
        per_rank, rest = divmod(job.sequences, dp)
        if rest or per_rank < 1:
            return 1
    return max(d for d in range(1, min(fit, per_rank) + 1) if per_rank % d == 0)


@lru_cache(maxsize=4096)
def rank_imbalance(mean: int, longest: int, prompt: int, per_rank: int, ranks: int) -> float:
    """Expected tokens of the fullest of `ranks` data-parallel ranks over their mean, when each rank holds
    `per_rank` sequences of prompt + a response drawn from the length distribution (rollout.length_scale: min(X,
    longest), X exponential). The largest of n i.i.d. sums S has CDF F_S^n (David & Nagaraja, "Order Statistics",
    eq. 2.1.1), so E[max] = integral of (1 - F_S(x)^n) dx. F_S is the `per_rank`-fold convolution of the length
    distribution, computed on a lattice of `longest` / bins tokens by FFT (the convolution theorem); each lattice
    cell's mass is split between its two ends so that the lattice keeps the distribution's mean exactly. 1 for one
    rank or lengths without spread."""
    if ranks <= 1 or longest <= mean or per_rank < 1:
        return 1.0
    theta = length_scale(mean, longest)
    bins = int(min(4096, max(16, (2 ** 19 - 1) // per_rank)))
    w = longest / bins
    edges = np.arange(bins + 1) * w
    cell = np.exp(-edges[:-1] / theta) - np.exp(-edges[1:] / theta)  # P(X in [j w, (j + 1) w))
    offset = theta - w / math.expm1(w / theta)  # E[X - j w | X in the cell], the same for every cell
    pmf = np.zeros(bins + 1)
    pmf[:-1] += cell * (1.0 - offset / w)
    pmf[1:] += cell * (offset / w)
    pmf[-1] += math.exp(-longest / theta)  # responses cut at the cap
    size = 1 << int(math.ceil(math.log2(per_rank * bins + 1)))  # covers the sum's support: no wrap-around
    total = np.fft.irfft(np.fft.rfft(pmf, size) ** per_rank, size)[:per_rank * bins + 1]
    total = np.maximum(total, 0.0)
    cdf = np.minimum(np.cumsum(total / total.sum()), 1.0)
    longest_sum = w * float(np.sum(1.0 - cdf[:-1] ** ranks))
    return (per_rank * prompt + longest_sum) / (per_rank * (prompt + mean))


@dataclass(frozen=True)
class TrainPhases:
    """Per training candidate (arrays): seconds of each training-side phase and the memory it needs."""

    train: np.ndarray
    log_prob: np.ndarray  # one forward pass of one model over the batch
    cpu_adam: np.ndarray
    peak_bytes: np.ndarray  # GPU, during the update (optimizer on the host when offloaded)
    context_bytes: np.ndarray  # the training process's CUDA context and NCCL buffers, resident in every phase
    weights_bytes: np.ndarray  # per GPU, bf16 weights of the peak rank
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    params_per_gpu: np.ndarray
    ev: Evaluation


def price_training(model: ModelSpec, cluster: ClusterSpec, job: RLJob, strategies: Sequence[Strategy],
                   offload: Sequence[str]) -> TrainPhases:
    """Price every (strategy, offload) pair on `cluster` (the training pool)."""
    wl = workload_of(job)
    lay = layouts_from_strategies(list(strategies), cluster.num_gpus, gpu_id=cluster.gpu.id)
    ev = evaluate(model, cluster, wl, lay)
    tt = ev.time_terms
    comm = tt["tp_comm"] + tt["cp_comm"] + tt["ep_comm"] + tt["pp_comm"]
    log_prob = tt["compute"] / 3.0 + comm / 2.0 + tt["bubble"] / 3.0
    per_update = tt["dp_comm"] + tt["optimizer"]
    # the micro-batches' work (everything but the gradient sync and the optimizer) waits, every optimizer step, for
    # the rank with the most tokens (`rank_imbalance`)
    dp = np.array([max(1, cluster.num_gpus // (s.tp * s.pp * s.cp)) for s in strategies])
    per_rank = np.ceil(job.sequences / job.mini_batches / dp).astype(int)
    slowest = np.array([rank_imbalance(job.response_len, job.max_response_len, job.prompt_len, int(k), int(g))
                        for k, g in zip(per_rank, dp)])
    train = slowest * (ev.step_time_s - per_update) + job.mini_batches * per_update
    weights = ev.memory_terms["weights"]
    params = weights / 2.0  # bf16 weights
    off = np.array([o in ("optimizer", "all") for o in offload])
    ranks_per_node = min(cluster.gpu.gpus_per_node, cluster.num_gpus)
    adam = np.where(off, job.mini_batches * params * CPU_ADAM_BYTES_PER_PARAM * ranks_per_node
                    / HOST_DRAM_BYTES_PER_S, 0.0)
    train = np.where(off, train - job.mini_batches * tt["optimizer"], train)
    peak = np.where(off, ev.peak_mem_bytes - ev.memory_terms["optimizer"], ev.peak_mem_bytes)
    context = ev.memory_terms["cuda_context"] + ev.memory_terms["nccl"]
    return TrainPhases(train=train, log_prob=log_prob, cpu_adam=adam, peak_bytes=peak, context_bytes=context,
                       weights_bytes=weights,
                       grads_bytes=ev.memory_terms["grads"], optimizer_bytes=ev.memory_terms["optimizer"],
                       params_per_gpu=params, ev=ev)


def swap_seconds(bytes_per_gpu: np.ndarray, cluster: ClusterSpec) -> np.ndarray:
    """Moving `bytes_per_gpu` to the host and back once (verl's param/grad offload around the rollout) over each
    GPU's host link (GpuSpec.host_bandwidth_gbytes_per_s)."""
    return 2.0 * bytes_per_gpu / hardware_of(cluster).host_bytes_per_s


def candidate_strategies(model: ModelSpec, gpus: int, gpus_per_node: int) -> List[Strategy]:
    """Training layouts the search tries: tp up to a node, pp dividing the layers (an uneven last stage when they
    do not divide, as verl's DeepSeek recipe's LAST_LAYER), ep dividing the experts, cp 1, full recompute (what
    verl's and slime's large-model recipes run), selective recompute and none (verl's Megatron 7B recipes leave
    megatron_actor.yaml's recompute unset), distributed optimizer, micro batch 1 and 2 (those recipes' 2 sequences
    per micro-batch; packing replaces it when --micro-batch-tokens is given)."""
    from autoplan.strategy import strategy_from_mapping

    out: List[Strategy] = []
    tps = [t for t in (1, 2, 4, 8) if t <= min(gpus_per_node, gpus) and model.num_attention_heads % t == 0]
    pps = [p for p in (1, 2, 4, 6, 8, 12, 16) if p <= model.num_layers and gpus % p == 0]
    eps = [1] if not model.is_moe else [e for e in (1, 2, 4, 8, 16, 32, 64) if model.num_experts % e == 0]
    for tp in tps:
        for pp in pps:
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            for ep in eps:
                if (dp * tp) % ep:  # experts span the data- and tensor-parallel ranks of a stage (etp=1)
                    continue
                for recompute, mbs in itertools.product(("full", "selective", "none"), (1, 2)):
                    values = {"tp": tp, "pp": pp, "ep": ep, "etp": 1, "cp": 1, "mbs": mbs, "zero": 1,
                              "sp": tp > 1, "recompute": recompute}
                    if pp > 1 and model.num_layers % pp:
                        base = model.num_layers // pp
                        values["last_stage_layers"] = model.num_layers - (pp - 1) * base
                    try:
                        out.append(strategy_from_mapping(values))
                    except (ValueError, TypeError):
                        continue
    return out
