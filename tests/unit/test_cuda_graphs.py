"""CUDA graphs (Strategy.cuda_graph_modules): the Megatron rules, the per-op cost of captured ops, the static
buffers graphs keep, the launch flags and their reading back."""
import subprocess
import sys

import numpy as np
import pytest

from autoplan import cuda_graphs as G
from autoplan.costmodel import compute as C
from autoplan.costmodel.calibration import DEFAULT
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.hardware import GIB, hardware_of
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.errors import InputError
from autoplan.integrations.importers import from_megatron_args
from autoplan.integrations.megatron import emit_megatron, megatron_args
from autoplan.strategy import Strategy, parse_strategy_text, strategy_from_mapping
from autoplan.validate import first_broken_rule
from engine_checks.plans import LLAMA_8B, MIXTRAL, make_plan

from conftest import cluster, make_moe, workload


def test_names_are_canonical_and_checked():
    s = strategy_from_mapping(parse_strategy_text("cuda_graph_modules=moe_router+attn+attn"))
    assert s.cuda_graph_modules == ("attn", "moe_router")
    with pytest.raises(InputError, match="unknown CUDA-graph module 'atn'.*did you mean 'attn'"):
        strategy_from_mapping(parse_strategy_text("cuda_graph_modules=atn"))
    with pytest.raises(InputError, match="full_iteration captures the whole step"):
        strategy_from_mapping(parse_strategy_text("cuda_graph_modules=full_iteration+attn"))
    assert strategy_from_mapping(parse_strategy_text("cuda_graph_modules=none")).cuda_graph_modules is None


@pytest.mark.parametrize("model_name, keys, engine, message", [
    ("dense", dict(cuda_graph_modules=("attn", "moe_router")), "megatron", "need an MoE model"),
    ("moe", dict(cuda_graph_modules=("attn", "moe")), "megatron", "needs drop-and-pad routing"),
    ("moe", dict(cuda_graph_modules=("attn", "moe_preprocess")), "megatron", "moe_preprocess needs moe_router"),
    ("all_moe", dict(cuda_graph_modules=("attn", "mlp")), "megatron", "mlp needs dense MLP layers"),
    ("dense", dict(cuda_graph_modules=("mamba",)), "megatron", "mamba needs Mamba layers"),
    ("dense", dict(cuda_graph_modules=("attn", "mlp"), recompute="full"), "megatron", "needs cuda_graph_modules="
                                                                                       "full_iteration"),
    ("dense", dict(cuda_graph_modules=("attn",)), "deepspeed", "Megatron-LM feature"),
])
def test_engine_rules(request, model_name, keys, engine, message):
    model = make_moe(first_k_dense_layers=0) if model_name == "all_moe" else request.getfixturevalue(model_name)
    broken = first_broken_rule(model, cluster(8), workload(2048, 32), Strategy(ep=8 if model.is_moe else 1, **keys),
                               engine=engine)
    assert broken and message in broken


def test_full_recompute_is_allowed_under_the_full_iteration_graph(dense):
    s = Strategy(cuda_graph_modules=("full_iteration",), recompute="full")
    assert first_broken_rule(dense, cluster(8), workload(2048, 32), s) is None


def test_bad_scope_on_the_command_line_is_exit_2_one_line():
    out = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "estimate", "--model", "llama3-8b", "--gpus",
                          "8", "--seq", "4096", "--gbs", "64", "--strategy", "tp=1,cuda_graph_modules=moe_router"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "moe_router need an MoE model" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def _dense_layer_fwd(model, strategy):
    lay = layouts_from_strategies([strategy], 8)
    sh = C.shard_of(model, lay, 2048)
    hw = hardware_of(cluster(8))
    return float(C.layer_time(model, sh, lay, 2048, hw, DEFAULT, moe=False).fwd[0])


def test_captured_ops_pay_the_graph_node_cost_instead_of_the_host_dispatch(dense):
    """A dense layer's forward ops: attention half 2 GEMMs (QKV, output) + core attention + 5 memory-bound kernels,
    MLP half 2 GEMMs + 5 kernels (compute.DENSE_KERNELS); each captured op saves the host dispatch."""
    saved = DEFAULT.kernel_overhead_s - DEFAULT.graph_kernel_s
    eager = _dense_layer_fwd(dense, Strategy())
    attn = _dense_layer_fwd(dense, Strategy(cuda_graph_modules=("attn",)))
    both = _dense_layer_fwd(dense, Strategy(cuda_graph_modules=("attn", "mlp")))
    full = _dense_layer_fwd(dense, Strategy(cuda_graph_modules=("full_iteration",)))
    assert np.isclose(eager - attn, (2 + 1 + 5) * saved)
    assert np.isclose(attn - both, (2 + 5) * saved)
    assert np.isclose(both, full)


def test_moe_router_scope_leaves_the_experts_eager(moe):
    lay = layouts_from_strategies([Strategy(ep=8), Strategy(ep=8, cuda_graph_modules=("moe_router",))], 8)
    sh = C.shard_of(moe, lay, 2048)
    hw = hardware_of(cluster(8))
    t = C.layer_time(moe, sh, lay, 2048, hw, DEFAULT, moe=True)
    saved = DEFAULT.kernel_overhead_s - DEFAULT.graph_kernel_s
    # the router GEMM and its 4 kernels (compute.MOE_KERNELS); the experts' GEMMs keep their per-op cost
    assert np.isclose(t.fwd[0] - t.fwd[1], (1 + 4) * saved)


def test_per_layer_graphs_hold_static_inputs_and_causal_masks(dense):
    seq, wl = 2048, workload(2048, 8)
    eager = estimate(dense, cluster(8), Strategy(), wl).memory_breakdown
    graphs = estimate(dense, cluster(8), Strategy(cuda_graph_modules=("attn", "mlp")), wl).memory_breakdown
    mlp_only = estimate(dense, cluster(8), Strategy(cuda_graph_modules=("mlp",)), wl).memory_breakdown
    hidden = 2 * seq * dense.hidden_size  # bf16 static input of each layer, mbs 1
    mask = seq * seq  # bool causal mask of each captured attention
    assert eager["cuda_graphs"] == 0
    assert np.isclose(graphs["cuda_graphs"] * GIB, dense.num_layers * (hidden + mask))
    assert np.isclose(mlp_only["cuda_graphs"] * GIB, dense.num_layers * hidden)
    assert {k: v for k, v in graphs.items() if k != "cuda_graphs"} == \
        {k: v for k, v in eager.items() if k != "cuda_graphs"}


def test_full_iteration_graph_keeps_the_step_copy_on_top_of_its_pool(dense):
    wl = workload(2048, 8)
    base = Strategy(zero=1, grad_reduce_bf16=True)
    eager = estimate(dense, cluster(8), base, wl)
    full = estimate(dense, cluster(8), base.model_copy(update={"cuda_graph_modules": ("full_iteration",)}), wl)
    assert full.peak_mem_gib > eager.peak_mem_gib
    assert full.memory_breakdown["transient"] > eager.memory_breakdown["transient"]
    batch = 1 * 2048 * (8 + 8 + 8 + 4)  # gbs 8 over dp 8: one micro batch of token ids, labels, positions, mask
    assert np.isclose(full.memory_breakdown["cuda_graphs"] * GIB, batch)
    assert full.step_time_s < eager.step_time_s


def test_emitted_flags():
    per_layer = make_plan(MIXTRAL, 64, 4096, 256, ep=8, cuda_graph_modules=("attn", "moe_router", "moe_preprocess"))
    argv = megatron_args(per_layer)
    i = argv.index("--cuda-graph-modules")
    assert argv[argv.index("--cuda-graph-impl") + 1] == "transformer_engine"
    assert argv[i + 1:i + 4] == ["attn", "moe_router", "moe_preprocess"] and "--te-rng-tracker" in argv
    full = megatron_args(make_plan(LLAMA_8B, 8, 4096, 64, cuda_graph_modules=("full_iteration",)))
    assert full[full.index("--cuda-graph-impl") + 1] == "full_iteration"
    assert "--no-check-for-nan-in-loss-and-grad" in full and "--cuda-graph-modules" not in full
    assert "--cuda-graph-impl" not in megatron_args(make_plan(LLAMA_8B, 8, 4096, 64))


def test_expandable_segments_with_te_graphs_turn_nccl_graph_registration_off():
    te = emit_megatron(make_plan(LLAMA_8B, 8, 4096, 64, cuda_graph_modules=("attn", "mlp"),
                                 expandable_segments=True))["train.sh"]
    full = emit_megatron(make_plan(LLAMA_8B, 8, 4096, 64, cuda_graph_modules=("full_iteration",),
                                   expandable_segments=True))["train.sh"]
    assert "export NCCL_GRAPH_REGISTER=0" in te and "NCCL_GRAPH_REGISTER" not in full


@pytest.mark.parametrize("flags, expected", [
    ("--cuda-graph-impl transformer_engine --cuda-graph-modules attn mlp", ("attn", "mlp")),
    ("--cuda-graph-impl full_iteration", ("full_iteration",)),
    ("--cuda-graph-impl local --cuda-graph-scope full_iteration", ("full_iteration",)),
    ("--enable-cuda-graph", ("attn", "mlp")),  # deprecated: local, whole layers
    ("--external-cuda-graph --cuda-graph-scope attn", ("attn",)),
    ("--cuda-graph-impl none --cuda-graph-modules attn", None),
])
def test_graph_flags_are_read_back(flags, expected):
    text = emit_megatron(make_plan(LLAMA_8B, 8, 4096, 64))["megatron_args.txt"] + "\n" + flags + "\n"
    assert from_megatron_args(text).strategy.get("cuda_graph_modules") == expected


def test_the_search_keeps_a_fixed_scope_and_its_rules(dense, moe):
    from autoplan.solvers.api import solve
    from autoplan.solvers.space import Problem, enumerate_grid

    problem = Problem(dense, cluster(8), workload(2048, 32), fixed={"cuda_graph_modules": ("attn", "mlp")})
    result = solve(problem, "enumerate", top_k=5)
    assert result.plans and all(p.strategy.cuda_graph_modules == ("attn", "mlp") for p in result.plans)
    grid = enumerate_grid(problem).layouts
    assert len(grid) and not np.any(grid.recompute == 2)  # full recompute needs the full-iteration graph
    full = enumerate_grid(Problem(dense, cluster(8), workload(2048, 32),
                                  fixed={"cuda_graph_modules": ("full_iteration",)})).layouts
    assert np.any(full.recompute == 2)
    # Each switch's rule reads the candidates with every fixed switch written: the all-to-all overlap excludes a
    # captured MLP half row by row too (Problem refuses this pair up front; the rows are checked here directly).
    from autoplan.solvers.space import _apply_switches

    problem = Problem(moe, cluster(8), workload(2048, 32), fixed={"cuda_graph_modules": ("attn", "moe_router")})
    object.__setattr__(problem, "fixed", {"cuda_graph_modules": ("attn", "mlp"), "moe_a2a_overlap": True})
    lay = layouts_from_strategies([Strategy(ep=8), Strategy(ep=8, vpp=1)], 8)
    written, keep = _apply_switches(problem, lay)
    assert written.moe_a2a_overlap.all() and not keep.any()


@pytest.mark.parametrize("keys, message", [
    (dict(cuda_graph_modules=("attn", "moe_router"), recompute="selective", recompute_modules=("moe",)),
     "recompute module moe cannot be combined with cuda_graph_modules moe_router"),
    (dict(cuda_graph_modules=("full_iteration",), cpu_offload_layers=2), "cannot be combined with CUDA graphs"),
])
def test_more_engine_rules(moe, keys, message):
    broken = first_broken_rule(moe, cluster(8), workload(2048, 32), Strategy(ep=8, **keys))
    assert broken and message in broken


def test_hidden_dropout_forbids_recomputing_a_captured_mlp(dense):
    s = Strategy(cuda_graph_modules=("attn", "mlp"), recompute="selective", recompute_modules=("mlp",))
    assert first_broken_rule(dense, cluster(8), workload(2048, 32), s) is None
    dropout = dense.model_copy(update={"hidden_dropout": 0.1})
    assert "hidden_dropout=0.1" in first_broken_rule(dropout, cluster(8), workload(2048, 32), s)


def test_an_unknown_fixed_module_name_is_one_line(dense):
    from autoplan.solvers.space import Problem

    with pytest.raises(InputError, match="unknown CUDA-graph module 'atn'"):
        Problem(dense, cluster(8), workload(2048, 32), fixed={"cuda_graph_modules": ("atn",)})


def test_published_rows_carry_their_presets_graphs():
    from benchmarks.recipes import cuda_graph_modules

    def row(model, precision="fp8", notes="fp8 recipe: MXFP8", **kw):
        base = dict(model=model, precision=precision, notes=notes, pp="1", vpp="", ep="1", mbs="1", gbs="128")
        return {**base, **kw}

    assert cuda_graph_modules(row("DeepSeekV3", pp="2", vpp="8", ep="32"), "gb300", "26.06") == G.MODULES[:1]
    assert cuda_graph_modules(row("DeepSeekV3", pp="2", vpp="8", ep="32"), "gb300", "26.04") == ()
    assert cuda_graph_modules(row("DeepSeekV3", pp="4", vpp="4", ep="64"), "gb200", "26.04") == \
        ("attn", "moe_router", "moe_preprocess")
    assert cuda_graph_modules(row("Qwen3_235B_a22B", ep="64", mbs="2"), "gb300", "26.04") == \
        ("moe_router", "moe_preprocess")
    assert cuda_graph_modules(row("LLAMA3_8B", notes="FP8-CS"), "h100", "26.04") == ()
    assert cuda_graph_modules(row("LLAMA3_8B", notes="FP8-CS"), "b200", "25.11") == ("full_iteration",)


@pytest.mark.parametrize("fixed, message", [
    ({"cuda_graph_modules": ("moe_router",)}, "need an MoE model"),
    ({"recompute": "selective", "recompute_modules": ("mla_up_proj",)}, "needs multi-latent attention"),
])
def test_a_fixed_module_set_the_model_rules_out_is_refused_before_the_search(dense, fixed, message):
    from autoplan.solvers.space import Problem

    with pytest.raises(InputError, match=message):
        Problem(dense, cluster(8), workload(2048, 32), fixed=fixed)


# ---- Megatron's unfused expert path (gpt-oss-style experts) and TransformerEngine's op fuser -------------------

def test_clamped_biased_experts_pay_megatrons_unfused_passes_unless_the_op_fuser_runs_them(moe):
    gptoss = moe.model_copy(update={"swiglu_limit": 7.0, "add_bias_linear": True, "activation": "swiglu"})
    lay = layouts_from_strategies([Strategy(ep=8), Strategy(ep=8, te_op_fuser=True)], 8)
    sh = C.shard_of(gptoss, lay, 2048)
    extra_bytes, extra_ops = C.unfused_expert_extras(gptoss, sh, lay)
    copies, f, h, experts = sh.expert_tokens[0], gptoss.moe_ffn_hidden_size, gptoss.hidden_size, 1
    assert np.isclose(extra_bytes[0] * 3, (18 * f + 13 * h) * 2 * copies)
    assert np.isclose(extra_ops[0] * 3, 7 + 6 * experts + 2)
    assert extra_bytes[1] == 0 and extra_ops[1] == 0
    hw = hardware_of(cluster(8))
    t = C.layer_time(gptoss, sh, lay, 2048, hw, DEFAULT, moe=True)
    assert t.fwd[0] > t.fwd[1]
    plain = C.unfused_expert_extras(moe, C.shard_of(moe, lay, 2048), lay)  # SwiGLU without biases: nothing extra
    assert plain == (0.0, 0.0)


def test_op_fuser_is_emitted_read_back_and_refused_by_deepspeed(dense):
    plan = make_plan(MIXTRAL, 64, 4096, 256, ep=8, te_op_fuser=True)
    text = emit_megatron(plan)["megatron_args.txt"]
    assert "--use-transformer-engine-op-fuser" in text
    assert from_megatron_args(text).strategy.get("te_op_fuser") is True
    broken = first_broken_rule(dense, cluster(8), workload(2048, 32), Strategy(te_op_fuser=True), engine="deepspeed")
    assert broken and "te_op_fuser" in broken


def test_fixed_switches_that_exclude_each_other_are_named_before_the_search(moe):
    from autoplan.solvers.space import Problem

    fixed = {"moe_a2a_overlap": [True], "cuda_graph_modules": [("attn", "mlp")]}  # as `--fix` parses them
    with pytest.raises(InputError, match="cannot be combined with moe_a2a_overlap=true"):
        Problem(moe, cluster(8), workload(2048, 32), fixed=fixed)
