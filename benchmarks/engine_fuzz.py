"""Do the engines accept what autoplan emits? For each (model, GPU, size) setup: the top-10 plans of the Megatron
search and the top-5 of the DeepSpeed search are emitted, then checked by the engines' own code on a fake process
group of the plan's world size (tests/engine_checks: megatron-core `initialize_model_parallel` + TransformerConfig,
DeepSpeed `DeepSpeedConfig` with its pipeline/AutoTP topology). Prints the counts; the goal is 0 rejections.
Models whose Megatron-LM launch the emitter refuses whatever the plan (`MODEL_REFUSED`: a setting pretrain_gpt.py has
no argument for) are not searched; the fuzz checks that they are still refused and prints the rule apart.

    python -m benchmarks.engine_fuzz [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ROOT / "tests" / "engine_checks"

# (model, GPU, GPUs, sequence length, global batch): dense and MoE, GQA/MHA/MLA, 8 to 2,048 GPUs, six GPU types.
SETUPS: List[Tuple[str, str, int, int, int]] = [
    ("llama3-8b", "h100", 8, 8192, 128),
    ("llama3-8b", "mi300x", 8, 8192, 128),
    ("llama3.1-8b", "b200", 16, 8192, 128),
    ("llama2-7b", "a100-80g", 16, 4096, 256),
    ("llama2-13b", "a100-40g", 32, 4096, 256),
    ("llama3-70b", "h100", 64, 8192, 128),
    ("llama3.1-70b", "h200", 128, 8192, 256),
    ("llama2-70b", "a100-80g", 256, 4096, 1024),
    ("qwen2.5-72b", "h100", 64, 8192, 128),
    ("llama3.1-405b", "h100", 1024, 8192, 512),
    ("gpt3-175b", "a100-80g", 1024, 2048, 1536),
    ("gpt3-20b", "a100-40g", 64, 2048, 512),
    ("gpt-1.7b", "a100-40g", 8, 2048, 64),
    ("nemotron-4-340b", "h100", 512, 4096, 512),
    ("mixtral-8x7b", "h100", 64, 4096, 512),
    ("mixtral-8x7b", "a100-80g", 32, 4096, 256),
    ("mixtral-8x22b", "h100", 256, 4096, 512),
    ("qwen3-30b-a3b", "h100", 32, 4096, 512),
    ("qwen3-30b-a3b", "b200", 8, 4096, 256),
    ("qwen3-235b-a22b", "h100", 256, 4096, 512),
    ("gpt-oss-120b", "h100", 64, 4096, 256),
    ("deepseek-v3", "h800", 1024, 4096, 512),
    ("deepseek-v3", "h800", 2048, 4096, 1024),  # 2,048 GPUs of MLA + MoE (Kimi-K2 is in MODEL_REFUSED)
    # Few micro-batches per pipeline: interleaved plans must still give Megatron's schedule whole groups of pp.
    ("qwen3-30b-a3b", "h100", 64, 4096, 128),
    ("qwen3-30b-a3b", "h100", 128, 4096, 64),
    ("mixtral-8x7b", "h100", 128, 4096, 128),
    ("llama3-70b", "h100", 256, 8192, 64),
    # A GPU count that does not fill whole nodes (31 x 8 + 4 A100).
    ("llama2-70b", "a100-80g", 252, 4096, 504),
]
MEGATRON_TOP, DEEPSPEED_TOP = 10, 5
# Kimi-K2: HF rope_scaling beta_fast=1, beta_slow=1, and MLATransformerConfig fixes 32 and 1 with no argument.
MODEL_REFUSED: List[str] = ["kimi-k2"]


@dataclass
class Emitted:
    """One emitted plan: which setup and rank, the world size and the file the engine check reads."""

    engine: str
    setup: Tuple[str, str, int, int, int]
    rank: int
    label: str
    world: int
    path: Optional[Path]  # None when the emitter refused the plan
    refusal: Optional[str] = None
    verdict: Optional[str] = None  # the engine check's line: 'OK ...' or 'REJECTED ...'


def search(setup, engine: str, top: int):
    """The plans `autoplan plan --engine ENGINE --precision any --top TOP` returns for the setup: bf16 and FP8 plans,
    so that the FP8 flags are checked by the engines too."""
    from autoplan.cli.common import load_inputs
    from autoplan.solvers.api import solve
    from autoplan.solvers.space import Problem

    model, gpu, gpus, seq, gbs = setup
    m, c, wl = load_inputs(model, None, gpu, gpus, seq, gbs)
    return solve(Problem(m, c, wl, engine=engine, precision="any"), "cpsat", top_k=top).plans


def emit(setup, engine: str, top: int, folder: Path) -> List[Emitted]:
    """Emit each plan of the search; the emitter's refusals are recorded, not raised."""
    from autoplan.errors import InputError
    from autoplan.integrations.deepspeed import deepspeed_config
    from autoplan.integrations.megatron import emit_megatron

    out = []
    for rank, plan in enumerate(search(setup, engine, top)):
        name = f"{engine}-{setup[0]}-{setup[1]}-{setup[2]}-{rank}"
        item = Emitted(engine, setup, rank, plan.strategy.label(), plan.cluster.num_gpus, None)
        try:
            if engine == "megatron":
                text = emit_megatron(plan)["megatron_args.txt"]
                item.path = folder / f"{name}.txt"
            else:
                text = json.dumps(deepspeed_config(plan), indent=1)
                item.path = folder / f"{name}.json"
            item.path.write_text(text)
        except InputError as e:
            item.refusal = str(e)
        out.append(item)
    return out


def check_env() -> dict:
    """The environment of an engine check process. A DeepSpeed check calls `deepspeed.init_distributed`, which
    loads DeepSpeed's shared-memory comm op and JIT-builds it in a fresh environment (integrations/ds_ops.py:
    minutes on a loaded 2-core host); in torch's default build folder, shared by every environment with the same
    Python, environments rebuild each other's op on each start. So checks use this interpreter's own folder
    (integrations/extlocks.py `environment_root`)."""
    from autoplan.integrations.extlocks import with_own_build_folder

    return with_own_build_folder(dict(os.environ), sys.executable)


def engine_check(script: str, args: List[str], timeout_s: Optional[float]) -> subprocess.CompletedProcess:
    """`python tests/engine_checks/<script> *args` in ROOT. For a DeepSpeed check (args[1] is a DeepSpeed config)
    its ops are built first by `python -m autoplan.integrations.ds_ops` (ds_ops.prepare_args, the probe's
    preparation step), with no deadline: build time is not check time, and a stale build lock ends that step with
    its one-line message instead of a wait with no end."""
    from autoplan.integrations.ds_ops import prepare_args

    env = check_env()
    if script.startswith("deepspeed") and len(args) > 1:
        built = subprocess.run([sys.executable, *prepare_args(args[1])], capture_output=True, text=True, cwd=ROOT,
                               env=env)
        if built.returncode != 0:
            raise RuntimeError(f"building DeepSpeed's ops failed (exit {built.returncode}): "
                               f"{(built.stdout + built.stderr).strip()[-500:]}")
    return subprocess.run([sys.executable, str(CHECKS / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT, env=env)


def run_check(script: str, items: List[Emitted], timeout_s: float = 900) -> None:
    """Run one engine check over every emitted file (one process: the fake process group is global state)."""
    todo = [i for i in items if i.path is not None]
    if not todo:
        return
    done = engine_check(script, [str(x) for i in todo for x in (i.world, i.path)], timeout_s)
    verdicts = {}
    for line in done.stdout.splitlines():
        if line.startswith(("OK ", "REJECTED ")):
            path = line.split(" ", 1)[1].split(":")[0].split(" ")[0]
            verdicts[path] = line
    for i in todo:
        i.verdict = verdicts.get(str(i.path), f"REJECTED {i.path}: the check did not finish "
                                                f"(exit {done.returncode}: {done.stderr.strip()[-300:]})")


def run_fuzz(folder: Path, setups=SETUPS) -> Dict[str, List[Emitted]]:
    """{engine: emitted plans with the emitter's refusal or the engine check's verdict}."""
    folder.mkdir(parents=True, exist_ok=True)
    items: Dict[str, List[Emitted]] = {"megatron": [], "deepspeed": []}
    for setup in setups:
        items["megatron"] += emit(setup, "megatron", MEGATRON_TOP, folder)
        items["deepspeed"] += emit(setup, "deepspeed", DEEPSPEED_TOP, folder)
    run_check("megatron_check.py", items["megatron"])
    run_check("deepspeed_check.py", items["deepspeed"])
    return items


def model_refusals(models=MODEL_REFUSED) -> Dict[str, Optional[str]]:
    """{model: the Megatron emitter's model-level rule, or None when the model is now emittable}."""
    from autoplan.integrations.megatron import inexpressible_problem
    from autoplan.modelio import load_model

    return {name: inexpressible_problem(load_model(name)) for name in models}


def summary(items: Dict[str, List[Emitted]]) -> Dict[str, Dict[str, int]]:
    """Per engine: plans, emitter refusals, engine rejections, accepted."""
    out = {}
    for engine, rows in items.items():
        refused = sum(1 for r in rows if r.refusal)
        rejected = sum(1 for r in rows if r.verdict and r.verdict.startswith("REJECTED"))
        accepted = sum(1 for r in rows if r.verdict and r.verdict.startswith("OK"))
        out[engine] = {"plans": len(rows), "emitter_refusals": refused, "engine_rejections": rejected,
                       "accepted": accepted}
    return out


def _setups_with_fewer_plans(items: Dict[str, List[Emitted]], setups) -> Dict[str, List[str]]:
    """Setups whose search returned some plans but fewer than the engine's top count."""
    top = {"megatron": MEGATRON_TOP, "deepspeed": DEEPSPEED_TOP}
    out = {}
    for engine, rows in items.items():
        counts = {s: sum(1 for r in rows if r.setup == s) for s in setups}
        out[engine] = [f"{s[0]} / {s[2]} x {s[1]} ({n})" for s, n in counts.items() if 0 < n < top[engine]]
    return out


def _setups_without_plans(items: Dict[str, List[Emitted]], setups) -> Dict[str, List[str]]:
    return {engine: [f"{s[0]} / {s[2]} x {s[1]}" for s in setups if not any(r.setup == s for r in rows)]
            for engine, rows in items.items()}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="Folder for the emitted files (default: a temporary folder).")
    args = p.parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        items = run_fuzz(Path(args.out or tmp))
        print(f"engine fuzz: {len(SETUPS)} setups (model x GPU x size), top {MEGATRON_TOP} Megatron and top "
              f"{DEEPSPEED_TOP} DeepSpeed plans each, checked by megatron-core / DeepSpeed on fake process groups")
        for engine, counts in summary(items).items():
            print(f"  {engine:9s} plans {counts['plans']:4d}  emitter refusals {counts['emitter_refusals']:3d}  "
                  f"engine rejections {counts['engine_rejections']:3d}  accepted {counts['accepted']:4d}")
        for name, rule in model_refusals().items():
            print(f"  megatron model-level refusal (not searched): {name}: "
                  f"{rule or 'NOT REFUSED any more: move it into SETUPS'}")
        for engine, names in _setups_without_plans(items, SETUPS).items():
            if names:
                print(f"  {engine}: no plan fits for {', '.join(names)}")
        for engine, names in _setups_with_fewer_plans(items, SETUPS).items():
            if names:
                print(f"  {engine}: fewer than the top count of plans for {', '.join(names)}")
        for rows in items.values():
            for r in rows:
                if r.refusal or (r.verdict and not r.verdict.startswith("OK")):
                    print(f"  {r.engine} {r.setup[0]} {r.setup[2]}x{r.setup[1]} #{r.rank} {r.label}: "
                          f"{r.refusal or r.verdict}")
    print(f"wall time {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
