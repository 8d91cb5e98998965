"""`ResilienceSpec`: how often a cluster's nodes fail and what saving, loading and restarting a job costs there.

Part of the cluster (`ClusterSpec.resilience`, the `resilience:` mapping of a cluster YAML, `--resilience key=value`
and `--ckpt-method` on the command line). Every default is a published figure or says that it is assumed; the
sources are listed in docs/sources.md, section "Goodput". The formulas that use these inputs are in
`autoplan/costmodel/goodput.py`."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

CKPT_METHODS = ("blocking", "async", "local")

# Llama 3 (Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, sec. 3.3.4): 419 unexpected interruptions
# in a 54-day snapshot of pre-training on 16,384 H100 (2,048 nodes of 8) = 419 / (54 x 2,048) x 1,000.
LLAMA3_FAILURES_PER_1K_NODE_DAYS = 419 / (54 * 2048) * 1000
# Same source and table: about 78% of the unexpected interruptions were confirmed or suspected hardware issues,
# the ones that take a node out of the job until it is repaired or replaced.
LLAMA3_HARDWARE_FRACTION = 0.78
# Same source, sec. 3.3.1: Tectonic, Meta's checkpoint store, sustains 2 TB/s (7 TB/s peak) across the cluster.
LLAMA3_STORAGE_TBYTES_PER_S = 2.0
# NVIDIA/nccl pull request #1789 ("NCCL Fast Init", 2025): ncclBuildRing and initTransportsRank are O(N^2) in the
# rank count; at 96K (98,304) ranks the ring build alone took 26 s of CPU time. Seconds per (rank / 1,024)^2.
NCCL_INIT_S_PER_KRANK_SQUARED = 26.0 / 96**2
# PyTorch blog "6x faster Async Checkpointing in PyTorch, using Cached Plans, no GIL contention" (Meta and Crusoe,
# 2025-04-30): Llama3-70B under TorchTitan (HSDP2) on 1,856 H200, asynchronous DCP saves in a background process
# with cached save plans (the layout closest to Megatron's persistent checkpoint worker): training runs at 700
# tokens/s per GPU and dips to 372 while the background save is in flight. The dip's depth is taken for the whole
# background write, so the overlapped steps' loss is an upper bound.
ASYNC_OVERLAP_SLOWDOWN = 1.0 - 372.0 / 700.0


class ResilienceSpec(BaseModel):
    """Failure rate, checkpoint method and storage, restart costs and spares of a cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    failures_per_1k_node_days: float = Field(
        LLAMA3_FAILURES_PER_1K_NODE_DAYS, gt=0,
        description="Job-interrupting failures per 1,000 node-days. Default 3.79: Llama 3's 419 interruptions in 54 "
                    "days on 2,048 nodes (arXiv:2407.21783 sec. 3.3.4).")
    node_mtbf_h: Optional[float] = Field(
        None, gt=0, description="Mean time between failures of one node, hours; replaces failures_per_1k_node_days "
                                "when given (24,000 / node_mtbf_h failures per 1,000 node-days).")
    gpu_mtbf_h: Optional[float] = Field(
        None, gt=0, description="Mean time between failures of one GPU, hours (a node fails when any of its GPUs "
                                "does); replaces failures_per_1k_node_days when given.")
    ckpt_method: Literal["blocking", "async", "local"] = Field(
        "async", description="blocking: every rank waits for the save to reach storage; async: Megatron "
                             "--async-save (the rank copies its share to host memory, a background worker writes "
                             "it); local: NVIDIA Resiliency Extension local checkpoints (each rank's own state to "
                             "node-local storage, replicated to `replication` nodes).")
    async_overlap_slowdown: float = Field(
        ASYNC_OVERLAP_SLOWDOWN, ge=0, lt=1,
        description="Share of training speed lost while an asynchronous (async or local) save is written in the "
                    "background (the rank's host memory, PCIe, CPU and network shared with the writer). Default "
                    "0.469: PyTorch's measured dip from 700 to 372 tokens/s per GPU during process-based "
                    "asynchronous saves on 1,856 H200 (pytorch.org blog, 2025-04-30), held for the whole write.")
    storage_write_gbytes_per_s_per_node: float = Field(
        25.0, gt=0, description="Checkpoint-store write bandwidth one node reaches, GB/s. Default 25 (assumed: one "
                                "200 Gb/s storage port per node).")
    storage_read_gbytes_per_s_per_node: float = Field(
        25.0, gt=0, description="Checkpoint-store read bandwidth of one node, GB/s (assumed, as the write).")
    storage_write_gbytes_per_s_total: float = Field(
        LLAMA3_STORAGE_TBYTES_PER_S * 1000, gt=0,
        description="Aggregate write bandwidth of the checkpoint store, GB/s. Default 2,000: Tectonic's sustained "
                    "2 TB/s in Llama 3 (arXiv:2407.21783 sec. 3.3.1).")
    storage_read_gbytes_per_s_total: float = Field(
        LLAMA3_STORAGE_TBYTES_PER_S * 1000, gt=0,
        description="Aggregate read bandwidth of the checkpoint store, GB/s (default as the write).")
    local_write_gbytes_per_s_per_node: float = Field(
        25.0, gt=0, description="Node-local checkpoint storage (NVMe or host memory file system) write rate, GB/s "
                                "(assumed: a few PCIe Gen4 NVMe drives).")
    replication: int = Field(
        2, ge=1, description="Copies of each local checkpoint on distinct nodes (Megatron --replication-factor, "
                             "default 2 in megatron/training/training_config.py CheckpointConfig).")
    scheduler_s: float = Field(
        60.0, ge=0, description="Seconds from a failure to the relaunched job's processes starting: detection, "
                                "the scheduler's requeue (assumed).")
    process_start_s: float = Field(
        120.0, ge=0, description="Seconds for a rank to start: interpreter, imports, CUDA context, model build "
                                 "(assumed).")
    comm_init_base_s: float = Field(
        10.0, ge=0, description="Communicator start-up seconds independent of the world size: rendezvous and "
                                "bootstrap (assumed).")
    comm_init_s_per_krank_squared: float = Field(
        NCCL_INIT_S_PER_KRANK_SQUARED, ge=0,
        description="Communicator start-up seconds per (world size / 1,024)^2: NCCL's ring build is O(N^2), 26 s at "
                    "96K ranks (NVIDIA/nccl pull request #1789).")
    hardware_fraction: float = Field(
        LLAMA3_HARDWARE_FRACTION, ge=0, le=1,
        description="Share of failures that take a node out until repair (Llama 3: 78%).")
    spare_nodes: Optional[int] = Field(
        None, ge=0, description="Hot-spare nodes the job restarts on at once instead of waiting for a repair; "
                                "None (default): the cluster's free pool always has a healthy node, no wait.")
    node_repair_h: float = Field(
        4.0, ge=0, description="Hours until a failed node is back (repaired or replaced) when no spare is free "
                               "(assumed).")

    @model_validator(mode="after")
    def _one_rate(self) -> "ResilienceSpec":
        if self.node_mtbf_h is not None and self.gpu_mtbf_h is not None:
            raise ValueError("give node_mtbf_h or gpu_mtbf_h, not both (a node's MTBF is its GPUs' divided by the "
                             "GPUs per node)")
        return self

    def node_failures_per_s(self, gpus_per_node: int) -> float:
        """Failure rate of one node, 1/s."""
        if self.gpu_mtbf_h is not None:
            return gpus_per_node / (self.gpu_mtbf_h * 3600.0)
        if self.node_mtbf_h is not None:
            return 1.0 / (self.node_mtbf_h * 3600.0)
        return self.failures_per_1k_node_days / (1000.0 * 86400.0)
