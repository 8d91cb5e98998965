"""Published Megatron-Bridge recipes that plain `estimate` predicts not to fit, priced with each recipe's own
switches (recompute and its modules, CPU offload, FP8 primary weights, TE fused cross entropy, expandable
segments, bf16 gradient reduction: `benchmarks/recipes.py`) and no escalation.

    python -m benchmarks.recipes_fit          # count and list
"""
from __future__ import annotations

import sys
from typing import List, Tuple

from autoplan.costmodel.estimate import estimate
from benchmarks.published import build_run, exclusion_reason, read_rows, stem
from benchmarks.recipes import release_of


def recipe_rows() -> List[Tuple[str, float, float]]:
    """(row id, predicted peak GiB, capacity GiB) of every usable Megatron-Bridge run (its tokens row), built as the
    accuracy benchmark builds it (`published.build_run`) with the recipe's recompute as written."""
    out, rows = [], read_rows()
    with_tokens = {stem(r["id"]) for r in rows if r["measured_metric_name"] == "tokens_per_sec_per_gpu"}
    for row in rows:
        if release_of(row["id"]) is None or exclusion_reason(row) is not None:
            continue
        if row["measured_metric_name"] != "tokens_per_sec_per_gpu" and stem(row["id"]) in with_tokens:
            continue  # one entry per run: its tokens row
        run = build_run(row, policy="written")
        est = estimate(run.model, run.cluster, run.strategy, run.workload)
        out.append((row["id"], est.peak_mem_gib, est.capacity_gib))
    return out


def main() -> int:
    rows = recipe_rows()
    over = [r for r in rows if r[1] > r[2]]
    print(f"Megatron-Bridge recipes predicted not to fit by plain estimate: {len(over)} of {len(rows)}")
    for rid, peak, cap in over:
        print(f"  {rid}: {peak:.1f} GiB > {cap:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
