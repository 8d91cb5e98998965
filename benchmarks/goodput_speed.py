"""Cost of goodput in the search: Llama-3.1-405B on 16,384 H100 (seq 8192, gbs 2048).

1. `autoplan plan --objective goodput` and the default `autoplan plan` as a user runs them (a fresh process, table
   output): wall and CPU seconds (the CPU time is what the wall time is on an idle machine), median of --repeats.
2. In-process: the default search (`solve`, cpsat) and what goodput adds to it (the checkpoint sizes and goodput of
   the plans it returns: `evaluate(every_rank=True)` with and without them); then pricing every legal candidate
   (`solvers.common.price`) under each objective.
3. `goodput_terms` alone over a million candidates: microseconds per candidate.

    python -m benchmarks.goodput_speed [--repeats 3]"""
from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import time

import numpy as np

CMD = ["autoplan", "plan", "--model", "llama3.1-405b", "--cluster", "h100", "--gpus", "16384", "--seq", "8192",
       "--gbs", "2048", "--objective", "goodput"]


def _median(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    for cmd in (CMD, CMD[:-2]):
        runs = []
        for _ in range(a.repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            runs.append((time.perf_counter() - t, cpu))
        wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        print(f"1. {' '.join(cmd)}: {wall:.2f} s wall, {cpu:.2f} s CPU (fresh process, median of {a.repeats}; "
              f"load average {open('/proc/loadavg').read().split()[0]})")

    from dataclasses import replace

    from autoplan.clusterio import load_cluster
    from autoplan.costmodel.estimate import evaluate
    from autoplan.costmodel.goodput import cluster_goodput
    from autoplan.costmodel.layout import layouts_from_strategies
    from autoplan.modelio import load_model
    from autoplan.solvers.api import solve
    from autoplan.solvers.common import price
    from autoplan.solvers.space import Problem, enumerate_grid
    from autoplan.workload import make_workload

    c = load_cluster("h100", 16384)
    problem = Problem(load_model("llama3.1-405b", ()), c, make_workload(8192, 2048))
    result = solve(problem, "cpsat")
    search = _median(lambda: solve(problem, "cpsat"), a.repeats)
    top = layouts_from_strategies([p.strategy for p in result.plans], c.num_gpus, gpu_id="h100")
    args = (problem.model, c, problem.workload, top)
    many = max(20, a.repeats)  # a few milliseconds each: more repeats to see the difference
    without = _median(lambda: evaluate(*args, every_rank=True, checkpoints=False), many)
    with_ = _median(lambda: evaluate(*args, every_rank=True), many)
    ev = evaluate(*args, every_rank=True)
    terms = _median(lambda: cluster_goodput(c, ev.step_time_s, ev.checkpoint_local_bytes,
                                            ev.checkpoint_unique_bytes), many)
    added = max(with_ - without, 0.0) + terms
    print(f"2. default search (cpsat, {result.evaluated:,} priced): {search:.3f} s; goodput of its "
          f"{len(result.plans)} plans adds {added * 1e3:.1f} ms ({added / search:.2%})")
    lay = enumerate_grid(problem).layouts
    plain = _median(lambda: price(problem, lay), a.repeats)
    good = _median(lambda: price(replace(problem, objective="goodput"), lay), a.repeats)
    print(f"   price all {len(lay):,} legal candidates: {plain:.3f} s throughput, {good:.3f} s goodput "
          f"(goodput {good / plain - 1:+.1%}; it adds the checkpoint sizes of every sampled rank and the goodput "
          f"terms)")
    n = 1_000_000
    step, local, unique = np.full(n, 5.4), np.full(n, 6e9), np.full(n, 3e8)
    per = _median(lambda: cluster_goodput(c, step, local, unique), a.repeats) / n
    print(f"3. goodput terms: {per * 1e6:.3f} us per candidate ({n:,} at once)")


if __name__ == "__main__":
    main()
