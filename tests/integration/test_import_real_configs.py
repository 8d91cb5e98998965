"""The importers on unedited public launch files (tests/data/real_configs, sources in its README): what each file
says is read, and `autoplan estimate` prices it as written (only keys the file truly lacks are chosen, listed)."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli.main import build_app
from autoplan.integrations.importers import DEEPSPEED_FIXED, from_deepspeed_config, from_megatron_args
from autoplan.modelio import load_model
from conftest import deadline_s

DATA = Path(__file__).parents[1] / "data" / "real_configs"
APP = build_app()
GPT2 = str(Path(__file__).parents[1] / "data" / "hf_configs" / "gpt2.json")

# file: (estimate options the file cannot give, model fields read, strategy keys read, (seq, gbs, launcher world))
MEGATRON = {
    "train_gpt3_175b_distributed.sh": (
        ["--gpus", "128"],
        dict(num_layers=96, hidden_size=12288, num_attention_heads=96, vocab_size=51200, activation="gelu",
             position_embedding="learned", tie_embeddings=True),
        dict(tp=8, pp=16, cp=1, vpp=1, mbs=1, zero=0, sp=False, fp8="none", recompute="none"),
        (2048, 1536, 8)),
    "train_llama3_8b_h100_fp8.sh": (
        [],
        dict(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_query_groups=8, vocab_size=128256,
             activation="swiglu", normalization="rmsnorm", tie_embeddings=False, hidden_dropout=0.0),
        dict(tp=1, pp=1, cp=1, mbs=1, zero=1, fp8="hybrid", fp8_param=True, grad_reduce_bf16=True,
             recompute="none"),
        (8192, 128, 8)),
    "train_llama3_8b_fsdp_h100_fp8.sh": (
        [],
        dict(num_layers=32, hidden_size=4096, vocab_size=128256),
        dict(tp=1, zero=3, fp8="hybrid", fp8_param=True, recompute="none"),
        (8192, 128, 8)),
    "train_mixtral_8x7b_distributed.sh": (
        ["--gpus", "32"],
        dict(num_layers=32, num_experts=8, moe_router_topk=2, vocab_size=32000, max_position_embeddings=32768,
             moe_aux_loss_coeff=0.01),
        dict(tp=1, pp=4, ep=8, etp=1, zero=1, fp8="none", recompute="none", sp=False),
        (4096, 256, 8)),
    "gptoss_02_train.sh": (
        ["--strategy", "pp=4"],
        dict(num_layers=12, hidden_size=512, num_attention_heads=64, num_experts=4, activation="swiglu",
             sliding_window=128, num_sliding_window_layers=6, vocab_size=128256, attention_sinks=True,
             swiglu_limit=7.0, moe_aux_loss_coeff=0.001),
        dict(tp=1, pp=8, ep=1, zero=1, fp8="hybrid", fp8_param=True, recompute="selective"),
        (8192, 128, 8)),
    "sbatch_mfsdp_deepseek_v3.sh": (
        ["--gpus", "256", "--cluster", "b200"],
        dict(num_layers=61, multi_latent_attention=True, q_lora_rank=1536, num_experts=256, moe_router_topk=8,
             first_k_dense_layers=3, shared_expert_ffn_hidden_size=2048, vocab_size=129280, rope_scaling="yarn",
             rope_scaling_factor=40.0, rope_mscale_all_dim=1.0),
        dict(tp=1, ep=8, etp=1, mbs=4, zero=3, fp8="none", recompute="selective", moe_flex_dispatcher=True,
             recompute_modules=("mlp", "moe", "mla_up_proj", "layernorm")),
        (4096, 2048, None)),
    "pretrain_gpt_distributed_with_mp.sh": (
        [],
        dict(num_layers=24, hidden_size=1024, num_attention_heads=16, vocab_size=50432, activation="gelu"),
        dict(tp=2, pp=2, sp=True, mbs=4, zero=0, fp8="none"),
        (1024, 16, 8)),
}

# file: (options, strategy keys read, keys the file lacks: chosen by the search and listed)
_LLAMA = ["--model", "llama3-8b", "--gpus", "8", "--seq", "4096"]
DEEPSPEED = {
    "hf_ds_config_zero2.json": (_LLAMA + ["--gbs", "64"], dict(zero=2, tp=1, pp=1), {"mbs", "recompute"}),
    "hf_ds_config_zero3.json": (_LLAMA + ["--gbs", "64", "--mbs", "2"], dict(zero=3, mbs=2), {"recompute"}),
    "hf_ds_config_zero3_bf16.json": (_LLAMA + ["--gbs", "32", "--mbs", "1"], dict(zero=3, mbs=1), {"recompute"}),
    "dse_tensor_parallel_hf_ds_config.json": (_LLAMA + ["--gbs", "64", "--mbs", "1"], dict(zero=2, tp=4, mbs=1),
                                              {"recompute"}),
    "dse_autotuning_ds_config_fp16_z3.json": (_LLAMA + ["--gbs", "64"], dict(zero=3), {"mbs", "recompute"}),
    "dse_zenflow_zf_config.json": (_LLAMA, dict(zero=2, mbs=1), {"recompute"}),
    "dse_pipeline_parallelism_ds_config.json": (["--model", GPT2, "--gpus", "8", "--seq", "1024"],
                                                dict(zero=0, mbs=8), {"recompute"}),
    "dse_compression_gpt2_ds_config.json": (["--model", GPT2, "--gpus", "2", "--seq", "1024"], dict(zero=0, mbs=4),
                                            {"recompute"}),
}


def test_corpus_is_complete_and_named():
    readme = (DATA / "README.md").read_text()
    files = [p.name for folder in ("megatron", "deepspeed") for p in sorted((DATA / folder).iterdir())]
    assert set(files) == set(MEGATRON) | set(DEEPSPEED)
    assert len(MEGATRON) >= 6 and len(DEEPSPEED) >= 4
    assert all(f"`{name}`" in readme for name in files)


def estimate_json(*args):
    result = CliRunner().invoke(APP, ["estimate", *args, "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.output)


@pytest.mark.parametrize("name", sorted(MEGATRON))
def test_megatron_script_is_read(name):
    _, model_fields, strategy_keys, (seq, gbs, world) = MEGATRON[name]
    imported = from_megatron_args(str(DATA / "megatron" / name))
    assert {k: getattr(imported.model, k) for k in model_fields} == model_fields
    assert {k: imported.strategy.get(k) for k in strategy_keys} == strategy_keys
    assert (imported.workload.seq_len, imported.workload.global_batch_size, imported.world_size) == (seq, gbs, world)


@pytest.mark.parametrize("name", sorted(MEGATRON))
def test_megatron_script_is_estimated_as_written(name):
    options, _, strategy_keys, _ = MEGATRON[name]
    est = estimate_json("--from-megatron", str(DATA / "megatron" / name), *options)
    overridden = {"pp": 4} if "pp=4" in options else {}
    expected = {**strategy_keys, **overridden}
    got = {k: est["strategy"].get(k, False if isinstance(v, bool) else None) for k, v in expected.items()}
    if "recompute_modules" in got:
        got["recompute_modules"] = tuple(got["recompute_modules"])
        expected["recompute_modules"] = tuple(sorted(expected["recompute_modules"],
                                                     key=got["recompute_modules"].index))
    assert got == expected
    assert not any("chosen for you" in n for n in est["notes"])
    assert any("priced as written" in n for n in est["notes"])
    if overridden:
        assert any("--strategy overrides the imported config: pp=4 (config: 8)" in n for n in est["notes"])


@pytest.mark.parametrize("name", sorted(DEEPSPEED))
def test_deepspeed_config_is_estimated_as_written(name):
    options, strategy_keys, lacking = DEEPSPEED[name]
    est = estimate_json("--from-deepspeed", str(DATA / "deepspeed" / name), *options)
    assert {k: est["strategy"][k] for k in strategy_keys} == strategy_keys
    assert {k: est["strategy"][k] for k in DEEPSPEED_FIXED} == DEEPSPEED_FIXED
    chosen = next(n for n in est["notes"] if n.startswith("chosen for you"))
    assert {item.split("=")[0] for item in chosen.split(": ", 1)[1].split(", ")} == lacking


def test_auto_batch_without_gbs_is_a_one_line_error():
    with pytest.raises(Exception) as err:
        from_deepspeed_config(DATA / "deepspeed" / "hf_ds_config_zero2.json", load_model("llama3-8b"), 8)
    assert "pass --gbs" in str(err.value) and "\n" not in str(err.value)


def test_offloading_is_named_not_hidden():
    imported = from_deepspeed_config(DATA / "deepspeed" / "hf_ds_config_zero3.json", load_model("llama3-8b"), 8,
                                     gbs=64)
    assert sum("offload" in n and "not modelled" in n for n in imported.notes) == 2


@pytest.mark.parametrize("name, need", [("train_gpt3_175b_distributed.sh", 128),
                                        ("train_mixtral_8x7b_distributed.sh", 32)])
def test_one_node_launcher_with_a_bigger_layout_asks_for_the_job_size(name, need):
    """These scripts launch one 8-GPU node while their layout needs more: the error says how many to pass."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "estimate", "--from-megatron",
                        str(DATA / "megatron" / name)], capture_output=True, text=True, timeout=deadline_s(100))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"needs at least {need}; pass --gpus N" in r.stderr and len(r.stderr.strip().splitlines()) == 1
