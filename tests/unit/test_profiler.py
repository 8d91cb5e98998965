"""The profiler on CPU with tiny models: shard sizes, layer shapes and parameters, timing and memory probes, the
full grid run, its JSON round trip and interpolation."""
from __future__ import annotations

import numpy as np
import pytest

from autoplan.costmodel import params as P
from autoplan.costmodel.measured import load_profile, save_profile
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.profiler.shards import shard_dims, tokens_per_local_expert

torch = pytest.importorskip("torch")

from autoplan.profiler.gemm import layer_gemm_shapes  # noqa: E402
from autoplan.profiler.layers import build_layer, layer_kinds  # noqa: E402
from autoplan.profiler.run import ProfileRequest, default_gpu_id, run_profile  # noqa: E402
from autoplan.profiler.timing import SavedTensorBytes, measure_layer  # noqa: E402

DENSE = ModelSpec(name="tiny-dense", num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=8,
                  num_query_groups=2, kv_channels=16, vocab_size=1000, max_position_embeddings=512)
MOE = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                num_query_groups=4, kv_channels=16, vocab_size=500, max_position_embeddings=512, num_experts=8,
                moe_router_topk=2, moe_ffn_hidden_size=32, shared_expert_ffn_hidden_size=32)
MLA = ModelSpec(name="tiny-mla", num_layers=3, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                num_query_groups=4, kv_channels=16, vocab_size=500, max_position_embeddings=512, num_experts=4,
                moe_router_topk=2, moe_ffn_hidden_size=32, multi_latent_attention=True, q_lora_rank=32,
                kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, first_k_dense_layers=1)
GELU = DENSE.model_copy(update=dict(name="tiny-gelu", activation="gelu", normalization="layernorm",
                                    position_embedding="learned", add_bias_linear=True))


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---- shard sizes and checks ------------------------------------------------------------------------------------

def test_shard_dims_split_heads_groups_ffn_and_pad_vocab():
    d = shard_dims(DENSE, tp=4)
    assert (d.heads, d.groups, d.ffn) == (2, 1, 64)  # 2 groups < tp 4: one replicated group per rank
    assert d.vocab * 4 == 1024  # 1000 padded to a multiple of 128 * 4
    assert shard_dims(DENSE, tp=2).groups == 1
    e = shard_dims(MOE, tp=2, ep=4)
    assert (e.local_experts, e.expert_ffn, e.shared_ffn) == (2, 16, 16)


@pytest.mark.parametrize("model, tp, ep, message", [
    (DENSE, 3, 1, "tp=3 must divide num_attention_heads=8; valid tp: 1, 2, 4, 8"),
    (MOE, 1, 3, "ep=3 must divide num_experts=8; valid ep: 1, 2, 4, 8"),
    (DENSE, 1, 2, "ep=2 needs an MoE model"),
])
def test_bad_degrees_raise_one_line_input_errors(model, tp, ep, message):
    with pytest.raises(InputError, match=message) as info:
        shard_dims(model, tp, ep)
    assert "\n" not in str(info.value)


def test_balanced_expert_load_is_tokens_times_k_over_local_experts():
    # 8 experts, ep=4: 2 local experts; ep * 100 tokens * k=2 / 8 experts = 50 rows per expert.
    assert tokens_per_local_expert(MOE, ep=4, tokens=100) == 4 * 100 * 2 // 8


# ---- layers ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", [DENSE, GELU, MLA])
def test_unsharded_layers_hold_the_parameter_counts_of_the_cost_model(model):
    norm = P.norm_params(model)
    assert n_params(build_layer(model, "attention", 1)) == P.attention_params(model) + norm
    assert n_params(build_layer(model, "mlp", 1)) == P.mlp_params(model, model.ffn_hidden_size,
                                                                  model.add_bias_linear) + norm


def test_moe_layer_holds_router_experts_and_shared_experts():
    moe = P.layer_params(MOE, moe=True)
    assert n_params(build_layer(MOE, "moe", 1)) == moe.router + moe.experts + moe.shared_experts + moe.norms // 2
    local = n_params(build_layer(MOE, "moe", 1, ep=4)) - moe.router - moe.norms // 2 - moe.shared_experts
    assert local == moe.experts // 4


def test_tp_shards_attention_and_mlp_weights():
    full, half = build_layer(DENSE, "attention", 1), build_layer(DENSE, "attention", 2)
    assert half.qkv.weight.shape == (DENSE.kv_channels * (4 + 2 * 1), DENSE.hidden_size)
    assert half.proj.weight.shape[1] * 2 == full.proj.weight.shape[1]
    assert build_layer(DENSE, "mlp", 2).fc2.weight.shape == (128, 128)


@pytest.mark.parametrize("model", [DENSE, GELU, MOE, MLA])
def test_every_kind_runs_forward_and_backward_with_gradients(model):
    for kind in layer_kinds(model):
        layer = build_layer(model, kind, tp=2 if model is not MLA else 1)
        inputs = layer.make_inputs(2, 16, torch.device("cpu"), torch.float32)
        out = layer(*inputs)
        if kind == "head":
            assert out.dim() == 0
        else:
            assert out.shape == (2, 16, model.hidden_size)
        out.backward(torch.ones_like(out))
        assert all(p.grad is not None for p in layer.parameters() if p.requires_grad), kind
        if layer.hidden_input:
            assert inputs[0].grad is not None


def test_attention_is_causal():
    layer = build_layer(DENSE, "attention", 1)
    x = torch.randn(1, 8, DENSE.hidden_size)
    y = x.clone()
    y[:, 5:] += 1.0  # change only later tokens
    assert torch.allclose(layer(x)[:, :5], layer(y)[:, :5], atol=1e-5)


def test_gemm_shapes_match_the_sharded_layers():
    shapes = layer_gemm_shapes(DENSE, tp=2, ep=1, mbs=2, seq=64)
    attn = build_layer(DENSE, "attention", 2)
    assert shapes["attention.qkv"] == (128, attn.qkv.weight.shape[0], DENSE.hidden_size)
    assert shapes["mlp.fc1"] == (128, 2 * 128, 128)
    assert shapes["head"] == (128, 512, 128)
    moe = layer_gemm_shapes(MOE, tp=1, ep=2, mbs=1, seq=64)
    assert moe["moe.expert_fc1"] == (64 * 2 // 4, 2 * 32, 64)  # rows = tokens * k / (E / ep) local experts


# ---- timing and memory probes ----------------------------------------------------------------------------------

def test_saved_tensor_bytes_count_activations_not_weights():
    linear = torch.nn.Linear(32, 64)
    x = torch.randn(10, 32, requires_grad=True)
    counter = SavedTensorBytes(list(linear.parameters()))
    with counter.hooks():
        y = torch.relu(linear(x))
    # Linear saves its input (10x32 fp32); relu saves its output (10x64 fp32); the weight is excluded.
    assert counter.total == (10 * 32 + 10 * 64) * 4
    y.sum().backward()


def test_measure_layer_keeps_every_repeat_and_activation_scales_with_tokens():
    layer = build_layer(DENSE, "mlp", 1)
    cpu = torch.device("cpu")
    one = measure_layer(layer, layer.make_inputs(1, 32, cpu, torch.float32), cpu, warmup=1, repeats=4)
    two = measure_layer(layer, layer.make_inputs(2, 32, cpu, torch.float32), cpu, warmup=1, repeats=4)
    assert len(one.fwd.raw) == 4 and len(one.bwd.raw) == 4 and min(one.fwd.raw) > 0
    assert two.activation_bytes == 2 * one.activation_bytes
    assert one.weight_bytes == n_params(layer) * 4 and one.peak_bytes is None


def test_default_gpu_id_from_device_names():
    assert default_gpu_id("NVIDIA H200") == "h200"
    assert default_gpu_id("NVIDIA A100-SXM4-80GB") == "a100"


# ---- the grid run ----------------------------------------------------------------------------------------------

def tiny_request(model, **kw):
    base = dict(model=model, tps=(1, 2), mbss=(1, 2), seqs=(32, 64), dtypes=("fp32",), device="cpu", warmup=1,
                repeats=3, min_repeat_s=0.0)
    base.update(kw)
    return ProfileRequest(**base)


def test_dense_profile_round_trips_and_interpolates(tmp_path):
    profile = run_profile(tiny_request(DENSE))
    kinds = {e.kind for e in profile.layers}
    assert kinds == {"attention", "mlp", "embedding", "head"}
    assert len(profile.layers) == 4 * 2 * 2 * 2 * 2  # kinds x tp x mbs x seq x pass
    assert profile.gemms and all(g.tflops > 0 for g in profile.gemms)
    loaded = load_profile(save_profile(profile, tmp_path / "dense.json"))
    e = next(x for x in loaded.layers if (x.kind, x.pass_, x.tp, x.mbs, x.seq) == ("mlp", "bwd", 2, 2, 64))
    assert len(e.raw_s) == 3 and e.min_s <= e.median_s <= e.max_s
    got = loaded.layer_time("mlp", "bwd", np.array([2, 2]), np.array([2, 1]), np.array([64, 45]), "fp32")
    assert got[0] == pytest.approx(e.median_s)
    lo = loaded.layer_time("mlp", "bwd", np.array([2]), np.array([1]), np.array([32]), "fp32")[0]
    hi = loaded.layer_time("mlp", "bwd", np.array([2]), np.array([1]), np.array([64]), "fp32")[0]
    assert min(lo, hi) <= got[1] <= max(lo, hi)
    assert np.isnan(loaded.layer_time("mlp", "fwd", np.array([8]), np.array([1]), np.array([32]), "fp32")).all()


def test_moe_profile_varies_ep_only_for_moe_layers():
    profile = run_profile(tiny_request(MOE, tps=(1,), eps=(1, 2), mbss=(1,), seqs=(32,), gemms=False))
    moe_eps = {e.ep for e in profile.layers if e.kind == "moe"}
    assert moe_eps == {1, 2}
    assert {e.ep for e in profile.layers if e.kind != "moe"} == {1}
    w = {e.ep: e.weight_bytes for e in profile.layers if e.kind == "moe" and e.pass_ == "fwd"}
    assert w[2] < w[1]
    t = profile.layer_time("moe", "fwd", np.array([1, 1]), np.array([1, 1]), np.array([32, 32]), "fp32",
                           ep=np.array([1, 2]))
    assert np.isfinite(t).all()


def test_mla_model_profiles_mlp_and_moe_kinds():
    profile = run_profile(tiny_request(MLA, tps=(1, 2), mbss=(1,), seqs=(32,), gemms=False, repeats=1))
    assert {e.kind for e in profile.layers} == {"attention", "mlp", "moe", "embedding", "head"}


def test_fp8_is_skipped_with_a_note_on_cpu():
    profile = run_profile(tiny_request(DENSE, tps=(1,), mbss=(1,), seqs=(32,), dtypes=("bf16", "fp8"),
                                       gemms=False, repeats=1, kinds=("mlp",)))
    assert {e.dtype for e in profile.layers} == {"bf16"}
    assert any("fp8" in n and "skipped" in n for n in profile.notes)


@pytest.mark.parametrize("kw, message", [
    (dict(tps=(3,)), "tp=3 must divide"),
    (dict(dtypes=("int4",)), "dtype 'int4' is not supported"),
    (dict(seqs=(1024,)), "seq=1024 exceeds max_position_embeddings=512"),
    (dict(kinds=("moe",)), "layer kind 'moe' is not in tiny-dense"),
])
def test_bad_requests_raise_input_errors(kw, message):
    with pytest.raises(InputError, match=message):
        run_profile(tiny_request(DENSE, **kw))


@pytest.mark.gpu
def test_cuda_profile_records_allocator_peaks():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    profile = run_profile(tiny_request(DENSE, device="cuda", dtypes=("bf16",)))
    assert profile.device.kind == "cuda"
    assert all(e.peak_bytes is not None and e.peak_bytes >= e.activation_bytes > 0
               for e in profile.layers if e.kind in ("attention", "mlp"))


def test_threads_apply_during_the_run_and_are_restored():
    before = torch.get_num_threads()
    profile = run_profile(tiny_request(DENSE, tps=(1,), mbss=(1,), seqs=(32,), gemms=False, repeats=1,
                                       kinds=("mlp",), threads=1))
    assert profile.device.cpu_threads == 1
    assert torch.get_num_threads() == before


def test_cpu_repeats_average_enough_iterations_to_outlast_jitter(monkeypatch):
    """A CPU repeat of a sub-millisecond layer averages several iterations (timeit's autorange)."""
    import contextlib

    import autoplan.profiler.timing as timing

    calls = []

    def fixed(*args, **kw):  # 1 ms forward + 2 ms backward, every call
        calls.append(1)
        return 0.001, 0.002

    monkeypatch.setattr(timing, "time_once", fixed)
    layer = build_layer(DENSE, "mlp", 1).to(dtype=torch.float32)
    cpu = torch.device("cpu")
    inputs = layer.make_inputs(1, 16, cpu, torch.float32)
    assert timing.iterations_for(layer, inputs, cpu, contextlib.nullcontext, 0.03) == 10
    calls.clear()
    out = timing.measure_points(layer, {0: inputs}, cpu, 0, 3, min_repeat_s=0.03)
    assert len(calls) == 1 + 3 * 10  # one sizing call, then 10 iterations in each of 3 repeats
    assert out[0].fwd.raw == pytest.approx((0.001,) * 3) and out[0].bwd.raw == pytest.approx((0.002,) * 3)
    calls.clear()
    timing.measure_points(layer, {0: inputs}, cpu, 0, 3, min_repeat_s=0.0)
    assert len(calls) == 3  # min_repeat_s = 0: one iteration per repeat
    assert ProfileRequest(model=DENSE, device="cpu").repeat_floor_s() == 0.01
    assert ProfileRequest(model=DENSE, device="cuda").repeat_floor_s() == 0.0
    with pytest.raises(InputError, match="min_repeat_s"):
        ProfileRequest(model=DENSE, device="cpu", min_repeat_s=-1).check()
