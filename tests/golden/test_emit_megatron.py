"""Megatron-LM emitter: golden files, argument names, engine rules and the launch scripts."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.errors import InputError
from autoplan.integrations.megatron import args_to_lines, emit_megatron, inexpressible_problem, megatron_args
from autoplan.integrations.megatron import moe_layer_pattern
from autoplan.integrations.megatron_releases import DEFAULT_RELEASE, RELEASES
from engine_checks.golden import check_golden
from engine_checks.plans import (B200, DEEPSEEK_V2_LITE, GPT2_SMALL, LLAMA_70B, LLAMA_8B, MIXTRAL, TINY, golden_plans,
                                 make_plan, mixer_plans)
from conftest import deadline_s

RELEASE_FILES = Path(__file__).parents[2] / "integrations" / "megatron_releases"
MEGATRON_CASES = {name: plan for name, (plan, engine) in golden_plans().items() if engine == "megatron"}


def release_names(tag=DEFAULT_RELEASE):
    lines = (RELEASE_FILES / f"{tag}.txt").read_text().splitlines()
    return {line.split()[0] for line in lines if line.strip() and not line.startswith("#")}


@pytest.mark.parametrize("case", sorted(MEGATRON_CASES))
def test_golden(case):
    check_golden(case, emit_megatron(MEGATRON_CASES[case]))


MIXER_CASES = mixer_plans()


@pytest.mark.parametrize("case", sorted(MIXER_CASES))
def test_golden_recent_attention_variants(case):
    check_golden(case, emit_megatron(MIXER_CASES[case]))


def test_qwen3_next_is_written_as_megatron_builds_it():
    f = flags(MIXER_CASES["megatron_qwen3_next_gdn"])
    # gated_delta_net on layer i unless (i + 1) % 4 == 0: Qwen3-Next's full_attention_interval 4, 36 of 48 layers.
    assert f["--experimental-attention-variant"] == "gated_delta_net" and f["--linear-attention-freq"] == "4"
    assert (f["--linear-num-key-heads"], f["--linear-num-value-heads"]) == ("16", "32")
    assert (f["--linear-key-head-dim"], f["--linear-value-head-dim"], f["--linear-conv-kernel-dim"]) == \
        ("128", "128", "4")
    for switch in ("--attention-output-gate", "--moe-shared-expert-gate", "--apply-layernorm-1p", "--qk-layernorm"):
        assert switch in f and f[switch] is None, switch
    assert f["--rotary-percent"] == "0.25"


def test_deepseek_v32_is_written_with_its_indexer():
    f = flags(MIXER_CASES["megatron_deepseek_v32_dsa"])
    assert f["--experimental-attention-variant"] == "dsa" and "--multi-latent-attention" in f
    assert (f["--dsa-indexer-n-heads"], f["--dsa-indexer-head-dim"], f["--dsa-indexer-topk"]) == ("64", "128", "2048")
    assert f["--dsa-indexer-loss-coeff"] == "0.01" and "--no-rope-fusion" in f


def test_dsa_without_the_indexer_loss_weight_asks_for_it():
    plan = MIXER_CASES["megatron_deepseek_v32_dsa"]
    plan = plan.model_copy(update={"model": plan.model.model_copy(update={"dsa_indexer_loss_coeff": None})})
    with pytest.raises(InputError) as e:
        megatron_args(plan)
    assert "--set dsa_indexer_loss_coeff=" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("tag", sorted(RELEASES))
def test_recent_attention_variants_are_in_every_release(tag):
    """Each flag the variants write is in the release's parser; a release without one would refuse naming it."""
    known = release_names(tag)
    for plan in MIXER_CASES.values():
        emitted = {a[2:] for a in megatron_args(plan, release=tag) if a.startswith("--")}
        assert emitted <= known, sorted(emitted - known)


def variety():
    return list(MEGATRON_CASES.values()) + [
        make_plan(MIXTRAL, 64, 4096, 256, tp=2, pp=2, vpp=2, ep=8, etp=2, sp=True, moe_a2a_overlap=True),
        make_plan(GPT2_SMALL, 8, 1024, 32, zero=3, tp=2, sp=True, tp_comm_overlap=True),
        make_plan(GPT2_SMALL, 8, 1024, 32, zero=2, pp=2, first_stage_layers=5, last_stage_layers=7),
        make_plan(DEEPSEEK_V2_LITE.model_copy(update={"q_lora_rank": 512}), 8, 1024, 32, zero=0, ep=8),
        make_plan(TINY.model_copy(update={"sliding_window": 64, "num_sliding_window_layers": 2, "add_qkv_bias": True,
                                          "qk_layernorm": True}), 8, 128, 8, recompute="full",
                  recompute_method="block", recompute_layers=2),
        make_plan(LLAMA_8B, 8, 4096, 32, zero=3, fp8="hybrid", fp8_param=True, cpu_offload_layers=4),
        make_plan(MIXTRAL, 64, 4096, 256, ep=8, moe_flex_dispatcher=True),
        make_plan(LLAMA_8B.model_copy(update={"bf16_first_layers": 1, "bf16_last_layers": 1}), 8, 4096, 32, gpu=B200,
                  fp8="e4m3", fp8_recipe="nvfp4"),
        make_plan(GPT_OSS.model_copy(update={"rope_truncate": False, "rope_mscale": 0.707, "rope_mscale_all_dim": 1.0,
                                             "rotary_percent": 0.5}), 32, 4096, 256, ep=8),
    ]


def test_hidden_dropout_is_the_models():
    assert flags(make_plan(LLAMA_8B, 8, 4096, 32))["--hidden-dropout"] == "0.0"
    dropped = LLAMA_8B.model_copy(update={"hidden_dropout": 0.1})
    assert flags(make_plan(dropped, 8, 4096, 32))["--hidden-dropout"] == "0.1"


def test_fp8_param_and_cpu_offload_flags():
    f = flags(make_plan(LLAMA_8B, 8, 4096, 32, zero=1, fp8="hybrid", fp8_param=True, cpu_offload_layers=4))
    assert "--fp8-param-gather" in f and f["--cpu-offloading-num-layers"] == "4"
    plain = flags(make_plan(LLAMA_8B, 8, 4096, 32, zero=1, fp8="hybrid"))
    assert "--fp8-param-gather" not in plain and "--cpu-offloading-num-layers" not in plain


def test_flex_dispatcher_flags():
    f = flags(make_plan(MIXTRAL, 64, 4096, 256, ep=8, moe_flex_dispatcher=True))
    assert f["--moe-token-dispatcher-type"] == "flex" and f["--moe-flex-dispatcher-backend"] == "hybridep"
    plain = flags(make_plan(MIXTRAL, 64, 4096, 256, ep=8))
    assert plain["--moe-token-dispatcher-type"] == "alltoall" and "--moe-flex-dispatcher-backend" not in plain


@pytest.mark.parametrize("probe", [False, True])
def test_every_emitted_argument_exists_in_megatron_lm(probe):
    known = release_names()
    for plan in variety():
        emitted = {a[2:] for a in megatron_args(plan, probe=probe) if a.startswith("--")}
        assert emitted <= known, f"not in {DEFAULT_RELEASE}'s arguments.py: {sorted(emitted - known)}"


def test_release_lists_name_their_commits():
    for tag, commit in RELEASES.items():
        header = (RELEASE_FILES / f"{tag}.txt").read_text().splitlines()[:3]
        assert any(tag in line and commit in line for line in header), tag
        assert len(release_names(tag)) > 600  # the whole parser, not a hand-picked subset


def flags(plan, probe=False):
    words = [shlex.split(line) for line in args_to_lines(megatron_args(plan, probe=probe))]
    return {w[0]: " ".join(w[1:]) or None for w in words}


def test_dense_layout_args():
    f = flags(MEGATRON_CASES["megatron_dense_tp_pp_vpp_sp"])
    assert f["--tensor-model-parallel-size"] == "8" and f["--pipeline-model-parallel-size"] == "4"
    assert f["--num-virtual-stages-per-pipeline-rank"] == "5" and "--sequence-parallel" in f
    assert f["--num-query-groups"] == "8" and "--group-query-attention" in f
    assert f["--recompute-granularity"] == "selective" and "--recompute-method" not in f
    assert "--use-distributed-optimizer" in f and "--overlap-param-gather" in f
    assert "--num-experts" not in f and "--expert-model-parallel-size" not in f


def test_moe_args_and_layer_pattern():
    f = flags(MEGATRON_CASES["megatron_moe_ep_etp"])
    assert f["--num-experts"] == "64" and f["--moe-router-topk"] == "6"
    assert f["--expert-model-parallel-size"] == "8" and f["--expert-tensor-parallel-size"] == "1"
    assert f["--moe-layer-freq"] == "[0]*1+[1]*26"
    assert f["--moe-token-dispatcher-type"] == "alltoall" and "--moe-grouped-gemm" in f
    assert f["--recompute-method"] == "uniform" and f["--recompute-num-layers"] == "1"
    every_other = MIXTRAL.model_copy(update={"moe_layer_freq": 2, "first_k_dense_layers": 1, "num_layers": 6})
    assert moe_layer_pattern(every_other) == "[0]*1+[1]*1+[0]*1+[1]*1+[0]*1+[1]*1"


def test_probe_args():
    f = flags(MEGATRON_CASES["megatron_dense_tp_pp_vpp_sp"], probe=True)
    assert f["--train-iters"] == "10" and f["--log-interval"] == "1" and "--log-throughput" in f
    assert f["--log-memory-interval"] == "1" and f["--eval-iters"] == "0" and "--mock-data" in f


def test_zero_stages_map_to_megatron_fsdp():
    plan = make_plan(GPT2_SMALL, 8, 1024, 32, zero=3)
    f = flags(plan)
    assert "--use-megatron-fsdp" in f and f["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert "--use-distributed-optimizer" not in flags(make_plan(GPT2_SMALL, 8, 1024, 32, zero=0))


def test_max_connections_only_before_blackwell_and_without_fsdp():
    plan = MEGATRON_CASES["megatron_dense_tp_pp_vpp_sp"]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in emit_megatron(plan)["train.sh"]
    b200 = make_plan(LLAMA_70B, 64, 8192, 128, gpu=B200, tp=8, pp=4, sp=True)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in emit_megatron(b200)["train.sh"]
    fsdp = make_plan(LLAMA_8B, 16, 4096, 64, tp=2, sp=True, zero=3)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in emit_megatron(fsdp)["train.sh"]


def test_scripts_are_valid_bash_with_plan_sizes(tmp_path):
    files = emit_megatron(MEGATRON_CASES["megatron_long_context_cp"])
    for name in ("train.sh", "sbatch.sh"):
        (tmp_path / name).write_text(files[name])
        subprocess.run(["bash", "-n", str(tmp_path / name)], check=True)
    assert "NNODES=${NNODES:-4}" in files["train.sh"] and "GPUS_PER_NODE=${GPUS_PER_NODE:-8}" in files["train.sh"]
    assert "#SBATCH --nodes=4" in files["sbatch.sh"] and "srun" in files["sbatch.sh"]


def test_train_sh_passes_args_file_to_torchrun(tmp_path):
    """Run train.sh with a fake torchrun on PATH and check the argv it receives."""
    plan = MEGATRON_CASES["megatron_moe_ep_etp"]
    for name, text in emit_megatron(plan).items():
        (tmp_path / name).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (bin_dir / "torchrun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MEGATRON_LM": "/opt/mlm", "NODE_RANK": "1"}
    out = subprocess.run(["bash", str(tmp_path / "train.sh"), "--train-iters", "5"], env=env, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    assert out[:8] == ["--nnodes", "4", "--node_rank", "1", "--nproc_per_node", "8", "--master_addr", "localhost"]
    assert "/opt/mlm/pretrain_gpt.py" in out
    argv = out[out.index("/opt/mlm/pretrain_gpt.py") + 1:]
    checkpoints = str(tmp_path / "checkpoints")
    assert argv[:-2] == megatron_args(plan) + ["--save", checkpoints, "--load", checkpoints, "--save-interval", "500"]
    assert argv[-2:] == ["--train-iters", "5"]
    env["CHECKPOINT_DIR"], env["SAVE_INTERVAL"] = "/ckpt/run 1", "200"
    out = subprocess.run(["bash", str(tmp_path / "train.sh")], env=env, check=True, capture_output=True,
                         text=True).stdout.splitlines()
    assert out[-6:] == ["--save", "/ckpt/run 1", "--load", "/ckpt/run 1", "--save-interval", "200"]
    env["DATA_PATH"], env["TOKENIZER_MODEL"] = "/data/corpus", "/tok"
    out = subprocess.run(["bash", str(tmp_path / "train.sh")], env=env, check=True, capture_output=True,
                         text=True).stdout.splitlines()
    assert "--mock-data" not in out and "/data/corpus" in out and "HuggingFaceTokenizer" in out


@pytest.mark.parametrize("update, message", [
    (dict(tp=8, pp=3), "must be divisible by tp*pp*cp"),
    (dict(tp=8, pp=4, vpp=3), "must be divisible by pp*vpp"),
    (dict(tp=8, mbs=3), "global_batch_size=128 must be divisible by mbs*dp"),
    (dict(tp=8, tp_comm_overlap=True), "tp_comm_overlap=true needs"),
    (dict(tp=8, pp=2, first_stage_layers=10, last_stage_layers=11), "uneven pipeline"),
    (dict(tp=8, ep=2), "needs an MoE model"),
])
def test_megatron_rules_are_one_line_input_errors(update, message):
    plan = make_plan(LLAMA_70B, 64, 8192, 128, **update)
    with pytest.raises(InputError, match=re.escape(message)) as err:
        emit_megatron(plan)
    assert "\n" not in str(err.value)


def test_moe_with_tp_needs_sp_and_cp_needs_even_split():
    with pytest.raises(InputError, match="requires sp=true"):
        emit_megatron(make_plan(MIXTRAL, 16, 4096, 64, tp=2, ep=8))
    with pytest.raises(InputError, match="divisible by 2\\*cp"):
        emit_megatron(make_plan(LLAMA_8B, 16, 4098, 64, cp=2))
    with pytest.raises(InputError, match="tp=3 must divide num_attention_heads=4"):
        emit_megatron(make_plan(TINY, 6, 128, 8, tp=3))


LLAMA31_405B = LLAMA_70B.model_copy(update={"name": "llama3.1-405b", "num_layers": 126, "hidden_size": 16384,
                                            "ffn_hidden_size": 53248, "num_attention_heads": 128,
                                            "max_position_embeddings": 131072, "rope_scaling": "llama3",
                                            "rope_scaling_factor": 8.0})
GPT_OSS = MIXTRAL.model_copy(update={"name": "gpt-oss-120b", "num_layers": 36, "hidden_size": 2880,
                                     "ffn_hidden_size": 2880, "num_attention_heads": 64, "kv_channels": 64,
                                     "num_experts": 128, "moe_router_topk": 4, "moe_ffn_hidden_size": 2880,
                                     "add_bias_linear": True, "add_qkv_bias": True, "sliding_window": 128,
                                     "num_sliding_window_layers": 18, "rotary_base": 150000.0,
                                     "rope_scaling": "yarn", "rope_scaling_factor": 32.0,
                                     "rope_original_max_position_embeddings": 4096, "attention_sinks": True,
                                     "swiglu_limit": 7.0, "moe_aux_loss_coeff": 0.9})


def test_llama31_rope_scaling_is_emitted():
    f = flags(make_plan(LLAMA31_405B, 64, 8192, 64, tp=8, pp=8, first_stage_layers=15, last_stage_layers=15))
    assert f["--position-embedding-type"] == "rope" and "--use-rope-scaling" in f
    assert f["--rope-scaling-factor"] == "8"
    assert "--use-rope-scaling" not in flags(make_plan(LLAMA_70B, 64, 8192, 128, tp=8, pp=2))


def test_gpt_oss_specifics_as_megatron_runs_them():
    # examples/gptoss/02_train.sh: quick GEGLU, linear offset 1, clamp 7, learnable softmax, fp32 router.
    f = flags(make_plan(GPT_OSS, 64, 4096, 128, ep=8, etp=1))
    assert "--quick-geglu" in f and "--swiglu" not in f
    assert f["--glu-linear-offset"] == "1.0" and f["--activation-func-clamp-value"] == "7"
    assert f["--softmax-type"] == "learnable" and f["--moe-router-dtype"] == "fp32"
    assert "--no-bias-gelu-fusion" in f and "--no-rope-fusion" in f
    assert f["--position-embedding-type"] == "yarn" and f["--rotary-scaling-factor"] == "32"
    assert f["--yarn-original-max-position-embeddings"] == "4096"
    assert f["--moe-aux-loss-coeff"] == "0.9" and "--disable-bias-linear" not in f


def test_aux_loss_coefficient_is_the_models():
    assert flags(make_plan(MIXTRAL, 64, 4096, 256, ep=8))["--moe-aux-loss-coeff"] == "0.001"
    mixtral_hf = MIXTRAL.model_copy(update={"moe_aux_loss_coeff": 0.02})
    assert flags(make_plan(mixtral_hf, 64, 4096, 256, ep=8))["--moe-aux-loss-coeff"] == "0.02"


@pytest.mark.parametrize("plan", variety() + [make_plan(GPT_OSS, 64, 4096, 128, ep=8),
                                              make_plan(LLAMA31_405B, 64, 8192, 64, tp=8, pp=8,
                                                        first_stage_layers=15, last_stage_layers=15)],
                         ids=lambda p: f"{p.model.name}-{p.strategy.label()}".replace(" ", "_"))
def test_args_file_is_shell_words_with_checkpoint_placeholders(plan):
    text = emit_megatron(plan)["megatron_args.txt"]
    words = shlex.split(text, comments=True)  # raises on an unclosed quote
    assert words[:-6] == megatron_args(plan)
    assert words[-6:] == ["--save", "${CHECKPOINT_DIR}", "--load", "${CHECKPOINT_DIR}", "--save-interval",
                          "${SAVE_INTERVAL}"]
    assert {w[2:] for w in words if w.startswith("--")} <= release_names()
    assert "--save" not in shlex.split(emit_megatron(plan, probe=True)["megatron_args.txt"], comments=True)


def test_llama2_7b_args_file_reads_with_shlex(tmp_path):
    # The reported case: llama2-7b on 16 A100-80G; every plan of the search, through `autoplan plan --json`.
    from autoplan.cli.emit import load_plan

    out = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "plan", "--model", "llama2-7b", "--cluster",
                          "a100-80g", "--gpus", "16", "--seq", "4096", "--gbs", "256", "--top", "5", "--json"],
                         capture_output=True, text=True, timeout=deadline_s(100))
    assert out.returncode == 0, out.stderr
    (tmp_path / "plans.json").write_text(out.stdout)
    for i in range(5):
        plan = load_plan(str(tmp_path / "plans.json"), i)
        words = shlex.split(emit_megatron(plan)["megatron_args.txt"], comments=True)
        assert words[:-6] == megatron_args(plan)


def test_interleaved_schedule_needs_whole_groups_of_pp_micro_batches():
    # 64 GPUs, tp8 pp4 -> dp2; gbs 4 at mbs 1 gives 2 micro-batches, fewer than pp.
    with pytest.raises(InputError, match=r"vpp=5 \(Megatron's interleaved schedule\) needs .* pp=4, got 2"):
        megatron_args(make_plan(LLAMA_70B, 64, 8192, 4, tp=8, pp=4, vpp=5, sp=True))
    with pytest.raises(InputError, match=r"pp=4, got 6"):
        megatron_args(make_plan(LLAMA_70B, 64, 8192, 12, tp=8, pp=4, vpp=5, sp=True))
    assert megatron_args(make_plan(LLAMA_70B, 64, 8192, 16, tp=8, pp=4, vpp=5, sp=True))
    assert megatron_args(make_plan(LLAMA_70B, 64, 8192, 4, tp=8, pp=4, sp=True))  # 1F1B takes any count


def test_partial_rotary_is_emitted():
    neox = LLAMA_8B.model_copy(update={"rotary_percent": 0.25})
    assert flags(make_plan(neox, 8, 4096, 32))["--rotary-percent"] == "0.25"
    assert "--rotary-percent" not in flags(make_plan(LLAMA_8B, 8, 4096, 32))


@pytest.mark.parametrize("update, word", [
    (dict(gate_activation="gelu_tanh"), "gelu_tanh-gated MLP"),
    (dict(sandwich_norm=True), "sandwich_norm=true"),
    (dict(logit_softcapping=30.0), "logit_softcapping=30"),
])
def test_features_pretrain_gpt_cannot_express_are_refused(update, word):
    with pytest.raises(InputError, match=f"pretrain_gpt.py has no argument for .*{re.escape(word)}"):
        emit_megatron(make_plan(LLAMA_8B.model_copy(update=update), 8, 4096, 32))


def test_mla_yarn_settings_are_the_models():
    v3_rope = dict(rope_scaling="yarn", rope_scaling_factor=40.0, rope_original_max_position_embeddings=4096,
                   rope_mscale=1.0, rope_mscale_all_dim=1.0)
    f = flags(make_plan(DEEPSEEK_V2_LITE.model_copy(update=v3_rope), 32, 4096, 256, tp=2, ep=8, sp=True))
    assert f["--rope-type"] == "yarn" and f["--rotary-scaling-factor"] == "40"
    assert f["--mscale"] == "1" and f["--mscale-all-dim"] == "1"
    plain = flags(make_plan(DEEPSEEK_V2_LITE, 32, 4096, 256, tp=2, ep=8, sp=True))
    assert plain["--rope-type"] == "rope" and "--mscale" not in plain


def test_gpt_yarn_mscale_is_the_models(tmp_path):
    # Non-MLA YaRN: training/argument_utils.py _apply_yarn_config_from_args sets yarn_mscale / yarn_mscale_all_dim
    # from --mscale / --mscale-all-dim (defaults 1 and 0, which gpt-oss uses).
    from autoplan.integrations.importers import from_megatron_args

    scaled = GPT_OSS.model_copy(update={"rope_mscale": 0.707, "rope_mscale_all_dim": 1.0})
    plan = make_plan(scaled, 32, 4096, 256, ep=8)
    f = flags(plan)
    assert f["--position-embedding-type"] == "yarn" and f["--mscale"] == "0.707" and f["--mscale-all-dim"] == "1"
    (tmp_path / "args.txt").write_text(emit_megatron(plan)["megatron_args.txt"])
    back = from_megatron_args(str(tmp_path / "args.txt")).model
    assert (back.rope_mscale, back.rope_mscale_all_dim) == (0.707, 1.0)  # read back by the importer
    plain = flags(make_plan(GPT_OSS, 32, 4096, 256, ep=8))
    assert "--mscale" not in plain and "--mscale-all-dim" not in plain


def test_gpt_yarn_correction_range_is_the_models(tmp_path):
    # gpt-oss: HF rope_scaling truncate=false, which Megatron writes as --no-yarn-correction-range-round-to-int
    # (arguments.py; post_training/model_builder.py sets the same for GPT-OSS).
    from autoplan.integrations.importers import from_megatron_args

    plan = make_plan(GPT_OSS.model_copy(update={"rope_truncate": False}), 32, 4096, 256, ep=8)
    assert "--no-yarn-correction-range-round-to-int" in megatron_args(plan)
    (tmp_path / "args.txt").write_text(emit_megatron(plan)["megatron_args.txt"])
    assert from_megatron_args(str(tmp_path / "args.txt")).model.rope_truncate is False
    assert "--no-yarn-correction-range-round-to-int" not in megatron_args(make_plan(GPT_OSS, 32, 4096, 256, ep=8))


@pytest.mark.parametrize("update, word", [
    (dict(rope_truncate=False), "rope_truncate=false"),
    (dict(rope_original_max_position_embeddings=8192), "original_max_position_embeddings=8192"),
    # Kimi-K2's HF rope_scaling beta_fast=1, beta_slow=1; MLATransformerConfig fixes 32 and 1 with no argument.
    (dict(rope_beta_fast=1.0, rope_beta_slow=1.0), "rope_beta_fast=1, rope_beta_slow=1 (Megatron fixes 32 and 1)"),
    (dict(rope_beta_slow=2.0), "rope_beta_fast=32, rope_beta_slow=2"),
])
def test_mla_yarn_settings_without_an_argument_are_refused(update, word):
    yarn = dict(rope_scaling="yarn", rope_scaling_factor=40.0, rope_original_max_position_embeddings=4096)
    model = DEEPSEEK_V2_LITE.model_copy(update={**yarn, **update})
    with pytest.raises(InputError, match=f"pretrain_gpt.py has no argument for MLA YaRN .*{re.escape(word)}"):
        emit_megatron(make_plan(model, 32, 4096, 256, tp=2, ep=8, sp=True))
    assert emit_megatron(make_plan(DEEPSEEK_V2_LITE.model_copy(update=yarn), 32, 4096, 256, tp=2, ep=8, sp=True))


def test_catalogue_kimi_k2_is_refused_and_deepseek_v3_emitted():
    # Kimi-K2 and DeepSeek-V3 differ in YaRN betas only as far as this rule goes (HF 1/1 against 32/1).
    from autoplan.modelio import load_model

    kimi, v3 = load_model("kimi-k2"), load_model("deepseek-v3")
    assert (kimi.rope_beta_fast, kimi.rope_beta_slow, v3.rope_beta_fast, v3.rope_beta_slow) == (1.0, 1.0, 32.0, 1.0)
    assert "rope_beta_fast=1, rope_beta_slow=1" in inexpressible_problem(kimi)
    assert inexpressible_problem(v3) is None


def test_gpt_yarn_betas_are_the_models(tmp_path):
    # Non-MLA YaRN: arguments.py --yarn-beta-fast / --yarn-beta-slow, mapped onto yarn_beta_fast / yarn_beta_slow by
    # training/argument_utils.py _apply_yarn_config_from_args (defaults 32 and 1, written only when they differ).
    from autoplan.integrations.importers import from_megatron_args

    plan = make_plan(GPT_OSS.model_copy(update={"rope_beta_fast": 1.0, "rope_beta_slow": 0.5}), 32, 4096, 256, ep=8)
    f = flags(plan)
    assert (f["--yarn-beta-fast"], f["--yarn-beta-slow"]) == ("1", "0.5")
    (tmp_path / "args.txt").write_text(emit_megatron(plan)["megatron_args.txt"])
    back = from_megatron_args(str(tmp_path / "args.txt")).model
    assert (back.rope_beta_fast, back.rope_beta_slow) == (1.0, 0.5)
    plain = flags(make_plan(GPT_OSS, 32, 4096, 256, ep=8))
    assert "--yarn-beta-fast" not in plain and "--yarn-beta-slow" not in plain


def test_sliding_window_is_flash_attentions_left_count(tmp_path):
    # HF sliding_window=128 attends to the query and 127 earlier keys; flash-attention's window_size=(127, 0) and
    # Megatron-LM's examples/gptoss/02_train.sh --window-size 127,0 say the same.
    from autoplan.integrations.importers import from_megatron_args

    plan = make_plan(GPT_OSS, 32, 4096, 256, ep=8)
    f = flags(plan)
    assert f["--window-size"] == "127,0" and f["--window-attn-skip-freq"] == "2"
    (tmp_path / "args.txt").write_text(emit_megatron(plan)["megatron_args.txt"])
    back = from_megatron_args(str(tmp_path / "args.txt")).model
    assert (back.sliding_window, back.num_sliding_window_layers) == (128, 18)


def test_gpu_count_that_does_not_fill_nodes_runs_the_rest_on_the_last_node(tmp_path):
    # 252 A100 = 31 nodes of 8 and one of 4 (a published run); torchrun ranks nodes of different sizes in order.
    from autoplan.clusterio import load_gpu

    plan = make_plan(LLAMA_70B, 252, 4096, 504, gpu=load_gpu("a100-80g"), tp=4, pp=1, sp=True)
    files = emit_megatron(plan)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert "#SBATCH --nodes=32" in files["sbatch.sh"] and "GPUS_PER_NODE=8" not in files["sbatch.sh"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (bin_dir / "torchrun").chmod(0o755)
    for node_rank, nproc in (("0", "8"), ("30", "8"), ("31", "4")):
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MEGATRON_LM": "/opt/mlm", "NODE_RANK": node_rank}
        out = subprocess.run(["bash", str(tmp_path / "train.sh")], env=env, check=True, capture_output=True,
                             text=True).stdout.splitlines()
        assert out[:6] == ["--nnodes", "32", "--node_rank", node_rank, "--nproc_per_node", nproc]


def test_window_longer_than_the_sequence_is_dropped_and_noted():
    """Phi-4-mini's sliding_window 262144 (config.json of microsoft/Phi-4-mini-instruct) never binds at 4096 tokens:
    no --window-size 262143,0 in the launch, a note in the plan; a 2047-token window at 4096 is written."""
    import json

    from autoplan.costmodel.estimate import estimate
    from autoplan.modelio import from_hf_config

    config = json.loads((Path(__file__).parents[1] / "data" / "hf_configs" / "phi3_mini_4k_instruct.json").read_text())

    long_window = from_hf_config({**config, "sliding_window": 262144, "max_position_embeddings": 131072}, "phi4")
    assert long_window.sliding_window == 262144 and long_window.num_sliding_window_layers == 32
    plan = make_plan(long_window, 8, 4096, 32, tp=2, sp=True)
    assert "--window-size" not in flags(plan) and "--window-attn-skip-freq" not in flags(plan)
    est = estimate(plan.model, plan.cluster, plan.strategy, plan.workload)
    assert any("sliding_window=262144 is not shorter than seq_len=4096" in n for n in est.notes), est.notes
    short = make_plan(from_hf_config(config, "phi3"), 8, 4096, 32, tp=2, sp=True)
    assert flags(short)["--window-size"] == "2046,0"
    assert not short.model.window_note(4096)


def test_files_name_and_keep_to_their_release(tmp_path):
    """gpt-oss writes --position-embedding-type yarn, which core_v0.16.1's parser rejects (its choices lack yarn),
    and --yarn-original-max-position-embeddings, which only core_v0.19.0 has. The per-layer CUDA graph module list
    is --cuda-graph-modules from core_v0.18 and --cuda-graph-scope before."""
    from autoplan.integrations.megatron_releases import release_tag

    oss = make_plan(GPT_OSS, 32, 4096, 256, ep=8)
    with pytest.raises(InputError, match=r"--position-embedding-type yarn is not in the argument parser of "
                                         r"Megatron-LM core_v0.16.1 .*core_v0.18.2, core_v0.19.0 accept it; pass "
                                         r"--megatron-version core_v0.19.0"):
        emit_megatron(oss, release="core_v0.16.1")
    with pytest.raises(InputError, match=r"--yarn-original-max-position-embeddings is not in the argument parser "
                                         r"of Megatron-LM core_v0.18.2 .*; core_v0.19.0 accepts it"):
        emit_megatron(oss, release="core_v0.18.2")
    files = emit_megatron(oss, release="core_v0.19.0")
    commit = "5be9626709af2722333bf54797c954c09edeada3"
    for name in ("megatron_args.txt", "train.sh", "sbatch.sh"):
        assert f"# for Megatron-LM core_v0.19.0 (NVIDIA/Megatron-LM commit {commit})" in files[name], name
    assert 'if [[ "$FOUND" != "0.19" ]]' in files["train.sh"]
    graphs = make_plan(MIXTRAL, 64, 4096, 256, ep=8, moe_a2a_overlap=True,
                       cuda_graph_modules=("attn", "moe_router", "moe_preprocess"))
    assert flags(graphs)["--cuda-graph-modules"] == "attn moe_router moe_preprocess"
    old = {w[0]: w[1:] for w in map(shlex.split, args_to_lines(megatron_args(graphs, release="core_v0.16.1")))}
    assert old["--cuda-graph-scope"] == ["attn", "moe_router", "moe_preprocess"] and "--cuda-graph-modules" not in old
    assert release_tag("0.16") == release_tag("0.16.1") == "core_v0.16.1"
    with pytest.raises(InputError, match="--megatron-version '0.12' is not a release"):
        release_tag("0.12")


def test_train_sh_warns_about_another_checkout(tmp_path):
    files = emit_megatron(MEGATRON_CASES["megatron_dense_tp_pp_vpp_sp"], release="core_v0.16.1")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    checkout = tmp_path / "Megatron-LM"
    (checkout / "megatron" / "core").mkdir(parents=True)
    (checkout / "pretrain_gpt.py").write_text("")
    fake_torchrun = tmp_path / "bin" / "torchrun"
    fake_torchrun.parent.mkdir()
    fake_torchrun.write_text("#!/usr/bin/env bash\nexit 0\n")
    fake_torchrun.chmod(0o755)
    env = {"PATH": f"{fake_torchrun.parent}:/usr/bin:/bin", "MEGATRON_LM": str(checkout)}
    for minor, warned in (("19", True), ("16", False)):
        (checkout / "megatron" / "core" / "package_info.py").write_text(f"MAJOR = 0\nMINOR = {minor}\nPATCH = 0\n")
        out = subprocess.run(["bash", str(tmp_path / "train.sh")], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert ("checked against Megatron-LM core_v0.16.1" in out.stderr) is warned, out.stderr


def test_emit_cli_takes_megatron_version(tmp_path, capsys):
    from conftest import run_cli

    plan = tmp_path / "plan.json"
    plan.write_text(make_plan(LLAMA_8B, 8, 4096, 32).model_dump_json())
    code, _, err = run_cli(["emit", str(plan), "--format", "megatron", "--out", str(tmp_path / "a"),
                            "--megatron-version", "0.12"], capsys)
    assert code == 2 and "--megatron-version '0.12' is not a release" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()
    code, _, _ = run_cli(["emit", str(plan), "--format", "megatron", "--out", str(tmp_path / "b"),
                          "--megatron-version", "0.16"], capsys)
    assert code == 0 and "core_v0.16.1" in (tmp_path / "b" / "megatron_args.txt").read_text()
