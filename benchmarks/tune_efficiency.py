"""How well `tune` finds the best plan compared with probing every plan.

On CPU with real DeepSpeed probes (gloo) of a tiny model: probe every runnable plan of the space once (the
exhaustive sweep), then run `tune` from scratch on a fresh study; print the regret (1 - best measured by tune /
best measured by the sweep, in tokens/s/device) and tune's probe time as a fraction of the sweep's.
Target: regret <= 3% at <= 20% of the sweep's probe time. CPU timings are noisy (several % between repeats).

    python benchmarks/tune_efficiency.py [--gpus 2] [--fix recompute=none] [--trial-fraction 0.2] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from autoplan.clusterio import load_cluster
from autoplan.integrations.probe import run_probe
from autoplan.modelio import load_model
from autoplan.solvers.space import Problem
from autoplan.strategy import parse_strategy_text
from autoplan.tuning.candidates import build_candidates, plan_of
from autoplan.tuning.study import run_tune
from autoplan.workload import Workload

TINY = Path(__file__).resolve().parent.parent / "tests" / "data" / "tiny.json"


def sweep(problem: Problem, out: Path, iters: int, warmup: int, timeout_s: float):
    candidates, _ = build_candidates(problem)
    rows = []
    for i, cand in enumerate(candidates):
        res = run_probe(plan_of(problem, cand), engine=problem.engine, out_dir=out / f"sweep-{i:03d}", iters=iters,
                        warmup=warmup, launcher="local", timeout_s=timeout_s)
        rows.append({"label": cand.strategy.label(), "status": res.status, "wall_s": res.wall_time_s,
                     "tokens_per_s_per_gpu": res.tokens_per_s_per_gpu,
                     "predicted_tokens_per_s_per_gpu": cand.estimate.tokens_per_s_per_gpu})
        print(f"sweep {i + 1}/{len(candidates)} {rows[-1]['label']}: {res.status} "
              f"{res.tokens_per_s_per_gpu or 0:.1f} tokens/s/device ({res.wall_time_s:.1f} s)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--fix", default="recompute=none", help="strategy keys fixed for the whole space")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--trial-fraction", type=float, default=0.2, help="tune trials as a fraction of the sweep")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="tune-efficiency-"))
    problem = Problem(model=load_model(str(TINY)), cluster=load_cluster("cpu", args.gpus),
                      workload=Workload(seq_len=args.seq, global_batch_size=args.gbs), engine="deepspeed",
                      fixed=parse_strategy_text(args.fix) if args.fix else {})
    start = time.monotonic()
    rows = sweep(problem, out / "sweep", args.iters, args.warmup, args.timeout)
    sweep_probe_s = sum(r["wall_s"] for r in rows)
    best_sweep = max((r for r in rows if r["status"] == "ok"), key=lambda r: r["tokens_per_s_per_gpu"])
    trials = max(1, math.floor(args.trial_fraction * len(rows)))
    report = run_tune(problem, trials=trials, out_dir=out / "tune", iters=args.iters, warmup=args.warmup,
                      launcher="local", probe_timeout_s=args.timeout,
                      log=lambda s: print(s, flush=True))
    tune_best = report.best["measured_tokens_per_s_per_gpu"] if report.best else 0.0
    # The same plan measured by the sweep too: regret against the sweep's own figure for it removes run-to-run
    # noise from the comparison of which plan was picked.
    sweep_figure = {r["label"]: r["tokens_per_s_per_gpu"] for r in rows}
    picked_in_sweep = sweep_figure.get(report.best["label"]) if report.best else None
    summary = {
        "space": len(rows), "tune_trials": trials, "sweep_probe_s": sweep_probe_s, "tune_probe_s": report.probe_time_s,
        "probe_time_fraction": report.probe_time_s / sweep_probe_s,
        "best_sweep": best_sweep, "tune_best": report.best,
        "regret_measured_by_tune": 1 - tune_best / best_sweep["tokens_per_s_per_gpu"],
        "regret_same_measurement": (1 - picked_in_sweep / best_sweep["tokens_per_s_per_gpu"])
        if picked_in_sweep else None,
        "sweep_rank_of_tune_pick": sorted((r["tokens_per_s_per_gpu"] or 0 for r in rows), reverse=True).index(
            picked_in_sweep) + 1 if picked_in_sweep else None,
        "corrections": report.corrections, "wall_s": time.monotonic() - start,
    }
    (out / "tune_efficiency.json").write_text(json.dumps({"summary": summary, "sweep": rows}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
