"""The published-runs data set parses, maps to valid cost-model inputs, and every run is predicted to fit."""
import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` lives at the repository root, outside the installed package

from benchmarks.published import (DATA, DIM_COLUMNS, dominates, exclusion_reason, load_runs, read_rows,  # noqa: E402
                                  slower_than_a_weaker_gpu, stem)
from benchmarks.memory_vs_megatron import CASES, compare  # noqa: E402

# Runs that did run but that autoplan predicts not to fit, and why. Each is a modelling gap, not a data error;
# the list may only shrink.
KNOWN_MEMORY_GAPS: set = {
    # The 26.02.01 table prints Llama3-70B GB300 NVFP4 as tp1 pp1 mbs2 with no FSDP; Megatron-Bridge v0.3.0's
    # LLAMA3_70B_PRETRAIN_CONFIG_GB300_NVFP4 is pp4 vpp5 (llama3_workload_base_configs.py). 70B parameters with
    # bf16 weights and grads on one GPU cannot fit; the row is priced as printed and counted.
    "mb_26.02.01_pre-training_llama3_70b_gb300_64g_nvfp4_tp1pp1cp1vpep_gbs256_tok",
}

COLUMNS = ("id", "source", "model", "arch", "num_layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab",
           "seq_len", "num_experts", "topk", "moe_ffn_hidden", "gpu", "num_gpus", "precision", "tp", "pp", "vpp",
           "dp", "cp", "ep", "etp", "zero_or_distopt", "recompute", "mbs", "gbs", "measured_metric_name",
           "measured_value", "notes")


@pytest.fixture(scope="module")
def runs_and_excluded():
    return load_runs()


def test_csv_has_the_documented_columns_and_unique_ids():
    with open(DATA, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS
        rows = list(reader)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    for r in rows:
        assert float(r["measured_value"]) > 0
        assert r["measured_metric_name"] in ("tokens_per_sec_per_gpu", "tflops_per_gpu")


def test_every_row_is_either_used_or_excluded_with_a_reason(runs_and_excluded):
    runs, excluded = runs_and_excluded
    rows = read_rows()
    with_tokens = {stem(r["id"]) for r in rows if r["measured_metric_name"] == "tokens_per_sec_per_gpu"}
    considered = [r for r in rows if r["measured_metric_name"] == "tokens_per_sec_per_gpu"
                  or stem(r["id"]) not in with_tokens]
    assert len(runs) + len(excluded) == len(considered)
    assert all(reason for _, reason in excluded)
    assert {r.id for r in runs}.isdisjoint({i for i, _ in excluded})
    assert len(runs) >= 100


def test_exclusion_rules_name_the_cause():
    row = {"precision": "fp8", "notes": "task=SFT (not pretraining)", "model": "LLAMA3_70B", "id": "x",
           "gpu": "GB200"}
    assert "SFT" in exclusion_reason(row)
    row = {"precision": "fp8", "notes": "", "model": "Nemotron_3_Ultra", "id": "x", "gpu": "GB200"}
    assert "no public config" in exclusion_reason(row)


def test_nvfp4_and_hybrid_rows_are_priced_not_excluded():
    row = {"precision": "nvfp4", "notes": "", "model": "LLAMA3_70B", "id": "x", "gpu": "GB200"}
    assert exclusion_reason(row) is None
    for model in ("Nemotron_3_Nano", "Nemotron_3_Super", "Nemotron_3_5_Lightning"):
        assert exclusion_reason({"precision": "fp8", "notes": "", "model": model, "id": "x", "gpu": "GB200"}) is None


def test_hybrid_model_files_reproduce_the_published_flops_per_token():
    """Megatron's hybrid FLOP formula on the model files matches each source's TFLOP/s / tokens ratio (26.04 rows)."""
    from autoplan.costmodel.flops import model_flops_per_token
    from benchmarks.published import build_model

    published = {"Nemotron_3_Nano": 729e12 / 32727, "Nemotron_3_Super": 783e12 / 9243,
                 "Nemotron_3_5_Lightning": 807e12 / 28672}
    for name, flops in published.items():
        model, _ = build_model({"model": name, **{c: "" for c in DIM_COLUMNS}})
        assert model_flops_per_token(model, 8192) == pytest.approx(flops, rel=2e-3)


def test_deepseek_rows_train_with_or_without_mtp_as_they_say(runs_and_excluded):
    """The "(w/o MTP)" DeepSeek-V3 rows drop the catalogue model's MTP depth; the "(w/ MTP)" row keeps it and is
    priced (costmodel/layers/mtp.py), not excluded."""
    runs, excluded = runs_and_excluded
    by_id = {r.id: r for r in runs}
    marked = {r["id"]: r["notes"] for r in read_rows() if "MTP)" in r["notes"]}
    assert any("(w/o MTP)" in n for n in marked.values()) and any("(w/ MTP)" in n for n in marked.values())
    for row_id, notes in marked.items():
        if row_id not in by_id:
            continue  # the tflops twin of a tokens row
        assert by_id[row_id].model.mtp_num_layers == (0 if "(w/o MTP)" in notes else 1)
    assert not [i for i, _ in excluded if i in marked]


def test_bridge_rows_split_the_pipeline_as_their_recipe(runs_and_excluded):
    """Qwen3-235B and Llama3.1-405B recipes count the embedding and the loss as a layer each
    (account_for_*_in_pipeline_split), which makes every published pp x vpp split even."""
    runs, _ = runs_and_excluded
    checked = 0
    for r in runs:
        s = r.strategy
        if r.facts is None or s.pp == 1 or not r.model_name.startswith(("Qwen3_235B", "LLAMA3.1_405B")):
            continue
        assert s.account_for_embedding and s.account_for_loss, r.id
        assert (r.model.num_layers + 2) % (s.pp * s.vpp) == 0, r.id
        checked += 1
    assert checked >= 30


def test_every_pipelined_run_has_a_split_megatron_can_run(runs_and_excluded):
    """A row whose layers do not divide its pipeline stages and that states no split gets the split autoplan's own
    planner gives (published.with_unstated_split); rows with a stated split keep it."""
    from autoplan.pipeline_split import layout_problem
    from benchmarks.published import with_unstated_split

    runs, _ = runs_and_excluded
    filled = 0
    for r in runs:
        s = r.strategy
        if s.pp < 2:
            continue
        if s.pipeline_layout:
            assert layout_problem(s.pipeline_layout, s.pp, s.vpp, r.model.num_layers, r.model.mtp_num_layers) is None
            filled += "25.11" in r.id and r.model_name.startswith("DeepSeekV3") and r.model.mtp_num_layers == 0
            continue
        units = r.model.num_layers + s.account_for_embedding + s.account_for_loss
        assert s.first_stage_layers or units % (s.pp * s.vpp) == 0, r.id
        assert with_unstated_split(s, r.model) == s  # a stated or even split is left as it is
    assert filled == 2


def test_gpu_dominance_follows_every_profile_figure():
    assert dominates("b300", "b200") and dominates("gb300", "gb200") and dominates("h200", "h100")
    assert not dominates("b200", "b300") and not dominates("h100", "h100")
    assert not dominates("b200", "gb200")  # GB200 has the higher peak and the NVL72 domain


def test_regression_rule_compares_the_same_job_on_a_weaker_gpu():
    base = dict(model="M", num_gpus="64", precision="fp8", gbs="256", seq_len="4096", notes="",
                measured_metric_name="tokens_per_sec_per_gpu", source="s")
    rows = [dict(base, id="mb_26.02_a_tok", gpu="B300", measured_value="800"),
            dict(base, id="mb_26.02_b_tok", gpu="B200", measured_value="1000"),
            dict(base, id="mb_26.02_c_tok", gpu="GB300", measured_value="950"),
            dict(base, id="mb_26.04_d_tok", gpu="GB200", measured_value="2000")]  # other recipe tag
    for row in rows:
        row["model"] = "LLAMA3_70B"
    flagged = slower_than_a_weaker_gpu(rows)
    assert set(flagged) == {"mb_26.02_a"} and "B300 800 < B200 1000" in flagged["mb_26.02_a"]
    rows[0]["measured_value"] = "950"  # within the 10% margin
    assert slower_than_a_weaker_gpu(rows) == {}


def test_runs_map_to_the_published_layout(runs_and_excluded):
    runs, _ = runs_and_excluded
    for r in runs:
        s = r.strategy
        world = r.cluster.num_gpus
        assert world % (s.tp * s.pp * s.cp) == 0, r.id
        assert s.sp == (s.tp > 1)
        assert r.measured_tokens_per_gpu > 0
        if r.model.is_moe:
            # MoE parallel folding: experts are sharded over etp x ep inside each pipeline stage.
            assert world % (s.etp * s.ep * s.pp) == 0, r.id


def test_every_published_run_is_predicted_to_fit(runs_and_excluded):
    from autoplan.costmodel.estimate import estimate

    runs, _ = runs_and_excluded
    not_fitting = set()
    for r in runs:
        est = estimate(r.model, r.cluster, r.strategy, r.workload)
        # The recipe's own switches (published.base_strategy), no credits.
        if not est.fits:
            not_fitting.add(r.id)
    assert not_fitting <= KNOWN_MEMORY_GAPS, sorted(not_fitting - KNOWN_MEMORY_GAPS)


def test_megatron_bridge_rows_carry_the_recipe_facts(runs_and_excluded):
    runs, _ = runs_and_excluded
    bridge = [r for r in runs if r.id.startswith("mb_")]
    assert bridge and all(r.facts is not None and r.strategy.grad_reduce_bf16 for r in bridge)
    assert all(r.facts is None for r in runs if not r.id.startswith("mb_"))
    # Qwen3 on H100 runs the 1F1B all-to-all overlap in every release (qwen3 workload_base_configs).
    assert all(r.strategy.moe_a2a_overlap for r in bridge if r.model_name.startswith("Qwen3") and r.gpu == "h100")
    # The FP8 rows keep FP8 primary weights; the providers that set dropout 0 run a p = 0 model.
    # (NVFP4 rows keep bf16 weights: the NVFP4 recipes set fp4_param_gather False, perf_recipes/nemotronh)
    assert all(r.strategy.fp8_param for r in bridge if r.precision == "fp8" and r.strategy.fp8_recipe != "nvfp4")
    assert all(r.model.hidden_dropout == 0.0 for r in bridge if r.facts.no_dropout)


def test_recipe_recompute_is_kept_unless_it_does_not_fit(runs_and_excluded):
    runs, _ = runs_and_excluded
    for r in runs:
        if r.facts is not None and not r.escalated:
            assert r.strategy.recompute == r.facts.recompute, r.id


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_weights_and_optimizer_match_megatron_and_total_is_not_below(case):
    r = compare(case)
    # Same parameter split and bytes/param as theoretical_memory_usage.py (autoplan skips vocab padding).
    assert r["autoplan_states"] == pytest.approx(r["megatron_states"], rel=0.01)
    assert r["autoplan_stage0_total"] >= r["megatron_total"]


def test_ring_collective_across_domains_uses_every_nic_of_the_group():
    """4 nodes x 8 B200 (8x 400G NICs each) reach an all-reduce busbw of 381.8 GB/s at 16 GiB (reference gpus.md
    S3): each NIC carries 1/8 of the bus bytes. The model must land within 25% of that, and far above the
    single-NIC rate it would give if every byte crossed one NIC."""
    from autoplan.clusterio import load_cluster
    from autoplan.costmodel.collectives import collective_time
    from autoplan.costmodel.hardware import hardware_of

    hw = hardware_of(load_cluster("b200", 32))
    size, n = 16 * 2**30, 32
    bus = 2 * (n - 1) / n * size
    t_rings = float(collective_time("all_reduce", size, n, True, hw, ranks_per_domain=8))
    t_one_nic = float(collective_time("all_reduce", size, n, True, hw))
    assert bus / t_rings / 1e9 == pytest.approx(381.8, rel=0.25)
    assert t_one_nic > 5 * t_rings


def test_grouped_gemm_efficiency_falls_with_rows_per_expert():
    from dataclasses import replace

    from autoplan.costmodel.calibration import DEFAULT
    from autoplan.costmodel.compute import grouped_token_efficiency

    cal = replace(DEFAULT, grouped_gemm_half_tokens=1024.0)
    small, ref, large = grouped_token_efficiency([512.0, 8192.0, 65536.0], cal)
    assert small < ref < large
    assert ref == pytest.approx(1.0)
    assert grouped_token_efficiency([512.0], replace(DEFAULT, grouped_gemm_half_tokens=0.0))[0] == 1.0


def test_low_precision_gemms_slow_with_each_gemms_reduction_dimension():
    """FP8 / FP4 GEMMs pay compute.reduction_efficiency over the reduction dimensions of their forward (k), input
    gradient (n) and weight gradient (m) GEMMs; bf16 GEMMs do not."""
    from dataclasses import replace

    from autoplan.clusterio import load_cluster
    from autoplan.costmodel.calibration import DEFAULT
    from autoplan.costmodel.compute import gemm_time, reduction_efficiency
    from autoplan.costmodel.hardware import hardware_of
    from autoplan.costmodel.layout import layouts_from_strategies
    from autoplan.strategy import Strategy

    k0 = DEFAULT.lowp_gemm_half_k
    assert reduction_efficiency(8192.0, 8192.0, 8192.0, k0) == pytest.approx(1.0)
    # One short dimension: the harmonic mean of 1, 1 and the short GEMM's relative rate.
    short = (1024.0 / (1024.0 + k0)) / (8192.0 / (8192.0 + k0))
    for dims in ((1024.0, 8192.0, 8192.0), (8192.0, 1024.0, 8192.0), (8192.0, 8192.0, 1024.0)):
        assert reduction_efficiency(*dims, k0) == pytest.approx(3.0 / (2.0 + 1.0 / short))
    assert reduction_efficiency(1024.0, 1024.0, 1024.0, 0.0) == pytest.approx(1.0)

    hw = hardware_of(load_cluster("b200", 8))
    no_floor = replace(DEFAULT, kernel_overhead_s=0.0)
    for fp8, slower in (("hybrid", True), ("none", False)):
        lay = layouts_from_strategies([Strategy(tp=1, pp=1, mbs=1, zero=1, fp8=fp8)], 8)
        per_flop = [float(gemm_time(16384.0, 16384.0, k, lay, hw, no_floor)[0]) / k for k in (1024.0, 16384.0)]
        without = [float(gemm_time(16384.0, 16384.0, k, lay, hw, replace(no_floor, lowp_gemm_half_k=0.0))[0]) / k
                   for k in (1024.0, 16384.0)]
        assert (per_flop[0] / per_flop[1] > without[0] / without[1] * 1.1) is slower
        assert per_flop[0] / per_flop[1] >= without[0] / without[1] - 1e-12


def test_low_precision_reduction_term_follows_the_published_microbenchmark():
    """calibration.lowp_gemm_half_k is the least-squares fit to DeepGEMM's same-m GEMM pairs (benchmarks/microbench.py),
    and the fit recovers a k0 from rates generated with it."""
    from autoplan.costmodel.calibration import DEFAULT
    from benchmarks.microbench import (bf16_rate_spread, fit_half_k, load, lowp_gemm_half_k, same_m_pairs,
                                       size_efficiency)

    assert lowp_gemm_half_k() == DEFAULT.lowp_gemm_half_k
    assert len(same_m_pairs(load("grouped_gemm_deepgemm_h800_fp8.yaml"))) == 3

    def rate(m, n, k, k0=800.0):
        return 1000.0 * size_efficiency(m, n, k, 400.0) * k / (k + k0)

    shapes = [(4096.0, 4096.0, 7168.0), (4096.0, 7168.0, 2048.0), (4096.0, 2048.0, 1024.0)]
    pairs = [((*a, rate(*a)), (*b, rate(*b))) for i, a in enumerate(shapes) for b in shapes[i + 1:]]
    assert fit_half_k(pairs, 400.0) == 800.0
    assert bf16_rate_spread(load("gemm_square_torchao_b200.yaml")) < 0.05


def test_fp8_casts_are_priced_as_operand_traffic():
    """An FP8 / FP4 GEMM pays the HBM traffic of casting x (unless a fused norm wrote it quantised) and dy: each read
    in bf16 and written row- and column-wise at the recipe's bytes (compute.cast_bytes, a forward-equivalent third of
    the total); a bf16 GEMM pays none, and the cast time does not depend on k."""
    from dataclasses import replace

    from autoplan.clusterio import load_cluster
    from autoplan.costmodel.calibration import DEFAULT
    from autoplan.costmodel.compute import cast_bytes, gemm_time
    from autoplan.costmodel.hardware import hardware_of
    from autoplan.costmodel.layout import QUANTISED_BYTES, layouts_from_strategies
    from autoplan.strategy import Strategy

    m, n, k = 8192.0, 2048.0, 4096.0
    mx = QUANTISED_BYTES["mxfp8"]
    assert cast_bytes(m, n, k, mx) == pytest.approx((2 + 2 * mx) * (m * k + m * n) / 3)
    assert cast_bytes(m, n, k, mx, norm_fused_input=True) == pytest.approx((2 + 2 * mx) * m * n / 3)
    assert cast_bytes(m, n, k, QUANTISED_BYTES["nvfp4"]) < cast_bytes(m, n, k, mx)
    # A row-parallel GEMM under sequence parallelism casts only its rank's shard of dy.
    assert cast_bytes(m, n, k, mx, dy_rows=m / 4) == pytest.approx((2 + 2 * mx) * (m * k + m / 4 * n) / 3)

    hw = hardware_of(load_cluster("b200", 8))
    cal = replace(DEFAULT, kernel_overhead_s=0.0)
    bf16 = layouts_from_strategies([Strategy(tp=1, pp=1, mbs=1, zero=1)], 8)
    fp8 = layouts_from_strategies([Strategy(tp=1, pp=1, mbs=1, zero=1, fp8="hybrid", fp8_recipe="mxfp8")], 8)
    assert float(fp8.quant_bytes[0]) == mx
    for lay, has_casts in ((fp8, True), (bf16, False)):
        unfused = float(gemm_time(m, n, k, lay, hw, cal)[0])
        fused = float(gemm_time(m, n, k, lay, hw, cal, norm_fused_input=True)[0])
        expected = cast_bytes(m, n, k, mx) - cast_bytes(m, n, k, mx, norm_fused_input=True) if has_casts else 0.0
        assert unfused - fused == pytest.approx(expected / (hw.hbm_bytes_per_s * cal.hbm_eff))


def test_blackwell_attention_rates_follow_the_published_cudnn_benchmark():
    """The Blackwell GPU profiles' attention_efficiency is cuDNN 9.13.1's published causal forward at head dim 128 and
    sequence 8192 over the H100 baseline (benchmarks/microbench.py), B200's for GB200 and GB300's for B300."""
    from autoplan.clusterio import load_gpu
    from benchmarks.microbench import attention_efficiency

    for measured_on, profiles in (("b200", ("b200", "gb200")), ("gb300", ("gb300", "b300"))):
        for gpu in profiles:
            assert load_gpu(gpu).attention_efficiency == round(attention_efficiency(measured_on), 2)


def test_each_local_expert_gemm_pays_its_own_per_op_cost():
    """TransformerEngine issues one GEMM per local expert (multi_stream_cublas_gemm), so the expert GEMMs of a MoE
    layer pay the per-op cost twice per local expert (fc1, fc2), plus once for the router GEMM."""
    from dataclasses import replace

    from autoplan.clusterio import load_cluster
    from autoplan.costmodel import compute as C
    from autoplan.costmodel.calibration import DEFAULT
    from autoplan.costmodel.hardware import hardware_of
    from autoplan.costmodel.layout import layouts_from_strategies
    from autoplan.modelio import load_model
    from autoplan.strategy import Strategy

    model = load_model("qwen3-30b-a3b")  # 128 experts, no shared experts
    assert model.num_experts == 128 and not model.shared_expert_ffn_hidden_size
    hw = hardware_of(load_cluster("b200", 64))
    for ep in (8, 64):
        lay = layouts_from_strategies([Strategy(tp=1, pp=1, ep=ep, mbs=1, zero=1, fp8="hybrid")], 64)
        sh = C.shard_of(model, lay, 4096)
        with_cost = float(C.moe_gemm_time(model, sh, lay, hw, DEFAULT)[0])
        without = float(C.moe_gemm_time(model, sh, lay, hw, replace(DEFAULT, kernel_overhead_s=0.0))[0])
        local = 128 // ep
        assert with_cost - without == pytest.approx((2 * local + 1) * DEFAULT.kernel_overhead_s)
