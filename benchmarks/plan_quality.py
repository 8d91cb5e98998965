"""Plan quality: for every distinct published setup (model, GPU type and count, seq, gbs, precision), autoplan's best
plan against the published strategy, both priced by the same cost model.

Prints per setup: the published strategy's predicted tokens/s/GPU and memory, autoplan's best, the predicted speedup,
and the published strategy's rank among the feasible candidates the search priced (settings it skipped as dominated
are slower than a priced setting of the same layout and are not ranked). Then the speedup distribution, and each
setup where autoplan claims more than 1.3x, with both time breakdowns side by side, to examine.

Fairness: the search keeps the published precision (fp8 fixed to what the run used) and both sides use the same
switches: the run's own gradient precision and FP8 primary weights (from its recipe, `benchmarks/recipes.py`), TP
overlap with SP, no MoE a2a overlap and no CPU offload (the search does not vary those). The published strategy
gets the least recompute that fits under the plain cost model among the search's own
recompute options (none, selective module sets, full block n, full uniform), as the search's candidates do.
Run: python -m benchmarks.plan_quality [--solver enumerate] [--limit N]"""
from __future__ import annotations

import argparse
import time
from collections import OrderedDict

import numpy as np

from autoplan.costmodel.estimate import estimate
from autoplan.solvers.api import solve
from autoplan.solvers.space import Problem
from benchmarks.published import least_recompute, load_runs


def published_setups():
    runs, _ = load_runs(policy="none")
    setups = OrderedDict()
    for r in runs:
        key = (r.model_name, r.gpu, r.cluster.num_gpus, r.workload.seq_len, r.workload.global_batch_size,
               r.precision, r.strategy.label())
        setups.setdefault(key, r)
    return list(setups.values())


def neutral(s):
    """The published strategy with the switches the search also uses."""
    return s.model_copy(update={"moe_a2a_overlap": False, "tp_comm_overlap": None, "cpu_offload_layers": 0})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--solver", default="enumerate")
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()
    setups = published_setups()
    if args.limit:
        setups = setups[: args.limit]
    speedups, not_fit, flagged = [], [], []
    t0 = time.perf_counter()
    print(f"{'setup':58} {'published':>10} {'best':>10} {'speedup':>8} {'rank':>10}  best strategy")
    for r in setups:
        pub, _ = least_recompute(r.model, r.cluster, neutral(r.strategy), r.workload)
        pub_est = estimate(r.model, r.cluster, pub, r.workload)
        domain = r.cluster.gpu.nvlink_domain_size
        # Widen the space to hold the published layout where it runs TP or EP across NVLink domains.
        allow = {"ep-outside-domain"} if r.strategy.ep * r.strategy.etp > domain else set()
        allow |= {"tp-outside-domain"} if r.strategy.tp > domain else set()
        problem = Problem(r.model, r.cluster, r.workload, allow=frozenset(allow),
                          fixed={"fp8": ["hybrid" if r.precision == "fp8" else "none"],
                                 "grad_reduce_bf16": [r.strategy.grad_reduce_bf16],
                                 "fp8_param": [r.strategy.fp8_param]})
        res = solve(problem, args.solver, top_k=1)
        name = f"{r.model_name} {r.cluster.num_gpus}x{r.gpu} s{r.workload.seq_len} b{r.workload.global_batch_size} {r.precision}"
        if not pub_est.fits:
            not_fit.append((name, pub.label(), pub_est.peak_mem_gib, pub_est.capacity_gib))
        if not res.plans:
            print(f"{name:58} {pub_est.tokens_per_s_per_gpu:>10,.0f} {'none':>10}")
            continue
        best = res.plans[0]
        sp = best.estimate.tokens_per_s_per_gpu / pub_est.tokens_per_s_per_gpu
        times = res.feasible_step_times
        rank = (int(np.searchsorted(times, pub_est.step_time_s)) + 1) if times is not None else -1
        speedups.append(sp)
        print(f"{name:58} {pub_est.tokens_per_s_per_gpu:>10,.0f} {best.estimate.tokens_per_s_per_gpu:>10,.0f} "
              f"{sp:>7.2f}x {rank:>4}/{len(times) if times is not None else 0:<5}  {best.strategy.label()}")
        if sp > 1.3:
            flagged.append((name, pub, pub_est, best))
    s = np.array(speedups)
    print(f"\n{len(s)} setups in {time.perf_counter() - t0:.1f} s. Predicted speedup of autoplan's best over the "
          f"published strategy: median {np.median(s):.2f}x, p10 {np.percentile(s, 10):.2f}x, "
          f"p90 {np.percentile(s, 90):.2f}x, max {s.max():.2f}x; <= 1.05x: {(s <= 1.05).mean():.0%}, "
          f"> 1.3x: {(s > 1.3).sum()}")
    print(f"published strategies predicted not to fit: {len(not_fit)}")
    for row in not_fit:
        print(f"  {row[0]}: {row[1]} needs {row[2]:.1f} of {row[3]:.1f} GiB")
    for name, pub, pe, best in flagged:
        print(f"\n> 1.3x: {name}\n  published {pub.label()}\n  best      {best.strategy.label()}")
        for k in pe.time_breakdown:
            a, b = pe.time_breakdown[k], best.estimate.time_breakdown[k]
            if a > 0 or b > 0:
                print(f"    {k:10} {a:8.3f} {b:8.3f}")


if __name__ == "__main__":
    main()
