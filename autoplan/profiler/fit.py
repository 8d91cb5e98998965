"""Predicting a layer's time at an unmeasured (mbs, seq) from the points measured at the same (ep, tp) shard.

Four predictors, of which each (kind, pass, dtype) uses the one with the smallest leave-one-out error on its own
measurements (cross-validated model choice, Stone 1974, J. R. Stat. Soc. B 36(2)):

- "loglog": piecewise-linear log time vs log mbs, then log seq (`interpolate.nested_value`); exact for costs that
  are products of powers of the axes.
- "fit": the alpha-beta / roofline form (Hockney 1994, Parallel Computing 20(3); Williams et al. 2009, CACM 52(4))
      t = c0 + c1 * tokens + c2 * tokens * seq,     tokens = mbs * seq,
  a fixed per-call cost (kernel launches, weight reads, the embedding's dense vocab-sized gradient), work linear in
  tokens (GEMMs, norms, element-wise ops), and attention's score/softmax/context core, which per sequence grows
  with seq^2 (Vaswani et al. 2017, sec. 4 table 1), i.e. tokens * seq per micro batch. Coefficients are non-negative
  (Lawson & Hanson 1974, "Solving Least Squares Problems", ch. 23) and minimise the absolute relative residuals,
  so small and large shapes weigh alike and one point disturbed by other processes does not tilt the fit. It smooths timing noise across the whole slice instead of trusting two neighbours.
- "fit+loglog": the fit times the log-log interpolation of measured/fitted ratios: exact at measured points,
  the fit's shape between them (kernels that pick tiles by sequence length shift all mbs at one seq alike).
- "affine-mbs": at each measured seq, t = a + b * mbs (the same alpha-beta form with the micro batch as the
  size); across seq, those per-seq predictions are interpolated log-log.

Every predictor returns NaN where mbs or seq lies outside the slice's measured range by more than
`interpolate.EXTRAPOLATION_FACTOR`, or along an axis with a single measured value that the query does not match."""
from __future__ import annotations

import itertools
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from autoplan.profiler import interpolate

METHODS: Tuple[str, ...] = ("loglog", "fit", "fit+loglog", "affine-mbs")
# Fewest points a slice needs before the fit (3 coefficients) is considered; below it only "loglog" is used.
MIN_FIT_POINTS = 4

# IRLS for the L1 fit: iterations, and the relative residual below which a point's weight stops growing.
IRLS_ITERATIONS = 10
IRLS_FLOOR = 1e-3

SlicePoints = Dict[Tuple[int, int], float]  # {(seq, mbs): seconds} of one (ep, tp) shard


def features(mbs: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Design matrix rows [1, tokens, tokens * seq] of the alpha-beta form (module doc)."""
    mbs, seq = np.broadcast_arrays(np.asarray(mbs, float), np.asarray(seq, float))
    tokens = mbs * seq
    return np.stack([np.ones_like(tokens), tokens, tokens * seq], axis=-1)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0, by trying every active set: exact for the few columns used here (the
    optimum is the unconstrained least-squares solution on its own support, Lawson & Hanson ch. 23). Each support
    is solved from the normal equations (a^T a) x = a^T b of its columns (Cramer's rule, in floats: these are 1-3
    unknowns and this runs in the inner loop of the fits), and its residual is b^T b - 2 x^T a^T b + x^T a^T a x."""
    n = a.shape[1]
    gram, rhs, bb = (a.T @ a).tolist(), (a.T @ b).tolist(), float(b @ b)
    best, best_residual = [0.0] * n, bb
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            x_s = _solve_small([[gram[i][j] for j in cols] for i in cols], [rhs[i] for i in cols])
            if x_s is None:  # columns dependent on this support: least squares instead
                x_s = np.linalg.lstsq(a[:, list(cols)], b, rcond=None)[0].tolist()
            if any(v < 0 for v in x_s):
                continue
            x = [0.0] * n
            for i, v in zip(cols, x_s):
                x[i] = v
            quad = sum(x[i] * gram[i][j] * x[j] for i in cols for j in cols)
            residual = bb - 2.0 * sum(x[i] * rhs[i] for i in cols) + quad
            if residual < best_residual - 1e-12 * max(best_residual, 1e-300):
                best, best_residual = x, residual
    return np.array(best)


def _solve_small(m, v):
    """Solution of the k x k system m x = v (k <= 3, Cramer's rule), or None when m is singular; larger systems
    go to numpy."""
    k = len(v)
    if k > 3:
        try:
            return np.linalg.solve(np.array(m), np.array(v)).tolist()
        except np.linalg.LinAlgError:
            return None
    det = _det(m)
    scale = max(abs(e) for row in m for e in row) ** k
    if abs(det) <= 1e-13 * scale:
        return None
    out = []
    for c in range(k):
        mc = [[v[r] if j == c else m[r][j] for j in range(k)] for r in range(k)]
        out.append(_det(mc) / det)
    return out


def _det(m) -> float:
    if len(m) == 1:
        return m[0][0]
    if len(m) == 2:
        return m[0][0] * m[1][1] - m[0][1] * m[1][0]
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def fit_coefficients(points: SlicePoints) -> np.ndarray:
    """Non-negative [c0, c1, c2] minimising sum |model - t| / t over the slice's points: least absolute relative
    deviations by iteratively reweighted least squares (Holland & Welsch 1977, Commun. Stat. 6(9)), so one point
    hit by a burst of load from other processes does not tilt the whole fit."""
    keys = list(points)
    seq = np.array([k[0] for k in keys], float)
    mbs = np.array([k[1] for k in keys], float)
    t = np.array([points[k] for k in keys], float)
    a = features(mbs, seq)
    scale = a.max(axis=0)  # columns of order 1 keep lstsq well conditioned
    scale[scale == 0] = 1.0
    return relative_l1_nnls(a / scale, t) / scale


def relative_l1_nnls(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Non-negative x minimising sum |a x - t| / t (IRLS, see `fit_coefficients`)."""
    rows = a / t[:, None]
    weights = np.ones_like(t)
    for _ in range(IRLS_ITERATIONS):
        coef = nnls(rows * weights[:, None], weights)
        weights = 1.0 / np.sqrt(np.maximum(np.abs(rows @ coef - 1.0), IRLS_FLOOR))
    return coef


def in_range(points: SlicePoints, seq: float, mbs: float) -> bool:
    """The NaN rule of the module doc, per axis."""
    limit = interpolate.EXTRAPOLATION_FACTOR
    for axis, q in ((0, seq), (1, mbs)):
        values = {k[axis] for k in points}
        if len(values) == 1:
            if not np.isclose(q, next(iter(values)), rtol=1e-9, atol=0):
                return False
        elif not min(values) / limit <= q <= max(values) * limit:
            return False
    return True


def predictor(points: SlicePoints, method: str) -> Callable[[float, float], float]:
    """A function (seq, mbs) -> seconds for one slice by `method` (one of METHODS)."""
    if method == "loglog" or len(points) < MIN_FIT_POINTS:
        return lambda seq, mbs: interpolate.nested_value(points, (seq, mbs))
    coef = fit_coefficients(points)
    fitted = lambda seq, mbs: float(features(mbs, seq) @ coef)  # noqa: E731
    if method == "fit":
        return lambda seq, mbs: fitted(seq, mbs) if in_range(points, seq, mbs) else float("nan")
    if method == "fit+loglog":
        ratios = {k: t / fitted(*k) for k, t in points.items()}
        return lambda seq, mbs: fitted(seq, mbs) * interpolate.nested_value(ratios, (seq, mbs))
    if method == "affine-mbs":
        return affine_mbs_predictor(points)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def by_seq(points: SlicePoints) -> Dict[int, Dict[int, float]]:
    """{seq: {mbs: seconds}}."""
    out: Dict[int, Dict[int, float]] = {}
    for (seq, mbs), t in points.items():
        out.setdefault(seq, {})[mbs] = t
    return out


def affine_mbs_predictor(points: SlicePoints):
    """At each measured seq, t = a + b * mbs (non-negative, least absolute relative deviations): every op of a layer scales with
    the micro batch at fixed seq, on top of a fixed per-call cost (alpha-beta form in the batch); across seq the
    per-seq predictions are interpolated log-log."""
    rows = by_seq(points)
    lines = {}
    for seq, row in rows.items():
        mbs = np.array(sorted(row), float)
        t = np.array([row[m] for m in sorted(row)])
        a = np.stack([np.ones_like(mbs), mbs], axis=1)
        lines[seq] = (relative_l1_nnls(a, t) if len(row) >= 2 else None, sorted(row))

    def at_seq(seq: int, mbs: float) -> float:
        coef, measured = lines[seq]
        if coef is None:
            return rows[seq][measured[0]] if np.isclose(mbs, measured[0]) else float("nan")
        limit = interpolate.EXTRAPOLATION_FACTOR
        if not measured[0] / limit <= mbs <= measured[-1] * limit:
            return float("nan")
        return float(coef[0] + coef[1] * mbs)

    def predict(seq: float, mbs: float) -> float:
        values = {s: at_seq(s, mbs) for s in rows}
        xs = [s for s in sorted(values) if np.isfinite(values[s]) and values[s] > 0]
        return interpolate.loglog(xs, [values[s] for s in xs], seq)
    return predict


def cross_validated_error(slices: Dict[tuple, SlicePoints], method: str) -> float:
    """Mean |relative error| of predicting each measured point of every slice from the rest of its slice
    (points that cannot be predicted, e.g. a lone corner, are left out of the mean; inf when none can)."""
    errors = []
    for points in slices.values():
        if len(points) <= MIN_FIT_POINTS:
            continue
        for key, truth in points.items():
            rest = {k: t for k, t in points.items() if k != key}
            pred = predictor(rest, method)(*key)
            if np.isfinite(pred) and pred > 0:
                errors.append(abs(pred - truth) / truth)
    return float(np.mean(errors)) if errors else float("inf")


def choose_method(slices: Dict[tuple, SlicePoints]) -> str:
    """The method of METHODS with the smallest cross-validated error ("loglog" on ties and when nothing can be
    cross-validated)."""
    scores = {method: round(cross_validated_error(slices, method), 9) for method in METHODS}
    best = min(METHODS, key=lambda m: (scores[m], METHODS.index(m)))
    return best if np.isfinite(scores[best]) else "loglog"


def slices_of(points: Dict[Tuple[int, int, int, int], float]) -> Dict[Tuple[int, int], SlicePoints]:
    """{(ep, tp): {(seq, mbs): seconds}} from {(ep, tp, seq, mbs): seconds}."""
    slices: Dict[Tuple[int, int], SlicePoints] = {}
    for (ep, tp, seq, mbs), t in points.items():
        slices.setdefault((ep, tp), {})[(seq, mbs)] = t
    return slices


class LayerTable:
    """One (kind, pass, dtype)'s measurements, predicted per (ep, tp) slice by the cross-validated method, then
    interpolated log-log across tp and ep (`interpolate.nested_value`)."""

    def __init__(self, points: Dict[Tuple[int, int, int, int], float], method: Optional[str] = None):
        """`method` forces one of METHODS; None chooses by cross-validation."""
        slices = slices_of(points)
        self.method = method or choose_method(slices)
        self.predictors = {key: predictor(pts, self.method) for key, pts in slices.items()}

    def value(self, ep: float, tp: float, seq: float, mbs: float) -> float:
        per_slice = {key: predict(seq, mbs) for key, predict in self.predictors.items()}
        return interpolate.nested_value({k: v for k, v in per_slice.items() if np.isfinite(v) and v > 0},
                                        (ep, tp))

    def lookup(self, ep: np.ndarray, tp: np.ndarray, seq: np.ndarray, mbs: np.ndarray) -> np.ndarray:
        """`value` broadcast over the arrays; each distinct point is evaluated once."""
        arrays = np.broadcast_arrays(*[np.asarray(a, dtype=float) for a in (ep, tp, seq, mbs)])
        shape = arrays[0].shape
        stacked = np.stack([a.ravel() for a in arrays], axis=1)
        if stacked.size == 0:
            return np.zeros(shape)
        unique, inverse = np.unique(stacked, axis=0, return_inverse=True)
        values = np.array([self.value(*row) for row in unique])
        return values[inverse.ravel()].reshape(shape)
