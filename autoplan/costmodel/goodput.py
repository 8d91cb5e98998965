"""Goodput under failures: checkpoint stall, restart, optimal checkpoint interval and the useful-time fraction.

Vectorised over candidates (numpy arrays in, arrays out); the inputs are the cluster's `ResilienceSpec`
(autoplan/resilience.py), a candidate's step time and its checkpoint bytes per rank (costmodel/memory.py
`checkpoint_bytes`).

Failure model (Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps", Future
Generation Computer Systems 22(3), sec. 3): failures form a Poisson process of rate 1/M, M the job's mean time
between failures, and strike during training, saves and restarts alike. Training alternates tau seconds of work with
a save that stalls it delta seconds; a failure loses the work since the last durable checkpoint and costs a restart
R, which a failure during it starts over. The expected wall time of one tau of useful work is then

    T(tau) = M exp(R / M) (exp((tau + delta) / M) - 1)                      (Daly 2006, the complete cost function)

and the useful-time fraction is tau / T(tau). Daly's higher-order optimum interval (his eq. 37) and Young's first
order one (Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9):530-531)
are below.

An asynchronous save stalls training for its copy to host memory (Megatron's FileSystemWriterAsync.preload_tensors,
megatron/core/dist_checkpointing/strategies/filesystem_async.py, copies every tensor to the host and then calls
torch.cuda.synchronize() before the background writer starts); it becomes durable P seconds later, and a failure
inside that window rolls back one interval further. The background write is not free for the steps it overlaps:
they share the rank's host memory, PCIe, CPU and network with the writer and run at (1 - s) of their speed for those
P seconds (s = ResilienceSpec.async_overlap_slowdown), so each save costs s P of training time besides its stall
(`overlap_loss`): a segment of tau work that follows a save takes tau + delta + s P of wall time, the first one after
a restart (nothing in flight) tau + delta. Summing over the segments of one failure-free stretch (exponential, mean
M) as Daly does gives the same T(tau) with delta + s P in delta's place and R + (1 - s) P in R's place: P for the
rollback window (a failure strikes inside it with probability 1 - exp(-P/M) per save), less the s P the first
segment after a restart does not pay. This is exact for P <= tau; benchmarks/goodput_sim.py plays the rules one
failure at a time and checks it. Daly's optimum interval depends on delta and M only, so it is taken at delta + s P.
Megatron waits for the previous asynchronous save before it starts the next (megatron/training/checkpointing.py
save_checkpoint: `if args.async_save and not is_empty_async_queue()` finalizes it, blocking), so an interval is never
shorter than P."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoplan.resilience import ResilienceSpec


def young_interval(delta, mtbf):
    """Young (1974): tau = sqrt(2 delta M), the first-order optimum compute time between checkpoints."""
    return np.sqrt(2.0 * np.asarray(delta, dtype=float) * mtbf)


def daly_interval(delta, mtbf):
    """Daly (2006) eq. 37: tau = sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta for
    delta < 2M, else M."""
    delta = np.asarray(delta, dtype=float)
    x = delta / (2.0 * mtbf)
    tau = np.sqrt(2.0 * delta * mtbf) * (1.0 + np.sqrt(x) / 3.0 + x / 9.0) - delta
    return np.where(delta < 2.0 * mtbf, tau, mtbf)


def overlap_loss(persist, slowdown):
    """Training time the steps overlapping a background write of `persist` seconds lose, s: they run at
    (1 - slowdown) of their speed meanwhile (module docstring). Added to the blocking stall, it is the delta of
    T(tau) and of the optimum interval."""
    return slowdown * np.asarray(persist, dtype=float)


def daly_terms(blocking, persist, overlap, restart):
    """(delta, R) of Daly's T(tau) for saves that block training `blocking` s, are durable `persist` s after that and
    cost the steps they overlap `overlap` s, with restarts of `restart` s (module docstring)."""
    return blocking + overlap, restart + persist - overlap


def useful_fraction(tau, delta, restart, mtbf):
    """tau / T(tau) of Daly's complete cost function (module docstring), delta and R as `daly_terms` gives them."""
    tau = np.asarray(tau, dtype=float)
    wall = mtbf * np.exp(np.asarray(restart, dtype=float) / mtbf) * np.expm1((tau + delta) / mtbf)
    return tau / wall


def job_mtbf_s(spec: ResilienceSpec, nodes: int, gpus_per_node: int) -> float:
    """Mean time between failures of a job on `nodes` nodes, s: independent nodes, rates add."""
    return 1.0 / (nodes * spec.node_failures_per_s(gpus_per_node))


def comm_init_s(spec: ResilienceSpec, world: int) -> float:
    """Communicator start-up of a world of `world` ranks, s: a constant plus NCCL's O(N^2) ring build."""
    return spec.comm_init_base_s + spec.comm_init_s_per_krank_squared * (world / 1024.0) ** 2


def repair_wait_s(spec: ResilienceSpec, nodes: int, gpus_per_node: int) -> float:
    """Expected wait per failure for a node to come back: a hardware failure (share `hardware_fraction`) waits
    `node_repair_h` when every spare is itself in repair. Nodes in repair form an M/G/infinity queue, Poisson with
    mean (hardware failure rate x repair time); the wait happens when that count reaches `spare_nodes`. No spare
    count (None): a free node is always there."""
    if spec.spare_nodes is None:
        return 0.0
    repair = spec.node_repair_h * 3600.0
    mean = nodes * spec.node_failures_per_s(gpus_per_node) * spec.hardware_fraction * repair
    below, term = 0.0, np.exp(-mean)
    for k in range(spec.spare_nodes):  # P(N < spares) = sum_{k < spares} Poisson(k; mean)
        below += term
        term *= mean / (k + 1)
    return spec.hardware_fraction * max(0.0, 1.0 - below) * repair


@dataclass(frozen=True)
class Goodput:
    """Per-candidate arrays: seconds, bytes and fractions."""

    interval_s: np.ndarray  # compute time between checkpoints, a whole number of steps
    interval_steps: np.ndarray
    stall_s: np.ndarray  # training time lost to each save: the blocking stall plus overlap_s
    overlap_s: np.ndarray  # of which the steps overlapping the background write lose (0 for a blocking save)
    persist_s: np.ndarray  # from the stall's end until the save is durable (0 for a blocking save)
    load_s: np.ndarray
    restart_s: np.ndarray  # failure to training again: scheduler, start-up, communicators, load, repair wait
    lost_work_s: np.ndarray  # expected work redone per failure
    useful_fraction: np.ndarray
    ckpt_bytes_per_rank: np.ndarray  # what the method saves per rank (local state, or the global share)
    job_mtbf_s: float


def _save_times(spec: ResilienceSpec, local_bytes, unique_bytes, world: int, gpus_per_node: int,
                host_bytes_per_s: float, network_bytes_per_s_per_node: float):
    """(bytes per rank, stall, persist, load) seconds of the method. A global save writes each rank's unique share;
    a node writes its ranks' shares at `storage_write_gbytes_per_s_per_node`, the store takes all of them at its
    aggregate rate; the slower bounds it. async / local stall for the device-to-host copy of the rank's bytes."""
    per_node = spec.storage_write_gbytes_per_s_per_node * 1e9
    total = spec.storage_write_gbytes_per_s_total * 1e9
    write = np.maximum(gpus_per_node * unique_bytes / per_node, world * unique_bytes / total)
    read = np.maximum(gpus_per_node * unique_bytes / (spec.storage_read_gbytes_per_s_per_node * 1e9),
                      world * unique_bytes / (spec.storage_read_gbytes_per_s_total * 1e9))
    if spec.ckpt_method == "blocking":
        return unique_bytes, write, np.zeros_like(write), read
    if spec.ckpt_method == "async":
        return unique_bytes, unique_bytes / host_bytes_per_s, write, read
    # local: each rank's whole state to node-local storage, then (replication - 1) copies to other nodes over the
    # scale-out network; a restart reads it back locally, or from a replica for the replaced node.
    node_bytes = gpus_per_node * local_bytes
    local_write = node_bytes / (spec.local_write_gbytes_per_s_per_node * 1e9)
    replicate = (spec.replication - 1) * node_bytes / network_bytes_per_s_per_node
    load = np.maximum(node_bytes / (spec.local_write_gbytes_per_s_per_node * 1e9),
                      node_bytes / network_bytes_per_s_per_node)
    return local_bytes, local_bytes / host_bytes_per_s, np.maximum(local_write, replicate), load


def goodput_terms(spec: ResilienceSpec, step_time_s, local_bytes, unique_bytes, *, world: int, nodes: int,
                  gpus_per_node: int, host_bytes_per_s: float, network_bytes_per_s_per_node: float) -> Goodput:
    """Interval, stall, restart and useful fraction of each candidate (arrays of the same length). The bytes are
    the candidate's largest rank's (costmodel/estimate.py Evaluation): every node is priced as writing what that
    rank's node writes, so the slowest node sets the pace."""
    step = np.asarray(step_time_s, dtype=float)
    mtbf = job_mtbf_s(spec, nodes, gpus_per_node)
    ckpt, blocking, persist, load = _save_times(spec, np.asarray(local_bytes, dtype=float),
                                                np.asarray(unique_bytes, dtype=float), world, gpus_per_node,
                                                host_bytes_per_s, network_bytes_per_s_per_node)
    overlap = overlap_loss(persist, spec.async_overlap_slowdown)
    restart = (spec.scheduler_s + spec.process_start_s + comm_init_s(spec, world) + load
               + repair_wait_s(spec, nodes, gpus_per_node))
    stall, cycle_restart = daly_terms(blocking, persist, overlap, restart)
    tau = np.maximum(daly_interval(stall, mtbf), persist)
    steps = np.maximum(1, np.ceil(np.maximum(np.round(tau / step), persist / step)))
    tau = steps * step
    fraction = useful_fraction(tau, stall, cycle_restart, mtbf)
    segment = tau + stall  # a failure in it strikes on average M - L / (exp(L / M) - 1) into it (exponential)
    lost = mtbf - segment / np.expm1(segment / mtbf) + persist
    return Goodput(interval_s=tau, interval_steps=steps.astype(np.int64), stall_s=stall, overlap_s=overlap,
                   persist_s=persist,
                   load_s=load, restart_s=np.broadcast_to(restart, tau.shape), lost_work_s=lost,
                   useful_fraction=fraction, ckpt_bytes_per_rank=ckpt, job_mtbf_s=mtbf)


def cluster_goodput(cluster, step_time_s, local_bytes, unique_bytes) -> Goodput:
    """`goodput_terms` with the cluster's resilience inputs, node count and links (GpuSpec host and NIC rates)."""
    g = cluster.gpu
    per_node = min(cluster.num_gpus, g.gpus_per_node)
    network = max(g.nics_per_node * g.nic_gbit_per_s / 8.0, 1e-3) * 1e9
    return goodput_terms(cluster.resilience, step_time_s, local_bytes, unique_bytes, world=cluster.num_gpus,
                         nodes=cluster.num_nodes, gpus_per_node=per_node,
                         host_bytes_per_s=g.host_bandwidth_gbytes_per_s * 1e9, network_bytes_per_s_per_node=network)
