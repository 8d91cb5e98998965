"""autoplan: the fastest parallel training strategy that fits in memory.

Three inputs (`ModelSpec`, `ClusterSpec`, `Strategy`) plus the `Workload` (sequence length, global batch);
two outputs (`Estimate`, `Plan`).

The names below load on first use (PEP 562), so `import autoplan.cli.main` stays light and the command line can
take over SIGINT before the heavy modules load.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "InputError": "autoplan.errors", "Infeasible": "autoplan.errors", "ModelSpec": "autoplan.model",
    "ClusterSpec": "autoplan.cluster", "GpuSpec": "autoplan.cluster", "Strategy": "autoplan.strategy",
    "Workload": "autoplan.workload", "Estimate": "autoplan.results", "Plan": "autoplan.results",
}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autoplan' has no attribute {name!r}")
