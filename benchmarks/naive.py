"""The naive bar: one constant effective model TFLOP/s per GPU x precision x architecture.

Prediction for a row: tokens/s/GPU = E[gpu, precision, arch] / model FLOPs per token (Megatron's formula,
`autoplan.costmodel.flops.model_flops_per_token`). E is fitted on training rows only, as the geometric mean of the
achieved model TFLOP/s of the training rows with that key (the least-squares fit of log error). A held-out row
whose key has no training row uses a constant fraction of its GPU's dense peak at its precision (MFU), fitted the
same way over the training rows of the same precision and architecture, else of the same architecture, else of all
training rows; the level used is counted.
A physics model that cannot beat this constant is not worth its structure.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from autoplan.costmodel.flops import model_flops_per_token


def precision_of(run) -> str:
    """'bf16', 'fp8' or 'nvfp4' (the GEMM precision the run's recipe used)."""
    if getattr(run.strategy, "fp8_recipe", None) == "nvfp4":
        return "nvfp4"
    return run.precision


def achieved_tflops(run) -> float:
    """Model TFLOP/s per GPU the run reached (model FLOPs only, recompute not counted)."""
    return run.measured_tokens_per_gpu * model_flops_per_token(run.model, run.workload.seq_len) / 1e12


PEAK_KEY = {"bf16": "bf16", "fp8": "fp8", "nvfp4": "fp4"}


def peak_tflops(run) -> float:
    """Dense peak TFLOP/s of the run's GPU at the run's GEMM precision (profiles/gpus)."""
    return run.cluster.gpu.peak_tflops[PEAK_KEY[precision_of(run)]]


# (level name, key, whether the table holds TFLOP/s (False) or a fraction of peak (True)).
KEYS: Tuple[Tuple[str, Callable, bool], ...] = (
    ("gpu x precision x arch", lambda r: (r.gpu, precision_of(r), r.arch), False),
    ("MFU precision x arch", lambda r: (precision_of(r), r.arch), True),
    ("MFU arch", lambda r: (r.arch,), True),
    ("MFU all", lambda r: (), True),
)


@dataclass
class NaiveBar:
    """Geometric-mean effective TFLOP/s per key level, fitted on the training rows."""

    tables: List[Dict[tuple, float]]
    levels_used: Counter = field(default_factory=Counter)

    @classmethod
    def fit(cls, runs: Sequence) -> "NaiveBar":
        tables = []
        for _, key, of_peak in KEYS:
            groups: Dict[tuple, List[float]] = defaultdict(list)
            for r in runs:
                groups[key(r)].append(np.log(achieved_tflops(r) / (peak_tflops(r) if of_peak else 1.0)))
            tables.append({k: float(np.exp(np.mean(v))) for k, v in groups.items()})
        return cls(tables)

    def tflops(self, run) -> float:
        for (name, key, of_peak), table in zip(KEYS, self.tables):
            if key(run) in table:
                self.levels_used[name] += 1
                return table[key(run)] * (peak_tflops(run) if of_peak else 1.0)
        raise ValueError("the naive bar was fitted on no rows")

    def predict(self, run) -> float:
        """tokens/s/GPU."""
        return self.tflops(run) * 1e12 / model_flops_per_token(run.model, run.workload.seq_len)
