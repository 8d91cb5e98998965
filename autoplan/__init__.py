"""autoplan: the fastest parallel training strategy that fits in memory.

Three inputs (`ModelSpec`, `ClusterSpec`, `Strategy`) plus the `Workload` (sequence length, global batch);
two outputs (`Estimate`, `Plan`).
"""
from autoplan.errors import InputError, Infeasible
from autoplan.model import ModelSpec
from autoplan.cluster import ClusterSpec, GpuSpec
from autoplan.strategy import Strategy
from autoplan.workload import Workload
from autoplan.results import Estimate, Plan

__all__ = ["InputError", "Infeasible", "ModelSpec", "ClusterSpec", "GpuSpec", "Strategy", "Workload",
           "Estimate", "Plan"]
__version__ = "0.1.0"
