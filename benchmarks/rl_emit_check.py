"""Check the settings `autoplan rl --emit` writes against the frameworks' own configuration code.

verl: the overrides are composed with Hydra onto verl's own config tree, as `python -m verl.trainer.main_ppo`
does at start-up (`--config-name ppo_megatron_trainer`, verl's pinned release EMIT_VERL.VERL_VERSION installed with
`pip install --no-deps verl==<version>` into a separate venv that also holds hydra-core; nothing of it changes
torch). Hydra refuses a key the config does not have unless it is written `+key=...` (new keys: verl's own recipes
pass Megatron's override_transformer_config / override_optimizer_config entries that way). The split-placement keys
of verl's recipes (`rollout.nnodes`, `rollout.n_gpus_per_node`) live in recipe/one_step_off_policy/config and
recipe/fully_async_policy/config, which the wheel does not ship: they are checked against those YAML files of the
same release (--verl-recipes, a folder holding recipe/ of the v<version> tag). verl's config dataclasses
(verl.workers.config) are not run: importing verl needs torch and tensordict.

slime: its parser (slime/utils/arguments.py `parse_args`) builds on Megatron-LM's training parser
(megatron.training, not in the megatron-core wheel) and SGLang's ServerArgs (sglang pins its own torch), so it
cannot run here without another torch; each emitted flag is instead looked up in the argument definitions of the
pinned sources: slime's own ("--..." literals under slime/), Megatron-LM's (under megatron/) and SGLang's ServerArgs
fields (sglang/srt/arg_groups/fields/*.py and server_args.py; slime adds them with the --sglang- prefix).

Run: python -m benchmarks.rl_emit_check --verl-python /tmp/verlcheck/bin/python --verl-recipes DIR
       --slime-src DIR --megatron-src DIR --sglang-src DIR
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Set

CASES = [  # name, autoplan rl arguments
    ("qwen3-30b-a3b grpo colocated 32xh100", ["--model", "qwen3-30b-a3b", "--cluster", "h100", "--gpus", "32",
                                              "--prompts", "256", "--samples", "8", "--prompt-len", "1024",
                                              "--response-len", "4096", "--max-response-len", "16384",
                                              "--placement", "colocated"]),
    ("qwen2.5-math-7b one-step-off 12+4xh20", ["--model", "qwen2.5-math-7b", "--set", "max_position_embeddings=32768",
                                               "--cluster", "h20", "--gpus", "16", "--host-mem-gib", "2048",
                                               "--prompts", "512", "--samples", "12", "--prompt-len", "256",
                                               "--response-len", "2048", "--max-response-len", "8192", "--no-ref",
                                               "--mini-batches", "16", "--mode", "one-step-off", "--placement",
                                               "split:8"]),
    ("qwen2.5-math-7b async 16+16xh20", ["--model", "qwen2.5-math-7b", "--set", "max_position_embeddings=32768",
                                         "--cluster", "h20", "--gpus", "32", "--host-mem-gib", "2048", "--prompts",
                                         "512", "--samples", "16", "--prompt-len", "256", "--response-len", "2048",
                                         "--max-response-len", "28672", "--no-ref", "--mini-batches", "16",
                                         "--mode", "async", "--placement", "split:16"]),
    ("deepseek-v3 grpo colocated 96xh20", ["--model", "deepseek-v3", "--set", "mtp_num_layers=0", "--cluster", "h20",
                                           "--gpus", "96", "--host-mem-gib", "2048", "--prompts", "96", "--samples",
                                           "8", "--prompt-len", "256", "--response-len", "1960",
                                           "--max-response-len", "9632", "--mini-batches", "3", "--train-strategy",
                                           "tp=8,pp=12,ep=8,offload=all", "--rollout",
                                           "tp=32,dp=1,ep=1,engines=3,gpu_memory_utilization=0.6,cuda_graphs=false",
                                           "--placement", "colocated"]),
    ("qwen2.5-math-7b ppo colocated 16xh20", ["--model", "qwen2.5-math-7b", "--set", "max_position_embeddings=32768",
                                              "--cluster", "h20", "--gpus", "16", "--host-mem-gib", "2048", "--algo",
                                              "ppo", "--prompts", "128", "--samples", "4", "--prompt-len", "256",
                                              "--response-len", "1024", "--max-response-len", "4096",
                                              "--placement", "colocated"]),
]

COMPOSE = r'''
import json, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
import yaml
spec = json.loads(sys.argv[1])
site = [p for p in sys.path if p.endswith("site-packages")][0]
conf = str(Path(site) / "verl" / "trainer" / "config")
recipe_keys = {"rollout.nnodes", "rollout.n_gpus_per_node"}
core = [o for o in spec["overrides"] if o.split("=", 1)[0] not in recipe_keys]
with initialize_config_dir(config_dir=conf, version_base=None):
    cfg = compose(config_name="ppo_megatron_trainer", overrides=core)
for o in core:
    key, value = o.split("=", 1)
    if key.startswith("+"):
        continue
    node = cfg
    for part in key.split("."):
        node = node[part]
    assert str(node) == value or str(node).lower() == value.lower(), (key, node, value)
missing = []
if spec["recipe"]:
    recipe = yaml.safe_load(Path(spec["recipe"]).read_text())
    for o in spec["overrides"]:
        key = o.split("=", 1)[0]
        if key in recipe_keys:
            node = recipe
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                missing.append(key)
print(json.dumps({"composed": len(core), "recipe_missing": missing}))
'''


def _flags_in(folder: Path, pattern: str) -> Set[str]:
    found: Set[str] = set()
    for path in folder.rglob("*.py"):
        found |= set(re.findall(pattern, path.read_text(encoding="utf-8", errors="replace")))
    return found


def _megatron_flags(src: Path) -> Set[str]:
    """'--...' literals under megatron/, and the fields of Megatron-Core's config dataclasses, from which
    megatron/training/arguments.py generates its flags (ArgumentGroupFactory over ModelParallelConfig,
    TransformerConfig and the optimizer config)."""
    flags = {f.strip("'\"") for f in _flags_in(src / "megatron", r'["\'](--[a-z0-9][a-z0-9-]*)["\']')}
    for path in (src / "megatron" / "core").rglob("*config*.py"):
        for name in re.findall(r"^\s+([a-z][a-z0-9_]*)\s*:", path.read_text(encoding="utf-8"), flags=re.M):
            flags.add("--" + name.replace("_", "-"))
    return flags


def _sglang_flags(src: Path) -> Set[str]:
    flags = {f[2:] for f in _flags_in(src / "sglang" / "srt", r'"(--[a-z0-9][a-z0-9-]*)"')}
    for path in (src / "sglang" / "srt" / "arg_groups" / "fields").glob("*.py"):
        for name in re.findall(r"^\s+([a-z][a-z0-9_]*)\s*:", path.read_text(encoding="utf-8"), flags=re.M):
            flags.add(name.replace("_", "-"))
    return flags


def emit(args_list: List[str], framework: str, out: Path) -> dict:
    cmd = ["autoplan", "rl", *args_list, "--top", "1", "--emit", framework, "--out", str(out), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout)


def check_verl(name, args_list, a, tmp: Path) -> str:
    out = tmp / f"verl-{abs(hash(name))}"
    res = emit(args_list, "verl", out)
    if "error" in res:
        return f"not emitted: {res['error']}"
    overrides = (out / "verl_overrides.txt").read_text().split("\n")
    overrides = [o for o in overrides if o]
    mode = res["job"]["mode"]
    recipe = ""
    if mode != "on-policy" and a.verl_recipes:
        sub = "one_step_off_policy/config/one_step_off_ppo_megatron_trainer.yaml" if mode == "one-step-off" else \
            "fully_async_policy/config/fully_async_ppo_megatron_trainer.yaml"
        recipe = str(Path(a.verl_recipes) / "recipe" / sub)
    if not a.verl_python:
        return "not checked (no --verl-python)"
    p = subprocess.run([a.verl_python, "-c", COMPOSE, json.dumps({"overrides": overrides, "recipe": recipe})],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return f"REJECTED: {(p.stderr.strip().splitlines() or ['?'])[-1]}"
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["recipe_missing"]:
        return f"REJECTED: recipe lacks {r['recipe_missing']}"
    extra = f", recipe keys checked in {Path(recipe).name}" if recipe else ""
    return f"accepted by Hydra compose ({r['composed']} overrides{extra})"


def check_slime(name, args_list, a, tmp: Path, known) -> str:
    out = tmp / f"slime-{abs(hash(name))}"
    res = emit(args_list + ["--engine", "sglang"], "slime", out)
    if "error" in res:
        return f"not emitted: {res['error']}"
    words = [w for w in (out / "slime_args.txt").read_text().split("\n") if w.startswith("--")]
    slime, megatron, sglang = known
    unknown = []
    for w in words:
        flag = w[2:]
        if flag.startswith("sglang-") and flag[len("sglang-"):] in sglang:
            continue
        if w in slime or w in megatron:
            continue
        unknown.append(w)
    return f"{len(words)} flags, all defined" if not unknown else f"UNKNOWN flags: {' '.join(unknown)}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--verl-python")
    ap.add_argument("--verl-recipes")
    ap.add_argument("--slime-src")
    ap.add_argument("--megatron-src")
    ap.add_argument("--sglang-src")
    a = ap.parse_args()
    known = None
    if a.slime_src and a.megatron_src and a.sglang_src:
        known = (_flags_in(Path(a.slime_src) / "slime", r'"(--[a-z0-9][a-z0-9-]*)"'),
                 _megatron_flags(Path(a.megatron_src)),
                 _sglang_flags(Path(a.sglang_src)))
    failures = 0
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for name, args_list in CASES:
            v = check_verl(name, args_list, a, tmp)
            s = check_slime(name, args_list, a, tmp, known) if known else "not checked (sources not given)"
            failures += v.startswith("REJECTED") + s.startswith("UNKNOWN")
            print(f"{name}\n  verl : {v}\n  slime: {s}")
    print(f"emit check: {failures} rejected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
