"""DeepSpeed emitter: golden files, what DeepSpeed cannot run, the top-level key allow-list, the launch files."""
import json
import subprocess

import pytest

from autoplan.errors import InputError
from autoplan.integrations.deepspeed import deepspeed_config, emit_deepspeed
from autoplan.integrations.engines import DEEPSPEED_TOP_LEVEL_KEYS, check_deepspeed_keys, deepspeed_unsupported
from autoplan.strategy import Strategy
from engine_checks.golden import check_golden
from engine_checks.plans import GPT2_SMALL, LLAMA_8B, TINY, TINY_MOE, golden_plans, make_plan

DS_CASES = {name: plan for name, (plan, engine) in golden_plans().items() if engine == "deepspeed"}


@pytest.mark.parametrize("case", sorted(DS_CASES))
def test_golden(case):
    plan = DS_CASES[case]
    # Pipeline stages run only in the probe's stand-in model (the training run builds the HF model as one module).
    check_golden(case, emit_deepspeed(plan, probe=plan.strategy.pp > 1))


def test_zero3_config():
    config = deepspeed_config(DS_CASES["deepspeed_zero3"])
    # 16 GPUs, dp 16, mbs 2, gbs 64 -> 2 accumulation steps.
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"],
            config["gradient_accumulation_steps"]) == (64, 2, 2)
    assert config["zero_optimization"]["stage"] == 3 and "stage3_prefetch_bucket_size" in config["zero_optimization"]
    assert config["bf16"] == {"enabled": True} and "activation_checkpointing" in config
    assert "pipeline" not in config


def test_pipeline_config():
    config = deepspeed_config(DS_CASES["deepspeed_pipeline"])
    # 8 GPUs over 2 stages -> dp 4; gbs 32 / (mbs 4 x dp 4) = 2.
    assert config["pipeline"]["stages"] == 2 and config["gradient_accumulation_steps"] == 2
    assert config["zero_optimization"]["stage"] == 1


def test_launch_uses_hostfile_and_ds_train(tmp_path):
    files = emit_deepspeed(DS_CASES["deepspeed_zero3"], probe=True)
    assert files["hostfile"].splitlines()[1:] == ["node0 slots=8", "node1 slots=8"]
    launch = files["launch.sh"]
    assert "deepspeed --hostfile" in launch and "$HERE/ds_train.py" in launch and "--iters 10" in launch
    assert "--recompute full --recompute-method uniform --recompute-layers 1" in launch
    (tmp_path / "launch.sh").write_text(launch)
    subprocess.run(["bash", "-n", str(tmp_path / "launch.sh")], check=True)
    assert json.loads(files["model.json"])["name"] == "llama3-8b" and "AUTOPLAN_ITER" in files["ds_train.py"]


def test_user_train_script_gets_only_the_config():
    files = emit_deepspeed(DS_CASES["deepspeed_pipeline"], train_script="/src/train.py")
    assert '"/src/train.py" --deepspeed_config "$HERE/ds_config.json" "$@"' in files["launch.sh"]
    assert "ds_train.py" not in files and "model.json" not in files


@pytest.mark.parametrize("fields, word", [
    (dict(cp=2), "context parallelism (cp=2)"),
    (dict(pp=2, vpp=2), "interleaved"),
    (dict(tp=2, sp=True), "sequence parallelism"),
    (dict(fp8="hybrid"), "FP8"),
    (dict(ep=2), "expert parallelism"),
    (dict(ep=2, moe_flex_dispatcher=True), "no DeepEP / HybridEP token dispatcher"),
    (dict(pp=2, zero=2), "ZeRO stage 0 or 1"),
    (dict(pp=2, tp=2), "AutoTP"),
    (dict(pp=2, first_stage_layers=1), "uneven"),
    (dict(tp=2, sp=True, tp_comm_overlap=True), "sequence parallelism"),
    (dict(tp=4), "tp must divide num_query_groups (tp=4, num_query_groups=2); use tp in {1, 2}"),
])
def test_unsupported_strategies_name_the_feature(fields, word):
    reason = deepspeed_unsupported(Strategy(**fields), TINY_MOE)
    assert reason and word in reason and "\n" not in reason
    with pytest.raises(InputError, match="DeepSpeed"):
        emit_deepspeed(make_plan(TINY_MOE, 8, 64, 16, **fields))


@pytest.mark.parametrize("fields", [dict(), dict(zero=3), dict(pp=2, zero=1), dict(tp=2, zero=2), dict(zero=0),
                                    dict(recompute="selective"), dict(pp=2, recompute="full")])
def test_supported_strategies(fields):
    assert deepspeed_unsupported(Strategy(**fields), TINY) is None
    deepspeed_config(make_plan(TINY, 8, 64, 16, **fields))


def test_autotp_batch_sizes_count_data_parallel_ranks_only():
    # 8 GPUs with AutoTP 2 -> dp 4 (runtime/config.py _batch_assertion: 16 == 1 x 4 x 4), not 8.
    config = deepspeed_config(make_plan(TINY, 8, 64, 16, tp=2))
    assert config["tensor_parallel"] == {"autotp_size": 2}
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"],
            config["gradient_accumulation_steps"]) == (16, 1, 4)
    with pytest.raises(InputError, match="global_batch_size=6 must be divisible by mbs\\*dp = 1\\*4"):
        deepspeed_config(make_plan(TINY, 8, 64, 6, tp=2))


def test_user_script_with_autotp_is_told_to_pass_an_mpu():
    launch = emit_deepspeed(make_plan(TINY, 8, 64, 16, tp=2), train_script="/src/train.py")["launch.sh"]
    assert "mpu whose data-parallel size is world/2" in launch
    assert "mpu" not in emit_deepspeed(make_plan(TINY, 8, 64, 16, tp=2))["launch.sh"]


def test_batch_mismatch_is_input_error():
    with pytest.raises(InputError, match="global_batch_size=12 must be divisible by mbs\\*dp = 2\\*8"):
        deepspeed_config(make_plan(TINY, 8, 64, 12, mbs=2))


def test_unknown_top_level_key_rejected_with_suggestion():
    with pytest.raises(InputError, match="'zero_optimisation'.*did you mean 'zero_optimization'"):
        check_deepspeed_keys({"train_batch_size": 8, "zero_optimisation": {"stage": 2}})


def test_allow_list_covers_every_key_deepspeed_reads():
    """Record which top-level keys DeepSpeedConfig looks up and require them all in the allow-list; every
    allow-listed key must be a string DeepSpeed's sources define."""
    pytest.importorskip("deepspeed")
    import pathlib

    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    seen = set()

    class Recording(dict):
        def __getitem__(self, key):
            seen.add(key)
            return dict.__getitem__(self, key)

        def get(self, key, default=None):
            seen.add(key)
            return dict.get(self, key, default)

        def __contains__(self, key):
            seen.add(key)
            return dict.__contains__(self, key)

    DeepSpeedConfig(Recording(deepspeed_config(make_plan(TINY, 1, 64, 8, zero=2))))
    read = {k for k in seen if isinstance(k, str)}
    assert read and read <= DEEPSPEED_TOP_LEVEL_KEYS, sorted(read - DEEPSPEED_TOP_LEVEL_KEYS)
    sources = "\n".join(p.read_text(errors="ignore") for p in pathlib.Path(deepspeed.__file__).parent.rglob("*.py"))
    missing = [k for k in DEEPSPEED_TOP_LEVEL_KEYS if f'"{k}"' not in sources and f"'{k}'" not in sources]
    assert not missing, missing


def test_emitted_configs_pass_the_allow_list():
    for plan in DS_CASES.values():
        check_deepspeed_keys(deepspeed_config(plan))


GEMMA_LIKE = TINY.model_copy(update={"name": "tiny-gemma", "sandwich_norm": True, "gate_activation": "gelu_tanh",
                                     "rotary_percent": 0.5, "qk_layernorm": True, "logit_softcapping": 5.0,
                                     "tie_embeddings": True})


def test_ds_train_builds_the_new_layer_features_with_the_modelled_parameter_count():
    torch = pytest.importorskip("torch")
    from autoplan.costmodel.params import count_parameters
    from autoplan.integrations import ds_train

    for spec in (TINY, GEMMA_LIKE, GEMMA_LIKE.model_copy(update={"gate_activation": "gelu", "rotary_percent": 1.0})):
        model = ds_train.Gpt(json.loads(spec.model_dump_json()), "none", "uniform", 1)
        # Same shapes as the cost model prices: post-attention / post-MLP norms, q/k norms, tied head.
        assert sum(p.numel() for p in model.parameters()) == count_parameters(spec)[0]
    torch.manual_seed(0)
    model = ds_train.Gpt(json.loads(GEMMA_LIKE.model_dump_json()), "none", "uniform", 1)
    ids = torch.randint(0, GEMMA_LIKE.vocab_size, (2, 32))
    with torch.no_grad():
        model.head.lm_head.weight.mul_(100.0)  # logits far past the cap
        logits = model.head(model._run(0, GEMMA_LIKE.num_layers, model.embed(ids)))
    assert logits.abs().max() <= GEMMA_LIKE.logit_softcapping  # cap * tanh(logits / cap)
    model(ids, ids).backward()
    block = model.blocks[0]
    assert all(p.grad is not None for p in (block.post_attn_norm.weight, block.post_mlp_norm.weight,
                                            block.attn.q_norm.weight))
    x = torch.randn(1, 2, 8, GEMMA_LIKE.kv_channels)
    rotated = ds_train._rope(x, 10000.0, 0.5)
    assert torch.equal(rotated[..., 8:], x[..., 8:]) and not torch.allclose(rotated[..., :8], x[..., :8])
    gate = torch.randn(4, 8)
    assert torch.allclose(block.mlp.gate_act(gate), torch.nn.functional.gelu(gate, approximate="tanh"))


def test_launch_names_what_ds_train_approximates():
    gpt_oss_like = TINY.model_copy(update={"sliding_window": 16, "num_sliding_window_layers": 2,
                                           "attention_sinks": True, "rope_scaling": "yarn"})
    launch = emit_deepspeed(make_plan(gpt_oss_like, 2, 64, 8), probe=True)["launch.sh"]
    line = next(x for x in launch.splitlines() if "ds_train.py: a stand-in" in x)
    assert "16-token sliding window" in line and "attention sinks" in line and "yarn" in line
    assert "approximates" not in emit_deepspeed(make_plan(GEMMA_LIKE, 2, 64, 8), probe=True)["launch.sh"]
    assert "stand-in" not in emit_deepspeed(make_plan(gpt_oss_like, 2, 64, 8), train_script="mine.py")["launch.sh"]
    v3_like = TINY_MOE.model_copy(update={"moe_router_score_function": "sigmoid", "moe_router_expert_bias": True})
    assert "softmax top-k router" in emit_deepspeed(make_plan(v3_like, 2, 64, 8), probe=True)["launch.sh"]
    # The training run builds the user's Hugging Face model itself: nothing is approximated.
    assert "stand-in" not in emit_deepspeed(make_plan(gpt_oss_like, 2, 64, 8))["launch.sh"]


def test_bf16_master_weights_and_adam_states_are_written_as_priced():
    config = deepspeed_config(make_plan(TINY, 8, 64, 16, zero=3, bf16_master_weights=True, adam_bf16_states=True))
    assert config["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    assert deepspeed_config(make_plan(TINY, 8, 64, 16, zero=3))["bf16"] == {"enabled": True}
