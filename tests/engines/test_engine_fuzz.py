"""Fuzz acceptance: over >= 20 (model x GPU x size) setups, every top-10 Megatron plan and top-5 DeepSpeed plan the
search returns is emitted without refusal and accepted by the engines' own checks at its world size
(benchmarks/engine_fuzz.py prints the same counts); the models whose Megatron launch is refused whatever the plan
(MODEL_REFUSED) are checked apart."""
import pytest

from benchmarks.engine_fuzz import DEEPSPEED_TOP, MEGATRON_TOP, MODEL_REFUSED, SETUPS, model_refusals, run_fuzz, summary

pytestmark = pytest.mark.slow


def test_every_searched_plan_is_accepted_by_its_engine(tmp_path):
    pytest.importorskip("megatron.core")
    pytest.importorskip("deepspeed")
    assert len(SETUPS) >= 20
    items = run_fuzz(tmp_path)
    counts = summary(items)
    problems = [f"{r.engine} {r.setup} #{r.rank} {r.label}: {r.refusal or r.verdict}"
                for rows in items.values() for r in rows if r.refusal or not (r.verdict or "").startswith("OK")]
    assert not problems, "\n".join(problems[:20])
    assert counts["megatron"]["plans"] == MEGATRON_TOP * len(SETUPS)
    assert counts["megatron"]["accepted"] == counts["megatron"]["plans"]
    # DeepSpeed runs no expert or context parallelism: the largest MoE setups can hold fewer than 5 plans; the
    # DeepSeek-V3 setups (one MTP depth, which ds_train.py does not build) hold none.
    with_plans = {r.setup for r in items["deepspeed"]}
    assert with_plans == {s for s in SETUPS if s[0] != "deepseek-v3"}
    # 128 plans over the 26 setups on 2026-12-03: every one but a large MoE setup holds DEEPSPEED_TOP.
    assert counts["deepspeed"]["accepted"] == counts["deepspeed"]["plans"] > (DEEPSPEED_TOP - 1) * len(with_plans)


def test_models_megatron_cannot_express_are_refused_and_not_searched():
    # Counted apart from the setups: the emitter refuses these models whatever the plan.
    rules = model_refusals()
    assert set(rules) == set(MODEL_REFUSED) and not {s[0] for s in SETUPS} & set(MODEL_REFUSED)
    assert "MLA YaRN rope_beta_fast=1, rope_beta_slow=1" in rules["kimi-k2"]
