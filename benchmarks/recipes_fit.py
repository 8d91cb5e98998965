"""Published Megatron-Bridge recipes that plain `estimate` predicts not to fit, priced with each recipe's own
switches (recompute and its modules, CPU offload, FP8 primary weights, TE fused cross entropy, expandable
segments, bf16 gradient reduction: `benchmarks/recipes.py`) and no escalation.

    python -m benchmarks.recipes_fit          # count and list
"""
from __future__ import annotations

import sys
from typing import List, Tuple

from autoplan.clusterio import load_cluster
from autoplan.costmodel.estimate import estimate
from autoplan.workload import Workload
from benchmarks.published import (GPU_IDS, _int, base_strategy, build_model, exclusion_reason, read_rows,
                                  stem, with_recompute)
from benchmarks.recipes import recipe_facts, release_of


def recipe_rows() -> List[Tuple[str, float, float]]:
    """(row id, predicted peak GiB, capacity GiB) of every usable Megatron-Bridge row."""
    out, rows = [], read_rows()
    with_tokens = {stem(r["id"]) for r in rows if r["measured_metric_name"] == "tokens_per_sec_per_gpu"}
    for row in rows:
        if release_of(row["id"]) is None or exclusion_reason(row) is not None:
            continue
        if row["measured_metric_name"] != "tokens_per_sec_per_gpu" and stem(row["id"]) in with_tokens:
            continue  # one entry per run: its tokens row
        gpu = GPU_IDS[row["gpu"]]
        model, _ = build_model(row)
        facts = recipe_facts(row, gpu, fp8=row["precision"] != "bf16")
        if facts.no_dropout:
            model = model.model_copy(update={"hidden_dropout": 0.0})
        s = with_recompute(base_strategy(row, model, gpu, facts), facts.recompute, facts.recompute_layers,
                           facts.recompute_modules)
        est = estimate(model, load_cluster(gpu, _int(row["num_gpus"])), s,
                       Workload(seq_len=_int(row["seq_len"]), global_batch_size=_int(row["gbs"])))
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
