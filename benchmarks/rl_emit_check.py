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

slime's own parser (--slime-python): `slime.utils.arguments.parse_args` (SGLang's ServerArgs and router arguments,
Megatron-LM's training parser, then slime's, Megatron's and SGLang's validation) run on the emitted flags in a
separate interpreter that holds torch 2.13 (CPU), sglang 0.5.15.post1 and sglang-router installed with --no-deps
plus the light packages their argument modules import, with slime's sources (--slime-src, a checkout holding slime/
and scripts/models/) and Megatron-LM at slime's pinned commit (--slime-megatron-src) on its path. What the user's
own script adds is added as slime's example scripts do: the model's Megatron arguments (MODEL_ARGS of slime's
scripts/models/<model>.sh; Qwen2.5-Math-7B uses qwen2.5-7B.sh, the same architecture), a folder holding the
model's Hugging Face config.json (tests/data/hf_configs) for --hf-checkpoint and an empty one for --ref-load, and
the run length (--num-rollout 1). Three things of the check machine are answered for it, in the check process only:
torchvision (imported at module level by sglang/srt/utils/common.py and its multimodal helpers; PyPI has no CPU
build for torch 2.13) is a stand-in whose functions raise if called (argument parsing calls none) and
transformers is told it is absent; Megatron's validation asks the GPU's compute capability (grouped GEMMs, and
megatron/training/utils.py get_device_arch_version for tp/cp > 1), answered 9.0 (H100, H20); Hugging Face is read
offline.

Run: python -m benchmarks.rl_emit_check --verl-python /tmp/verlcheck/bin/python --verl-recipes DIR
       --slime-src DIR --megatron-src DIR --sglang-src DIR
       [--slime-python PY --slime-megatron-src DIR]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Set

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
    ("qwen3-next-80b-a3b (hybrid) grpo 32xh100", ["--model", "tests/data/hf_configs/qwen3_next_80b_a3b.json",
                                                  "--cluster", "h100", "--gpus", "32", "--prompts", "256",
                                                  "--samples", "8", "--prompt-len", "1024", "--response-len", "4096",
                                                  "--max-response-len", "16384"]),
    ("qwen3-next-80b-a3b (hybrid, bf16 state) grpo 16xh100", ["--model",
                                                              "tests/data/hf_configs/qwen3_next_80b_a3b.json",
                                                              "--set", "mamba_ssm_dtype=bfloat16", "--cluster",
                                                              "h100", "--gpus", "16", "--prompts", "128",
                                                              "--samples", "8", "--prompt-len", "1024",
                                                              "--response-len", "2048", "--max-response-len",
                                                              "8192"]),
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


SLIME_PARSE = r'''
import importlib.abc, importlib.machinery, json, os, sys, types
spec = json.loads(sys.argv[1])
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.update(spec["env"])


class _Absent:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        raise NotImplementedError("torchvision stand-in of the argument check")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent()


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attr(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Absent
        module.__getattr__ = attr
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StandIn())
import torch
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=9, minor=0, name="NVIDIA H100")
import transformers.utils as tu, transformers.utils.import_utils as iu
tu.is_torchvision_available = iu.is_torchvision_available = lambda: False
sys.path[:0] = [spec["slime_src"], spec["megatron_src"]]
sys.argv = ["train.py"] + spec["argv"]
from slime.utils.arguments import parse_args
args = parse_args()
keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
        "context_parallel_size", "rollout_num_gpus_per_engine", "rollout_num_gpus", "colocate", "sglang_dp_size",
        "sglang_ep_size", "sglang_mem_fraction_static", "n_samples_per_prompt", "rollout_batch_size",
        "global_batch_size")
print(json.dumps({k: getattr(args, k, None) for k in keys}))
'''

# Model -> (slime scripts/models/<script>, tests/data/hf_configs/<config.json>) for the parser check.
SLIME_MODELS = {"qwen3-30b-a3b": ("qwen3-30B-A3B.sh", "qwen3_30b_a3b.json"),
                "deepseek-v3": ("deepseek-v3.sh", "deepseek_v3.json"),
                "qwen2.5-math-7b": ("qwen2.5-7B.sh", "qwen2.5_7b.json"),
                "tests/data/hf_configs/qwen3_next_80b_a3b.json": ("qwen3-next-80B-A3B.sh", "qwen3_next_80b_a3b.json")}
HF_CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf_configs"


def slime_model_args(slime_src: Path, script: str) -> List[str]:
    """MODEL_ARGS of slime's scripts/models/<script>, as bash expands them."""
    p = subprocess.run(["bash", "-c", f'source "{slime_src / "scripts" / "models" / script}" >/dev/null; '
                       'printf "%s\\0" "${MODEL_ARGS[@]}"'], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{script}: {p.stderr.strip()}")
    return [w for w in p.stdout.split("\0") if w]


def slime_parse(python: str, slime_src: Path, megatron_src: Path, model: str, emitted: List[str],
                tmp: Path, env: Dict[str, str]) -> dict:
    """Run slime's parse_args on `emitted` (plus what the user's script adds; module doc) in `python`, with the
    environment `env` the emitted run script exports: the parsed values, or {"error": last line}."""
    script, config = SLIME_MODELS[model]
    hf = tmp / f"hf-{model}"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "config.json").write_text((HF_CONFIGS / config).read_text())
    argv = list(emitted)
    for flag, folder in (("--hf-checkpoint", hf), ("--ref-load", tmp / f"ref-{model}")):
        if flag in argv:
            folder.mkdir(parents=True, exist_ok=True)
            argv[argv.index(flag) + 1] = str(folder)
    argv = slime_model_args(slime_src, script) + argv + ["--num-rollout", "1"]
    spec = {"slime_src": str(slime_src), "megatron_src": str(megatron_src), "argv": argv, "env": env}
    p = subprocess.run([python, "-c", SLIME_PARSE, json.dumps(spec)], capture_output=True, text=True, cwd=tmp)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def slime_parser_missing(python: str, slime_src: Path, megatron_src: Path) -> str:
    """'' when `python` imports slime's parser with these sources (as SLIME_PARSE does), else why not (one line)."""
    probe = SLIME_PARSE.split("sys.argv = ")[0] + "from slime.utils.arguments import parse_args\n"
    spec = {"slime_src": str(slime_src), "megatron_src": str(megatron_src), "argv": [], "env": {}}
    try:
        p = subprocess.run([python, "-c", probe, json.dumps(spec)], capture_output=True, text=True)
    except OSError as e:
        return f"{python}: {e}"
    return "" if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1]


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
    # SGLang 0.5.15.post1 (slime's image) declares the ServerArgs fields in server_args.py itself, one per line at
    # the class body's indent, each a --flag of its name
    server_args = src / "sglang" / "srt" / "server_args.py"
    if server_args.exists():
        for name in re.findall(r"^    ([a-z][a-z0-9_]*)\s*:", server_args.read_text(encoding="utf-8"), flags=re.M):
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
    named = f"{len(words)} flags, all defined" if not unknown else f"UNKNOWN flags: {' '.join(unknown)}"
    if not a.slime_python:
        return named
    emitted = [w for w in (out / "slime_args.txt").read_text().split("\n") if w]
    model = args_list[args_list.index("--model") + 1]
    if model not in SLIME_MODELS:
        return f"{named}; slime's parse_args not run: slime has no scripts/models file for this model"
    env = dict(re.findall(r"^export (\w+)=(\S+)$", (out / "run_slime.sh").read_text(), flags=re.M))
    parsed = slime_parse(a.slime_python, Path(a.slime_src), Path(a.slime_megatron_src), model, emitted, out, env)
    if "error" in parsed:
        return f"{named}; REJECTED by slime's parse_args: {parsed['error']}"
    return f"{named}; accepted by slime's parse_args (tp {parsed['tensor_model_parallel_size']}, pp " \
           f"{parsed['pipeline_model_parallel_size']}, ep {parsed['expert_model_parallel_size']}, engine GPUs " \
           f"{parsed['rollout_num_gpus_per_engine']}, colocate {parsed['colocate']})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--verl-python")
    ap.add_argument("--verl-recipes")
    ap.add_argument("--slime-src")
    ap.add_argument("--megatron-src")
    ap.add_argument("--sglang-src")
    ap.add_argument("--slime-python", help="interpreter that can import slime's parser (module doc)")
    ap.add_argument("--slime-megatron-src", help="Megatron-LM at slime's pinned commit (holds megatron/)")
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
            failures += v.startswith("REJECTED") + s.startswith("UNKNOWN") + ("REJECTED" in s)
            print(f"{name}\n  verl : {v}\n  slime: {s}")
    print(f"emit check: {failures} rejected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
