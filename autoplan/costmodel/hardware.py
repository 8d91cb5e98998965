"""SI view of a GPU profile: the only place where datasheet units are converted (TFLOP/s -> FLOP/s, GiB -> B,
GB/s -> B/s, us -> s)."""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster import ClusterSpec

GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    """Per-GPU rates in SI units."""

    peak_flops_bf16: float  # FLOP/s, dense
    peak_flops_fp8: float  # FLOP/s, dense; 0 when the GPU has no FP8
    gemm_eff_bf16: float  # best achievable fraction of peak, large GEMM (MAMF)
    gemm_eff_fp8: float
    peak_flops_fp4: float  # FLOP/s, dense; 0 when the GPU has no FP4 (Blackwell NVFP4 tensor cores)
    gemm_eff_fp4: float
    attention_scale: float  # flash-attention speed relative to the calibrated baseline
    hbm_bytes_per_s: float
    capacity_bytes: float  # framework-visible device memory
    nvlink_bytes_per_s: float  # per direction
    network_bytes_per_s: float  # per GPU per direction
    host_bytes_per_s: float  # host<->device copies per GPU per direction (CPU activation offload)
    nvlink_bus_eff: float
    flex_nvlink_eff: float  # the profile's measured flex-dispatcher NVLink efficiency; 0 = calibration's
    network_bus_eff: float
    nvlink_latency_s: float
    network_latency_s: float
    domain_size: int  # GPUs per NVLink domain
    gpus_per_node: int
    num_gpus: int


def hardware_of(cluster: ClusterSpec) -> Hardware:
    g = cluster.gpu
    fp8 = g.peak_tflops.get("fp8", 0.0)
    return Hardware(
        peak_flops_bf16=g.peak_tflops["bf16"] * 1e12,
        peak_flops_fp8=fp8 * 1e12,
        gemm_eff_bf16=g.gemm_efficiency.get("bf16", 0.8),
        gemm_eff_fp8=g.gemm_efficiency.get("fp8", g.gemm_efficiency.get("bf16", 0.8)),
        peak_flops_fp4=g.peak_tflops.get("fp4", 0.0) * 1e12,
        gemm_eff_fp4=g.gemm_efficiency.get("fp4", g.gemm_efficiency.get("fp8", 0.8)),
        attention_scale=g.attention_efficiency,
        hbm_bytes_per_s=g.hbm_bandwidth_tbps * 1e12,
        capacity_bytes=g.hbm_gib * GIB,
        nvlink_bytes_per_s=g.nvlink_bandwidth_gbytes_per_s * 1e9,
        network_bytes_per_s=max(g.network_bandwidth_gbytes_per_s, 1e-3) * 1e9,
        host_bytes_per_s=g.host_bandwidth_gbytes_per_s * 1e9,
        nvlink_bus_eff=g.nvlink_bus_efficiency,
        flex_nvlink_eff=g.flex_nvlink_efficiency or 0.0,
        network_bus_eff=g.network_bus_efficiency,
        nvlink_latency_s=g.nvlink_latency_us * 1e-6,
        network_latency_s=g.network_latency_us * 1e-6,
        domain_size=min(g.nvlink_domain_size, cluster.num_gpus) if cluster.num_gpus else g.nvlink_domain_size,
        gpus_per_node=g.gpus_per_node,
        num_gpus=cluster.num_gpus,
    )
