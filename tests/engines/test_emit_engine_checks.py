"""Emitted files checked by the engines' own code on fake process groups of each plan's world size:
DeepSpeedConfig for DeepSpeed, parallel_state.initialize_model_parallel + TransformerConfig for megatron-core.
Each engine runs in one subprocess (the process group is global state)."""
import json

import pytest

from autoplan.integrations.deepspeed import deepspeed_config
from benchmarks.engine_fuzz import engine_check
from autoplan.integrations.megatron import emit_megatron
from conftest import deadline_s
from engine_checks.plans import GPT2_SMALL, LLAMA_8B, MIXTRAL, TINY, TINY_MOE, golden_plans, make_plan, mixer_plans

pytestmark = pytest.mark.slow  # the engines' own checks, each in a subprocess


def run_check(script, pairs):
    # A safety net only: 60 start-ups of torch + the engine (the ops are built before it starts counting).
    out = engine_check(script, [str(x) for pair in pairs for x in pair], deadline_s(60))
    assert out.returncode == 0, out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if line.startswith(("OK ", "REJECTED "))]


def megatron_plans():
    plans = {name: plan for name, (plan, engine) in golden_plans().items() if engine == "megatron"}
    plans.update({
        "mixtral_vpp_a2a": make_plan(MIXTRAL, 64, 4096, 256, tp=2, pp=2, vpp=2, ep=8, etp=2, sp=True,
                                     moe_a2a_overlap=True),
        "gpt2_fsdp_tp_overlap": make_plan(GPT2_SMALL, 8, 1024, 32, zero=3, tp=2, sp=True, tp_comm_overlap=True),
        "gpt2_uneven": make_plan(GPT2_SMALL, 8, 1024, 32, pp=2, first_stage_layers=5, last_stage_layers=7),
        "tiny_window_block": make_plan(TINY.model_copy(update={"sliding_window": 64, "num_sliding_window_layers": 2}),
                                       8, 128, 8, pp=2, recompute="full", recompute_method="block",
                                       recompute_layers=2),
        "tiny_moe_pp_ep": make_plan(TINY_MOE, 8, 128, 8, pp=2, ep=4, etp=1),
        "mixtral_te_graphs": make_plan(MIXTRAL, 64, 4096, 256, ep=8, moe_a2a_overlap=True,
                                       cuda_graph_modules=("attn", "moe_router", "moe_preprocess")),
        "llama_full_iteration_graph": make_plan(LLAMA_8B, 8, 4096, 64, cuda_graph_modules=("full_iteration",),
                                                recompute="full", recompute_method="uniform", recompute_layers=1),
    })
    return plans


def test_megatron_core_accepts_emitted_layouts(tmp_path):
    pytest.importorskip("megatron.core")
    pairs = []
    for name, plan in megatron_plans().items():
        path = tmp_path / f"{name}.txt"
        path.write_text(emit_megatron(plan)["megatron_args.txt"])
        pairs.append((plan.cluster.num_gpus, path))
    # A layout megatron-core must refuse, so the check is known to bite: 64 heads over 6 tensor-parallel ranks.
    bad = tmp_path / "bad_tp.txt"
    bad.write_text(pairs[0][1].read_text().replace("--tensor-model-parallel-size 8", "--tensor-model-parallel-size 6"))
    pairs.append((48, bad))
    # Interleaved schedule with 2 micro-batches on 4 pipeline ranks, and a batch dp does not divide.
    dense = pairs[0][1].read_text()
    assert "--global-batch-size 128\n" in dense and "--num-virtual-stages-per-pipeline-rank 5\n" in dense
    for name, gbs in (("few_microbatches", 4), ("batch_not_divisible", 5)):
        text = dense.replace("--global-batch-size 128\n", f"--global-batch-size {gbs}\n")
        (tmp_path / f"{name}.txt").write_text(text)
        pairs.append((64, tmp_path / f"{name}.txt"))
    # Full recompute under per-layer CUDA graphs, which megatron-core refuses (validate._cuda_graphs says so too).
    graphs = tmp_path / "per_layer_graphs_full_recompute.txt"
    graphs.write_text((tmp_path / "llama_full_iteration_graph.txt").read_text().replace(
        "--cuda-graph-impl full_iteration", "--cuda-graph-impl transformer_engine --cuda-graph-modules attn mlp"))
    pairs.append((8, graphs))
    lines = run_check("megatron_check.py", pairs)
    assert len(lines) == len(pairs)
    assert all(line.startswith("OK ") for line in lines[:-4]), lines
    assert all(line.startswith("REJECTED ") for line in lines[-4:]), lines[-4:]
    assert "virtual pipeline stage" in lines[-3] and "not divisible" in lines[-2]
    assert "full recompute is only supported with full iteration CUDA graph" in lines[-1]


def deepspeed_plans():
    plans = {name: plan for name, (plan, engine) in golden_plans().items() if engine == "deepspeed"}
    plans.update({
        "zero0": make_plan(TINY, 4, 64, 16, zero=0, mbs=2),
        "zero2_autotp": make_plan(LLAMA_8B, 16, 4096, 64, tp=2, zero=2),
        "pipe4_recompute": make_plan(GPT2_SMALL, 32, 1024, 64, pp=4, zero=1, mbs=2, recompute="full",
                                     recompute_layers=2),
        "moe_zero3": make_plan(TINY_MOE, 8, 64, 32, zero=3),
        "bf16_grads": make_plan(TINY, 8, 64, 32, zero=2, grad_reduce_bf16=True),
        "bf16_master_and_states": make_plan(TINY, 8, 64, 32, zero=3, bf16_master_weights=True,
                                            adam_bf16_states=True),
    })
    return plans


def test_deepspeed_accepts_emitted_configs(tmp_path):
    pytest.importorskip("deepspeed")
    pairs, expected_dp = [], []
    for name, plan in deepspeed_plans().items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(deepspeed_config(plan)))
        pairs.append((plan.cluster.num_gpus, path))
        s = plan.strategy
        expected_dp.append(plan.cluster.num_gpus // (s.tp * s.pp))
    # Configs DeepSpeed must refuse: bf16 optimizer states without bf16 master weights (runtime/config.py asserts),
    # and a batch that does not match micro x gas x dp.
    states = json.loads(pairs[-1][1].read_text())
    assert states["bf16"]["bf16_optimizer_states"] is True
    del states["bf16"]["bf16_master_weights_and_grads"]
    (tmp_path / "states_only.json").write_text(json.dumps(states))
    pairs.append((pairs[-1][0], tmp_path / "states_only.json"))
    expected_dp.append(None)
    bad = json.loads(pairs[0][1].read_text())
    bad["train_batch_size"] += 1
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    pairs.append((pairs[0][0], tmp_path / "bad.json"))
    lines = run_check("deepspeed_check.py", pairs)
    assert len(lines) == len(pairs)
    for line, dp in zip(lines[:-2], expected_dp[:-1]):
        assert line.startswith("OK ") and line.endswith(f"dp={dp}"), line
    assert lines[-2].startswith("REJECTED ") and "bf16_master_weights_and_grads" in lines[-2], lines[-2]
    assert lines[-1].startswith("REJECTED ") and "train_batch_size" in lines[-1]


def test_megatron_core_accepts_deepseek_v3_routing(tmp_path):
    """DeepSeek-V3's routing (sigmoid scores, aux-loss-free expert bias, weights scaled by 2.5, 8 groups of which 4
    are routed into, sequence-wise balancing loss) reaches MLATransformerConfig, which checks it; the same file with
    more routed groups than groups, or with the bias on softmax scores, is refused there."""
    pytest.importorskip("megatron.core")
    from autoplan.modelio import load_model

    plan = make_plan(load_model("deepseek-v3"), 64, 4096, 256, tp=2, ep=32, etp=1, sp=True, zero=1)
    text = emit_megatron(plan)["megatron_args.txt"]
    for line in ("--moe-router-score-function sigmoid", "--moe-router-enable-expert-bias",
                 "--moe-router-topk-scaling-factor 2.5", "--moe-router-num-groups 8", "--moe-router-group-topk 4",
                 "--moe-router-load-balancing-type seq_aux_loss"):
        assert f"\n{line}\n" in text, line
    good, too_many, softmax = tmp_path / "v3.txt", tmp_path / "v3_groups.txt", tmp_path / "v3_softmax.txt"
    good.write_text(text)
    too_many.write_text(text.replace("--moe-router-group-topk 4\n", "--moe-router-group-topk 9\n"))
    softmax.write_text(text.replace("--moe-router-score-function sigmoid\n", ""))
    lines = run_check("megatron_check.py", [(64, good), (64, too_many), (64, softmax)])
    assert lines[0] == f"OK {good}", lines
    assert lines[1].startswith("REJECTED ") and "moe_router_group_topk (9)" in lines[1], lines
    assert lines[2].startswith("REJECTED ") and "sigmoid" in lines[2], lines


def test_megatron_core_accepts_the_recent_attention_variants(tmp_path):
    """Qwen3-Next's Gated DeltaNet, gated attention, gated shared expert and zero-centred norms, and DeepSeek-V3.2's
    DSA reach TransformerConfig / MLATransformerConfig, which check them; the same files with value heads that are
    no multiple of the key heads, or DSA under context parallelism, are refused there."""
    pytest.importorskip("megatron.core")
    plans = mixer_plans()
    qwen = emit_megatron(plans["megatron_qwen3_next_gdn"])["megatron_args.txt"]
    v32 = emit_megatron(plans["megatron_deepseek_v32_dsa"])["megatron_args.txt"]
    files = {"qwen": qwen, "v32": v32,
             "qwen_heads": qwen.replace("--linear-num-key-heads 16\n", "--linear-num-key-heads 12\n"),
             "v32_cp": v32.replace("--context-parallel-size 1\n", "--context-parallel-size 2\n")}
    assert all(files[bad] != files[good] for bad, good in (("qwen_heads", "qwen"), ("v32_cp", "v32")))
    pairs = []
    for name, text in files.items():
        (tmp_path / f"{name}.txt").write_text(text)
        pairs.append((64, tmp_path / f"{name}.txt"))
    lines = run_check("megatron_check.py", pairs)
    assert lines[0] == f"OK {pairs[0][1]}" and lines[1] == f"OK {pairs[1][1]}", lines
    assert lines[2].startswith("REJECTED ") and "linear_num_key_heads" in lines[2], lines
    assert lines[3].startswith("REJECTED ") and "DSAttention" in lines[3], lines
