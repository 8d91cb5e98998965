"""Per-row residuals of the cost model over the validation rows, grouped as the few-shot benchmark groups them.

Reads the per-row CSV that `python -m benchmarks.accuracy --csv PATH` writes (without --test it holds no test row;
a test row found in it is refused) and prints, per (GPU, release, precision) group, each row's signed error of
predicted tokens/s/GPU (shipped constants) and its offset from the group's mean log error: the part of a row's error
that a cluster constant, fitted on another run of the group, cannot remove. With --before, each row's error under
an earlier CSV is printed beside it. Last, the mean signed error of each model family on each GPU type (geometric
mean of predicted / measured, over every release and precision), with each GPU's mean over its families and each
family's spread over the GPUs: a column off as a whole is a GPU-level error, which a calibration run of that
cluster removes; a row off on one GPU and not on another is a family's error that depends on the GPU.

    python -m benchmarks.accuracy --no-rotation --csv rows.csv
    python -m benchmarks.residuals rows.csv [--before old.csv] [--top N]
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

from benchmarks import holdout


def read_rows(path: str) -> Dict[str, Dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def release(row_id: str) -> str:
    """'26.04.01' for a Megatron-Bridge row id, the NeMo source's tag otherwise."""
    parts = row_id.split("_")
    return parts[1] if row_id.startswith("mb_") else parts[0]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="per-row CSV of `python -m benchmarks.accuracy --csv`")
    ap.add_argument("--before", metavar="CSV", help="an earlier per-row CSV, its errors printed beside")
    ap.add_argument("--top", type=int, default=25, help="rows with the largest within-group offset to list")
    args = ap.parse_args(argv)
    rows = read_rows(args.csv)
    test_ids = [i for i, r in rows.items() if holdout.is_test(r["model"], i)]
    if test_ids:
        print(f"test-row rule: {args.csv} holds {len(test_ids)} test rows (e.g. {test_ids[0]}); write it with "
              f"`python -m benchmarks.accuracy --csv` without --test", file=sys.stderr)
        return 2
    before = read_rows(args.before) if args.before else {}
    groups: Dict[str, List[str]] = defaultdict(list)
    for rid, r in rows.items():
        groups[f"{r['gpu']}/{release(rid)}/{r['precision']}"].append(rid)
    offsets = []
    print(f"{'group':22s} {'row':62s} {'side':7s} {'error':>7s} {'offset':>7s}" + ("  before" if before else ""))
    for g in sorted(groups):
        ids = groups[g]
        logs = {i: math.log1p(float(rows[i]["error_pct"]) / 100) for i in ids}
        mean = sum(logs.values()) / len(logs)
        for i in sorted(ids, key=lambda i: logs[i]):
            off = logs[i] - mean if len(ids) > 1 else float("nan")
            offsets.append((abs(off) if len(ids) > 1 else -1.0, g, i, off))
            tail = f"  {float(before[i]['error_pct']):+6.1f}%" if i in before else ""
            print(f"{g:22s} {rows[i]['model'][:18]:18s} {rows[i]['strategy'][:43]:43s} "
                  f"{rows[i]['holdout_side'][:7]:7s} {float(rows[i]['error_pct']):+6.1f}% {off:+7.3f}{tail}")
    multi = [o for o in offsets if o[0] >= 0]
    if multi:
        rms = math.sqrt(sum(o[3] ** 2 for o in multi) / len(multi))
        print(f"\nrows in groups of 2+: {len(multi)}; rms of the within-group log offset {rms:.3f}")
    print(f"largest within-group offsets (top {args.top}):")
    for a, g, i, off in sorted(multi, reverse=True)[:args.top]:
        print(f"  {off:+.3f}  {g:22s} {float(rows[i]['error_pct']):+6.1f}%  {i}")
    print()
    print(family_by_gpu(rows))
    return 0


def family_by_gpu(rows: Dict[str, Dict[str, str]]) -> str:
    """Table: per model family (rows) and GPU type (columns), the mean signed error (geometric mean of predicted /
    measured - 1, in %) and its row count; a last row with each GPU's mean over its families (each family weighs
    once) and a last column with each family's range over the GPUs it ran on."""
    cells: Dict[tuple, List[float]] = defaultdict(list)
    for r in rows.values():
        cells[(r["model"], r["gpu"])].append(math.log1p(float(r["error_pct"]) / 100))
    models = sorted({m for m, _ in cells})
    gpus = sorted({g for _, g in cells})

    def pct(logs: List[float]) -> float:
        return math.expm1(sum(logs) / len(logs)) * 100

    lines = ["mean signed error by model family and GPU (% of measured tokens/s/GPU; rows in brackets)",
             f"{'family':20s}" + "".join(f"{g:>14s}" for g in gpus) + f"{'range':>9s}"]
    for m in models:
        means = [pct(cells[(m, g)]) for g in gpus if cells.get((m, g))]
        line = f"{m[:20]:20s}" + "".join(f"{pct(cells[(m, g)]):+8.1f}% ({len(cells[(m, g)]):2d})" if cells.get(
            (m, g)) else f"{'-':>14s}" for g in gpus)
        lines.append(line + (f"{max(means) - min(means):8.1f}" if len(means) > 1 else f"{'-':>9s}"))
    gpu_means = []
    for g in gpus:
        fams = [sum(cells[(m, g)]) / len(cells[(m, g)]) for m in models if cells.get((m, g))]
        gpu_means.append(f"{math.expm1(sum(fams) / len(fams)) * 100:+8.1f}% ({len(fams):2d})")
    lines.append(f"{'mean of families':20s}" + "".join(gpu_means))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
