"""Cost model: FLOPs against Megatron's formula, activations against Korthikanti et al., and invariants."""
import numpy as np
import pytest

from autoplan.costmodel import compute as C
from autoplan.costmodel import memory as M
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.flops import megatron_reference_flops, model_flops_per_token
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.results import ESTIMATE_CONTRACT_KEYS
from autoplan.strategy import Strategy

from conftest import cluster, make_dense, make_moe, workload


def test_model_flops_match_megatron_formula():
    for m in (make_dense(), make_dense(activation="gelu", num_query_groups=16), make_dense(num_layers=80,
                                                                                           hidden_size=8192,
                                                                                           ffn_hidden_size=28672,
                                                                                           num_attention_heads=64,
                                                                                           num_query_groups=8,
                                                                                           kv_channels=128,
                                                                                           vocab_size=128256)):
        for seq in (2048, 8192):
            ours = model_flops_per_token(m, seq) * 4 * seq
            ref = megatron_reference_flops(m, 4, seq)
            assert ours == pytest.approx(ref, rel=1e-12)


def test_six_n_rule_for_a_dense_model():
    # Kaplan et al. 2020: training FLOPs ~ 6 N per token when seq << 6h (attention term small).
    m = make_dense(num_layers=24, hidden_size=4096, ffn_hidden_size=16384, num_query_groups=16,
                   num_attention_heads=32, kv_channels=128, activation="gelu", vocab_size=50000)
    from autoplan.costmodel.params import count_parameters

    total, _ = count_parameters(m)
    non_embedding = total - m.vocab_size * m.hidden_size * 2
    flops = model_flops_per_token(m, 128)
    assert flops == pytest.approx(6 * (non_embedding + m.vocab_size * m.hidden_size), rel=0.02)


def _shard(m, strategy, seq=2048, n=8):
    lay = layouts_from_strategies([strategy], n)
    return C.shard_of(m, lay, seq), lay


def test_activations_match_korthikanti_table2():
    # Korthikanti et al. 2022 Table 2, 16-bit, with flash attention (no 5as^2b term): per layer
    # sbh(34) with no parallelism; sbh(34)/t with TP + SP. Our itemisation reproduces 34sbh for a GPT-style layer
    # (MHA, GELU, ffn = 4h, kv_channels = h/a) up to the flash-attention statistics (4 bytes per token per head).
    # The paper's count includes the two dropout masks (p > 0).
    m = make_dense(activation="gelu", num_query_groups=16, ffn_hidden_size=4096, hidden_dropout=0.1)
    s, b, h, a = 2048, 1, m.hidden_size, m.num_attention_heads
    for tp, sp in ((1, False), (2, True), (8, True)):
        sh, lay = _shard(m, Strategy(tp=tp, sp=sp), seq=s)
        none, sel, ckpt = M.layer_activation_bytes(m, sh, lay, moe=False)
        lse = 4 * s * b * a / tp
        stats = float(M.norm_statistics_bytes(m, sh)[0])  # fp32 norm statistics, beyond Table 2
        assert float(none[0]) - lse - stats == pytest.approx(34 * s * b * h / tp, rel=1e-9)
        # Full recompute keeps the layer input: 2sbh/t with SP (sec. 4.1).
        assert float(ckpt[0]) == pytest.approx(2 * s * b * h / (tp if sp else 1))


def test_dropout_zero_stores_no_masks():
    """p = 0 drops exactly the two 1-byte masks per layer (after attention and after the MLP) and the embedding's."""
    for moe in (False, True):
        base = make_moe() if moe else make_dense()
        for tp, sp in ((1, False), (4, True)):
            sh, lay = _shard(base, Strategy(tp=tp, sp=sp, ep=2 if moe else 1))
            with_p, _, _ = M.layer_activation_bytes(base.model_copy(update=dict(hidden_dropout=0.1)), sh, lay, moe)
            without, _, _ = M.layer_activation_bytes(base, sh, lay, moe)
            region = sh.tokens_sp[0] * base.hidden_size
            assert float(with_p[0] - without[0]) == pytest.approx(2 * region)
            emb = M.embedding_activation_bytes(base.model_copy(update=dict(hidden_dropout=0.1)), sh)
            assert float(emb[0] - M.embedding_activation_bytes(base, sh)[0]) == pytest.approx(region)


def test_activations_without_sp_keep_replicated_regions():
    # Table 2, tensor parallel without SP: sbh(10 + 24/t), dropout masks included.
    m = make_dense(activation="gelu", num_query_groups=16, hidden_dropout=0.1)
    s, b, h, a, t = 2048, 1, m.hidden_size, m.num_attention_heads, 4
    sh, lay = _shard(m, Strategy(tp=t, sp=False), seq=s)
    none, _, _ = M.layer_activation_bytes(m, sh, lay, moe=False)
    stats = float(M.norm_statistics_bytes(m, sh)[0])  # fp32 norm statistics, beyond Table 2
    assert float(none[0]) - 4 * s * b * a / t - stats == pytest.approx(s * b * h * (10 + 24 / t), rel=1e-9)


def test_estimate_has_contract_keys(dense):
    est = estimate(dense, cluster(8), Strategy(tp=2, pp=2, sp=True), workload())
    d = est.contract()
    for k in ESTIMATE_CONTRACT_KEYS:
        assert k in d
    assert abs(sum(est.time_breakdown.values()) - est.step_time_s) < 1e-9 * est.step_time_s
    assert est.peak_mem_gib == pytest.approx(max(s.total_gib for s in est.stage_memory))


@pytest.mark.parametrize("model", [make_dense(), make_moe()])
def test_more_tp_never_raises_weight_memory(model):
    prev = None
    for tp in (1, 2, 4, 8):
        est = estimate(model, cluster(8), Strategy(tp=tp, sp=tp > 1, zero=0), workload(gbs=8))
        w = est.memory_breakdown["weights"]
        assert prev is None or w <= prev + 1e-9
        prev = w


@pytest.mark.parametrize("model", [make_dense(), make_moe()])
def test_recompute_orders_activation_memory(model):
    acts = {}
    for rc in ("none", "selective", "full"):
        est = estimate(model, cluster(8), Strategy(tp=2, pp=2, sp=True, recompute=rc), workload())
        acts[rc] = est.memory_breakdown["activations"]
    assert acts["full"] <= acts["selective"] <= acts["none"]
    assert acts["full"] < acts["none"]


def test_more_dp_never_changes_activation_memory(dense):
    base = None
    for n in (8, 16, 32):
        est = estimate(dense, cluster(n), Strategy(tp=2, pp=2, sp=True), workload(gbs=64))
        a = est.memory_breakdown["activations"]
        assert base is None or a == pytest.approx(base)
        base = a


def test_distributed_optimizer_shards_optimizer_state(dense):
    z0 = estimate(dense, cluster(8), Strategy(zero=0), workload(gbs=8)).memory_breakdown
    z1 = estimate(dense, cluster(8), Strategy(zero=1), workload(gbs=8)).memory_breakdown
    assert z1["optimizer"] == pytest.approx(z0["optimizer"] / 8)
    assert z1["grads"] == pytest.approx(z0["grads"])


def test_pipeline_bubble_follows_schedule(dense):
    # (p-1)/(v m) of the ideal time for balanced stages.
    wl = workload(gbs=16)
    e1 = estimate(dense, cluster(4), Strategy(pp=4, zero=0), wl)
    e2 = estimate(dense, cluster(4), Strategy(pp=4, vpp=2, zero=0), wl)
    assert e2.time_breakdown["bubble"] == pytest.approx(e1.time_breakdown["bubble"] / 2, rel=0.15)


def test_fp8_speeds_gemms_only(dense):
    wl = workload()
    bf = estimate(dense, cluster(8), Strategy(tp=2, sp=True), wl)
    f8 = estimate(dense, cluster(8), Strategy(tp=2, sp=True, fp8="hybrid"), wl)
    assert f8.time_breakdown["compute"] < bf.time_breakdown["compute"]
    assert f8.time_breakdown["tp_comm"] == pytest.approx(bf.time_breakdown["tp_comm"])


def test_moe_ep_all_to_all_costs_more_across_nodes(moe):
    wl = workload(gbs=64)
    inside = estimate(moe, cluster(16), Strategy(ep=8), wl).time_breakdown["ep_comm"]
    across = estimate(moe, cluster(16, nvlink_domain_size=4), Strategy(ep=8), wl).time_breakdown["ep_comm"]
    assert across > inside > 0


def test_expected_remote_nodes_is_the_occupancy_expectation():
    from autoplan.costmodel.collectives import expected_remote_nodes

    # N = 4 nodes, k = 8: 3 * (1 - 0.75^8); one node: nothing leaves it; k = 1: the (N-1)/N share.
    assert expected_remote_nodes(4, 8) == pytest.approx(3 * (1 - 0.75 ** 8))
    assert expected_remote_nodes(1, 8) == 0.0
    assert expected_remote_nodes(4, 1) == pytest.approx(0.75)
    # Monte Carlo over uniform expert draws agrees.
    rng = np.random.default_rng(0)
    nodes = rng.integers(0, 4, size=(20000, 8))
    distinct_remote = np.array([len(set(r) - {0}) for r in nodes])
    assert distinct_remote.mean() == pytest.approx(expected_remote_nodes(4, 8), rel=0.02)


def test_flex_dispatcher_cuts_network_all_to_all_only():
    # Large enough that bytes, not per-step latency, decide: 4 nodes, k = 8 -> 2.7 vs 6 token copies per NIC.
    moe = make_moe(num_experts=32, moe_router_topk=8, hidden_size=4096, num_attention_heads=32, kv_channels=128)
    wl = workload(seq=8192, gbs=64)
    ep_comm = lambda c, s: estimate(moe, c, s, wl).time_breakdown["ep_comm"]
    across = cluster(32, nvlink_domain_size=8)
    assert ep_comm(across, Strategy(ep=32, moe_flex_dispatcher=True)) < 0.6 * ep_comm(across, Strategy(ep=32))
    inside = cluster(8)
    # Inside a node a token goes once to each GPU holding one of its experts (5.25 of 8 GPUs for k = 8), not once
    # per expert: cheaper than the alltoall dispatcher there too.
    assert ep_comm(inside, Strategy(ep=8, moe_flex_dispatcher=True)) < ep_comm(inside, Strategy(ep=8))


def test_flex_dispatch_inside_the_domain_takes_the_profiles_measured_rate():
    """A GPU profile's flex_nvlink_efficiency (GB200: HybridEP's published NVL72 figure) replaces the calibration's
    DeepEP-on-H800 fraction inside the NVLink domain: with bytes deciding, the dispatch time scales by their ratio."""
    from autoplan.clusterio import load_gpu
    from autoplan.costmodel.calibration import DEFAULT

    moe = make_moe(num_experts=64, moe_router_topk=8, hidden_size=4096, num_attention_heads=32, kv_channels=128)
    wl = workload(seq=65536, gbs=64)  # long enough that the per-peer latency is a small share
    s = Strategy(ep=32, moe_flex_dispatcher=True)
    plain = cluster(32, nvlink_domain_size=72)
    measured = cluster(32, nvlink_domain_size=72, flex_nvlink_efficiency=0.39)
    a, b = (estimate(moe, c, s, wl).time_breakdown["ep_comm"] for c in (plain, measured))
    assert b / a == pytest.approx(DEFAULT.flex_nvlink_eff / 0.39, rel=0.02)
    assert load_gpu("gb200").flex_nvlink_efficiency == pytest.approx(468.9 / 900, abs=0.005)
    assert load_gpu("h800").flex_nvlink_efficiency is None  # the calibration constant is DeepEP's H800 figure


def test_flex_dispatch_counts_bytes_and_rates_as_deepep_measures_them():
    """One dispatch: token bytes x distinct destination nodes (own included) over the NIC at the DeepEP RDMA
    fraction, token bytes x distinct destination GPUs over NVLink at the DeepEP NVLink fraction, the slower one,
    plus the pairwise all-to-all's per-peer latency."""
    from autoplan.costmodel.calibration import DEFAULT
    from autoplan.costmodel.collectives import distinct_destinations, flex_all_to_all_time
    from autoplan.costmodel.hardware import hardware_of

    hw = hardware_of(cluster(32, nvlink_domain_size=8))
    size = 64e6
    t = float(flex_all_to_all_time(size, 8, 32, 8, hw, DEFAULT.flex_nvlink_eff, DEFAULT.flex_network_eff))
    net = size * 4 * (1 - 0.75 ** 8) / (hw.network_bytes_per_s * DEFAULT.flex_network_eff)
    nv = size * 32 * (1 - (31 / 32) ** 8) / (hw.nvlink_bytes_per_s * DEFAULT.flex_nvlink_eff)
    assert t == pytest.approx(31 * hw.network_latency_s + max(net, nv))
    assert distinct_destinations(4, 8) == pytest.approx(4 * (1 - 0.75 ** 8))
    inside = float(flex_all_to_all_time(size, 8, 8, 8, hw, DEFAULT.flex_nvlink_eff, DEFAULT.flex_network_eff))
    assert inside == pytest.approx(7 * hw.nvlink_latency_s + size * distinct_destinations(8, 8)
                                   / (hw.nvlink_bytes_per_s * DEFAULT.flex_nvlink_eff))


def test_vectorised_matches_scalar(dense):
    from autoplan.costmodel.estimate import evaluate

    strategies = [Strategy(tp=t, pp=p, sp=t > 1, mbs=b) for t in (1, 2) for p in (1, 2) for b in (1, 2)]
    lay = layouts_from_strategies(strategies, 8)
    ev = evaluate(dense, cluster(8), workload(), lay, every_rank=True)
    for i, s in enumerate(strategies):
        assert ev.step_time_s[i] == pytest.approx(estimate(dense, cluster(8), s, workload()).step_time_s)


def test_fp8_param_drops_the_bf16_weight_copy(dense):
    wl = workload()
    cache = estimate(dense, cluster(8), Strategy(zero=1, fp8="hybrid"), wl).memory_breakdown
    primary = estimate(dense, cluster(8), Strategy(zero=1, fp8="hybrid", fp8_param=True), wl).memory_breakdown
    # bf16 copy (2 bytes) + FP8 row/column copies (2 bytes) -> FP8 copies only.
    assert primary["weights"] == pytest.approx(cache["weights"] / 2)
    assert primary["optimizer"] == pytest.approx(cache["optimizer"])


def test_cpu_offload_keeps_the_other_layers_activations(dense):
    wl = workload()
    full = estimate(dense, cluster(8), Strategy(), wl).memory_breakdown
    off = estimate(dense, cluster(8), Strategy(cpu_offload_layers=6), wl).memory_breakdown
    ids_and_mask = (8 * 2048 + 2048 * dense.hidden_size * (dense.hidden_dropout > 0)) / 2**30  # ids + mask, GiB
    layers = dense.num_layers
    assert off["activations"] - ids_and_mask == pytest.approx((full["activations"] - ids_and_mask) * 2 / layers)
    assert off["fragmentation"] < full["fragmentation"]


def test_embedding_activations_only_on_chunk_0_micro_batches(dense):
    from autoplan.costmodel.rank import embedding_in_flight
    lay = layouts_from_strategies([Strategy(pp=4, vpp=2), Strategy(pp=4)], 8)
    # rank 0 holds (4 - 1) * 2 + (2 - 1) * 4 + 1 = 11 pairs: forwards 0-3 and 8-10 run on chunk 0.
    assert list(embedding_in_flight(lay, np.array([11, 4]))) == [7, 4]


def test_deepspeed_autotp_replicates_the_vocabulary(dense):
    # DeepSpeed AutoTP shards Linear layers only: embedding and LM head stay whole on every tp rank.
    s, wl = Strategy(tp=2, zero=0), workload(gbs=8)
    mega = estimate(dense, cluster(8), s, wl)
    ds = estimate(dense, cluster(8), s, wl, engine="deepspeed")
    vocab_half = 2 * dense.vocab_size * dense.hidden_size / 2  # embedding + untied head, the other tp half
    assert ds.memory_breakdown["weights"] - mega.memory_breakdown["weights"] == pytest.approx(
        2 * vocab_half / 2**30, rel=1e-6)
    assert ds.memory_breakdown["logits"] > mega.memory_breakdown["logits"]
    assert ds.step_time_s > mega.step_time_s


def test_a2a_overlap_pairs_only_steady_state_passes():
    """Combined 1F1B (Megatron combined_1f1b.py): without pipelining the first forward and the last backward run
    alone, so of m micro batches (m - 1) / m of the passes are paired; interleaved, the warm-up forwards
    2 (pp - rank - 1) + (vpp - 1) pp + 1 run alone."""
    from autoplan.costmodel.rank import a2a_paired_fraction

    for gbs, m_micro in ((8, 1), (40, 5), (160, 20)):
        lay = layouts_from_strategies([Strategy(ep=8, mbs=1, moe_a2a_overlap=True)], 8)
        assert a2a_paired_fraction(workload(gbs=gbs), lay, np.array([0]))[0] == pytest.approx(1 - 1 / m_micro)
    lay = layouts_from_strategies([Strategy(pp=4, vpp=2, ep=2, mbs=1, moe_a2a_overlap=True)], 8)
    # dp = 2, gbs 64 -> m = 32 micro batches, 64 chunk passes; rank 0 warm-up 2*3 + 1*4 + 1 = 11, last rank 5.
    paired = a2a_paired_fraction(workload(gbs=64), lay, np.array([0, 3]))
    assert paired == pytest.approx([1 - 11 / 64, 1 - 5 / 64])


def test_a2a_overlap_hides_less_with_fewer_micro_batches():
    m = make_moe()
    s = Strategy(ep=8, mbs=1, zero=1, moe_a2a_overlap=True)
    plain = Strategy(ep=8, mbs=1, zero=1)
    exposed = {}
    for gbs in (16, 128):
        on = estimate(m, cluster(8), s, workload(gbs=gbs)).time_breakdown["ep_comm"]
        off = estimate(m, cluster(8), plain, workload(gbs=gbs)).time_breakdown["ep_comm"]
        assert on < off
        exposed[gbs] = on / off
    assert exposed[16] > exposed[128]  # warm-up and cool-down weigh more with 2 than with 16 micro batches


def test_fused_permute_moves_fewer_bytes_than_unfused():
    m = make_moe(moe_router_topk=4)
    megatron = layouts_from_strategies([Strategy(ep=8)], 8)
    deepspeed = layouts_from_strategies([Strategy(ep=8)], 8, engine="deepspeed")
    fused = C.elementwise_bytes(m, C.shard_of(m, megatron, 2048), megatron, moe=True)
    unfused = C.elementwise_bytes(m, C.shard_of(m, deepspeed, 2048), deepspeed, moe=True)
    sh = C.shard_of(m, megatron, 2048)
    # fused: (k + 1) reads + writes of h per source token; unfused: 2 k
    saved = (4 * 4 - 2 * (4 + 1)) * m.hidden_size * C.BF16 * sh.expert_tokens / 4
    assert (unfused - fused)[0] == pytest.approx(saved[0])


def test_sampled_ranks_find_the_memory_peak_of_every_rank():
    """The search prices five ranks per candidate; their peak must equal the peak over every rank, also when the
    leading dense layers leave rank 1 lighter than the next (DeepSeek-style first_k_dense)."""
    from autoplan.costmodel.estimate import evaluate
    from autoplan.solvers.space import Problem, enumerate_grid

    m = make_moe(num_layers=16, first_k_dense_layers=3)
    p = Problem(m, cluster(16), workload(gbs=64))
    lay = enumerate_grid(p).layouts
    sampled = evaluate(m, p.cluster, p.workload, lay).peak_mem_bytes
    every = evaluate(m, p.cluster, p.workload, lay, every_rank=True).peak_mem_bytes
    assert (lay.pp >= 4).any()
    np.testing.assert_allclose(sampled, every, rtol=1e-9)


@pytest.mark.parametrize("moe", [False, True])
def test_sandwich_norms_add_their_saved_inputs_under_every_recompute(moe):
    # Two more norm inputs per layer (bf16 [s/tp, b, h] with SP, as Korthikanti et al. 2022 sec. 4.1 counts the
    # pre-norm inputs) and RMSNorm's fp32 1/rms per token; outputs feed the residual add only, so selective
    # recompute (layernorm module included) keeps them and the full-recompute checkpoint is unchanged.
    base = make_moe() if moe else make_dense()
    sandwich = base.model_copy(update=dict(sandwich_norm=True))
    h, seq = base.hidden_size, 2048
    for tp, sp, modules in ((1, False, None), (4, True, None), (4, True, ("core_attn", "layernorm"))):
        st = Strategy(tp=tp, sp=sp, ep=8 if moe else 1, recompute="selective", recompute_modules=modules)
        sh, lay = _shard(base, st, seq=seq)
        tokens_sp = seq / (tp if sp else 1)
        plain = M.layer_activation_bytes(base, sh, lay, moe)
        extra = M.layer_activation_bytes(sandwich, sh, lay, moe)
        added = 2 * (2 * tokens_sp * h + 4 * tokens_sp)
        assert float(extra[0][0] - plain[0][0]) == pytest.approx(added)  # no recompute
        assert float(extra[1][0] - plain[1][0]) == pytest.approx(added)  # selective
        assert float(extra[2][0]) == pytest.approx(float(plain[2][0]))  # full: the layer input only


def test_sandwich_norms_add_weights_and_norm_time(dense):
    from autoplan.costmodel.params import count_parameters

    sandwich = dense.model_copy(update=dict(sandwich_norm=True))
    extra_params = dense.num_layers * 2 * dense.hidden_size  # HF Gemma2DecoderLayer post_*_layernorm weights
    assert count_parameters(sandwich)[0] - count_parameters(dense)[0] == extra_params
    st, wl = Strategy(tp=1, pp=1, zero=0, recompute="none"), workload(gbs=8)
    plain, extra = estimate(dense, cluster(8), st, wl), estimate(sandwich, cluster(8), st, wl)
    assert (extra.memory_breakdown["weights"] - plain.memory_breakdown["weights"]) * 2**30 == \
        pytest.approx(2 * extra_params)  # bf16 copies, nothing sharded at tp = pp = 1, zero = 0
    assert extra.memory_breakdown["activations"] > plain.memory_breakdown["activations"]
    sh, lay = _shard(dense, st)
    norm_rw = 2 * 2 * dense.hidden_size * 2 * sh.tokens_sp  # two norms, read + write, bf16
    assert float((C.elementwise_bytes(sandwich, sh, lay, False) - C.elementwise_bytes(dense, sh, lay, False))[0]) \
        == pytest.approx(float(norm_rw[0]))
    assert extra.step_time_s > plain.step_time_s


def test_logit_softcapping_holds_one_more_bf16_logits_copy(dense):
    capped = dense.model_copy(update=dict(logit_softcapping=30.0))
    for te_xent in (False, True):
        st = Strategy(tp=2, sp=True, te_cross_entropy=te_xent)
        sh, lay = _shard(dense, st)
        added = M.logits_bytes(capped, sh, lay) - M.logits_bytes(dense, sh, lay)
        assert float(added[0]) == pytest.approx(float(2 * sh.tokens[0] * dense.vocab_size / 2))  # tanh's output
