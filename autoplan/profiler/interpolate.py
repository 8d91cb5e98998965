"""Interpolation of measured layer times and GEMM throughput (numpy only).

Layer times are interpolated piecewise-linearly in log-log space: log time against log mbs (that is, log tokens at
fixed seq), then log seq, then log tp, then log ep. Compute that scales as a power of an axis (linear GEMMs in
tokens, quadratic attention in seq, 1/tp sharding) is exactly linear in log-log, so bracketing points predict it
well. Outside the measured range the end segment's slope is extended up to `EXTRAPOLATION_FACTOR` times past the
last point; farther than that, or along an axis with a single measured value that does not match, the answer is
NaN and the cost model falls back to its analytic value."""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, Sequence, Tuple

import numpy as np

# How far past the measured range (as a ratio on the axis) the end slope is trusted.
EXTRAPOLATION_FACTOR = 2.0
# A GEMM shape is predicted only from measured shapes within this ratio on every dimension.
GEMM_NEIGHBOUR_RATIO = 2.0


def loglog(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """y at x from points (xs, ys), piecewise linear in (log x, log y); NaN when unsafe (see module doc)."""
    if len(xs) == 0:
        return float("nan")
    order = np.argsort(xs)
    lx = np.log(np.asarray(xs, dtype=float)[order])
    ly = np.log(np.asarray(ys, dtype=float)[order])
    lq = np.log(x)
    exact = np.isclose(lx, lq, rtol=0, atol=1e-9)
    if exact.any():
        return float(np.exp(ly[exact][0]))
    if len(lx) == 1 or lq < lx[0] - np.log(EXTRAPOLATION_FACTOR) or lq > lx[-1] + np.log(EXTRAPOLATION_FACTOR):
        return float("nan")
    i = int(np.clip(np.searchsorted(lx, lq) - 1, 0, len(lx) - 2))
    slope = (ly[i + 1] - ly[i]) / (lx[i + 1] - lx[i])
    return float(np.exp(ly[i] + slope * (lq - lx[i])))


def nested_value(points: Dict[tuple, float], query: tuple) -> float:
    """Interpolate over the axes of the point keys, outermost first: each outer value's slice is reduced to one
    number by recursion on the inner axes, then those numbers are interpolated along the outer axis."""
    if not points:
        return float("nan")
    if len(query) == 1:
        xs = list(k[0] for k in points)
        return loglog(xs, [points[(x,)] for x in xs], query[0])
    groups: Dict[float, Dict[tuple, float]] = defaultdict(dict)
    for key, t in points.items():
        groups[key[0]][key[1:]] = t
    if query[0] in groups:  # exact match on this axis: only its slice is needed
        value = nested_value(groups[query[0]], query[1:])
        if np.isfinite(value):
            return value
    xs, ys = [], []
    for x in sorted(groups):
        value = nested_value(groups[x], query[1:])
        if np.isfinite(value):
            xs.append(x)
            ys.append(value)
    return loglog(xs, ys, query[0])


def lookup(points: Dict[Tuple[int, int, int, int], float], *axes: np.ndarray) -> np.ndarray:
    """Vectorised `nested_value` over broadcast query arrays (one per key axis); evaluates each distinct point
    once."""
    arrays = np.broadcast_arrays(*[np.asarray(a, dtype=float) for a in axes])
    shape = arrays[0].shape
    stacked = np.stack([a.ravel() for a in arrays], axis=1)
    if stacked.size == 0:
        return np.zeros(shape)
    unique, inverse = np.unique(stacked, axis=0, return_inverse=True)
    values = np.array([nested_value(points, tuple(row)) for row in unique])
    return values[inverse.ravel()].reshape(shape)


def gemm_lookup(table: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Achieved TFLOP/s at (m, n, k) from rows (m, n, k, tflops): inverse-distance weighting in log2 shape space
    over measured shapes within `GEMM_NEIGHBOUR_RATIO` on every dimension; an exact shape returns its own value."""
    m, n, k = np.broadcast_arrays(np.asarray(m, float), np.asarray(n, float), np.asarray(k, float))
    out = np.full(m.shape, np.nan)
    if len(table) == 0:
        return out
    shapes = np.log2(table[:, :3])
    log_tflops = np.log(table[:, 3])
    limit = np.log2(GEMM_NEIGHBOUR_RATIO)
    for idx in np.ndindex(m.shape):
        q = np.log2([m[idx], n[idx], k[idx]])
        dist = np.abs(shapes - q).max(axis=1)  # Chebyshev distance in log2 units
        near = dist <= limit + 1e-12
        if not near.any():
            continue
        if dist.min() < 1e-9:
            out[idx] = np.exp(log_tflops[np.argmin(dist)])
            continue
        w = 1.0 / dist[near]
        out[idx] = np.exp(np.sum(w * log_tflops[near]) / np.sum(w))
    return out
