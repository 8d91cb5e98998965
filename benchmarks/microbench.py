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


def same_m_pairs(table: Dict) -> List[Tuple[Tuple[float, float, float, float], Tuple[float, float, float, float]]]:
    """Pairs of rows of one kind with the same m (rows, or rows per group) and different (n, k): the dense rows, and
    the contiguous grouped rows of each m. Each row as (m, n, k, TFLOP/s)."""
    dense = [(float(m), float(n), float(k), float(tf)) for m, n, k, tf in table["dense"]]
    kinds = [dense] + [[(float(m), float(n), float(k), float(tf)) for _, m, n, k, tf in table["contiguous"]
                        if m == rows] for rows in sorted({r[1] for r in table["contiguous"]})]
    return [(a, b) for rows in kinds for i, a in enumerate(rows) for b in rows[i + 1:] if a[2] != b[2]]


def fit_half_k(pairs, half_dim: float) -> float:
    """k0 >= 0 minimising the squared log error, over pairs of GEMMs with the same m, of the cost model's rate ratio:
    the shape term (`size_efficiency`) times k / (k + k0) of each GEMM's reduction dimension k
    (compute.reduction_efficiency, forward GEMM). Grid search, one per step up to 4096."""
    grid = np.arange(0.0, 4097.0)
    err = np.zeros_like(grid)
    for (m1, n1, k1, tf1), (m2, n2, k2, tf2) in pairs:
        shape = np.log(size_efficiency(m1, n1, k1, half_dim) / size_efficiency(m2, n2, k2, half_dim))
        model = shape + np.log((k1 / (k1 + grid)) / (k2 / (k2 + grid)))
        err += (model - np.log(tf1 / tf2)) ** 2
    return float(grid[np.argmin(err)])


def lowp_gemm_half_k(half_dim: float = DEFAULT.gemm_half_dim) -> float:
    return fit_half_k(same_m_pairs(load("grouped_gemm_deepgemm_h800_fp8.yaml")), half_dim)


def bf16_rate_spread(table: Dict, min_size: float = 3072.0) -> float:
    """Largest relative departure of a bf16 square GEMM's rate from the mean over sizes >= min_size."""
    rates = np.array([bf16 for size, bf16, _ in table["rows"] if size >= min_size])
    return float(np.max(np.abs(rates / rates.mean() - 1.0)))


def expert_gemm_issue_seconds(table: Dict) -> float:
    """Seconds to issue one expert's GEMM in TransformerEngine's per-expert (multi-stream cuBLASLt) grouped GEMM, from
    the "pure" row: the loop issues the experts' GEMMs one after another, and the last one runs after its issue, so
    multi-stream = experts x issue + one expert's share of the single-launch kernel (the GEMM work itself)."""
    experts, _, _, _, _, single_ms, multi_ms = next(r for r in table["rows"] if r[4] == "pure")
    return (multi_ms - single_ms / experts) / experts * 1e-3


def expert_gemm_issue_s() -> float:
    return round(expert_gemm_issue_seconds(load("grouped_linear_multistream_sm100_nvfp4.yaml")), 7)


REFERENCE_SEQ = 8192  # the sequence length of the dense published runs; the MoE runs use 4096


def attention_efficiency(gpu: str) -> float:
    """A GPU's flash-attention rate relative to the H100 baseline (GPU profile `attention_efficiency`): cuDNN's
    published causal BF16 forward at head dim 128 and sequence 8192 over peak bf16 x calibration.attention_eff_fwd."""
    table = load("attention_cudnn_sdpa_blackwell.yaml")
    fwd = {(g, s): f for g, s, f, _ in table["rows"]}[(gpu, REFERENCE_SEQ)]
    return fwd / (table["peak_tflops_bf16"][gpu] * DEFAULT.attention_eff_fwd)


def main() -> int:
    points = relative_grouped_efficiency(load("grouped_gemm_deepgemm_h800_fp8.yaml"))
    for m, n, k, r in points:
        shape = size_efficiency(m, n, k, DEFAULT.gemm_half_dim) / size_efficiency(REFERENCE_M, n, k,
                                                                                DEFAULT.gemm_half_dim)
        print(f"  rows per expert {m:6.0f} n {n:5.0f} k {k:5.0f}: measured {r:.3f} of the 8192-row rate, "
              f"shape term alone {shape:.3f}")
    m0 = fit_half_tokens(points, DEFAULT.gemm_half_dim)
    print(f"grouped_gemm_half_tokens = {m0:.0f} (calibration.py: {DEFAULT.grouped_gemm_half_tokens:g})")
    for a, b in same_m_pairs(load("grouped_gemm_deepgemm_h800_fp8.yaml")):
        print(f"  m {a[0]:5.0f}: (n {a[1]:5.0f}, k {a[2]:5.0f}) {a[3]:5.0f} TFLOP/s vs (n {b[1]:5.0f}, k {b[2]:5.0f}) "
              f"{b[3]:5.0f} TFLOP/s: ratio {a[3] / b[3]:.3f}, shape term alone "
              f"{size_efficiency(*a[:3], DEFAULT.gemm_half_dim) / size_efficiency(*b[:3], DEFAULT.gemm_half_dim):.3f}")
    print(f"lowp_gemm_half_k = {lowp_gemm_half_k():.0f} (calibration.py: {DEFAULT.lowp_gemm_half_k:g})")
    spread = bf16_rate_spread(load("gemm_square_torchao_b200.yaml"))
    print(f"bf16 square GEMMs on B200, k = 3072..8192: rates within {spread:.1%} of their mean (no k term for bf16)")
    issue = expert_gemm_issue_s()
    print(f"per-expert GEMM issue = {issue * 1e6:.1f} us (TransformerEngine multi-stream grouped GEMM, SM100); "
          f"calibration.py kernel_overhead_s, fitted on the published runs and paid by each expert's GEMM: "
          f"{DEFAULT.kernel_overhead_s * 1e6:.1f} us")
    from autoplan.clusterio import load_gpu

    for gpu, parts in (("b200", ("b200", "gb200")), ("gb300", ("gb300", "b300"))):
        used = ", ".join(f"{p} {load_gpu(p).attention_efficiency:g}" for p in parts)
        print(f"attention_efficiency from cuDNN 9.13.1 on {gpu} (causal, head dim 128, seq {REFERENCE_SEQ}) = "
              f"{attention_efficiency(gpu):.3f} (profiles: {used})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
