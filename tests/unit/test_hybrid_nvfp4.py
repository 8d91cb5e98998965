"""Mamba / attention hybrid models (layer pattern, Mamba-2 mixers, latent MoE, MTP) and NVFP4 pricing."""
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from autoplan.clusterio import load_cluster
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.flops import model_flops_per_token
from autoplan.costmodel.params import count_parameters, layer_params, mamba_mixer_params
from autoplan.model import ModelSpec
from autoplan.modelio import load_model
from autoplan.strategy import Strategy
from autoplan.workload import Workload

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
TINY = dict(name="tiny-hybrid", hidden_size=256, ffn_hidden_size=512, num_attention_heads=4, num_query_groups=2,
            kv_channels=64, vocab_size=1000, max_position_embeddings=4096, activation="gelu",
            mamba_num_heads=8, mamba_head_dim=32, mamba_state_dim=16, mamba_num_groups=2)


def nano() -> ModelSpec:
    return load_model(str(MODELS / "nemotron-3-nano.yaml"))


def test_pattern_must_match_num_layers_and_use_known_symbols():
    with pytest.raises(ValidationError, match="len\\(hybrid_layer_pattern\\)"):
        ModelSpec(**TINY, num_layers=3, hybrid_layer_pattern="M*")
    with pytest.raises(ValidationError, match="symbols"):
        ModelSpec(**TINY, num_layers=2, hybrid_layer_pattern="MX")
    with pytest.raises(ValidationError, match="num_experts"):
        ModelSpec(**TINY, num_layers=2, hybrid_layer_pattern="ME")
    with pytest.raises(ValidationError, match="mtp_layer_pattern"):  # a GPT model's MTP depth is its own layer kind
        ModelSpec.model_validate({**load_model("llama3-8b").model_dump(), "mtp_num_layers": 1,
                                  "mtp_layer_pattern": "*-"})
    with pytest.raises(ValidationError, match="mtp_layer_pattern"):  # a hybrid names its depth's layers
        ModelSpec(**TINY, num_layers=2, hybrid_layer_pattern="M*", mtp_num_layers=1)


def test_pattern_decides_the_moe_layers():
    m = nano()
    assert m.is_hybrid and m.num_layers == 52
    assert [m.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, False]
    assert m.num_moe_layers == m.layer_count("E") == 23
    assert (m.layer_count("M"), m.layer_count("*")) == (23, 6)


def test_mamba_mixer_parameters_by_hand():
    m = ModelSpec(**TINY, num_layers=1, hybrid_layer_pattern="M")
    d_inner, gn = 8 * 32, 2 * 16
    in_proj = 256 * (2 * d_inner + 2 * gn + 8)
    conv = (d_inner + 2 * gn) * (4 + 1)
    expected = in_proj + conv + 3 * 8 + d_inner + d_inner * 256
    assert mamba_mixer_params(m) == expected
    # One layer = the mixer + its pre-norm; the model adds embedding, final norm and head.
    total, _ = count_parameters(m)
    assert total == expected + 256 + 2 * 1000 * 256 + 256


def test_hybrid_layer_params_average_the_non_moe_layers():
    m = ModelSpec(**TINY, num_layers=3, hybrid_layer_pattern="M*-")
    p = layer_params(m, False)
    from autoplan.costmodel.params import attention_params, mlp_params
    assert p.attention == pytest.approx((mamba_mixer_params(m) + attention_params(m)) / 3)
    assert p.dense_mlp == pytest.approx(mlp_params(m, 512, False) / 3)


def test_nemotron_3_nano_size_matches_its_name():
    total, active = count_parameters(nano())
    assert 30e9 < total < 33e9 and 3e9 < active < 4e9  # 30B-A3B (31.6B total in the public release)


def test_latent_moe_runs_experts_and_dispatch_on_the_latent_width():
    base = load_model(str(MODELS / "nemotron-3-super.yaml"))
    full = base.model_copy(update={"moe_latent_size": 0})
    assert layer_params(base, True).experts == pytest.approx(layer_params(full, True).experts * 1024 / 4096)
    assert model_flops_per_token(base, 8192) < model_flops_per_token(full, 8192)


def _estimate(model, gpu="gb200", n=8, **kw):
    s = Strategy(tp=1, pp=1, ep=8 if model.is_moe else 1, mbs=1, zero=1, fp8="hybrid", **kw)
    return estimate(model, load_cluster(gpu, n), s, Workload(seq_len=8192, global_batch_size=64))


def test_mtp_depths_cost_time_memory_and_flops():
    lightning = load_model(str(MODELS / "nemotron-3.5-lightning.yaml"))
    plain = nano()
    a, b = _estimate(plain), _estimate(lightning)
    assert b.step_time_s > a.step_time_s and b.peak_mem_gib > a.peak_mem_gib
    assert model_flops_per_token(lightning, 8192) > model_flops_per_token(plain, 8192)
    assert count_parameters(lightning)[0] > count_parameters(plain)[0]


def test_mamba_layers_are_priced_with_their_scan():
    m = nano()
    e = _estimate(m)
    assert np.isfinite(e.step_time_s) and e.tokens_per_s_per_gpu > 0
    longer = m.model_copy(update={"mamba_state_dim": 256})
    assert _estimate(longer).step_time_s > e.step_time_s


def test_nvfp4_is_faster_than_mxfp8_on_blackwell_and_refused_on_hopper():
    m = load_model("llama3-8b")
    fp8 = _estimate(m, fp8_recipe="mxfp8")
    fp4 = _estimate(m, fp8_recipe="nvfp4")
    assert fp4.step_time_s < fp8.step_time_s
    from autoplan.validate import first_broken_rule
    s = Strategy(tp=1, pp=1, mbs=1, zero=1, fp8="hybrid", fp8_recipe="nvfp4")
    wl = Workload(seq_len=8192, global_batch_size=64)
    assert "nvfp4 needs a Blackwell" in first_broken_rule(m, load_cluster("h100", 8), wl, s)
    assert first_broken_rule(m, load_cluster("b200", 8), wl, s) is None


def test_megatron_emits_fp4_flags_for_nvfp4():
    from autoplan.integrations.megatron import _precision_args
    from types import SimpleNamespace
    plan = SimpleNamespace(strategy=Strategy(tp=1, pp=1, mbs=1, zero=1, fp8="hybrid", fp8_recipe="nvfp4"),
                           cluster=load_cluster("b200", 8), model=load_model("llama3-8b"))
    args = _precision_args(plan)
    assert args[args.index("--fp4-format") + 1] == "e2m1" and "--fp8-format" not in args


def test_grouped_gemm_half_tokens_follows_the_published_microbenchmark():
    """calibration.grouped_gemm_half_tokens is the least-squares fit to DeepGEMM's grouped-GEMM tables, not a
    constant fitted to the published runs."""
    import sys
    sys.path.insert(0, str(MODELS.parent.parent))
    from autoplan.costmodel.calibration import DEFAULT
    from benchmarks.microbench import fit_half_tokens, grouped_gemm_half_tokens

    assert grouped_gemm_half_tokens() == DEFAULT.grouped_gemm_half_tokens
    # The fit recovers m0 from rates generated with it (shape term included).
    from benchmarks.microbench import REFERENCE_M, size_efficiency
    pts = []
    for m in (256.0, 512.0, 1024.0):
        shape = size_efficiency(m, 4096, 7168, 384.0) / size_efficiency(REFERENCE_M, 4096, 7168, 384.0)
        pts.append((m, 4096.0, 7168.0, shape * (m / (m + 300.0)) / (REFERENCE_M / (REFERENCE_M + 300.0))))
    assert fit_half_tokens(pts, 384.0) == 300.0


def test_per_expert_gemm_issue_time_from_the_published_microbenchmark():
    """The per-expert GEMM issue time benchmarks/microbench.py reads from TransformerEngine's published per-expert
    vs single-launch grouped GEMM timings (the cross-check of calibration.kernel_overhead_s)."""
    import sys
    sys.path.insert(0, str(MODELS.parent.parent))
    from benchmarks.microbench import expert_gemm_issue_s, expert_gemm_issue_seconds

    # PR #3134, pure timings: (0.267 - 0.069 / 8) / 8 ms per expert.
    assert expert_gemm_issue_s() == pytest.approx(32.3e-6, abs=0.05e-6)
    # 4 experts issued at 10 us each, the single kernel doing all four GEMMs in 8 us: 4 x 10 + 8 / 4 = 42 us.
    table = {"rows": [[4, 128, 1024, 1024, "pure", 0.008, 0.042]]}
    assert expert_gemm_issue_seconds(table) == pytest.approx(10e-6)


def test_engines_refuse_hybrid_models_instead_of_writing_a_transformer():
    from autoplan.integrations.engines import deepspeed_unsupported
    from autoplan.integrations.megatron import inexpressible_problem

    m = nano()
    assert "pretrain_mamba.py" in inexpressible_problem(m)
    assert inexpressible_problem(load_model("llama3-8b")) is None
    s = Strategy(tp=1, pp=1, mbs=1, zero=1)
    assert "hybrid" in deepspeed_unsupported(s, m)
    assert deepspeed_unsupported(s, load_model("llama3-8b")) is None



def test_search_prices_a_fixed_nvfp4_recipe_at_fp4():
    from autoplan.solvers.space import Problem, enumerate_grid

    model = load_model("llama3-8b")
    wl = Workload(seq_len=4096, global_batch_size=64)
    grid = {}
    for recipe in ("mxfp8", "nvfp4"):
        problem = Problem(model, load_cluster("b200", 8), wl, fixed={"fp8": ["hybrid"], "fp8_recipe": [recipe]})
        grid[recipe] = enumerate_grid(problem).layouts
    assert grid["nvfp4"].fp4.all() and not grid["mxfp8"].fp4.any()


def test_layers_kept_in_bf16_cost_the_bf16_rate_and_never_less_memory():
    m = load_model("llama3-8b")
    tail = m.model_copy(update={"bf16_last_layers": 8})
    assert tail.bf16_layer_fraction == pytest.approx(8 / 32)
    fp4, fp4_tail = _estimate(m, fp8_recipe="nvfp4"), _estimate(tail, fp8_recipe="nvfp4")
    bf16 = estimate(m, load_cluster("gb200", 8), Strategy(tp=1, pp=1, mbs=1, zero=1),
                    Workload(seq_len=8192, global_batch_size=64))
    assert fp4.step_time_s < fp4_tail.step_time_s < bf16.step_time_s
    assert fp4_tail.peak_mem_gib >= fp4.peak_mem_gib
    with pytest.raises(ValidationError, match="cannot exceed num_layers"):
        ModelSpec.model_validate({**m.model_dump(), "bf16_first_layers": 20, "bf16_last_layers": 20})


def test_megatron_emits_the_layers_kept_in_bf16():
    from types import SimpleNamespace
    from autoplan.integrations.megatron import _precision_args
    m = load_model("llama3-8b").model_copy(update={"bf16_last_layers": 4})
    fp8 = Strategy(tp=1, pp=1, mbs=1, zero=1, fp8="hybrid", fp8_recipe="mxfp8")
    args = _precision_args(SimpleNamespace(strategy=fp8, cluster=load_cluster("b200", 8), model=m))
    assert args[args.index("--num-layers-at-end-in-bf16") + 1] == "4" and "--first-last-layers-bf16" in args
    bf16 = Strategy(tp=1, pp=1, mbs=1, zero=1)
    assert "--first-last-layers-bf16" not in _precision_args(SimpleNamespace(strategy=bf16, model=m,
                                                                            cluster=load_cluster("b200", 8)))


def test_modules_a_per_module_recipe_keeps_out_of_nvfp4_cost_their_own_rate_and_never_less_memory():
    # Megatron-Bridge's Nemotron-3 Super NVFP4 presets (te_quant.cfg): attention linears, latent projections and the
    # MTP depths in bf16, the Mamba out_proj in MXFP8. Each module moved out of NVFP4 is slower, none is faster.
    base = load_model(str(MODELS / "nemotron-3-super.yaml"))
    fp4 = _estimate(base, fp8_recipe="nvfp4")
    for field, module in (("bf16_modules", "attention_linear"), ("bf16_modules", "latent_proj"),
                          ("bf16_modules", "mtp"), ("mxfp8_modules", "mamba_out_proj")):
        moved = _estimate(base.model_copy(update={field: (module,)}), fp8_recipe="nvfp4")
        assert moved.step_time_s > fp4.step_time_s, module
        assert moved.peak_mem_gib >= fp4.peak_mem_gib, module
    recipe = base.model_copy(update={"bf16_modules": ("attention_linear", "latent_proj", "mtp"),
                                     "mxfp8_modules": ("mamba_out_proj",)})
    mxfp8 = _estimate(base, fp8_recipe="mxfp8")
    assert fp4.step_time_s < _estimate(recipe, fp8_recipe="nvfp4").step_time_s
    # Under MXFP8 the MXFP8 override changes nothing; a bf16 run ignores both.
    assert _estimate(recipe.model_copy(update={"bf16_modules": ()}), fp8_recipe="mxfp8").step_time_s == \
        pytest.approx(mxfp8.step_time_s)
    bf16 = Strategy(tp=1, pp=1, ep=8, mbs=1, zero=1)
    wl = Workload(seq_len=8192, global_batch_size=64)
    assert estimate(recipe, load_cluster("gb200", 8), bf16, wl).step_time_s == \
        pytest.approx(estimate(base, load_cluster("gb200", 8), bf16, wl).step_time_s)


def test_per_module_recipe_names_known_modules_once():
    m = load_model("llama3-8b")
    with pytest.raises(ValidationError, match="each must be one of"):
        ModelSpec.model_validate({**m.model_dump(), "bf16_modules": ["router"]})
    with pytest.raises(ValidationError, match="in both bf16_modules and mxfp8_modules"):
        ModelSpec.model_validate({**m.model_dump(), "bf16_modules": ["mtp"], "mxfp8_modules": ["mtp"]})


def test_megatron_refuses_a_per_module_recipe_it_cannot_write():
    from types import SimpleNamespace
    from autoplan.errors import InputError
    from integrations.megatron import check_megatron_plan
    m = load_model("llama3-8b").model_copy(update={"bf16_modules": ("attention_linear",)})
    s = Strategy(tp=1, pp=1, mbs=1, zero=1, fp8="hybrid", fp8_recipe="nvfp4")
    plan = SimpleNamespace(strategy=s, cluster=load_cluster("gb200", 8), model=m,
                           workload=Workload(seq_len=8192, global_batch_size=64))
    with pytest.raises(InputError, match="te-precision-config-file"):
        check_megatron_plan(plan)
