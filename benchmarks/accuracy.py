"""How close the cost model comes to published training throughput.

Runs `autoplan.costmodel.estimate` on every usable row of `data/published_runs.csv` (tokens/s/GPU rows; a
model-TFLOP/s row only where its run has no tokens row, converted with `autoplan.costmodel.flops`) and prints,
per row, the predicted and measured tokens/s/GPU, the error, the predicted peak memory and whether it fits; then
the mean absolute percentage error (MAPE) per subset (arch x GPU x precision) and overall for dense and MoE rows.

Which rows are left out and why, and every assumption used to turn a row into a strategy (SP, distributed
optimizer, overlaps, FP8 recipe, recompute), are stated in `benchmarks/published.py`.

    python -m benchmarks.accuracy                 # table + summary, recompute policy "recipe"
    python -m benchmarks.accuracy --recompute none
    python -m benchmarks.accuracy --json          # machine-readable
    python -m benchmarks.accuracy --csv out.csv   # per-row table as CSV as well
    python -m benchmarks.accuracy --keep-regressions  # also the rows measured below a weaker GPU's
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np

from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.costmodel.estimate import estimate
from benchmarks.published import POLICIES, PublishedRun, load_runs


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
        peak = e.peak_mem_gib - r.memory_credit_gib  # FP8 primary weights / CPU offload (published.py)
        out.append(RowResult(r, e.tokens_per_s_per_gpu, peak, e.capacity_gib, peak <= e.capacity_gib))
    return out


def mape(errors: Sequence[float]) -> float:
    return float(np.mean(np.abs(errors)) * 100.0) if len(errors) else float("nan")


def summary(results: Sequence[RowResult]) -> Dict[str, object]:
    """MAPE per subset and per architecture, and the rows predicted not to fit."""
    by_subset: Dict[str, List[float]] = defaultdict(list)
    by_arch: Dict[str, List[float]] = defaultdict(list)
    for res in results:
        by_subset[res.run.subset].append(res.error)
        by_arch[res.run.arch].append(res.error)
    return {
        "rows": len(results),
        "mape_pct": {arch: mape(v) for arch, v in sorted(by_arch.items())},
        "mape_pct_by_subset": {k: {"rows": len(v), "mape_pct": mape(v)} for k, v in sorted(by_subset.items())},
        "mape_pct_all": mape([r.error for r in results]),
        "not_fitting": [r.run.id for r in results if not r.fits],
    }


def row_record(res: RowResult) -> Dict[str, object]:
    r = res.run
    return {
        "id": r.id, "model": r.model_name, "gpu": r.gpu, "num_gpus": r.cluster.num_gpus,
        "precision": r.precision, "strategy": r.strategy.label(), "metric": r.metric,
        "predicted_tokens_per_s_per_gpu": round(res.predicted, 1),
        "measured_tokens_per_s_per_gpu": round(r.measured_tokens_per_gpu, 1),
        "error_pct": round(res.error * 100.0, 2), "peak_mem_gib": round(res.peak_mem_gib, 2),
        "capacity_gib": round(res.capacity_gib, 1), "fits": res.fits,
    }


def print_table(results: Sequence[RowResult], out=sys.stdout) -> None:
    head = f"{'model':15s} {'gpu':5s} {'n':>4s} {'prec':4s} {'strategy':42s} {'pred':>8s} {'meas':>8s} " \
           f"{'err%':>7s} {'mem GiB':>11s} fits"
    print(head, file=out)
    for res in results:
        rec = row_record(res)
        mem = f"{rec['peak_mem_gib']:.0f}/{rec['capacity_gib']:.0f}"
        print(f"{rec['model'][:15]:15s} {rec['gpu']:5s} {rec['num_gpus']:4d} {rec['precision']:4s} "
              f"{rec['strategy'][:42]:42s} {rec['predicted_tokens_per_s_per_gpu']:8.0f} "
              f"{rec['measured_tokens_per_s_per_gpu']:8.0f} {rec['error_pct']:7.1f} {mem:>11s} "
              f"{'yes' if res.fits else 'NO'}", file=out)


def print_summary(s: Dict[str, object], excluded, out=sys.stdout) -> None:
    print("\nMAPE by subset (arch/gpu/precision):", file=out)
    for key, v in s["mape_pct_by_subset"].items():
        print(f"  {key:22s} rows {v['rows']:3d}  MAPE {v['mape_pct']:6.1f}%", file=out)
    print(f"\nOverall: rows {s['rows']}, MAPE {s['mape_pct_all']:.1f}% "
          + ", ".join(f"{k} {v:.1f}%" for k, v in s["mape_pct"].items()), file=out)
    print(f"Predicted not to fit: {len(s['not_fitting'])} of {s['rows']}"
          + (": " + ", ".join(s["not_fitting"]) if s["not_fitting"] else ""), file=out)
    reasons: Dict[str, int] = defaultdict(int)
    for _, why in excluded:
        reasons[why] += 1
    print(f"Excluded rows: {len(excluded)}", file=out)
    for why, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:3d}  {why}", file=out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recompute", choices=POLICIES, default="recipe",
                    help="recompute policy for rows that do not state it (see benchmarks/published.py)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--csv", metavar="PATH", help="also write the per-row table as CSV")
    ap.add_argument("--keep-regressions", action="store_true",
                    help="also use the rows measured below the same job on a weaker GPU (published.py)")
    args = ap.parse_args(argv)
    runs, excluded = load_runs(policy=args.recompute, keep_regressions=args.keep_regressions)
    results = predict(runs)
    s = summary(results)
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            records = [row_record(r) for r in results]
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    if args.json:
        json.dump({"recompute_policy": args.recompute, "summary": s, "rows": [row_record(r) for r in results],
                   "excluded": [{"id": i, "reason": why} for i, why in excluded]}, sys.stdout, indent=1)
        print()
    else:
        print_table(results)
        print_summary(s, excluded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
