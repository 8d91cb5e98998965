"""Read every Megatron-LM example a user may hand to `autoplan estimate --from-megatron`, from a whole checkout:
the launch scripts under examples/ that run a pretrain_*.py entry, and the model fragments under
examples/post_training/modelopt/conf and examples/rl/model_configs. Each is estimated with one job from the command
line (a fragment: --gpus --gbs --seq --cluster; a launch script keeps its own, see `estimate`), and the counts are
printed: priced (fits or not at that job) and refused, with each refusal's one-line reason.

    python -m benchmarks.import_megatron_examples TREE [--commit SHA] [--gpus 256] [--gbs 512] [--seq 4096]
        [--cluster h100]

TREE is a Megatron-LM checkout or an extraction of one (`git archive HEAD examples | tar -x -C TREE`); symbolic
links are followed as the shell follows them.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import List, Optional, Tuple

FRAGMENT_DIRS = ("examples/post_training/modelopt/conf", "examples/rl/model_configs")


def example_files(tree: Path) -> List[Tuple[str, Path]]:
    """(kind, path) of every file read: 'launch' (runs a pretrain_*.py) or 'fragment'."""
    from autoplan.integrations.megatron_flags import launch_words

    out = []
    for path in sorted((tree / "examples").rglob("*.sh")):
        rel = path.relative_to(tree).as_posix()
        if rel.startswith(FRAGMENT_DIRS):
            out.append(("fragment", path))
            continue
        try:
            entry = launch_words(path.read_text(errors="replace")).entry
        except Exception:  # a file the reader cannot split is listed by the estimate below, not here
            entry = None
        if entry:
            out.append(("launch", path))
    return out


def estimate(path: Path, kind: str, gpus: int, gbs: int, seq: int, cluster: str) -> Tuple[str, str]:
    """('fits' | 'does not fit' | 'refused', detail) of `autoplan estimate --from-megatron path` with the job: a
    fragment takes the whole job from the command line; a launch script keeps its own batch, sequence and launcher
    size, and gets --gpus only when its launcher is too small for its own layout (one node of a larger job)."""
    from autoplan.integrations.importers import parse_megatron_flags

    args = ["autoplan", "estimate", "--from-megatron", str(path), "--cluster", cluster, "--json"]
    try:
        flags, world = parse_megatron_flags(path.read_text(errors="replace"))
    except Exception:
        flags, world = {}, {}
    if kind == "fragment" or "global-batch-size" not in flags:
        args += ["--gbs", str(gbs)]
    if kind == "fragment" or "seq-length" not in flags:
        # a sequence the model's positions hold: Megatron asserts max_position_embeddings >= seq_length
        limit = flags.get("max-position-embeddings")
        args += ["--seq", str(min(seq, int(limit)) if limit and limit.isdigit() else seq)]
    if kind == "fragment" or not world:
        args += ["--gpus", str(gpus)]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0 and "pass --gpus" in run.stderr and "--gpus" not in args:
        run = subprocess.run(args + ["--gpus", str(gpus)], capture_output=True, text=True)
    if run.returncode == 0:
        out = json.loads(run.stdout[run.stdout.index("{"):])
        label = "fits" if out["fits"] else "does not fit"
        st = out["strategy"]
        return label, f"{out['dp'] * st['tp'] * st['pp'] * st.get('cp', 1)} GPUs, tp{st.get('tp')} pp{st.get('pp')} " \
                      f"vpp{st.get('vpp')} ep{st.get('ep')} mbs{st.get('mbs')}, {out['step_time_s']:.2f} s/step, " \
                      f"peak {out['peak_mem_gib']:.1f} of {out['capacity_gib']:.1f} GiB"
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("autoplan: error:")]
    return "refused", (lines[-1][len("autoplan: error: "):] if lines else run.stderr.strip()[-300:])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path)
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--gbs", type=int, default=512)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--cluster", default="h100")
    parser.add_argument("--commit", default="", help="the commit an extracted tree came from (printed)")
    a = parser.parse_args(argv)
    commit = subprocess.run(["git", "-C", str(a.tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    print(f"tree {a.tree} (commit {a.commit or commit.stdout.strip() or 'unknown'}); --cluster {a.cluster}; fragments: "
          f"--gpus {a.gpus} --gbs {a.gbs} --seq {a.seq} (or the model's max positions when fewer); launch scripts: "
          f"their own batch, sequence and launcher size, --gbs/--seq where they lack them, --gpus {a.gpus} where the "
          f"launcher is too small for the layout")
    counts: Counter = Counter()
    for kind, path in example_files(a.tree):
        result, detail = estimate(path, kind, a.gpus, a.gbs, a.seq, a.cluster)
        counts[(kind, result)] += 1
        print(f"{kind:8s} {result:12s} {path.relative_to(a.tree).as_posix()}: {detail}")
    print()
    for kind in ("launch", "fragment"):
        total = sum(v for (k, _), v in counts.items() if k == kind)
        parts = ", ".join(f"{r} {counts[(kind, r)]}" for r in ("fits", "does not fit", "refused"))
        print(f"{kind}: {total} files: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
