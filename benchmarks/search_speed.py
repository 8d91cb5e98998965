"""Search speed: wall time (whole process, from a fresh interpreter), candidates and candidates per second for the
reference setups, over the whole space (`--precision any`: bf16 and FP8 GEMMs; the default bf16 search is the half
of it without FP8). Run: python -m benchmarks.search_speed [--solver cpsat]."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

SETUPS = [  # model, gpu, gpus, seq, gbs
    ("gpt3-175b", "a100-80g", 1024, 2048, 1536),
    ("llama3.1-405b", "h100", 16384, 8192, 2048),
    ("deepseek-v3", "h800", 2048, 4096, 15360),
    ("qwen3-235b-a22b", "h100", 256, 4096, 2048),
    ("llama3.1-405b", "h100", 131072, 8192, 16384),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--solver", default="cpsat")
    args = ap.parse_args()
    print(f"{'setup':48} {'wall s':>7} {'space':>10} {'priced':>9} {'priced/s':>10} {'best':>40}")
    for model, gpu, n, seq, gbs in SETUPS:
        t = time.perf_counter()
        out = subprocess.run(["autoplan", "plan", "--model", model, "--cluster", gpu, "--gpus", str(n), "--seq",
                              str(seq), "--gbs", str(gbs), "--solver", args.solver, "--top", "1", "--precision", "any",
                              "--json"],
                             capture_output=True, text=True)
        wall = time.perf_counter() - t
        if out.returncode not in (0, 1):
            print(f"{model} on {n} {gpu}: failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        data = json.loads(out.stdout)
        s = data["search"]
        best = data["plans"][0]["strategy"] if data["plans"] else {}
        label = " ".join(f"{k}{best[k]}" for k in ("tp", "pp", "vpp", "cp", "ep", "dp", "mbs") if k in best)
        rate = s["evaluated"] / s["wall_s"] if s["wall_s"] else float("inf")
        print(f"{model + ' / ' + str(n) + ' ' + gpu + f' s{seq} b{gbs}':48} {wall:7.2f} {s['space_size']:>10,} "
              f"{s['evaluated']:>9,} {rate:>10,.0f} {label:>40}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
