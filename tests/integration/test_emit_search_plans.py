"""Every plan `autoplan plan --engine E --top 10` returns is emitted by E's emitter without refusal: the search and
the emitter read one rule of what each engine runs (integrations/engines.py)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from autoplan.cli.emit import emit_files, load_plan
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.integrations.engines import deepspeed_blocked, deepspeed_unsupported
from autoplan.strategy import Strategy
from engine_checks.plans import MIXTRAL, TINY_MOE
from conftest import deadline_s

# (model, gpu, gpus, seq, global batch): dense and MoE, 8 to 1,024 GPUs.
SETUPS = [
    ("llama3-8b", "h100", 8, 4096, 512),
    ("llama3-70b", "h100", 64, 8192, 128),
    ("gpt3-175b", "a100-80g", 128, 2048, 1536),
    ("mixtral-8x7b", "h100", 64, 4096, 512),
    ("qwen3-30b-a3b", "h100", 32, 4096, 512),
    ("qwen3-235b-a22b", "h100", 256, 4096, 512),
    ("deepseek-v3", "h800", 1024, 4096, 512),
]


def search(tmp_path, engine, model, gpu, gpus, seq, gbs):
    out = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "plan", "--model", model, "--cluster", gpu,
                          "--gpus", str(gpus), "--seq", str(seq), "--gbs", str(gbs), "--engine", engine,
                          "--top", "10", "--json"], capture_output=True, text=True, timeout=deadline_s(100))
    assert out.returncode == 0, out.stderr[-2000:]
    path = tmp_path / f"{engine}-{model}-{gpus}.json"
    path.write_text(out.stdout)
    return path, len(json.loads(out.stdout)["plans"])


@pytest.mark.parametrize("engine", ["megatron", "deepspeed"])
@pytest.mark.parametrize("setup", SETUPS, ids=[s[0] for s in SETUPS])
def test_every_searched_plan_is_emitted(tmp_path, engine, setup):
    if engine == "deepspeed" and setup[0] == "deepseek-v3":
        pytest.skip("DeepSeek-V3 trains with an MTP depth, which ds_train.py does not build: "
                    "test_deepspeed_has_no_plan_for_an_mtp_model")
    path, count = search(tmp_path, engine, *setup)
    assert count >= 5, f"{setup}: the search returned {count} plans"
    for i in range(count):
        plan = load_plan(str(path), i)
        # DeepSpeed pipeline stages run in the probe's stand-in model only: the training run builds the Hugging
        # Face model as one module and refuses pp > 1 (integrations/deepspeed.py check_training_run).
        probe = engine == "deepspeed" and plan.strategy.pp > 1
        files = emit_files(plan, engine, probe=probe)  # raises InputError on a refusal
        assert files, f"{setup} plan {i}: nothing emitted"


def test_deepspeed_moe_search_keeps_expert_parallelism_off(tmp_path):
    # The reported case: mixtral-8x7b on 64 H100 returned `tp1 pp1 ep8 mbs1 zero2`, which the emitter refused.
    path, count = search(tmp_path, "deepspeed", "mixtral-8x7b", "h100", 64, 4096, 512)
    eps = {json.loads(path.read_text())["plans"][i]["strategy"]["ep"] for i in range(count)}
    assert eps == {1}


STRATEGIES = [
    dict(), dict(ep=2), dict(ep=4, zero=2), dict(tp=2, sp=True), dict(cp=2), dict(pp=2, vpp=2), dict(fp8="hybrid"),
    dict(pp=2, zero=2), dict(pp=2, tp=2), dict(tp=4), dict(tp=2), dict(pp=2, first_stage_layers=1),
    dict(recompute="selective", recompute_modules=("core_attn", "layernorm")), dict(recompute="selective"),
    dict(pp=2, recompute="full", recompute_method="block", recompute_layers=1),
    dict(pp=2, recompute="full", recompute_method="uniform", recompute_layers=1), dict(cpu_offload_layers=1),
    dict(moe_a2a_overlap=True), dict(etp=2, tp=2), dict(zero=3), dict(tp=2, sp=True, tp_comm_overlap=True),
]


@pytest.mark.parametrize("model", [TINY_MOE, MIXTRAL], ids=["tiny-moe", "mixtral"])
def test_search_mask_and_emitter_rule_agree(model):
    strategies = [Strategy(**s) for s in STRATEGIES]
    blocked = deepspeed_blocked(layouts_from_strategies(strategies, 16, "deepspeed"), model)
    expected = np.array([deepspeed_unsupported(s, model) is not None for s in strategies])
    assert expected.any() and (~expected).any()
    assert blocked.tolist() == expected.tolist()


def test_deepspeed_has_no_plan_for_an_mtp_model():
    """DeepSeek-V3 (mtp_num_layers 1): every DeepSpeed candidate is left out by the same rule the emitter refuses,
    and the no-plan message names that rule and its way out."""
    from autoplan.modelio import load_model

    out = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "plan", "--model", "deepseek-v3", "--cluster",
                          "h800", "--gpus", "1024", "--seq", "4096", "--gbs", "512", "--engine", "deepspeed",
                          "--json"], capture_output=True, text=True, timeout=deadline_s(100))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "no deepspeed plan for deepseek-v3" in out.stderr
    assert "multi-token-prediction" in out.stderr and "mtp_num_layers=0" in out.stderr
    assert "multi-token-prediction" in deepspeed_unsupported(Strategy(), load_model("deepseek-v3"))
