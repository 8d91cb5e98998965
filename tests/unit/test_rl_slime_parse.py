"""The slime arguments `autoplan rl --emit slime` writes, run through slime's own parser
(`slime.utils.arguments.parse_args`, with Megatron-LM's and SGLang's parsers and validation inside it).

slime's parser needs SGLang 0.5.15 (which pins its own torch) and Megatron-LM's training package, so it runs in a
separate interpreter (benchmarks/rl_emit_check.py's module doc says how that one is made and what the check
answers for the machine). The test runs where AUTOPLAN_SLIME_PYTHON (that interpreter), AUTOPLAN_SLIME_SRC (a slime
checkout holding slime/ and scripts/models/) and AUTOPLAN_SLIME_MEGATRON_SRC (Megatron-LM at slime's pinned commit)
are set and the parser imports there; elsewhere it is skipped with the reason."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.rl_emit_check import slime_parse, slime_parser_missing

PY = os.environ.get("AUTOPLAN_SLIME_PYTHON", "")
SRC = os.environ.get("AUTOPLAN_SLIME_SRC", "")
MEG = os.environ.get("AUTOPLAN_SLIME_MEGATRON_SRC", "")


def _why_not() -> str:
    if not (PY and SRC and MEG):
        return ("slime's parser is not installed here: set AUTOPLAN_SLIME_PYTHON, AUTOPLAN_SLIME_SRC and "
                "AUTOPLAN_SLIME_MEGATRON_SRC (benchmarks/rl_emit_check.py module doc)")
    missing = slime_parser_missing(PY, Path(SRC), Path(MEG))
    return f"slime's parser does not import in {PY}: {missing}" if missing else ""


WHY_NOT = _why_not()


@pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
@pytest.mark.parametrize("case", [
    ["--model", "qwen3-30b-a3b", "--cluster", "h100", "--gpus", "32", "--prompts", "256", "--samples", "8",
     "--prompt-len", "1024", "--response-len", "4096", "--max-response-len", "16384", "--placement", "colocated"],
    ["--model", "deepseek-v3", "--set", "mtp_num_layers=0", "--cluster", "h20", "--gpus", "96", "--host-mem-gib",
     "2048", "--prompts", "96", "--samples", "8", "--prompt-len", "256", "--response-len", "1960",
     "--max-response-len", "9632", "--mini-batches", "3", "--train-strategy", "tp=8,pp=12,ep=8,offload=all",
     "--rollout", "tp=32,dp=1,ep=1,engines=3,gpu_memory_utilization=0.6,cuda_graphs=false", "--placement",
     "colocated"],
], ids=["qwen3-30b-a3b-colocated", "deepseek-v3-colocated"])
def test_slime_parser_accepts_the_emitted_arguments(case, tmp_path):
    out = tmp_path / "slime"
    p = subprocess.run([str(Path(sys.executable).parent / "autoplan"), "rl", *case, "--engine", "sglang", "--top", "1",
                        "--emit", "slime", "--out", str(out), "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)["plans"][0]
    emitted = [w for w in (out / "slime_args.txt").read_text().split("\n") if w]
    script = (out / "run_slime.sh").read_text()
    env = dict(line[len("export "):].split("=", 1) for line in script.splitlines() if line.startswith("export "))
    model = case[case.index("--model") + 1]
    parsed = slime_parse(PY, Path(SRC), Path(MEG), model, emitted, tmp_path, env)
    assert "error" not in parsed, parsed.get("error")
    assert parsed["tensor_model_parallel_size"] == plan["train"]["tp"]
    assert parsed["pipeline_model_parallel_size"] == plan["train"]["pp"]
    assert parsed["expert_model_parallel_size"] == plan["train"]["ep"]
    assert parsed["rollout_num_gpus_per_engine"] == plan["rollout"]["tp"] * plan["rollout"]["dp"]
    assert parsed["colocate"] == (plan["placement"]["kind"] == "colocated")
    assert parsed["sglang_mem_fraction_static"] == plan["rollout"]["gpu_memory_utilization"]
