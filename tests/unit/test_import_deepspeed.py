"""Reading DeepSpeed configs; emit -> import round trips."""
import json

import pytest

from autoplan.errors import InputError
from autoplan.integrations.deepspeed import emit_deepspeed
from autoplan.integrations.importers import from_deepspeed_config
from autoplan.strategy import strategy_from_mapping
from autoplan.workload import Workload
from engine_checks.plans import LLAMA_8B, TINY, golden_plans, make_plan

ROUND_TRIP = {name: plan for name, (plan, engine) in golden_plans().items() if engine == "deepspeed"}
ROUND_TRIP.update({
    "zero0": make_plan(TINY, 4, 64, 16, zero=0, mbs=2),
    "bf16_grads": make_plan(TINY, 4, 64, 16, zero=1, grad_reduce_bf16=True),
    "autotp_zero2": make_plan(LLAMA_8B, 16, 4096, 64, tp=2, zero=2, overlap_grad_reduce=False),
    "pipe_recompute_2": make_plan(TINY, 8, 64, 32, pp=2, zero=1, recompute="full", recompute_layers=2),
})


@pytest.mark.parametrize("case", sorted(ROUND_TRIP))
def test_round_trip(case, tmp_path):
    plan = ROUND_TRIP[case]
    # The probe's files: the training run has no pipeline stages (ds_hf_train.py), the config is the same.
    (tmp_path / "ds_config.json").write_text(emit_deepspeed(plan, probe=True)["ds_config.json"])
    imported = from_deepspeed_config(tmp_path / "ds_config.json", plan.model, plan.cluster.num_gpus,
                                     seq_len=plan.workload.seq_len)
    assert imported.model == plan.model and imported.world_size == plan.cluster.num_gpus
    # DeepSpeed has one switch, overlap_comm, for the gradient reduction and the weight gathers.
    expected = plan.strategy.model_copy(update={"overlap_param_gather": plan.strategy.overlap_grad_reduce}) \
        if plan.strategy.zero else plan.strategy
    assert strategy_from_mapping(imported.strategy) == expected
    assert imported.workload == plan.workload


def test_batch_derived_from_micro_and_accumulation(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                                "zero_optimization": {"stage": 2}}))
    imported = from_deepspeed_config(path, TINY, 8)
    assert imported.global_batch_size == 64 and imported.workload is None
    assert strategy_from_mapping(imported.strategy).zero == 2
    assert from_deepspeed_config(path, TINY, 8, seq_len=128).workload == Workload(seq_len=128, global_batch_size=64)


@pytest.mark.parametrize("config, message", [
    ({"train_batch_size": 63, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4},
     "train_batch_size=63 != micro 2 x gas 4 x dp 8"),
    ({"train_batch_size": 16, "zero_optimisation": {"stage": 3}}, "did you mean 'zero_optimization'"),
    ({"train_batch_size": 16, "pipeline": {"stages": 3}}, "not divisible by autotp_size*stages"),
    ({"train_micro_batch_size_per_gpu": "two"}, "must be a non-negative integer"),
])
def test_bad_configs_are_one_line_errors(config, message, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    with pytest.raises(InputError) as err:
        from_deepspeed_config(path, TINY, 8)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        from_deepspeed_config(tmp_path / "none.json", TINY, 8)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        from_deepspeed_config(tmp_path / "bad.json", TINY, 8)
