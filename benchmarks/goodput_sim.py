"""Monte-Carlo check of the goodput closed form (autoplan/costmodel/goodput.py) over a grid of job MTBF x checkpoint
cost, for blocking and asynchronous saves.

The simulator plays the rules the closed form is derived from, one failure at a time (a renewal process, so the
useful-time fraction is the ratio of the sums over cycles): failures are Poisson with mean gap M and strike during
training, saves and restarts alike; training runs segments of tau seconds of work followed by a save that stalls it
delta seconds; a blocking save is durable when its stall ends, an asynchronous one P seconds later, and a failure
before that rolls back to the checkpoint before; while an asynchronous save is written in the background the steps
run at (1 - s) of their speed (s = ResilienceSpec.async_overlap_slowdown), so a segment that follows a save takes
tau + s P of wall time to do tau of work and the first segment after a restart (nothing in flight) takes tau; a
failure costs a restart of R seconds, which a failure during it starts over. The closed form (Daly 2006's T(tau)
with delta + s P for delta and R + (1 - s) P for R; autoplan/costmodel/goodput.py) is exact for these rules when
P <= tau, so the table shows the Monte-Carlo noise and any slip in the derivation or the code.

    python benchmarks/goodput_sim.py [--failures 40000] [--seed 0] [--out benchmarks/results/goodput_sim.md]

Prints one row per grid point and exits 1 when any differs from the closed form by more than 0.5 goodput points."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from autoplan.costmodel.goodput import daly_interval, daly_terms, overlap_loss, useful_fraction
from autoplan.resilience import ASYNC_OVERLAP_SLOWDOWN

TOLERANCE_POINTS = 0.5
MTBF_H = (0.5, 1.0, 3.0, 12.0, 48.0)
CHECKPOINT_S = (1.0, 10.0, 60.0, 300.0)
RESTART_S = 600.0  # R = 10 min, as in Daly 2006's worked cases (figs. 3-5)
# An asynchronous save's stall as a share of its write: the device-to-host copy at PCIe Gen5 (~55 GB/s,
# GpuSpec.host_bandwidth_gbytes_per_s) against a rank's share of the store, between the node limit (25 GB/s over 8
# GPUs, ~3 GB/s: 1/18) and the aggregate limit at 16,384 GPUs (2 TB/s, ~0.12 GB/s per rank: 1/450); ResilienceSpec.
ASYNC_STALL_SHARE = 0.02


def simulate(tau: float, delta: float, persist: float, restart: float, mtbf: float, failures: int,
             rng: np.random.Generator, slowdown: float = 0.0) -> float:
    """Useful-time fraction of `failures` failure cycles: work kept / wall time. Each save's background write of
    `persist` seconds slows the steps after it to (1 - slowdown) of their speed; nothing is in flight after a
    restart, so the first segment's work runs at full speed."""
    first = tau + delta  # work, then the stall of the first save after a restart
    later = tau + slowdown * persist + delta  # the work of tau, slowed for `persist` s by the save before it
    up = rng.exponential(mtbf, failures)  # time from the end of a restart to the next failure
    # segments whose save stall ended before the failure, and how far into the next one the failure struck
    done = np.where(up < first, 0.0, 1.0 + np.floor((up - first) / later))
    into = np.where(up < first, up, up - first - (done - 1) * later)
    # An asynchronous save is durable `persist` after its stall: a failure sooner loses that segment too.
    kept = np.where((done >= 1) & (into < persist), done - 1, done) * tau
    wall = up + _restarts(restart, mtbf, failures, rng)
    return float(kept.sum() / wall.sum())


def _restarts(restart: float, mtbf: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Time of n restarts of `restart` seconds that a failure during them starts over."""
    total = np.zeros(n)
    pending = np.arange(n)
    while len(pending):
        gap = rng.exponential(mtbf, len(pending))
        ok = gap >= restart
        total[pending] += np.where(ok, restart, gap)
        pending = pending[~ok]
    return total


def grid(failures: int, seed: int):
    """Rows (method, MTBF h, delta s, P s, slowdown, tau s, closed form %, simulated %, difference in points).
    Asynchronous rows are run without and with the default overlap slowdown (ResilienceSpec)."""
    rng = np.random.default_rng(seed)
    rows = []
    for method, slowdown in (("blocking", 0.0), ("async", 0.0), ("async", ASYNC_OVERLAP_SLOWDOWN)):
        for mtbf_h in MTBF_H:
            mtbf = mtbf_h * 3600.0
            for cost in CHECKPOINT_S:
                delta, persist = (cost, 0.0) if method == "blocking" else (cost * ASYNC_STALL_SHARE, cost)
                stall, restart = daly_terms(delta, persist, float(overlap_loss(persist, slowdown)), RESTART_S)
                tau = float(max(daly_interval(stall, mtbf), persist))  # as goodput_terms, without whole steps
                closed = 100 * float(useful_fraction(tau, stall, restart, mtbf))
                sim = 100 * simulate(tau, delta, persist, RESTART_S, mtbf, failures, rng, slowdown)
                rows.append((method, mtbf_h, delta, persist, slowdown, tau, closed, sim, sim - closed))
    return rows


def table(rows, failures: int, seed: int) -> str:
    head = (f"Goodput: closed form vs Monte-Carlo ({failures:,} failures per point, seed {seed}, restart "
            f"{RESTART_S:.0f} s, tolerance {TOLERANCE_POINTS} points)\n\n"
            "| method | MTBF h | stall s | durable after s | overlap slowdown | interval s | closed form % | "
            "simulated % | diff pts |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    body = "".join(f"| {m} | {h:g} | {d:g} | {p:g} | {w:.3f} | {t:,.0f} | {c:.2f} | {s:.2f} | {x:+.2f} |\n"
                   for m, h, d, p, w, t, c, s, x in rows)
    worst = max(abs(r[-1]) for r in rows)
    return head + body + f"\nlargest difference: {worst:.2f} points\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--failures", type=int, default=400_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="Also write the table here (markdown).")
    a = ap.parse_args(argv)
    rows = grid(a.failures, a.seed)
    text = table(rows, a.failures, a.seed)
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 0 if max(abs(r[-1]) for r in rows) <= TOLERANCE_POINTS else 1


if __name__ == "__main__":
    sys.exit(main())
