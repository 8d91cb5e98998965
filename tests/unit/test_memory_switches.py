"""Memory switches priced by the cost model (TE fused cross entropy, expandable segments) and the FP8/FP4 recipe's
saved-tensor sizes."""
import numpy as np
import pytest

from autoplan.costmodel import memory as M
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.hardware import GIB
from autoplan.costmodel.layout import QUANTISED_BYTES, layouts_from_strategies
from autoplan.strategy import Strategy

from conftest import cluster, workload


def test_te_cross_entropy_holds_a_third_of_the_logits_and_expandable_segments_no_fragmentation(dense):
    wl = workload(2048, 8)
    plain = estimate(dense, cluster(8), Strategy(), wl).memory_breakdown
    te = estimate(dense, cluster(8), Strategy(te_cross_entropy=True), wl).memory_breakdown
    exp = estimate(dense, cluster(8), Strategy(expandable_segments=True), wl).memory_breakdown
    assert np.isclose(te["logits"], plain["logits"] / 3)  # 2 of 6 bytes per logit
    assert plain["fragmentation"] > 0 and exp["fragmentation"] == 0


def test_delayed_fp8_keeps_linear_proj_own_copy_of_the_attention_output(dense):
    """Megatron makes linear_proj save its bf16 input only for non-delayed FP8 recipes (attention.py
    set_save_original_input); under delayed scaling its FP8 copy is held beside flash attention's bf16 output."""
    wl = workload(2048, 8)
    h100 = cluster(8)
    delayed = estimate(dense, h100, Strategy(fp8="hybrid", fp8_recipe="delayed"), wl).memory_breakdown
    current = estimate(dense, h100, Strategy(fp8="hybrid", fp8_recipe="tensorwise"), wl).memory_breakdown
    default = estimate(dense, h100, Strategy(fp8="hybrid"), wl).memory_breakdown  # H100 default recipe: delayed
    out_bytes = 2048 * dense.num_attention_heads * dense.kv_channels * dense.num_layers  # 1 byte each
    assert np.isclose((delayed["activations"] - current["activations"]) * GIB, out_bytes)
    assert default["activations"] == delayed["activations"]


@pytest.mark.parametrize("recipe, gpu, per_element", [("tensorwise", "h100", 1.0), ("delayed", "h100", 1.0),
                                                      ("mxfp8", "b200", 1 + 1 / 32), ("nvfp4", "b200", 0.5625),
                                                      (None, "b200", 1 + 1 / 32), (None, "h100", 1.0)])
def test_saved_gemm_inputs_carry_the_recipe_scales(recipe, gpu, per_element):
    lay = layouts_from_strategies([Strategy(fp8="hybrid", fp8_recipe=recipe)], 8, gpu_id=gpu)
    assert np.isclose(M.gemm_input_bytes(lay)[0], per_element)
    assert QUANTISED_BYTES["nvfp4"] < QUANTISED_BYTES["tensorwise"] < QUANTISED_BYTES["mxfp8"]


def test_bf16_adam_moments_hold_two_thirds_of_the_optimizer_state(dense):
    """Precision-aware optimizer with bf16 moments: fp32 master (4) + bf16 m, v (2 + 2) = 8 bytes per parameter
    instead of 12, sharded the same way; nothing else changes."""
    wl = workload(2048, 8)
    plain = estimate(dense, cluster(8), Strategy(zero=1), wl).memory_breakdown
    low = estimate(dense, cluster(8), Strategy(zero=1, adam_bf16_states=True), wl).memory_breakdown
    assert np.isclose(low["optimizer"], plain["optimizer"] * 8 / 12)
    assert {k: v for k, v in low.items() if k != "optimizer"} == {k: v for k, v in plain.items() if k != "optimizer"}
    lay = layouts_from_strategies([Strategy(zero=1), Strategy(zero=1, adam_bf16_states=True)], 8)
    assert list(M.optimizer_bytes_per_param(lay)) == [12.0, 8.0]


def test_bf16_adam_moments_need_the_megatron_distributed_optimizer(dense):
    from autoplan.validate import first_broken_rule
    for s, engine in ((Strategy(zero=3, adam_bf16_states=True), "megatron"),
                      (Strategy(zero=1, adam_bf16_states=True), "deepspeed")):
        msg = first_broken_rule(dense, cluster(8), workload(2048, 8), s, engine=engine)
        assert msg.startswith("adam_bf16_states=true needs Megatron's distributed optimizer (zero=1; ")
        assert f"engine={engine}" in msg and "bf16_master_weights=false" in msg
    assert first_broken_rule(dense, cluster(8), workload(2048, 8), Strategy(zero=1, adam_bf16_states=True)) is None
    # DeepSpeed's bf16 optimizer states are legal beside its bf16 master weights (runtime/config.py).
    assert first_broken_rule(dense, cluster(8), workload(2048, 8),
                             Strategy(zero=1, adam_bf16_states=True, bf16_master_weights=True),
                             engine="deepspeed") is None


def test_gated_experts_keep_the_routing_probabilities_not_their_output(moe, monkeypatch):
    """Megatron weights the routed copies inside the fused SwiGLU (WeightedSwiGLUFunction saves its input and the
    probabilities) and unpermutes without probabilities, so a gated MoE layer holds one fp32 probability per
    routed copy where the experts' bf16 output (h wide) was counted."""
    lay = layouts_from_strategies([Strategy()], 8)
    assert M.routing_weight_bytes(10) == 40 and M.weighted_activation_bytes(moe, lay, 10, 1024)[0] == 0
    wl, s = workload(2048, 8), Strategy(mbs=1)
    new = estimate(moe, cluster(8), s, wl).memory_breakdown["activations"]
    from autoplan.costmodel.layers import moe as moe_layer

    for module in (moe_layer, M):  # where the MoE layer's bytes and the selective-recompute drop read it
        monkeypatch.setattr(module, "routing_weight_bytes", lambda copies: 2.0 * copies * moe.hidden_size)
    old = estimate(moe, cluster(8), s, wl).memory_breakdown["activations"]
    copies = 2048 * moe.moe_router_topk  # one micro batch of 2048 tokens, top-2, tp = ep = 1
    moe_layers = moe.num_layers - moe.first_k_dense_layers
    assert moe.gated_mlp and np.isclose((old - new) * GIB, moe_layers * copies * (2 * moe.hidden_size - 4))


def test_non_gated_experts_save_the_activation_output_unless_fused(moe):
    """experts.py's unfused branch `activation_func(x) * permuted_probs` saves the bf16 activation output for the
    probabilities' gradient; the fused weighted squared ReLU saves only its input and the probabilities; moe_act
    recompute rebuilds that output either way."""
    relu = moe.model_copy(update={"activation": "gelu"})
    wl = workload(2048, 8)
    copies, f = 2048 * relu.moe_router_topk, relu.moe_ffn_hidden_size
    moe_layers = relu.num_layers - relu.first_k_dense_layers

    def acts(**kw):
        return estimate(relu, cluster(8), Strategy(mbs=1, **kw), wl).memory_breakdown["activations"] * GIB

    assert np.isclose(acts() - acts(fused_weighted_squared_relu=True), moe_layers * 2 * copies * f)
    sel = dict(recompute="selective", recompute_modules=("moe_act",), fp8="none")
    assert np.isclose(acts(**sel), acts(fused_weighted_squared_relu=True, **sel))


def test_fused_weighted_squared_relu_rules(moe, dense):
    from autoplan.validate import first_broken_rule
    on = Strategy(fused_weighted_squared_relu=True)
    relu = moe.model_copy(update={"activation": "gelu"})
    assert first_broken_rule(relu, cluster(8), workload(2048, 8), on) is None
    for model, engine in ((moe, "megatron"), (dense, "megatron"), (relu, "deepspeed")):
        msg = first_broken_rule(model, cluster(8), workload(2048, 8), on, engine=engine)
        assert msg.startswith("fused_weighted_squared_relu=true needs a Megatron MoE model with non-gated experts")


def test_nvfp4_layernorm_linear_keeps_both_copies_of_its_input_under_sequence_parallelism():
    """TransformerEngine's LayerNormLinear (QKV, dense FC1, Mamba in_proj) saves its local norm output with both
    row- and column-wise NVFP4 copies when it must all-gather it (sequence parallelism); MXFP8 and the other recipes
    keep one copy, and without the gather NVFP4 keeps one too."""
    def lay(recipe, tp, sp):
        s = Strategy(tp=tp, sp=sp, fp8="hybrid", fp8_recipe=recipe)
        return layouts_from_strategies([s], 8, gpu_id="b200")

    nvfp4, mxfp8 = QUANTISED_BYTES["nvfp4"], QUANTISED_BYTES["mxfp8"]
    assert M.norm_linear_input_bytes(lay("nvfp4", 4, True))[0] == pytest.approx(2 * nvfp4)
    assert M.norm_linear_input_bytes(lay("nvfp4", 4, False))[0] == pytest.approx(nvfp4)
    assert M.norm_linear_input_bytes(lay("nvfp4", 1, False))[0] == pytest.approx(nvfp4)
    assert M.norm_linear_input_bytes(lay("mxfp8", 4, True))[0] == pytest.approx(mxfp8)
    # The plain linears (MoE experts, shared experts, MLA down projections) keep the column-wise copy only.
    assert M.gemm_input_bytes(lay("nvfp4", 4, True))[0] == pytest.approx(nvfp4)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_shared_expert_recompute_drops_what_the_shared_experts_hold(recipe):
    """With sequence parallelism the shared experts' fc1 input is the local shard; recomputing them frees exactly
    what they hold, never more."""
    from autoplan.costmodel import compute as C
    from autoplan.modelio import load_model

    m = load_model("deepseek-v3")
    lay = layouts_from_strategies([Strategy(tp=4, ep=8, sp=True, recompute="selective",
                                            recompute_modules=("shared_experts",), fp8="hybrid", fp8_recipe=recipe)],
                                  256, gpu_id="b200")
    sh = C.shard_of(m, lay, 4096)
    no_shared = m.model_copy(update={"shared_expert_ffn_hidden_size": 0})
    held = M.moe_activation_bytes(m, sh, lay) - M.moe_activation_bytes(no_shared, sh, lay)
    dropped = M.selective_dropped_bytes(m, sh, lay, True) - M.selective_dropped_bytes(no_shared, sh, lay, True)
    assert float(dropped[0]) == pytest.approx(float(held[0]))


def test_moe_routing_index_tensors_are_held_per_micro_batch():
    """The fused permute's int32 row-id map [tokens, 2E + 1], the router's top-k indices (int64) and probabilities
    (fp32), and with several local experts the two chunk-sort maps per routed copy."""
    from autoplan.costmodel import compute as C
    from autoplan.modelio import load_model

    m = load_model("qwen3-30b-a3b")  # 128 experts, top-8
    for ep, local in ((8, 16), (128, 1)):
        lay = layouts_from_strategies([Strategy(tp=2, ep=ep, sp=True)], 128, gpu_id="h100")
        sh = C.shard_of(m, lay, 4096)
        tokens = 4096 / 2  # the rank's own tokens, sharded over tp
        copies = tokens * 8
        expected = 4 * (2 * 128 + 1) * tokens + 12 * 8 * tokens + (16 * copies if local > 1 else 0.0)
        assert float(sh.local_experts[0]) == local
        assert float(M.routing_index_bytes(m, sh, lay)[0]) == pytest.approx(expected)


def test_dispatcher_state_is_held_once_per_moe_layer_not_per_micro_batch_in_flight(monkeypatch):
    """Megatron's token dispatcher keeps the last micro batch's probs, routing map and row-id map on each MoE layer:
    the rank holds it once per layer however many micro batches are in flight."""
    from autoplan.clusterio import load_cluster
    from autoplan.modelio import load_model
    from autoplan.workload import Workload

    m = load_model("qwen3-30b-a3b")
    s = Strategy(tp=1, pp=4, ep=8, mbs=1, zero=1)
    wl = Workload(seq_len=4096, global_batch_size=64)
    with_state = estimate(m, load_cluster("h100", 32), s, wl).stage_memory[0]
    monkeypatch.setattr(M, "dispatcher_state_bytes", lambda *a: 0.0)
    without = estimate(m, load_cluster("h100", 32), s, wl).stage_memory[0]
    layers = with_state.num_layers  # every Qwen3-MoE layer is an MoE layer
    per_layer = (4 + 1 + 8) * 128 * 4096 + 4 * 4096
    gib = (with_state.breakdown_gib["activations"] - without.breakdown_gib["activations"])
    assert gib * GIB == pytest.approx(layers * per_layer)


def test_context_parallel_forward_holds_every_ring_step_kv_chunk():
    """TransformerEngine's p2p ring attention keeps each received K/V chunk and each step's output and fp32 lse
    until the layer's forward returns: the transient of a stage without logits grows with cp once that exceeds a
    layer's working set."""
    from autoplan.clusterio import load_cluster
    from autoplan.costmodel import compute as C
    from autoplan.modelio import load_model
    from autoplan.workload import Workload

    m = load_model("llama3-70b")  # 64 heads, 8 KV groups, head dim 128
    s = Strategy(tp=8, pp=2, cp=32, sp=True, mbs=1, zero=1)
    wl = Workload(seq_len=4096 * 32 * 2, global_batch_size=4)
    lay = layouts_from_strategies([s], 512, gpu_id="h100")
    sh = C.shard_of(m, lay, wl.seq_len)
    h, g, d = 64 / 8, 1.0, 128  # per tp rank
    kv = 2 * 2 * g * d
    per_token = 32 * (kv + 2 * h * d + 4 * h) + kv + 4 * h
    assert float(M.cp_forward_working_bytes(m, sh, lay)[0]) == pytest.approx(per_token * 8192)
    first_stage = estimate(m, load_cluster("h100", 512), s, wl).stage_memory[0]
    assert first_stage.breakdown_gib["transient"] * GIB >= per_token * 8192 * (1 - 1e-9)
    no_cp = layouts_from_strategies([Strategy(tp=8, sp=True)], 8, gpu_id="h100")
    assert float(M.cp_forward_working_bytes(m, C.shard_of(m, no_cp, 8192), no_cp)[0]) == 0.0


@pytest.mark.parametrize("pp, vpp, plain, overlapped", [(1, 1, 1, 2), (4, 2, 11, 12)])
def test_all_to_all_overlap_holds_one_more_micro_batch(pp, vpp, plain, overlapped):
    """Megatron's combined 1F1B (moe_a2a_overlap) runs one more forward ahead: without pipelining micro batch k+1's
    forward beside micro batch k's backward; interleaved, one extra warm-up micro batch (schedules.py
    get_pp_rank_microbatches). Rank 0's in-flight (micro batch, chunk) pairs grow by one."""
    import numpy as np

    from autoplan.costmodel.rank import in_flight

    def chunks(overlap):
        s = Strategy(pp=pp, vpp=vpp, ep=8, moe_a2a_overlap=overlap)
        lay = layouts_from_strategies([s], 64)
        return int(in_flight(lay, np.array([0]), np.array([64]))[0])

    assert (chunks(False), chunks(True)) == (plain, overlapped)


def test_flex_dispatcher_buffers_are_sized_for_the_whole_expert_parallel_group():
    """HybridEP allocates its token buffer for every rank's tokens of the EP group (T x G x H x 2 bytes plus the
    routing probabilities, scales and the gathered routing map): DeepSeek-V3 at ep 64 inside one NVL72 domain,
    4096 tokens per rank and 4 local experts, about 3.87 GiB; none without the flex dispatcher."""
    from autoplan.costmodel import compute as C
    from autoplan.modelio import load_model

    m = load_model("deepseek-v3")

    def buffers(flex, ep, per_domain):
        lay = layouts_from_strategies([Strategy(ep=ep, moe_flex_dispatcher=flex)], 256, gpu_id="gb200")
        return float(M.flex_dispatcher_buffer_bytes(m, C.shard_of(m, lay, 4096), lay, per_domain)[0])

    t, g, h, e = 4096, 64, 7168, 4
    expected = t * g * (h * 2 + e * g * 4 + h / 128 * 4) + e * g * t * g
    assert buffers(True, 64, 64) == pytest.approx(expected)
    assert expected / GIB == pytest.approx(3.87, abs=0.01)
    assert buffers(True, 64, 8) > buffers(True, 64, 64)  # across NVLink domains the internode buffers add
    assert buffers(False, 64, 64) == 0.0


def test_optimizer_step_fp32_grad_copy():
    """From a bf16 grad buffer Megatron's optimizer step makes an fp32 copy of the rank's gradient shard
    (distrib_optimizer.py `shard_model_grad.float()`), of every gradient without the distributed optimizer, and
    none when the precision-aware optimizer reads the bf16 grad (bf16 moments without FP8) or grads are fp32."""
    import numpy as np

    def copy(**kw):
        s = Strategy(tp=1, **kw)
        lay = layouts_from_strategies([s], 8, gpu_id="b200")
        return float(M.optimizer_step_grad_copy_bytes(np.array([8e9]), np.array([0.0]), lay, np.array([8]))[0])

    assert copy(zero=1, grad_reduce_bf16=True) == pytest.approx(4 * 8e9 / 8)
    assert copy(zero=0, grad_reduce_bf16=True) == pytest.approx(4 * 8e9)
    assert copy(zero=1, grad_reduce_bf16=False) == 0.0
    assert copy(zero=1, grad_reduce_bf16=True, adam_bf16_states=True) == 0.0
    assert copy(zero=1, grad_reduce_bf16=True, adam_bf16_states=True, fp8="hybrid",
                fp8_recipe="mxfp8") == pytest.approx(4 * 8e9 / 8)


def test_peak_covers_the_optimizer_step_when_it_outweighs_the_activations():
    from autoplan.clusterio import load_cluster
    from autoplan.costmodel.hardware import GIB
    from autoplan.modelio import load_model
    from autoplan.workload import Workload

    m = load_model("llama3-8b")
    s = Strategy(tp=1, pp=1, zero=0, grad_reduce_bf16=True, recompute="full", mbs=1)
    est = estimate(m, load_cluster("h100", 2), s, Workload(seq_len=512, global_batch_size=2))
    b = est.memory_breakdown
    params = 8.03e9
    assert (b["weights"] + b["grads"] + b["optimizer"] + b["activations"] + b["logits"] + b["transient"]) * GIB \
        >= (b["weights"] + b["grads"] + b["optimizer"]) * GIB + 4 * params * 0.99


def test_each_pre_norm_saves_its_fp32_statistics():
    from autoplan.costmodel import compute as C
    from autoplan.modelio import load_model

    m = load_model("llama3-8b")  # RMSNorm: one fp32 per token per norm, two norms per layer
    lay = layouts_from_strategies([Strategy(tp=2, sp=True)], 8, gpu_id="h100")
    sh = C.shard_of(m, lay, 4096)
    assert float(M.norm_statistics_bytes(m, sh)[0]) == pytest.approx(2 * 4 * 4096 / 2)


def test_megatron_fsdp_buffers():
    """Megatron-FSDP: small units are gathered several at a time (prefetch up to 5e8 elements); with bf16
    parameters TransformerEngine caches every layer's full FP8 weight; unsharded grad buckets and the fp32 grad
    copy of the optimizer step are priced."""
    import numpy as np

    from autoplan.costmodel.rank import _fsdp_unsharded_grads, _gathered_params
    from autoplan.costmodel.stages import stage_layers
    from autoplan.modelio import load_model

    lay = layouts_from_strategies([Strategy(tp=1, zero=3)], 8, gpu_id="h100")
    st = stage_layers(load_model("llama3-8b"), lay, np.array([0]))
    dense, vocab = np.array([7.0e9]), np.array([1.05e9])
    unit = (7.0e9 - 1.05e9) / 32  # ~186M elements per layer
    gathered = float(_gathered_params(lay, st, dense, np.array([0.0]), vocab)[0])
    assert gathered == pytest.approx(2 * (unit * (1 + np.ceil(5e8 / unit)) + 1.05e9))  # 4 units, not 2
    head = np.array([0.525e9])
    extra = float(_fsdp_unsharded_grads(lay, st, dense, np.array([0.0]), vocab, np.array([0.0]), head)[0])
    assert extra >= 2 * 0.525e9  # at least the output layer's full grad bucket
    # FP8 compute with bf16 parameters: the FP8 copies are not sharded under Megatron-FSDP.
    fp8 = layouts_from_strategies([Strategy(tp=1, zero=3, fp8="hybrid", fp8_recipe="mxfp8")], 8, gpu_id="b200")
    w_fp8, _, _ = M.state_bytes(dense, np.array([0.0]), fp8, np.array([8]), fp8.fp8)
    w_bf16, _, _ = M.state_bytes(dense, np.array([0.0]), lay, np.array([8]), lay.fp8)
    assert float(w_fp8[0] - w_bf16[0]) == pytest.approx(2 * (1 + 1 / 32) * 7.0e9)
    # The step's fp32 copy of the bf16 grad shard.
    assert float(M.optimizer_step_grad_copy_bytes(dense, np.array([0.0]), lay, np.array([8]))[0]) == \
        pytest.approx(4 * 7.0e9 / 8)


def test_deepep_buffer_hints_match_deepeps_formula():
    """DeepEP's NVLink and RDMA buffer hints (DeepEP csrc/config.hpp get_nvl_buffer_size_hint /
    get_rdma_buffer_size_hint) worked by hand with Megatron's 20 SMs (10 channels), int64 top-k indices, 8-byte
    source meta, kNumMaxTopK = kNumMaxScales = 128 and the deep_ep/buffer.py chunk configs, rounded up to 128 bytes."""
    from autoplan.costmodel.layers.moe import deepep_nvl_buffer_hint, deepep_rdma_buffer_hint

    # 4 ranks, hidden 2048: 10 ch x 4 nvl x (2 x 1 + 3) x 4 = 800; 10 x 4 x 256 x (4096 + 8 + 1024 + 512 + 512)
    # = 62,996,480; 62,997,280 rounded up to 128
    assert float(deepep_nvl_buffer_hint(2048 * 2, 4, 256)) == 62_997_376
    assert float(deepep_rdma_buffer_hint(2048 * 2, 4, 6, 128)) == 0  # one node: no RDMA buffer
    # 8 ranks, hidden 7168: 10 x 8 x 5 x 4 = 1600; 10 x 8 x 256 x (14336 + 8 + 1024 + 512 + 512) = 335,708,160
    assert float(deepep_nvl_buffer_hint(7168 * 2, 8, 256)) == 335_709_824
    # 16 ranks: nvl 10 x 8 x 7 x 4 = 2240 + 10 x 8 x 288 x 16392 = 377,671,680; rdma recv 128 aligned up to the
    # send chunk 20 -> 140:
    # 10 x 2 x 18 x 2 x 4 = 2880 + 10 x 2 x 140 x 2 x (16392 + 16) = 91,884,800
    assert float(deepep_nvl_buffer_hint(7168 * 2, 16, 288)) == 377_673_984
    assert float(deepep_rdma_buffer_hint(7168 * 2, 16, 20, 128)) == 91_887_744
    # 64 ranks: 8 RDMA ranks; 10 x 8 x 18 x 2 x 4 = 11520 + 10 x 8 x 128 x 32816 = 336,035,840
    assert float(deepep_rdma_buffer_hint(7168 * 2, 64, 8, 128)) == 336_047_360


def test_flex_dispatcher_buffers_cover_both_backends():
    """The flex dispatcher's buffers are priced as the larger of HybridEP's and DeepEP's (an imported run may use
    either backend): DeepSeek-V3 at EP 8 with 1024 tokens per rank is DeepEP's NVLink buffer, its peer pointers and
    32 MiB workspace (more than HybridEP's); DeepEP's group is ETP x EP."""
    from autoplan.costmodel import compute as C
    from autoplan.costmodel.layers.moe import deepep_buffer_bytes, hybridep_buffer_bytes
    from autoplan.modelio import load_model

    for name in ("deepseek-v3", "qwen3-30b-a3b"):
        m = load_model(name)
        for ep in (2, 8, 16, 64):
            lay = layouts_from_strategies([Strategy(ep=ep, moe_flex_dispatcher=True)], 64, gpu_id="h100")
            for tokens in (1024, 4096, 16384):
                sh = C.shard_of(m, lay, tokens)
                priced = M.flex_dispatcher_buffer_bytes(m, sh, lay, 8)
                assert priced >= hybridep_buffer_bytes(m, sh, lay, 8)
                assert priced >= deepep_buffer_bytes(m, lay)
    m = load_model("deepseek-v3")
    lay = layouts_from_strategies([Strategy(ep=8, moe_flex_dispatcher=True)], 64, gpu_id="h100")
    sh = C.shard_of(m, lay, 1024)
    deepep = 335_709_824 + 8 * (4 + 8 + 8) + 32 * 1024 ** 2
    assert float(M.flex_dispatcher_buffer_bytes(m, sh, lay, 8)[0]) == deepep
    assert float(hybridep_buffer_bytes(m, sh, lay, 8)[0]) < deepep
    split = layouts_from_strategies([Strategy(tp=2, ep=4, etp=2, moe_flex_dispatcher=True)], 64, gpu_id="h100")
    assert float(deepep_buffer_bytes(m, split)[0]) == deepep  # a group of 4 EP x 2 ETP = 8 ranks
    off = layouts_from_strategies([Strategy(ep=8, moe_flex_dispatcher=False)], 64, gpu_id="h100")
    assert float(deepep_buffer_bytes(m, off)[0]) == 0.0
