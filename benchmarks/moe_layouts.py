"""Cross-node expert parallelism against runs that measured it: `data/moe_layout_runs.csv` (Megatron-MoE-ModelZoo's
Qwen3-235B-A22B on 256 H100 in five layouts, two of them with EP over four nodes; the DeepSeek-V3 report's 2,048
H800 run), each priced with the strategy the source states (dispatcher and 1F1B all-to-all overlap included).

Printed per row: measured and predicted tokens/s/GPU and the error, beside the naive constant-throughput bar
(benchmarks/naive.py, fitted on the published runs of `benchmarks.accuracy.headline_runs`, not on these rows).
Per setup with several layouts: Spearman's rho of predicted vs measured tokens/s/GPU, and whether the layouts with
expert parallelism across NVLink domains are ordered as measured against the others. Then what `plan` chooses for
the setup (the search's best strategy and whether its EP leaves the NVLink domain).

    python -m benchmarks.moe_layouts            # rows, ordering
    python -m benchmarks.moe_layouts --plan     # also the search's choice for each setup (minutes)
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from autoplan.calibration.runs import MeasuredRun, run_of_row
from autoplan.costmodel.estimate import estimate

DATA = Path(__file__).resolve().parent.parent / "data" / "moe_layout_runs.csv"
RUN_COLUMNS = ("model", "cluster", "gpus", "seq", "gbs", "strategy", "step_time_s")


@dataclass(frozen=True)
class LayoutRun:
    """One row: the measured run and what the naive bar needs to price it (benchmarks/naive.py reads these
    attributes)."""

    id: str
    run: MeasuredRun

    @property
    def model(self):
        return self.run.model

    @property
    def cluster(self):
        return self.run.cluster

    @property
    def strategy(self):
        return self.run.strategy

    @property
    def workload(self):
        return self.run.workload

    @property
    def gpu(self) -> str:
        return self.run.cluster.gpu.id

    @property
    def arch(self) -> str:
        return "moe" if self.run.model.is_moe else "dense"

    @property
    def precision(self) -> str:
        return "fp8" if self.run.strategy.uses_fp8 else "bf16"

    @property
    def measured_tokens_per_gpu(self) -> float:
        return self.run.workload.tokens_per_step / self.run.step_time_s / self.run.cluster.num_gpus

    @property
    def setup(self) -> Tuple:
        return (self.run.model.name, self.gpu, self.run.cluster.num_gpus, self.precision, self.run.workload.seq_len)

    @property
    def ep_outside_domain(self) -> bool:
        s = self.run.strategy
        return s.ep > 1 and s.ep * s.etp > self.run.cluster.gpu.nvlink_domain_size


def read_layout_runs(path: Path = DATA) -> List[LayoutRun]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [LayoutRun(r["id"], run_of_row(r["id"], str(path), {k: r[k] for k in RUN_COLUMNS})) for r in rows]


def predicted_tokens(r: LayoutRun) -> float:
    e = estimate(r.run.model, r.run.cluster, r.run.strategy, r.run.workload)
    return e.tokens_per_s_per_gpu


def naive_bar():
    from benchmarks.accuracy import headline_runs
    from benchmarks.naive import NaiveBar

    runs, _, no_fit = headline_runs()
    return NaiveBar.fit([r for r in runs if r.id not in no_fit])


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    from benchmarks.ranking import spearman as rho

    return rho(a, b)


def cross_node_ordered(rows: Sequence[LayoutRun], predicted: Sequence[float]) -> Tuple[int, int]:
    """(pairs ordered as measured, pairs) over the pairs of one cross-node-EP layout and one other layout."""
    good = total = 0
    for i, a in enumerate(rows):
        for j, b in enumerate(rows):
            if a.ep_outside_domain and not b.ep_outside_domain:
                dm = a.measured_tokens_per_gpu - b.measured_tokens_per_gpu
                if dm == 0:
                    continue
                total += 1
                good += (predicted[i] - predicted[j]) * dm > 0
    return good, total


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="store_true", help="also run the search for each setup")
    args = ap.parse_args(argv)
    rows = read_layout_runs()
    bar = naive_bar()
    predicted = [predicted_tokens(r) for r in rows]
    naive = [bar.predict(r) for r in rows]
    print("Cross-node expert parallelism: measured vs predicted tokens/s/GPU (error = predicted / measured - 1)")
    print(f"  {'row':52s} {'EP across':>9s} {'measured':>8s} {'model':>7s} {'error':>7s} {'naive':>7s} {'error':>7s}")
    errs, nerrs = [], []
    for r, p, n in zip(rows, predicted, naive):
        m = r.measured_tokens_per_gpu
        errs.append(p / m - 1)
        nerrs.append(n / m - 1)
        print(f"  {r.id[:52]:52s} {'yes' if r.ep_outside_domain else 'no':>9s} {m:8.0f} {p:7.0f} {p / m - 1:+7.1%} "
              f"{n:7.0f} {n / m - 1:+7.1%}")
    print(f"  MAPE over {len(rows)} rows: model {np.mean(np.abs(errs)):.1%}, naive bar {np.mean(np.abs(nerrs)):.1%}")
    by_setup: Dict[Tuple, List[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_setup[r.setup].append(i)
    for key, idx in by_setup.items():
        if len(idx) < 3:
            continue
        sub = [rows[i] for i in idx]
        meas = [r.measured_tokens_per_gpu for r in sub]
        pred = [predicted[i] for i in idx]
        good, total = cross_node_ordered(sub, pred)
        rho_naive = spearman([naive[i] for i in idx], meas)
        print(f"  setup {' '.join(str(k) for k in key)}: {len(idx)} layouts, Spearman rho {spearman(pred, meas):+.2f} "
              f"(naive bar {'no order: one throughput for every layout' if np.isnan(rho_naive) else f'{rho_naive:+.2f}'}); "
              f"cross-node-EP vs other layout pairs ordered as measured {good}/{total}")
        if args.plan:
            print_plan(sub[0])
    return 0


def print_plan(r: LayoutRun) -> None:
    """The search's best strategy for the setup (engine megatron, the run's GEMM precision)."""
    from autoplan.solvers.api import solve
    from autoplan.solvers.space import Problem

    prob = Problem(r.run.model, r.run.cluster, r.run.workload, precision=r.precision)
    result = solve(prob, "cpsat", top_k=3)
    for k, plan in enumerate(result.plans, start=1):
        s = plan.strategy
        across = s.ep > 1 and s.ep * s.etp > r.run.cluster.gpu.nvlink_domain_size
        print(f"    plan #{k}: {s.label(True)}  flex={s.moe_flex_dispatcher} a2a_overlap={s.moe_a2a_overlap}  "
              f"{plan.estimate.tokens_per_s_per_gpu:.0f} tokens/s/GPU predicted; EP across NVLink domains: "
              f"{'yes' if across else 'no'}")


if __name__ == "__main__":
    sys.exit(main())
