"""Fit a few global efficiency constants of `Calibration` to the published runs.

Minimises the mean squared log error of predicted vs measured tokens/s/GPU over the rows of
`benchmarks/published.py` with a bounded Nelder-Mead search (numpy only). Every constant is global: one value
for every row, GPU and model; no per-row factor. The recompute choice of each row is fixed before fitting (the
fitted constants are time terms and do not change memory; policy "recipe", see benchmarks/published.py).

Overfitting guard: the constants are first fitted on the training rows of `benchmarks/holdout.py` (split by model
family and by source, never by row) and the MAPE is reported on the held-out rows, before the final fit on all
rows but the frozen test split of `benchmarks/holdout.py`, which no fit sees. Rows the source flags as regressed (`benchmarks.published.FOOTNOTE`) are never fitted on.

    python -m benchmarks.calibrate                # before/after MAPE, hold-out MAPE, values for calibration.py
    python -m benchmarks.calibrate --max-evals 60 # quicker, coarser
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Callable, Dict, Sequence, Tuple

import numpy as np

from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.costmodel.estimate import evaluate
from autoplan.costmodel.layout import layouts_from_strategies
from benchmarks import holdout
from benchmarks.published import PublishedRun, headline_runs

# (name, lower, upper): physically sensible ranges, so a fit cannot wander into nonsense.
PARAMETERS: Tuple[Tuple[str, float, float], ...] = (
    ("gemm_scale", 0.6, 1.0),  # at most the measured MAMF fraction of the GPU profile
    ("gemm_half_dim", 0.0, 400.0),
    ("grouped_gemm_eff", 0.3, 1.0),
    ("kernel_overhead_s", 0.0, 3e-5),
    ("tp_overlap_hidden", 0.0, 0.95),
    ("a2a_overlap_hidden", 0.0, 0.95),
    ("fp4_overhead", 0.0, 0.75),
)


class Predictor:
    """tokens/s/GPU of every run under a Calibration (layouts built once)."""

    def __init__(self, runs: Sequence[PublishedRun]):
        self.runs = list(runs)
        self.layouts = [layouts_from_strategies([r.strategy], r.cluster.num_gpus) for r in self.runs]
        self.measured = np.array([r.measured_tokens_per_gpu for r in self.runs])

    def __call__(self, cal: Calibration, index: Sequence[int]) -> np.ndarray:
        out = []
        for i in index:
            r = self.runs[i]
            ev = evaluate(r.model, r.cluster, r.workload, self.layouts[i], cal)
            out.append(r.workload.tokens_per_step / float(ev.step_time_s[0]) / r.cluster.num_gpus)
        return np.array(out)


def to_calibration(unit: np.ndarray, base: Calibration = DEFAULT) -> Calibration:
    """Map a point of the unit cube to a Calibration (clipped into the bounds)."""
    u = np.clip(unit, 0.0, 1.0)
    values = {name: lo + float(x) * (hi - lo) for (name, lo, hi), x in zip(PARAMETERS, u)}
    return replace(base, **values)


def holdout_start() -> Calibration:
    """Where the hold-out refit starts: every fitted constant at the middle of its bounds (the measured ones as in
    calibration.py), so nothing fitted on the held-out rows reaches the refit through its start point."""
    return to_calibration(np.full(len(PARAMETERS), 0.5), DEFAULT)


def to_unit(cal: Calibration) -> np.ndarray:
    return np.array([(getattr(cal, name) - lo) / (hi - lo) for name, lo, hi in PARAMETERS])


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.15, max_evals: int = 250,
                tol: float = 1e-6) -> Tuple[np.ndarray, float]:
    """Plain Nelder-Mead (Nelder & Mead 1965; coefficients 1, 2, 0.5, 0.5)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        evals += 1
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            evals += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            evals += 1
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
                evals += n
    best = int(np.argmin(values))
    return simplex[best], values[best]


def log_loss(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.log(pred / measured) ** 2))


def mape(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / measured - 1.0)) * 100.0)


RESTARTS = 3  # Nelder-Mead restarted from its best point with a fresh simplex (a collapsed simplex stalls)


def fit(predict: Predictor, index: Sequence[int], start: Calibration, max_evals: int,
        restarts: int = RESTARTS) -> Calibration:
    """Constants minimising the log error over rows `index`: `restarts` Nelder-Mead runs of `max_evals`
    evaluations each, every run starting where the previous one ended."""
    measured = predict.measured[list(index)]

    def loss(unit: np.ndarray) -> float:
        return log_loss(predict(to_calibration(unit, start), index), measured)

    best = np.clip(to_unit(start), 0.0, 1.0)
    for _ in range(restarts):
        best, _ = nelder_mead(loss, np.clip(best, 0.0, 1.0), max_evals=max_evals)
    return to_calibration(best, start)


def report(label: str, predict: Predictor, cal: Calibration, index: Sequence[int]) -> Dict[str, float]:
    pred = predict(cal, index)
    meas = predict.measured[list(index)]
    arch = np.array([predict.runs[i].arch for i in index])
    out = {"all": mape(pred, meas)}
    for a in ("dense", "moe"):
        if np.any(arch == a):
            out[a] = mape(pred[arch == a], meas[arch == a])
    print(f"  {label:34s} rows {len(index):3d}  MAPE all {out['all']:5.1f}%  "
          + "  ".join(f"{k} {v:5.1f}%" for k, v in out.items() if k != "all"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-evals", type=int, default=250, help="objective evaluations per fit")
    args = ap.parse_args(argv)
    runs, _, no_fit = headline_runs()
    predict = Predictor(runs)
    sides = holdout.split(runs)
    every = [i for i, r in enumerate(runs) if r.id not in no_fit and i not in set(sides["test"])]  # never the test split
    train = [i for i in sides["train"] if runs[i].id not in no_fit]
    test = sides["holdout"]
    print(f"{len(runs)} rows ({len(every)} fitted on); {holdout.describe()}; training rows {len(train)}, "
          f"held-out rows {len(test)}")
    print("Hold-out check (fit on the training setups only):")
    report("current constants, hold-out rows", predict, DEFAULT, test)
    held_fit = fit(predict, train, holdout_start(), args.max_evals)
    report("fitted on train, train rows", predict, held_fit, train)
    report("fitted on train, hold-out rows", predict, held_fit, test)
    print("Final fit on all rows (except the footnote rows):")
    report("current constants", predict, DEFAULT, every)
    final = fit(predict, every, DEFAULT, args.max_evals)
    report("fitted constants", predict, final, every)
    print("Values for autoplan/costmodel/calibration.py:")
    for name, lo, hi in PARAMETERS:
        print(f"  {name} = {getattr(final, name):.4g}  (was {getattr(DEFAULT, name):.4g}; bounds {lo:g}..{hi:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
