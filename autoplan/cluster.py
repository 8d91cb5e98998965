"""`GpuSpec` and `ClusterSpec`: the accelerator and how many of them, with their links.

Units are in the field names (TFLOP/s, GiB, TB/s, GB/s per direction, Gb/s for NICs); the cost model converts
them to SI once (`autoplan.costmodel.hardware`)."""
from __future__ import annotations

from typing import Dict, List, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoplan.resilience import ResilienceSpec


class GpuSpec(BaseModel):
    """One accelerator and the node it sits in, from a datasheet (`profiles/gpus/*.yaml`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Lower-case id used on the command line, e.g. 'h100'.")
    name: str = Field(description="Marketing name.")
    peak_tflops: Dict[str, float] = Field(description="Dense peak TFLOP/s per dtype: bf16, fp8, fp4 where it exists.")
    gemm_efficiency: Dict[str, float] = Field(
        description="Best achievable fraction of peak for a large GEMM per dtype (measured MAMF / peak).")
    hbm_gib: float = Field(gt=0, description="Device memory visible to the framework, GiB.")
    hbm_bandwidth_tbps: float = Field(gt=0, description="HBM bandwidth, TB/s (10^12 B/s).")
    nvlink_bandwidth_gbytes_per_s: float = Field(gt=0, description="Scale-up bandwidth per GPU per direction, GB/s.")
    nvlink_domain_size: int = Field(gt=0, description="GPUs in one scale-up (NVLink) domain: 8 HGX, 72 NVL72.")
    gpus_per_node: int = Field(gt=0, description="GPUs per server (OS image).")
    nics_per_node: int = Field(ge=0, description="Scale-out (compute fabric) NICs per node.")
    nic_gbit_per_s: float = Field(ge=0, description="Line rate of one NIC, Gb/s.")
    nvlink_bus_efficiency: float = Field(0.80, gt=0, le=1.2,
                                         description="Ring collective bus bandwidth / link rate in the domain.")
    network_bus_efficiency: float = Field(0.80, gt=0, le=1.0,
                                          description="Ring collective bus bandwidth / NIC rate across nodes.")
    nvlink_latency_us: float = Field(5.0, ge=0, description="Per-step collective latency inside the domain, us.")
    network_latency_us: float = Field(12.0, ge=0, description="Per-step collective latency across nodes, us.")
    host_bandwidth_gbytes_per_s: float = Field(55.4, gt=0, description=(
        "Host<->device copy rate per GPU per direction, GB/s (CPU activation offload); default: PCIe Gen5 x16 as "
        "measured by nvbandwidth on 8x H200, 55.4 GB/s (profiles/gpu_reference.md sec. 3, S1)."))
    flex_nvlink_efficiency: Optional[float] = Field(None, gt=0, le=1.2, description=(
        "Measured bandwidth of the flex token dispatcher (DeepEP / HybridEP) inside the NVLink domain, as a fraction "
        "of the per-direction NVLink rate, counted as collectives.flex_all_to_all_time counts bytes; unset: "
        "calibration.flex_nvlink_eff (DeepEP on H800)."))
    attention_efficiency: float = Field(1.0, gt=0, le=2.0,
                                        description="Flash-attention speed relative to the calibrated baseline "
                                                    "(softmax exp throughput vs tensor throughput); 1 = baseline.")
    source: str = Field(description="Where the figures come from (datasheet, measurement).")

    @model_validator(mode="after")
    def _check(self) -> "GpuSpec":
        if "bf16" not in self.peak_tflops:
            raise ValueError(f"GPU {self.id}: peak_tflops needs a bf16 entry")
        return self

    def has_dtype(self, dtype: str) -> bool:
        return self.peak_tflops.get(dtype, 0) > 0

    @property
    def network_bandwidth_gbytes_per_s(self) -> float:
        """Scale-out bandwidth per GPU per direction, GB/s."""
        return self.nics_per_node * self.nic_gbit_per_s / 8.0 / self.gpus_per_node


class ClusterSpec(BaseModel):
    """A homogeneous cluster: `num_gpus` of one GPU type."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: GpuSpec = Field(description="The accelerator.")
    num_gpus: int = Field(gt=0, description="Total GPUs in the job (world size).")
    name: Optional[str] = Field(None, description="Optional label.")
    resilience: ResilienceSpec = Field(default_factory=ResilienceSpec,
                                       description="Failure rate, checkpoint method and storage, restart costs.")

    @property
    def num_nodes(self) -> int:
        """Nodes the job occupies: full nodes plus one partly used node when the count does not fill them."""
        return max(1, -(-self.num_gpus // self.gpu.gpus_per_node))

    @property
    def partial_node_gpus(self) -> int:
        """GPUs on a last, partly used node (0 when every node is full or the job fits in one node)."""
        per_node = self.gpu.gpus_per_node
        return self.num_gpus % per_node if self.num_gpus > per_node else 0

    @property
    def node_gpu_counts(self) -> List[int]:
        """GPUs on each node: full nodes, the last one holding the rest (e.g. 252 A100 = 31 x 8 + 4); one node
        holds a job smaller than a node."""
        per_node = min(self.num_gpus, self.gpu.gpus_per_node)
        return [per_node] * (self.num_nodes - 1) + [self.partial_node_gpus or per_node]
