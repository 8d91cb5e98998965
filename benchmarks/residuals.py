"""Per-row residuals of the cost model over the validation rows, grouped as the few-shot benchmark groups them.

Reads the per-row CSV that `python -m benchmarks.accuracy --csv PATH` writes (without --test it holds no test row;
a test row found in it is refused) and prints, per (GPU, release, precision) group, each row's signed error of
predicted tokens/s/GPU (shipped constants) and its offset from the group's mean log error: the part of a row's error
that a cluster constant, fitted on another run of the group, cannot remove. With --before, each row's error under
an earlier CSV is printed beside it.

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
