"""`Estimate` and `Plan`: what the cost model and the search return."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from pydantic import BaseModel, ConfigDict, Field

from autoplan.cluster import ClusterSpec
from autoplan.model import ModelSpec
from autoplan.strategy import Strategy
from autoplan.workload import Workload

# Keys of `autoplan estimate --json` that are a stable contract.
ESTIMATE_CONTRACT_KEYS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu",
                          "peak_mem_gib", "fits", "time_breakdown", "memory_breakdown", "goodput_tokens_per_s",
                          "checkpoint_interval_s", "checkpoint_stall_s", "checkpoint_gib_per_rank",
                          "expected_job_mtbf_s")


class StageMemory(BaseModel):
    """Memory of one pipeline rank (all its model chunks), GiB."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: int = Field(description="Pipeline rank, 0-based.")
    num_layers: int = Field(description="Decoder layers held by this rank (all chunks).")
    total_gib: float = Field(description="Predicted peak allocated memory, GiB.")
    breakdown_gib: Dict[str, float] = Field(description="Weights, grads, optimizer, activations, overheads; GiB.")


class Estimate(BaseModel):
    """Predicted step time and memory of one strategy. Times in seconds, memory in GiB (2^30 bytes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_time_s: float = Field(description="One optimizer step (all microbatches), s.")
    tokens_per_s: float = Field(description="Training tokens per second, whole job.")
    tokens_per_s_per_gpu: float = Field(description="Tokens per second per GPU.")
    model_tflops_per_gpu: float = Field(description="Model FLOPs (no recompute) per second per GPU, TFLOP/s.")
    mfu: float = Field(description="Model FLOPs utilisation vs. the dense bf16 peak (fp8 peak when fp8), 0..1.")
    peak_mem_gib: float = Field(description="Highest predicted memory over pipeline ranks, GiB.")
    fits: bool = Field(description="peak_mem_gib <= usable device memory.")
    time_breakdown: Dict[str, float] = Field(description="Seconds per step by cause (exposed parts only).")
    memory_breakdown: Dict[str, float] = Field(description="GiB by kind for the peak pipeline rank.")
    stage_memory: List[StageMemory] = Field(default_factory=list, description="Memory of every pipeline rank.")
    capacity_gib: float = Field(0.0, description="Usable device memory the fit is judged against, GiB.")
    num_microbatches: int = Field(0, description="Microbatches per step per pipeline.")
    dp: int = Field(0, description="Data-parallel degree.")
    bottleneck: str = Field("", description="Largest time term.")
    sources: Dict[str, str] = Field(default_factory=dict, description="Where each time term came from.")
    notes: List[str] = Field(default_factory=list, description="Choices made for the user, and warnings.")
    # Goodput under failures (autoplan/costmodel/goodput.py), with the cluster's resilience inputs.
    goodput_tokens_per_s: Optional[float] = Field(None, description="tokens_per_s x useful_fraction.")
    useful_fraction: Optional[float] = Field(None, description="Share of wall time that trains and is kept, 0..1.")
    checkpoint_method: Optional[str] = Field(None, description="blocking, async or local.")
    checkpoint_interval_s: Optional[float] = Field(None, description="Training time between checkpoints, s.")
    checkpoint_interval_steps: Optional[int] = Field(None, description="The same in steps (--save-interval).")
    checkpoint_stall_s: Optional[float] = Field(
        None, description="Training time each save costs, s: its blocking part plus checkpoint_overlap_s.")
    checkpoint_overlap_s: Optional[float] = Field(
        None, description="Of which the steps overlapping an asynchronous save's background write lose, s.")
    checkpoint_persist_s: Optional[float] = Field(None, description="After the stall, until the save is durable, s.")
    checkpoint_gib_per_rank: Optional[float] = Field(None, description="Bytes a rank saves per checkpoint, GiB.")
    restart_s: Optional[float] = Field(None, description="Failure to training again (incl. the load), s.")
    lost_work_s: Optional[float] = Field(None, description="Expected training redone per failure, s.")
    expected_job_mtbf_s: Optional[float] = Field(None, description="Mean time between failures of the job, s.")

    def contract(self) -> Dict[str, Any]:
        """The JSON object of `autoplan estimate --json`."""
        return self.model_dump()


class Plan(BaseModel):
    """A strategy for a model on a cluster, with its estimate: what `plan` ranks and `emit`/`probe` consume."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSpec
    cluster: ClusterSpec
    workload: Workload
    strategy: Strategy
    estimate: Estimate
    objective: Optional[str] = Field(None, description="What the search ranked by when not throughput: 'goodput' "
                                                       "(the launch files then carry its checkpoint interval and "
                                                       "method).")
