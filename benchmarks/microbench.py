"""Constants derived from published microbenchmarks in profiles/microbenchmarks (not from the published runs).

    python -m benchmarks.microbench   # prints each derived constant beside the value in calibration.py
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import yaml

from autoplan.costmodel.calibration import DEFAULT

MICRO = Path(__file__).resolve().parent.parent / "profiles" / "microbenchmarks"
REFERENCE_M = 8192.0  # compute.grouped_token_efficiency is normalised here


def load(name: str) -> Dict:
    with open(MICRO / name, encoding="utf-8") as f:
        return yaml.safe_load(f)


def relative_grouped_efficiency(table: Dict) -> List[Tuple[float, float, float, float]]:
    """(rows per expert, n, k, TFLOP/s relative to the 8192-row grouped GEMM of the same n, k) per masked row."""
    big = {(n, k): tf for _, m, n, k, tf in table["contiguous"] if m == REFERENCE_M}
    return [(float(m), float(n), float(k), tf / big[(n, k)]) for _, m, n, k, tf in table["masked"] if (n, k) in big]


def size_efficiency(m, n, k, half_dim: float) -> np.ndarray:
    """compute.gemm_time's shape term: harmonic mean dimension d, d / (d + gemm_half_dim)."""
    d = 3.0 / (1.0 / np.asarray(m, dtype=float) + 1.0 / n + 1.0 / k)
    return d / (d + half_dim)


def fit_half_tokens(points: List[Tuple[float, float, float, float]], half_dim: float) -> float:
    """m0 >= 0 minimising the squared error, over the points (m, n, k, relative rate), of the cost model's
    relative grouped-GEMM rate: the shape term relative to m = 8192 times (m / (m + m0)) / (8192 / (8192 + m0))
    (compute.grouped_token_efficiency). Grid search, one row per step."""
    grid = np.arange(0.0, 2049.0)
    m, n, k, rel = (np.array([p[i] for p in points])[:, None] for i in range(4))
    shape = size_efficiency(m, n, k, half_dim) / size_efficiency(REFERENCE_M, n, k, half_dim)
    model = shape * (m / (m + grid)) / (REFERENCE_M / (REFERENCE_M + grid))
    return float(grid[np.argmin(np.sum((model - rel) ** 2, axis=0))])


def grouped_gemm_half_tokens(half_dim: float = DEFAULT.gemm_half_dim) -> float:
    return fit_half_tokens(relative_grouped_efficiency(load("grouped_gemm_deepgemm_h800_fp8.yaml")), half_dim)


def expert_gemm_issue_seconds(table: Dict) -> float:
    """Seconds to issue one expert's GEMM in TransformerEngine's per-expert (multi-stream cuBLASLt) grouped GEMM, from
    the "pure" row: the loop issues the experts' GEMMs one after another, and the last one runs after its issue, so
    multi-stream = experts x issue + one expert's share of the single-launch kernel (the GEMM work itself)."""
    experts, _, _, _, _, single_ms, multi_ms = next(r for r in table["rows"] if r[4] == "pure")
    return (multi_ms - single_ms / experts) / experts * 1e-3


def expert_gemm_issue_s() -> float:
    return round(expert_gemm_issue_seconds(load("grouped_linear_multistream_sm100_nvfp4.yaml")), 7)


def main() -> int:
    points = relative_grouped_efficiency(load("grouped_gemm_deepgemm_h800_fp8.yaml"))
    for m, n, k, r in points:
        shape = size_efficiency(m, n, k, DEFAULT.gemm_half_dim) / size_efficiency(REFERENCE_M, n, k,
                                                                                DEFAULT.gemm_half_dim)
        print(f"  rows per expert {m:6.0f} n {n:5.0f} k {k:5.0f}: measured {r:.3f} of the 8192-row rate, "
              f"shape term alone {shape:.3f}")
    m0 = fit_half_tokens(points, DEFAULT.gemm_half_dim)
    print(f"grouped_gemm_half_tokens = {m0:.0f} (calibration.py: {DEFAULT.grouped_gemm_half_tokens:g})")
    issue = expert_gemm_issue_s()
    print(f"per-expert GEMM issue = {issue * 1e6:.1f} us (TransformerEngine multi-stream grouped GEMM, SM100); "
          f"calibration.py kernel_overhead_s, fitted on the published runs and paid by each expert's GEMM: "
          f"{DEFAULT.kernel_overhead_s * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
