"""How close the cost model comes to published training throughput, in sample and out of sample, beside the
naive bar, and how well it ranks the strategies measured for one setup.

Rows: every pre-training row of `data/published_runs.csv` the cost model can express (`headline_runs`): a
tokens/s/GPU row, or a model-TFLOP/s row where its run has no tokens row (converted with Megatron's model-FLOPs
formula, `autoplan.costmodel.flops`). Only rows that are not pre-training or whose architecture is not in the row
are left out (`benchmarks/published.py` `exclusion_reason`); rows measured below the same job on a weaker GPU and
the rows under the source's regression footnote are counted (the footnote rows are not fitted on).

Columns (MAPE of predicted vs measured tokens/s/GPU):
- in-sample: the constants of `autoplan/costmodel/calibration.py` (fitted on every row) on every row, beside the
  naive bar fitted on every row (`benchmarks/naive.py`);
- hold-out (validation): constants refitted on the training rows only (`benchmarks/calibrate.py` fit, same bounds) on
  the held-out rows, beside the naive bar fitted on the same training rows. The split is by model family and source
  (`benchmarks/holdout.py`). These rows were used to choose the model (benchmarks/README.md): validation figures.
  Beside them, the spread of the same figures over the rotations of the split (offsets 0, 1, 2 of its hash rule).
- test (`--test` only): the frozen test split of `benchmarks/holdout.py` (newest release and one family; never fitted
  on, never in the tables above), under the training-row constants and naive bar. Run once a change is final.
Then Spearman's rho per setup with several measured strategies (`benchmarks/ranking.py`), over the non-test rows.

    python -m benchmarks.accuracy                 # summary tables
    python -m benchmarks.accuracy --rows          # also the per-row table
    python -m benchmarks.accuracy --json          # machine-readable
    python -m benchmarks.accuracy --csv out.csv   # per-row table as CSV as well
    python -m benchmarks.accuracy --test          # also the frozen test split (once a change is final)
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.costmodel.estimate import estimate
from benchmarks import holdout, ranking
from benchmarks.calibrate import PARAMETERS, Predictor, fit, holdout_start  # numpy-only Nelder-Mead over the bounds
from benchmarks.naive import NaiveBar, precision_of
from benchmarks.published import POLICIES, PublishedRun, exclusion_reason, headline_runs, stem

@dataclass(frozen=True)
class RowResult:
    run: PublishedRun
    predicted: float  # tokens/s/GPU
    peak_mem_gib: float
    capacity_gib: float
    fits: bool

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return self.predicted / self.run.measured_tokens_per_gpu - 1.0


def predict(runs: Sequence[PublishedRun], cal: Calibration = DEFAULT) -> List[RowResult]:
    out = []
    for r in runs:
        e = estimate(r.model, r.cluster, r.strategy, r.workload, cal=cal)
        out.append(RowResult(r, e.tokens_per_s_per_gpu, e.peak_mem_gib, e.capacity_gib, e.fits))
    return out


def mape(errors: Sequence[float]) -> float:
    return float(np.mean(np.abs(errors)) * 100.0) if len(errors) else float("nan")


def subset(run: PublishedRun) -> str:
    return f"{run.arch}/{run.gpu}/{precision_of(run)}"


@dataclass
class Report:
    """Signed errors of the model and the naive bar, in sample (every row) and out of sample (held-out rows)."""

    runs: List[PublishedRun]
    model_in: np.ndarray
    naive_in: np.ndarray
    held: List[int]  # indices into runs
    model_out: np.ndarray  # over `held`
    naive_out: np.ndarray
    held_side: List[str]  # 'family' | 'source' per held row
    fitted: Calibration
    train_rows: int
    naive_levels: Dict[str, int]  # fallback levels the training-row naive bar used on the held-out rows
    test: List[int]  # indices of the frozen test rows (left out of every table but `test_table`)
    model_test: Optional[np.ndarray] = None  # over `test`, when evaluated (--test)
    naive_test: Optional[np.ndarray] = None
    rotation: Optional[Dict[str, Tuple[float, float]]] = None  # arch -> (min, max) validation MAPE over offsets

    def table(self, key) -> List[Tuple[str, Dict[str, object]]]:
        """Rows grouped by key(run): counts and the four MAPEs (test rows left out)."""
        groups: Dict[str, Dict[str, list]] = defaultdict(lambda: defaultdict(list))
        test = set(self.test)
        for i, r in enumerate(self.runs):
            if i in test:
                continue
            g = groups[key(r)]
            g["model_in"].append(self.model_in[i])
            g["naive_in"].append(self.naive_in[i])
        for k, i in enumerate(self.held):
            g = groups[key(self.runs[i])]
            g["model_out"].append(self.model_out[k])
            g["naive_out"].append(self.naive_out[k])
        return [(name, {"rows": len(g["model_in"]), "model_in": mape(g["model_in"]), "naive_in": mape(g["naive_in"]),
                        "held": len(g["model_out"]), "model_out": mape(g["model_out"]),
                        "naive_out": mape(g["naive_out"])}) for name, g in sorted(groups.items())]

    def test_table(self, key) -> List[Tuple[str, Dict[str, object]]]:
        """The test rows grouped by key(run): count, model MAPE, naive-bar MAPE."""
        groups: Dict[str, Dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for k, i in enumerate(self.test):
            g = groups[key(self.runs[i])]
            g["model"].append(self.model_test[k])
            g["naive"].append(self.naive_test[k])
        return [(name, {"rows": len(g["model"]), "model": mape(g["model"]), "naive": mape(g["naive"])})
                for name, g in sorted(groups.items())]

    def held_by_side(self) -> Dict[str, Dict[str, object]]:
        out = {}
        for side in ("family", "source"):
            for arch in ("dense", "moe"):
                idx = [k for k, i in enumerate(self.held)
                       if self.held_side[k] == side and self.runs[i].arch == arch]
                out[f"{side}/{arch}"] = {"held": len(idx), "model_out": mape(self.model_out[idx]),
                                         "naive_out": mape(self.naive_out[idx])}
        return out


def validation(runs: Sequence[PublishedRun], predictor: Predictor, no_fit: set, max_evals: int, offset: int = 0):
    """(training rows, held-out rows, constants refitted on the training rows, model errors on the held-out rows,
    naive bar fitted on the training rows) under the validation rule at `offset` (test rows in neither)."""
    sides = holdout.split(runs, offset)
    train = [i for i in sides["train"] if runs[i].id not in no_fit]
    held = sides["holdout"]
    fitted = fit(predictor, train, holdout_start(), max_evals)
    model_out = predictor(fitted, held) / predictor.measured[held] - 1.0
    return train, held, fitted, model_out, NaiveBar.fit([runs[i] for i in train])


def rotation_spread(runs: Sequence[PublishedRun], predictor: Predictor, no_fit: set, max_evals: int,
                    first: Dict[str, float]) -> Dict[str, Tuple[float, float]]:
    """arch -> (min, max) of the validation model MAPE over the offsets 0 (`first`), 1, ... HOLD_EVERY - 1."""
    seen: Dict[str, List[float]] = {a: [v] for a, v in first.items()}
    for offset in range(1, holdout.HOLD_EVERY):
        _, held, _, model_out, _ = validation(runs, predictor, no_fit, max_evals, offset)
        for arch in seen:
            sel = [k for k, i in enumerate(held) if runs[i].arch == arch]
            if sel:
                seen[arch].append(mape(model_out[sel]))
    return {a: (min(v), max(v)) for a, v in seen.items()}


def build_report(runs: Sequence[PublishedRun], results: Sequence[RowResult], no_fit: set,
                 max_evals: int, with_test: bool = False, rotation: bool = True) -> Report:
    runs = list(runs)
    model_in = np.array([res.error for res in results])
    test = holdout.split(runs)["test"]
    fit_rows = [r for i, r in enumerate(runs) if r.id not in no_fit and i not in set(test)]
    bar_all = NaiveBar.fit(fit_rows)
    naive_in = np.array([bar_all.predict(r) / r.measured_tokens_per_gpu - 1.0 for r in runs])
    predictor = Predictor(runs)
    train, held, fitted, model_out, bar_train = validation(runs, predictor, no_fit, max_evals)
    naive_out = np.array([bar_train.predict(runs[i]) / runs[i].measured_tokens_per_gpu - 1.0 for i in held])
    held_side = [holdout.side(runs[i].model_name, runs[i].id) for i in held]
    rep = Report(runs, model_in, naive_in, held, model_out, naive_out, held_side, fitted, len(train),
                 dict(bar_train.levels_used), test)
    if rotation:
        first = {a: mape(model_out[[k for k, i in enumerate(held) if runs[i].arch == a]]) for a in ("dense", "moe")}
        rep.rotation = rotation_spread(runs, predictor, no_fit, max_evals, first)
    if with_test:
        rep.model_test = predictor(fitted, test) / predictor.measured[test] - 1.0
        rep.naive_test = np.array([bar_train.predict(runs[i]) / runs[i].measured_tokens_per_gpu - 1.0 for i in test])
    return rep


def row_record(res: RowResult, holdout_error: Optional[float] = None) -> Dict[str, object]:
    """One row: the in-sample prediction and, for a held-out row, its error under the training-row constants."""
    r = res.run
    return {
        "id": r.id, "model": r.model_name, "gpu": r.gpu, "num_gpus": r.cluster.num_gpus,
        "precision": precision_of(r), "strategy": r.strategy.label(), "metric": r.metric,
        "holdout_side": holdout.side(r.model_name, r.id),
        "predicted_tokens_per_s_per_gpu": round(res.predicted, 1),
        "measured_tokens_per_s_per_gpu": round(r.measured_tokens_per_gpu, 1),
        "error_pct": round(res.error * 100.0, 2), "peak_mem_gib": round(res.peak_mem_gib, 2),
        "capacity_gib": round(res.capacity_gib, 1), "fits": res.fits,
        "holdout_error_pct": None if holdout_error is None else round(holdout_error * 100.0, 2),
    }


def row_records(results: Sequence[RowResult], rep: Report) -> List[Dict[str, object]]:
    """Every row's record, each held-out row with its error under the training-row constants."""
    held_error = dict(zip(rep.held, rep.model_out))
    return [row_record(res, held_error.get(i)) for i, res in enumerate(results)]


def print_rows(results: Sequence[RowResult], out=sys.stdout) -> None:
    print(f"{'model':15s} {'gpu':5s} {'n':>4s} {'prec':5s} {'strategy':42s} {'pred':>8s} {'meas':>8s} "
          f"{'err%':>7s} {'mem GiB':>11s} fits side", file=out)
    for res in results:
        rec = row_record(res)
        mem = f"{rec['peak_mem_gib']:.0f}/{rec['capacity_gib']:.0f}"
        print(f"{rec['model'][:15]:15s} {rec['gpu']:5s} {rec['num_gpus']:4d} {rec['precision']:5s} "
              f"{rec['strategy'][:42]:42s} {rec['predicted_tokens_per_s_per_gpu']:8.0f} "
              f"{rec['measured_tokens_per_s_per_gpu']:8.0f} {rec['error_pct']:7.1f} {mem:>11s} "
              f"{'yes' if res.fits else 'NO':4s} {rec['holdout_side']}", file=out)


def _pct(v: float) -> str:
    return "     -" if np.isnan(v) else f"{v:5.1f}%"


def print_report(rep: Report, results: Sequence[RowResult], excluded, found, out=sys.stdout) -> None:
    print(f"Hold-out split: {holdout.describe()}", file=out)
    print(f"Training rows {rep.train_rows}, held-out rows {len(rep.held)} (constants refitted on the training rows "
          f"only; naive bar fitted on the same rows)\n", file=out)
    head = f"{'':24s} {'rows':>4s} {'model':>6s} {'naive':>6s} | {'held':>4s} {'model':>6s} {'naive':>6s}"
    print(f"{'MAPE':24s} {'in-sample':^18s} | {'hold-out':^18s}", file=out)
    print(head, file=out)
    for name, v in rep.table(subset):
        print(f"  {name:22s} {v['rows']:4d} {_pct(v['model_in'])} {_pct(v['naive_in'])} | {v['held']:4d} "
              f"{_pct(v['model_out'])} {_pct(v['naive_out'])}", file=out)
    for name, v in rep.table(lambda r: r.arch) + rep.table(lambda r: "all"):
        spread = rep.rotation.get(name) if rep.rotation else None
        rot = f"   rotation spread {spread[0]:.1f}-{spread[1]:.1f}%" if spread else ""
        print(f"{name:24s} {v['rows']:4d} {_pct(v['model_in'])} {_pct(v['naive_in'])} | {v['held']:4d} "
              f"{_pct(v['model_out'])} {_pct(v['naive_out'])}{rot}", file=out)
    if rep.rotation:
        print(f"(rotation spread: hold-out model MAPE over the offsets 0..{holdout.HOLD_EVERY - 1} of the split's hash "
              f"rule, each refitted on its own training rows)", file=out)
    print("Hold-out by kind (unseen family / seen family, unseen source):", file=out)
    for name, v in rep.held_by_side().items():
        print(f"  {name:22s} {'':18s} | {v['held']:4d} {_pct(v['model_out'])} {_pct(v['naive_out'])}", file=out)
    print("Naive bar on held-out rows, level used: " + ", ".join(f"{k} {v}" for k, v in rep.naive_levels.items()),
          file=out)
    print("Rows the model could not price before (a row can be both):", file=out)
    for name, pick in (("hybrid (Mamba) models", lambda r: r.model.is_hybrid),
                       ("nvfp4", lambda r: precision_of(r) == "nvfp4")):
        v = dict(rep.table(lambda r: "yes" if pick(r) else "no")).get("yes")
        if v:
            print(f"  {name:22s} {v['rows']:4d} {_pct(v['model_in'])} {_pct(v['naive_in'])} | {v['held']:4d} "
                  f"{_pct(v['model_out'])} {_pct(v['naive_out'])}", file=out)
    print(f"Predicted not to fit: {sum(not r.fits for r in results)} of {len(results)}", file=out)
    print("Constants refitted on the training rows: " + ", ".join(
        f"{name} {getattr(rep.fitted, name):.4g}" for name, _, _ in PARAMETERS), file=out)
    print_ranking(found, out)
    if rep.model_test is not None:
        print_test(rep, out)
    reasons: Dict[str, int] = defaultdict(int)
    for _, why in excluded:
        reasons[why] += 1
    print(f"\nExcluded rows: {len(excluded)}", file=out)
    for why, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:3d}  {why}", file=out)


def print_test(rep: Report, out=sys.stdout) -> None:
    print(f"\nTest split ({len(rep.test)} rows: families {', '.join(holdout.TEST_FAMILIES)}, sources "
          f"{', '.join(holdout.TEST_SOURCES)}; constants and naive bar fitted on the {rep.train_rows} training rows):",
          file=out)
    print(f"{'MAPE':24s} {'rows':>4s} {'model':>6s} {'naive':>6s}", file=out)
    for name, v in rep.test_table(subset):
        print(f"  {name:22s} {v['rows']:4d} {_pct(v['model'])} {_pct(v['naive'])}", file=out)
    for name, v in rep.test_table(lambda r: r.arch) + rep.test_table(lambda r: "all"):
        print(f"{name:24s} {v['rows']:4d} {_pct(v['model'])} {_pct(v['naive'])}", file=out)


def print_ranking(found: Sequence[ranking.Setup], out=sys.stdout) -> None:
    s = ranking.summary(found)
    print(f"\nRanking (Spearman rho of predicted vs measured tokens/s/GPU per setup with >= "
          f"{ranking.MIN_STRATEGIES} strategies; current constants):", file=out)
    for st in found:
        good, total = st.pairs()
        rho = "    -" if len(st.strategies) < ranking.MIN_STRATEGIES or np.isnan(st.rho) else f"{st.rho:5.2f}"
        print(f"  {' '.join(str(k) for k in st.key):52s} strategies {len(st.strategies):2d}  rho {rho}  "
              f"pairs {good}/{total}", file=out)
    print(f"  setups ranked {s['ranked_setups']}, mean rho {s['mean_rho']:.2f}, rho >= 0.8 in "
          f"{s['setups_rho_at_least_0.8']}; pairs ordered as measured {s['pairs_ordered']}/{s['pairs']}", file=out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recompute", choices=POLICIES, default="recipe",
                    help="recompute policy for rows that do not state it (see benchmarks/published.py)")
    ap.add_argument("--rows", action="store_true", help="also print the per-row table")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    ap.add_argument("--csv", metavar="PATH", help="also write the per-row table as CSV")
    ap.add_argument("--max-evals", type=int, default=250, help="objective evaluations of the training-row refit")
    ap.add_argument("--test", action="store_true", help="also evaluate the frozen test split (once a change is "
                    "final; benchmarks/holdout.py)")
    ap.add_argument("--no-rotation", action="store_true", help="skip the rotation spread (two more refits)")
    args = ap.parse_args(argv)
    runs, excluded, no_fit = headline_runs(args.recompute)
    results = predict(runs)
    rep = build_report(runs, results, no_fit, args.max_evals, with_test=args.test, rotation=not args.no_rotation)
    test = set(rep.test)
    shown = [i for i in range(len(runs)) if i not in test]
    found = ranking.setups([runs[i] for i in shown], [results[i].predicted for i in shown])
    records = [rec for i, rec in enumerate(row_records(results, rep)) if args.test or i not in test]
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    if args.json:
        json.dump({"recompute_policy": args.recompute, "split": holdout.describe(),
                   "by_subset": dict(rep.table(subset)), "by_arch": dict(rep.table(lambda r: r.arch)),
                   "all": dict(rep.table(lambda r: "all")), "held_by_side": rep.held_by_side(),
                   "hybrid": dict(rep.table(lambda r: "yes" if r.model.is_hybrid else "no")).get("yes"),
                   "nvfp4": dict(rep.table(lambda r: "yes" if precision_of(r) == "nvfp4" else "no")).get("yes"),
                   "ranking": ranking.summary(found), "rows": records,
                   "rotation": rep.rotation,
                   "test": None if rep.model_test is None else {
                       "by_subset": dict(rep.test_table(subset)), "by_arch": dict(rep.test_table(lambda r: r.arch)),
                       "all": dict(rep.test_table(lambda r: "all"))},
                   "excluded": [{"id": i, "reason": why} for i, why in excluded]}, sys.stdout, indent=1)
        print()
        return 0
    if args.rows:
        print_rows([results[i] for i in range(len(runs)) if args.test or i not in test])
        print()
    print_report(rep, results, excluded, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
