"""ZeRO-2/3 and Megatron-FSDP data-parallel communication: per micro batch, per unit, overlapped only inside it."""
import numpy as np

from autoplan.costmodel import rank as E
from autoplan.costmodel.calibration import DEFAULT
from autoplan.costmodel.collectives import collective_time
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.hardware import GIB, hardware_of
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.costmodel.stages import stage_layers
from autoplan.modelio import load_model
from autoplan.clusterio import load_cluster
from autoplan.strategy import Strategy

from conftest import cluster, make_dense, workload

LLAMA_70B_TP2_Z3 = Strategy(tp=2, sp=True, zero=3, recompute="full")


def _one_layer_gather(model, clus, s):
    """Seconds of one transformer layer's bf16 parameter all-gather over the rank's DP group."""
    hw = hardware_of(clus)
    lay = layouts_from_strategies([s], clus.num_gpus)
    st = stage_layers(model, lay, np.zeros(1, int))
    vocab = E._vocab_params(model, lay, st)
    dense, expert, edp = E._rank_params(model, hw, lay, st, vocab)
    layer = (dense - vocab) / model.num_layers
    return float(E._dp_groups(hw, lay, edp).time("all_gather", 2.0 * layer, 0.0 * layer)[0])


def test_zero3_waits_for_the_first_unit_of_every_pass_of_every_micro_batch():
    model = load_model("llama3-70b")
    for gpus, gbs in ((64, 128), (512, 1024)):
        clus = load_cluster("h100", gpus)
        est = estimate(model, clus, LLAMA_70B_TP2_Z3, workload(8192, gbs))
        floor = est.num_microbatches * 2 * _one_layer_gather(model, clus, LLAMA_70B_TP2_Z3)
        assert est.time_breakdown["dp_comm"] >= floor > 0.01  # was ~2 ms: only the last bucket was exposed


def test_zero3_exposed_time_grows_with_micro_batches_zero1_does_not(dense):
    small, large = workload(2048, 8), workload(2048, 64)
    z3 = [estimate(dense, cluster(8), Strategy(zero=3), wl).time_breakdown["dp_comm"] for wl in (small, large)]
    z1 = [estimate(dense, cluster(8), Strategy(zero=1), wl).time_breakdown["dp_comm"] for wl in (small, large)]
    assert z3[1] > 3 * z3[0]  # 8x the micro batches: per-micro-batch waits dominate
    assert z1[1] == z1[0]


def test_zero3_gathers_exposed_when_the_forward_is_too_short_to_hide_them(dense):
    """With one sequence of 256 tokens per micro batch the forward is far shorter than the gathers: most of the
    2 gathers + 1 reduce-scatter per micro batch are exposed, every micro batch."""
    wl = workload(256, 64)
    est = estimate(dense, cluster(64), Strategy(zero=3), wl)
    hw = hardware_of(cluster(64))
    lay = layouts_from_strategies([Strategy(zero=3)], 64)
    st = stage_layers(dense, lay, np.zeros(1, int))
    params, expert, edp = E._rank_params(dense, hw, lay, st, E._vocab_params(dense, lay, st))
    g = E._dp_groups(hw, lay, edp)
    one_gather = float(g.time("all_gather", 2.0 * params, 0.0 * params)[0])
    assert est.time_breakdown["dp_comm"] > est.num_microbatches * one_gather
    assert est.time_breakdown["dp_comm"] > est.time_breakdown["compute"]


def test_deepspeed_zero2_reduces_every_micro_batch_and_gathers_after_the_step(dense):
    small, large = workload(2048, 8), workload(2048, 64)
    ds = [estimate(dense, cluster(8), Strategy(zero=2), wl, engine="deepspeed").time_breakdown["dp_comm"]
          for wl in (small, large)]
    assert ds[1] > ds[0]
    # ZeRO-1: DeepSpeed gathers the updated parameters after the optimizer step (exposed); Megatron overlaps it.
    ds_z1 = estimate(dense, cluster(8), Strategy(zero=1), small, engine="deepspeed").time_breakdown["dp_comm"]
    mg_z1 = estimate(dense, cluster(8), Strategy(zero=1), small).time_breakdown["dp_comm"]
    assert ds_z1 > mg_z1


def test_zero3_holds_gathered_units_and_the_vocabulary(dense):
    wl = workload(2048, 8)
    z3 = estimate(dense, cluster(8), Strategy(zero=3), wl).memory_breakdown["weights"] * GIB
    hw = hardware_of(cluster(8))
    lay = layouts_from_strategies([Strategy(zero=3)], 8)
    st = stage_layers(dense, lay, np.zeros(1, int))
    vocab = E._vocab_params(dense, lay, st)
    params, _, _ = E._rank_params(dense, hw, lay, st, vocab)
    unit = (params - vocab) / dense.num_layers
    shard = 2.0 * params / 8
    # Megatron-FSDP prefetches units until 5e8 elements are in flight: this small model is gathered whole.
    units = np.minimum(1 + np.ceil(np.maximum(E.FSDP_PREFETCH_ELEMENTS, unit) / unit), dense.num_layers)
    assert np.isclose(z3, float(np.squeeze(shard + 2.0 * (units * unit + vocab))))


def test_deepspeed_zero3_holds_up_to_max_live_parameters():
    model = make_dense(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                       num_query_groups=8, kv_channels=128)
    wl = workload(2048, 8)
    ds = estimate(model, cluster(8), Strategy(zero=3), wl, engine="deepspeed").memory_breakdown["weights"] * GIB
    assert ds >= 2.0 * E.DS_MAX_LIVE_PARAMETERS


def test_ring_latency_mixes_network_and_nvlink_hops():
    hw = hardware_of(cluster(64))
    one = collective_time("all_gather", 0.0, 64, True, hw, ranks_per_domain=1)
    eight = collective_time("all_gather", 0.0, 64, True, hw, ranks_per_domain=8)
    assert np.isclose(one, 63 * hw.network_latency_s)
    assert np.isclose(eight, 63 * (hw.network_latency_s / 8 + hw.nvlink_latency_s * 7 / 8))




def test_fsdp_rebuilds_fp8_weight_transposes_every_micro_batch(dense):
    """Megatron-FSDP makes the transpose of its gathered FP8 primary weights after every backward gather (per-tensor
    scaling); the distributed optimizer keeps it for the step, MXFP8 gathers no transpose to make."""
    fp8 = dict(fp8="hybrid", fp8_recipe="tensorwise", fp8_param=True)
    hw = hardware_of(cluster(8))
    lay = layouts_from_strategies([Strategy(zero=3, **fp8), Strategy(zero=1, **fp8),
                                   Strategy(zero=3, fp8="hybrid", fp8_recipe="mxfp8", fp8_param=True)], 8,
                                  gpu_id="h100")
    st = stage_layers(dense, lay, np.zeros(3, int))
    vocab = E._vocab_params(dense, lay, st)
    params, _, _ = E._rank_params(dense, hw, lay, st, vocab)
    per_micro = E._fp8_transpose_per_micro(lay, DEFAULT, hw, params - vocab)
    assert per_micro[0] > 0 and per_micro[1] == 0 and per_micro[2] == 0
    est = estimate(dense, cluster(8), Strategy(zero=3, **fp8), workload(2048, 64))
    assert est.time_breakdown["dp_comm"] >= est.num_microbatches * per_micro[0]


def test_zero3_overlaps_only_what_the_engine_overlaps(dense):
    wl = workload(2048, 32)
    on = estimate(dense, cluster(8), Strategy(zero=3), wl).time_breakdown["dp_comm"]
    no_prefetch = estimate(dense, cluster(8), Strategy(zero=3, overlap_param_gather=False), wl)
    no_overlap = estimate(dense, cluster(8), Strategy(zero=3, overlap_grad_reduce=False, overlap_param_gather=False),
                          wl)
    assert on < no_prefetch.time_breakdown["dp_comm"] < no_overlap.time_breakdown["dp_comm"]
    ds_on = estimate(dense, cluster(8), Strategy(zero=2), wl, engine="deepspeed").time_breakdown["dp_comm"]
    ds_off = estimate(dense, cluster(8), Strategy(zero=2, overlap_grad_reduce=False), wl,
                      engine="deepspeed").time_breakdown["dp_comm"]
    assert ds_on < ds_off
