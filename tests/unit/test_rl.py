"""`autoplan rl`: the rollout engines' KV-cache and decode formulas, refit bytes, host RAM, step composition by mode,
the verl/slime settings and the command line's bad-input answers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoplan.clusterio import load_cluster
from autoplan.costmodel.hardware import GIB, hardware_of
from autoplan.costmodel.params import count_parameters
from autoplan.modelio import load_model
from autoplan.rl import refit as F
from autoplan.rl import rollout as R
from autoplan.rl.search import Fixed, search
from autoplan.rl.spec import Placement, RLJob, RolloutLayout, parse_placement, parse_rollout
from autoplan.errors import InputError
from tests.conftest import run_cli

H100_NODE = hardware_of(load_cluster("h100", 8))  # one 8-GPU H100 node, the hardware of most rollout checks


def _job(**kw):
    base = dict(algo="grpo", prompts=64, samples=8, prompt_len=512, response_len=1024, max_response_len=4096,
                host_mem_gib=2048.0)
    return RLJob(**{**base, **kw})


# ---- KV cache ------------------------------------------------------------------------------------------------------

def _vllm_page_size_bytes(coef, block_size, num_kv_heads, head_size, dtype_size):
    """vllm/v1/kv_cache_interface.py AttentionSpec.page_size_bytes, as written there."""
    return coef * block_size * num_kv_heads * head_size * dtype_size


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_kv_bytes_per_token_match_vllm_page_size_for_gqa(tp):
    m = load_model("llama3-8b", ())  # 32 layers, 8 KV heads of 128
    heads = max(1, m.num_query_groups // tp)  # vllm ModelConfig.get_num_kv_heads
    block = 16
    per_block = _vllm_page_size_bytes(2, block, heads, m.kv_channels, 2) * m.num_layers
    assert R.kv_bytes_per_token(m, tp) == per_block / block


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    m = load_model("qwen2.5-math-7b", ())  # 4 KV heads
    assert R.kv_bytes_per_token(m, 8) == R.kv_bytes_per_token(m, 4)  # one head per rank either way
    assert R.kv_bytes_per_token(m, 2) == 2 * R.kv_bytes_per_token(m, 4)


def test_mla_kv_is_one_latent_per_token_on_every_tp_rank():
    m = load_model("deepseek-v3", ("mtp_num_layers=0",))
    latent = _vllm_page_size_bytes(1, 1, 1, m.kv_lora_rank + m.qk_pos_emb_head_dim, 2) * m.num_layers
    assert latent == 61 * 576 * 2
    assert R.kv_bytes_per_token(m, 1) == R.kv_bytes_per_token(m, 32) == latent


def test_kv_capacity_is_requested_memory_less_weights_activation_and_context():
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    vllm = RolloutLayout(engine="vllm", tp=2, engines=4, gpu_memory_utilization=0.7)
    sgl = vllm.model_copy(update={"engine": "sglang"})
    weights = R.engine_weights(m, vllm).total
    # vLLM Worker.determine_available_memory: total * utilization - non-KV memory of the profiling run
    expect = 0.7 * hw.capacity_bytes - weights - R.CUDA_CONTEXT_GIB * GIB - R.profile_activation_bytes(m, vllm)
    assert R.kv_cache_bytes(m, vllm, hw) == pytest.approx(expect)
    # SGLang profile_max_num_token: total * mem_fraction_static - weights - what was in use before
    assert R.kv_cache_bytes(m, sgl, hw) == pytest.approx(0.7 * hw.capacity_bytes - weights - R.CUDA_CONTEXT_GIB * GIB)
    # the weights halve with tp 2 (bf16, all sharded but norms)
    params = count_parameters(m)[0]
    assert params * 2 / 2 < weights < params * 2 / 2 * 1.001


def test_the_kv_cache_decides_the_admitted_batch():
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    lay = RolloutLayout(tp=1, engines=8, gpu_memory_utilization=0.5)
    job = _job(prompts=1024, samples=8, prompt_len=2048, response_len=8192, max_response_len=8192)
    sim = R.simulate(m, lay, hw, job)
    assert sim.batch == int(R.kv_tokens_per_group(m, lay, hw) // (2048 + 8192)) < R.MAX_NUM_SEQS


# ---- decode time ---------------------------------------------------------------------------------------------------

def test_small_batch_decode_reads_every_weight_once():
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    lay = RolloutLayout(tp=1, engines=8)
    sm = R.step_model(m, lay, hw, 8)
    weights = R.engine_weights(m, lay).total
    assert sm.time(1, 0.0) == pytest.approx(weights / (hw.hbm_bytes_per_s * R.HBM_EFFICIENCY) + R.STEP_OVERHEAD_S)
    # the KV cache of the context is read too
    ctx = 4096
    extra = ctx * R.kv_bytes_per_token(m, 1) / (hw.hbm_bytes_per_s * R.HBM_EFFICIENCY)
    assert sm.time(1, ctx) == pytest.approx(sm.time(1, 0.0) + extra)


def test_large_batch_decode_is_compute_bound():
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    lay = RolloutLayout(tp=1, engines=8)
    n = 4096
    sm = R.step_model(m, lay, hw, n)
    gemm = 2 * R.active_params_per_token(m) * n / (hw.peak_flops_bf16 * hw.gemm_eff_bf16)
    assert sm.time(n, 0.0) == pytest.approx(gemm + R.STEP_OVERHEAD_S)


def test_a_long_context_large_batch_step_adds_the_kv_reads_to_the_gemms():
    """The GEMMs and the attention are kernels run one after the other: a compute-bound GEMM phase does not hide the
    KV cache's HBM reads."""
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    lay = RolloutLayout(tp=1, engines=8)
    n, ctx = 1024, 1024 * 2048
    sm = R.step_model(m, lay, hw, n)
    hbm = hw.hbm_bytes_per_s * R.HBM_EFFICIENCY
    gemm = 2 * R.active_params_per_token(m) * n / (hw.peak_flops_bf16 * hw.gemm_eff_bf16)
    assert gemm > R.engine_weights(m, lay).total / hbm  # the GEMMs are compute-bound at this batch
    kv = ctx * R.kv_bytes_per_token(m, 1) / hbm
    attn = 4.0 * m.num_layers * m.num_attention_heads * m.kv_channels * ctx / (hw.peak_flops_bf16 * hw.gemm_eff_bf16)
    assert kv > attn  # and the attention reads more than it computes
    assert sm.time(n, ctx) == pytest.approx(gemm + kv + R.STEP_OVERHEAD_S)


def _latency_without_overhead(name, tp):
    """A DECODE_FIGURES run (batch 8, 32 prompt tokens, 128 output tokens, H200) priced without the per-step
    overhead."""
    m = load_model(name, ())
    hw = hardware_of(load_cluster("h200", 8))
    lay = RolloutLayout(tp=tp, engines=1)
    sm = R.step_model(m, lay, hw, 8, overhead=0.0)
    return sum(sm.time(8, 8 * (32 + i)) for i in range(128)) + R.prefill_seconds(m, lay, hw, 8 * 32)


def test_step_overhead_is_the_median_residual_of_the_published_decode_latencies():
    residuals = sorted((ms / 1e3 - _latency_without_overhead(name, tp)) / 128 for name, tp, ms in R.DECODE_FIGURES)
    assert all(r > 0 for r in residuals)  # the engine is slower than its HBM reads on every run
    assert R.STEP_OVERHEAD_S == pytest.approx(residuals[1], abs=5e-6)


@pytest.mark.parametrize("name, tp, ms", R.DECODE_FIGURES)
def test_decode_latency_against_vllm_published_figures(name, tp, ms):
    """With the overhead, each published latency is within 25% (the fit's own data: the spread of residuals)."""
    predicted = _latency_without_overhead(name, tp) + 128 * R.STEP_OVERHEAD_S
    assert predicted == pytest.approx(ms / 1e3, rel=0.25)


def test_moe_decode_reads_only_the_experts_its_tokens_chose():
    m = load_model("qwen3-30b-a3b", ())
    hw = H100_NODE
    lay = RolloutLayout(tp=1, dp=1, ep=1, engines=8)
    sm = R.step_model(m, lay, hw, 2)
    w = R.engine_weights(m, lay)
    k, e = m.moe_router_topk, m.num_experts
    assert sm.mem_fixed[1] == pytest.approx(w.dense + w.experts * k / e)
    assert sm.mem_fixed[2] == pytest.approx(w.dense + w.experts * (1 - (1 - k / e) ** 2))


def test_eager_decode_pays_kernel_launches():
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    graphs = R.step_model(m, RolloutLayout(tp=1, engines=8), hw, 4)
    eager = R.step_model(m, RolloutLayout(tp=1, engines=8, cuda_graphs=False), hw, 4)
    assert eager.time(1, 0.0) - graphs.time(1, 0.0) == pytest.approx(
        R.LAUNCH_S * m.num_layers * R.KERNELS_DENSE_LAYER)
    assert R.cuda_graph_bytes(m, RolloutLayout(tp=1, engines=8, cuda_graphs=False)) == 0.0


def test_response_lengths_keep_the_mean_and_end_at_the_expected_longest():
    lengths = R.response_lengths(2000, 16384, 4096)
    assert np.all(np.diff(lengths) >= 0) and lengths.max() <= 16384
    assert lengths[-1] == round(R.expected_longest(2000, 16384, 4096))
    assert lengths.mean() == pytest.approx(2000, rel=0.002)
    assert np.all(R.response_lengths(1000, 1000, 10) == 1000)


def test_length_scale_solves_the_capped_exponential_mean():
    theta = R.length_scale(2048, 8192)
    assert theta * (1.0 - np.exp(-8192 / theta)) == pytest.approx(2048, rel=1e-9)
    assert R.length_scale(2048, 1e7) == pytest.approx(2048, rel=1e-6)  # a cap far out leaves the exponential


@pytest.mark.parametrize("mean,cap,k", [(2048, 20480, 768), (2048, 8192, 1024), (1960, 9632, 256), (500, 600, 7)])
def test_expected_longest_is_the_integral_of_the_maximum_survival(mean, cap, k):
    """E[min(max of k, cap)] = integral_0^cap (1 - F(x)^k) dx with F the exponential CDF of the length scale
    (David & Nagaraja eq. 2.1.1), integrated numerically here against the closed form's sum."""
    theta = R.length_scale(mean, cap)
    x = np.linspace(0.0, cap, 400_001)
    survival = 1.0 - (1.0 - np.exp(-x / theta)) ** k
    integral = float(np.sum((survival[1:] + survival[:-1]) / 2.0 * np.diff(x)))
    assert R.expected_longest(mean, cap, k) == pytest.approx(integral, rel=1e-6)


def test_expected_longest_without_a_cap_is_theta_times_the_harmonic_number():
    k = 1000
    harmonic = float(np.sum(1.0 / np.arange(1, k + 1)))
    assert R.expected_longest(1000, 1e9, k) == pytest.approx(1000 * harmonic, rel=1e-6)
    assert R.expected_longest(1000, 1e9, 1) == 1000  # one draw: its mean
    # more draws, a longer expected maximum; never past the cap
    assert R.expected_longest(2048, 8192, 10) < R.expected_longest(2048, 8192, 100) <= 8192


def test_the_slowest_engine_holds_the_batch_longest_and_the_mean_engine_its_own():
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    job = _job(prompts=256, response_len=2048, max_response_len=32768)
    eight = R.simulate(m, RolloutLayout(tp=1, engines=8), hw, job)
    assert eight.seconds > eight.mean_seconds  # the batch's longest draw outlasts an engine's own
    one = R.simulate(m, RolloutLayout(tp=1, engines=1), hw, job)
    assert one.seconds == one.mean_seconds  # one engine holds the whole batch: its longest is the batch's
    even = R.simulate(m, RolloutLayout(tp=1, engines=8), hw, _job(prompts=256, response_len=2048,
                                                                  max_response_len=2048))
    assert even.seconds == even.mean_seconds  # no spread, no gap
    (plan,), _ = search(m, load_cluster("h100", 8), job, Fixed(rollout={"tp": 1, "engines": 8,
                                                                        "gpu_memory_utilization": 0.5},
                                                                offload="none", train={"tp": 1, "pp": 1},
                                                                placement=Placement(kind="colocated", gpus=8,
                                                                                    train_gpus=8)), top_k=1)
    sim = R.simulate(m, plan.rollout, hw, job)
    assert plan.phases["rollout"] == pytest.approx(sim.seconds)  # the step waits for the slowest engine
    assert plan.details["rollout_engine_mean_s"] == pytest.approx(sim.mean_seconds)
    assert plan.details["rollout_slowest_engine_s"] == pytest.approx(sim.seconds)


def test_a_long_tail_makes_the_rollout_drain():
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    lay = RolloutLayout(tp=1, engines=8)
    even = R.simulate(m, lay, hw, _job(prompts=256, response_len=2048, max_response_len=2048))
    tail = R.simulate(m, lay, hw, _job(prompts=256, response_len=2048, max_response_len=16384))
    assert tail.seconds > even.seconds
    assert tail.throughput_seconds < tail.seconds


# ---- refit ---------------------------------------------------------------------------------------------------------

def test_refit_bytes_by_method():
    m = load_model("qwen3-30b-a3b", ())
    lay = RolloutLayout(tp=2, dp=2, ep=4, engines=8)
    full = count_parameters(m)[0] * 2
    assert F.refit_bytes(m, lay, "ipc", 1, 1, 8).per_rollout_gpu == full
    b = F.refit_bytes(m, lay, "broadcast", 2, 4, 8)
    assert b.per_rollout_gpu == full and b.per_train_gpu == full / 4
    shard = F.refit_bytes(m, lay, "shard", 1, 1, 8)
    assert shard.per_rollout_gpu == R.engine_weights(m, lay).total
    # an engine's GPUs together hold at least the whole model (attention and dense parts repeat over dp)
    assert shard.per_rollout_gpu * lay.gpus_per_engine >= full * 0.99
    hw = hardware_of(load_cluster("h100", 32))
    assert F.refit_seconds(m, lay, hw, "shard", 1, 1, 8, False) < F.refit_seconds(m, lay, hw, "broadcast", 1, 1, 8,
                                                                                    False)


# ---- search, memory and modes ------------------------------------------------------------------------------------

def test_a_plan_needing_more_host_ram_than_the_nodes_have_does_not_fit():
    m = load_model("qwen3-30b-a3b", ())
    c = load_cluster("h100", 16)
    fixed = Fixed(train={"tp": 1, "pp": 1, "ep": 8}, offload="all", placement=Placement(kind="colocated", gpus=16,
                                                                                         train_gpus=16))
    (roomy,), ok = search(m, c, _job(host_mem_gib=4096.0), fixed, top_k=1)
    assert ok and roomy.fits and roomy.host_mem_gib > 64
    (tight,), ok = search(m, c, _job(host_mem_gib=64.0), fixed, top_k=1)
    assert not ok and not tight.fits and tight.host_mem_gib > 64


def test_a_colocated_engine_shares_the_gpu_with_what_training_keeps():
    m = load_model("llama3-8b", ())
    c = load_cluster("h100", 16)
    hw = hardware_of(c)
    rollout = {"tp": 1, "engines": 16, "gpu_memory_utilization": 0.6}
    col = Placement(kind="colocated", gpus=16, train_gpus=16)
    plans = {off: search(m, c, _job(), Fixed(train={"tp": 2, "pp": 1}, offload=off, placement=col,
                                             rollout=rollout), top_k=1)[0][0] for off in ("all", "optimizer", "none")}
    engine = R.rollout_gpu_bytes(m, RolloutLayout(**rollout), hw) / GIB
    from autoplan.rl.train import price_training
    strategy = plans["all"].strategy
    context = float(price_training(m, c, _job(), [strategy], ["all"]).context_bytes[0]) / GIB
    assert context > 0  # the training worker's CUDA context and NCCL buffers stay
    assert plans["all"].memory_gib["rollout"] == pytest.approx(engine + context, rel=0.02)
    assert plans["all"].memory_gib["rollout"] < plans["optimizer"].memory_gib["rollout"] < \
        plans["none"].memory_gib["rollout"]


def test_one_step_off_overlaps_rollout_with_training():
    m = load_model("llama3-8b", ())
    c = load_cluster("h100", 16)
    split = Placement(kind="split", gpus=16, train_gpus=8)
    fixed = Fixed(train={"tp": 1, "pp": 1}, offload="none", placement=split,
                  rollout={"tp": 1, "engines": 8, "gpu_memory_utilization": 0.8})
    (on,), _ = search(m, c, _job(), fixed, top_k=1)
    (off,), _ = search(m, c, _job(mode="one-step-off"), fixed, top_k=1)
    p = off.phases
    assert off.step_time_s == pytest.approx(max(p["rollout"], p["ref"] + p["old_log_prob"] + p["reward"]
                                                + p["train"]) + p["refit"])
    assert on.step_time_s == pytest.approx(sum(on.phases.values()))
    assert off.step_time_s < on.step_time_s


def test_ppo_prices_the_critic_it_is_given():
    actor = load_model("llama3-8b", ())
    c = load_cluster("h100", 16)
    fixed = Fixed(train={"tp": 2, "pp": 1}, offload="swap", placement=Placement(kind="colocated", gpus=16,
                                                                                 train_gpus=16),
                  rollout={"tp": 1, "engines": 16, "gpu_memory_utilization": 0.6})
    (grpo,), _ = search(actor, c, _job(), fixed, top_k=1)
    (same,), _ = search(actor, c, _job(algo="ppo"), fixed, top_k=1)
    (small,), _ = search(actor, c, _job(algo="ppo"), fixed, top_k=1, critic=load_model("qwen2.5-math-7b", ()))
    assert grpo.phases["reward"] == 0.0
    assert same.phases["reward"] == pytest.approx(same.phases["old_log_prob"])  # a critic of the actor's shape
    assert same.phases["train"] > 1.9 * grpo.phases["train"]
    assert 0.0 < small.phases["reward"] < same.phases["reward"]  # Qwen2.5-Math-7B is smaller than Llama-3-8B
    assert small.host_mem_gib < same.host_mem_gib


def test_parsers_refuse_bad_text():
    assert parse_rollout("tp=2,engines=4,gpu_memory_utilization=0.6") == {"tp": 2, "engines": 4,
                                                                         "gpu_memory_utilization": 0.6}
    for bad in ("tp=0", "tp=x", "gpu_memory_utilization=1.5", "foo=1", "tp"):
        with pytest.raises(InputError):
            parse_rollout(bad)
    assert parse_placement("split:8", 16).rollout_gpus == 8
    for bad in ("split:0", "split:16", "split:x", "half"):
        with pytest.raises(InputError):
            parse_placement(bad, 16)


# ---- command line ----------------------------------------------------------------------------------------------------

BASE = ["rl", "--model", "llama3-8b", "--cluster", "h100", "--gpus", "16", "--prompts", "64", "--samples", "8",
        "--prompt-len", "512", "--response-len", "1024", "--max-response-len", "4096"]


def test_cli_prices_a_given_layout_with_every_phase(capsys):
    code, out, err = run_cli(BASE + ["--train-strategy", "tp=2,pp=1,offload=optimizer", "--rollout",
                                     "tp=1,engines=16,gpu_memory_utilization=0.6", "--placement", "colocated",
                                     "--json"], capsys)
    assert code == 0, err
    plan = json.loads(out)["plans"][0]
    assert plan["train"]["tp"] == 2 and plan["train"]["offload"] == "optimizer"
    assert plan["rollout"] == {"engine": "vllm", "tp": 1, "dp": 1, "ep": 1, "engines": 16,
                               "gpu_memory_utilization": 0.6, "cuda_graphs": True}
    est = plan["estimate"]
    assert set(est["phase_times_s"]) >= {"rollout", "ref", "reward", "refit", "train"}
    for key in ("step_time_s", "samples_per_s", "peak_mem_gib", "host_mem_gib", "fits"):
        assert key in est
    assert est["samples_per_s"] == pytest.approx(64 * 8 / est["step_time_s"])


@pytest.mark.parametrize("extra, words", [
    (["--algo", "dpo"], "--algo"),
    (["--mode", "sync"], "--mode"),
    (["--placement", "split:99"], "TRAIN_GPUS"),
    (["--rollout", "tp=3x"], "tp"),
    (["--max-response-len", "100"], "--max-response-len"),
    (["--emit", "verl"], "--out"),
    (["--placement", "colocated", "--mode", "one-step-off"], "two GPU pools"),
    (["--placement", "split:8", "--rollout", "tp=2,engines=8"], "engines"),
    (["--train-strategy", "tp=3"], "divisible"),
    (["--train-strategy", "offload=maybe"], "offload"),
    (["--staleness", "0.5"], "--mode async"),
    (["--mode", "async", "--placement", "split:8", "--staleness", "-1"], "--staleness"),
    (["--mode", "async", "--placement", "split:8", "--mini-batches", "4", "--require-batches", "3"], "divisor"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, extra, words):
    code, out, err = run_cli(BASE + extra, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err
    assert out == ""


def test_cli_a_given_training_layout_is_searched_over_the_placements_it_tiles(capsys):
    code, out, err = run_cli(BASE + ["--train-strategy", "tp=2,pp=4", "--top", "20", "--json"], capsys)
    assert code == 0, err
    plans = json.loads(out)["plans"]
    assert all(p["train"]["tp"] == 2 and p["train"]["pp"] == 4 for p in plans)
    assert all(p["placement"]["train_gpus"] % 8 == 0 for p in plans)  # tp*pp = 8 tiles only these pools


def test_cli_unknown_host_ram_is_asked_for(capsys):
    code, _, err = run_cli(["rl", "--model", "llama3-8b", "--cluster", "a100-80g", "--gpus", "8", "--prompts", "8",
                            "--samples", "4", "--prompt-len", "256", "--response-len", "256"], capsys)
    assert code == 2 and "--host-mem-gib" in err


def test_cli_emits_verl_and_slime_settings(tmp_path, capsys):
    code, out, err = run_cli(BASE + ["--emit", "verl", "--out", str(tmp_path / "verl"), "--placement", "colocated",
                                     "--json"], capsys)
    assert code == 0, err
    text = (tmp_path / "verl" / "verl_overrides.txt").read_text()
    plan = json.loads(out)["plans"][0]
    assert f"actor_rollout_ref.rollout.tensor_model_parallel_size={plan['rollout']['tp']}" in text
    assert f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={plan['train']['tp']}" in text
    assert "data.train_batch_size=64" in text and "actor_rollout_ref.rollout.n=8" in text
    code, out, err = run_cli(BASE + ["--emit", "slime", "--out", str(tmp_path / "slime"), "--json"], capsys)
    assert code == 0, err
    args = (tmp_path / "slime" / "slime_args.txt").read_text().split("\n")
    plan = json.loads(out)["plans"][0]
    assert args[args.index("--rollout-num-gpus-per-engine") + 1] == str(plan["rollout"]["tp"] * plan["rollout"]["dp"])
    assert ("--colocate" in args) == (plan["placement"]["kind"] == "colocated")


# ---- the engine's memory outside its requested fraction (rollout.ENGINE_RUNTIME) ---------------------------------

def test_engine_runtime_buffers_follow_the_engines_sources():
    """vLLM: a device communicator per tp/dp/ep group of more than one rank, custom all-reduce (3 x 8 MiB) and the
    symmetric-memory buffer on a tp group of 2-8 GPUs in one node, the MLA prefill workspace (64 Ki rows of
    kv_lora_rank + rope dim, bf16), a CUDA context of its own; SGLang: one communicator for its tp group."""
    hw = hardware_of(load_cluster("h100", 16))
    nccl = R.NCCL_GIB_PER_GROUP * GIB
    dense = load_model("llama3-8b", ())
    one = R.engine_runtime_bytes(dense, RolloutLayout(tp=1, engines=16), hw)
    assert one["engine_nccl"] == 0.0 and one["custom_all_reduce"] == 0.0 and one["mla_workspace"] == 0.0
    assert one["engine_cuda_context"] == pytest.approx(R.CUDA_CONTEXT_GIB * GIB)
    tp8 = R.engine_runtime_bytes(dense, RolloutLayout(tp=8, engines=2), hw)
    assert tp8["engine_nccl"] == pytest.approx(2 * nccl)  # tp group and the ep group over the same 8 GPUs
    assert tp8["custom_all_reduce"] == pytest.approx(3 * 8 * 2**20 + 128 * 2**20)
    tp16 = R.engine_runtime_bytes(dense, RolloutLayout(tp=16, engines=1), hw)
    assert tp16["custom_all_reduce"] == 0.0  # the group spans two nodes
    v3 = load_model("deepseek-v3", ("mtp_num_layers=0",))
    mla = R.engine_runtime_bytes(v3, RolloutLayout(tp=8, dp=2, engines=1), hw)
    assert mla["engine_nccl"] == pytest.approx(3 * nccl)
    assert mla["mla_workspace"] == pytest.approx(64 * 1024 * (512 + 64) * 2)
    sgl = R.engine_runtime_bytes(v3, RolloutLayout(engine="sglang", tp=8, dp=2, ep=16, engines=1), hw)
    assert sgl["engine_nccl"] == pytest.approx(nccl) and sgl["mla_workspace"] == 0.0
    lay = RolloutLayout(tp=8, engines=2, gpu_memory_utilization=0.6)
    assert R.rollout_gpu_bytes(dense, lay, hw) == pytest.approx(
        0.6 * hw.capacity_bytes + sum(R.engine_runtime_bytes(dense, lay, hw).values()))


@pytest.mark.xfail(strict=True, reason="the modelled rollout-phase memory of verl's DeepSeek-V3 run is 59.8 GiB, "
                                       "2.7% under the published 66 GB; no term of the engines' code or the recipe "
                                       "found covers the rest (what was checked: benchmarks/rl_published.py, V3)")
def test_deepseek_v3_colocated_gpu_memory_is_not_under_the_published_figure():
    """verl docs/perf/dpsk.md: DeepSeek-V3 GRPO on 96 H20, 'GPU memory(GB) 66' (benchmarks/rl_published.py)."""
    from benchmarks.rl_published import runs

    run = next(r for r in runs() if r.name.startswith("V3 verl"))
    (plan,), _ = search(load_model(run.model, run.sets), load_cluster(run.gpu, run.gpus), run.job, run.fixed,
                        top_k=1)
    assert plan.peak_mem_gib >= run.published["gpu_mem_gib"]


def test_a_colocated_refit_holds_the_actor_and_the_engine_weights_together():
    """verl's rollout_mode brings the offloaded actor weights back, resumes the engine's weights and syncs them
    through one 512 MiB bucket before the KV cache returns (autoplan/rl/memory.py): with a small memory share the
    refit, not the generation, is the rollout side's peak."""
    from autoplan.rl.refit import BUCKET_BYTES
    from autoplan.rl.train import price_training

    m = load_model("llama3-70b", ())
    c = load_cluster("h100", 16)
    hw = hardware_of(c)
    rollout = {"tp": 4, "engines": 4, "gpu_memory_utilization": 0.5}
    col = Placement(kind="colocated", gpus=16, train_gpus=16)
    (plan,), _ = search(m, c, _job(), Fixed(train={"tp": 4, "pp": 2}, offload="all", placement=col,
                                            rollout=rollout), top_k=1)
    lay = RolloutLayout(**rollout)
    tp = price_training(m, c, _job(), [plan.strategy], ["all"])
    expect = (float(tp.context_bytes[0]) + float(tp.weights_bytes[0]) + R.engine_weights(m, lay).total
              + sum(R.engine_runtime_bytes(m, lay, hw).values()) + BUCKET_BYTES) / GIB
    assert plan.memory_gib["refit"] == pytest.approx(expect, rel=1e-6)
    assert plan.memory_gib["refit"] > plan.memory_gib["rollout"]
    assert plan.peak_mem_gib >= plan.memory_gib["refit"]


# ---- packed micro-batches (verl use_dynamic_bsz, slime --use-dynamic-batch-size) ---------------------------------

def test_packed_micro_batches_hold_the_token_cap_times_the_sequence_split():
    from autoplan.rl.train import packed_mbs

    job = _job(prompts=512, samples=12, prompt_len=256, response_len=2048, max_response_len=8192, mini_batches=16,
               micro_batch_tokens=20480)
    # 384 sequences per optimizer step over dp 4: 96 per rank; a cp-4 group packs 20480 * 4 // 2304 = 35 of them,
    # and the largest divisor of 96 not above 35 is 32
    assert packed_mbs(job, dp=4, cp=4) == 32
    assert packed_mbs(job, dp=4, cp=1) == 8  # 20480 // 2304 = 8, a divisor of 96
    assert packed_mbs(job.model_copy(update={"micro_batch_tokens": None}), dp=4, cp=4) == 1
    assert packed_mbs(job.model_copy(update={"micro_batch_tokens": 1000}), dp=4, cp=1) == 1  # below one sequence


def test_packing_prices_fuller_micro_batches_and_is_faster():
    m = load_model("llama3-8b", ())
    c = load_cluster("h100", 16)
    split = Placement(kind="split", gpus=16, train_gpus=8)
    fixed = Fixed(train={"tp": 1, "pp": 1}, offload="none", placement=split,
                  rollout={"tp": 1, "engines": 8, "gpu_memory_utilization": 0.8})
    (one,), _ = search(m, c, _job(mini_batches=4), fixed, top_k=1)
    (packed,), _ = search(m, c, _job(mini_batches=4, micro_batch_tokens=5000), fixed, top_k=1)
    # 512 sequences, 4 optimizer steps, dp 8: 16 per rank per step; 5000 // (512 + 1024) = 3 fit, and the largest
    # divisor of 16 not above 3 is 2
    assert one.strategy.mbs == 1 and packed.strategy.mbs == 2
    assert packed.phases["train"] < one.phases["train"]


def test_cli_micro_batch_tokens_default_admit_the_longest_sequence_and_a_smaller_cap_is_refused(tmp_path, capsys):
    code, out, err = run_cli(BASE + ["--emit", "verl", "--out", str(tmp_path), "--placement", "colocated",
                                     "--json"], capsys)
    assert code == 0, err
    job = json.loads(out)["job"]
    assert job["micro_batch_tokens"] == job["prompt_len"] + job["max_response_len"]
    text = (tmp_path / "verl_overrides.txt").read_text()
    assert f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={job['micro_batch_tokens']}" in text
    code, out, err = run_cli(BASE + ["--micro-batch-tokens", "100"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--micro-batch-tokens" in err and out == ""


# ---- the colocated switch: states moved between GPU and host where verl times it ---------------------------------

SWITCH_MODEL, SWITCH_CLUSTER = load_model("llama3-8b", ()), load_cluster("h100", 16)
SWITCH_ROLLOUT = {"tp": 1, "engines": 16, "gpu_memory_utilization": 0.6}


def _colocated_tp2(**fixed):
    """The best colocated plan of Llama-3 8B on 16 H100 at training tp 2 and the SWITCH_ROLLOUT layout."""
    col = Placement(kind="colocated", gpus=16, train_gpus=16)
    (plan,), _ = search(SWITCH_MODEL, SWITCH_CLUSTER, _job(), Fixed(train={"tp": 2, "pp": 1}, placement=col,
                                                                  rollout=SWITCH_ROLLOUT, **fixed), top_k=1)
    return plan


def test_colocated_switch_moves_the_offloaded_weights_twice_and_a_split_pool_never_switches():
    from autoplan.rl.train import price_training

    m, c = SWITCH_MODEL, SWITCH_CLUSTER
    swap, kept = _colocated_tp2(offload="swap"), _colocated_tp2(offload="none")
    tp = price_training(m, c, _job(), [swap.strategy], ["swap"])
    weights = float(tp.weights_bytes[0])
    move = 2.0 * weights / hardware_of(c).host_bytes_per_s
    assert swap.phases["switch"] == pytest.approx(move)  # vLLM at sleep level 2 copies none of its own weights
    assert swap.phases["old_log_prob"] == pytest.approx(float(tp.log_prob[0]) + move)
    assert kept.phases["switch"] == 0.0 and kept.phases["old_log_prob"] == pytest.approx(float(tp.log_prob[0]))
    assert kept.phases["ref"] == pytest.approx(float(tp.log_prob[0]) + move)  # the reference waits on the host
    assert swap.step_time_s == pytest.approx(sum(swap.phases.values()))
    split = Placement(kind="split", gpus=16, train_gpus=8)
    (off,), _ = search(m, c, _job(mode="one-step-off"), Fixed(train={"tp": 1, "pp": 1}, offload="none",
                                                               placement=split,
                                                               rollout={"tp": 1, "engines": 8}), top_k=1)
    assert off.phases["switch"] == 0.0


def test_only_an_engine_that_keeps_its_weights_on_the_host_copies_them_and_needs_the_host_ram():
    plans = {e: _colocated_tp2(offload="none", engine=e) for e in ("vllm", "sglang")}
    engine_w = R.engine_weights(SWITCH_MODEL, RolloutLayout(**SWITCH_ROLLOUT)).total
    assert not R.WEIGHTS_ON_HOST_ASLEEP["vllm"] and R.WEIGHTS_ON_HOST_ASLEEP["sglang"]
    assert plans["sglang"].phases["switch"] - plans["vllm"].phases["switch"] == pytest.approx(
        2.0 * engine_w / hardware_of(SWITCH_CLUSTER).host_bytes_per_s)
    assert plans["sglang"].host_mem_gib - plans["vllm"].host_mem_gib == pytest.approx(8 * engine_w / GIB)


# ---- the slowest engine and the slowest data-parallel rank ----------------------------------------------------------

def test_all_admitted_closed_form_is_the_event_loop():
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    sm = R.step_model(m, RolloutLayout(tp=1, engines=8), hw, 300)
    lengths = R.response_lengths(2048, 16384, 300)[R._arrival_order(300)]
    closed = R._all_admitted(sm, 512, lengths, 0.01)
    (loop,) = R._admitted_in_turn(sm, 512, lengths, 300, 0.01)
    assert closed[0] == pytest.approx(loop[0], rel=1e-12) and closed[1] == pytest.approx(loop[1], rel=1e-12)


@pytest.mark.parametrize("count,slots", [(300, 37), (64, 63), (200, 5)])
def test_the_mean_engine_forked_from_the_slowest_is_its_own_run(count, slots):
    """The mean engine's run (its longest shorter) continues from the slowest engine's state: the same result as
    running it alone."""
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    sm = R.step_model(m, RolloutLayout(tp=1, engines=8), hw, slots)
    order = R._arrival_order(count)
    own = R.response_lengths(1500, 12000, count)
    batch = own.copy()
    batch[-1] = 12000.0
    top = int(np.flatnonzero(order == count - 1)[0])
    slow, mean = R._admitted_in_turn(sm, 512, batch[order], slots, 0.01, top, float(own[-1]))
    assert slow == R._admitted_in_turn(sm, 512, batch[order], slots, 0.01)[0]
    assert mean == R._admitted_in_turn(sm, 512, own[order], slots, 0.01)[0]
    assert slow[0] > mean[0]


def test_rank_imbalance_of_one_sequence_per_rank_is_the_expected_longest():
    from autoplan.rl.train import rank_imbalance

    # one sequence per rank: the fullest rank holds the longest of `ranks` draws (closed form in rollout)
    for mean, cap, ranks in ((2048, 28672, 8), (2048, 8192, 32)):
        expect = (256 + R.expected_longest(mean, cap, ranks)) / (256 + mean)
        assert rank_imbalance(mean, cap, 256, 1, ranks) == pytest.approx(expect, rel=1e-4)
    assert rank_imbalance(2048, 28672, 256, 16, 1) == 1.0  # one rank waits for nobody
    assert rank_imbalance(2048, 2048, 256, 16, 32) == 1.0  # no spread


def test_rank_imbalance_tends_to_the_normal_order_statistic():
    """Many sequences per rank: a rank's tokens are near normal (central limit), and the larger of two normals
    exceeds the mean by sigma / sqrt(pi) (David & Nagaraja, the expected maximum of two standard normals)."""
    from autoplan.rl.train import rank_imbalance

    mean, cap, k = 2048, 28672, 400
    theta = R.length_scale(mean, cap)
    x = np.linspace(0.0, cap, 200_001)
    survival = np.exp(-x / theta)  # P(min(X, cap) > x) below the cap
    second = float(np.sum((x[1:] * survival[1:] + x[:-1] * survival[:-1]) * np.diff(x)))  # E[min(X, cap)^2]
    sigma = np.sqrt(second - mean ** 2)
    excess = (rank_imbalance(mean, cap, 0, k, 2) - 1.0) * k * mean
    assert excess == pytest.approx(np.sqrt(k) * sigma / np.sqrt(np.pi), rel=0.03)
    # fewer sequences per rank and more ranks: a larger lead of the fullest rank
    assert rank_imbalance(mean, cap, 256, 64, 8) < rank_imbalance(mean, cap, 256, 32, 16) < \
        rank_imbalance(mean, cap, 256, 16, 32)


def test_training_waits_for_the_fullest_rank_every_optimizer_step():
    from autoplan.rl.train import price_training, rank_imbalance
    from autoplan.strategy import strategy_from_mapping

    m = load_model("llama3-8b", ())
    c = load_cluster("h100", 16)
    s = strategy_from_mapping({"tp": 2, "pp": 1, "ep": 1, "cp": 1, "mbs": 1, "zero": 1, "recompute": "full"})
    spread = _job(response_len=1024, max_response_len=16384, mini_batches=4)
    even = spread.model_copy(update={"max_response_len": 1024})  # same mean: the same training cost model
    a, b = price_training(m, c, spread, [s], ["none"]), price_training(m, c, even, [s], ["none"])
    tt = b.ev.time_terms
    per_update = float(tt["dp_comm"][0] + tt["optimizer"][0])
    work = float(b.train[0]) - 4 * per_update
    dp, per_rank = 8, int(np.ceil(64 * 8 / 4 / 8))
    assert float(a.train[0]) - 4 * per_update == pytest.approx(
        work * rank_imbalance(1024, 16384, 512, per_rank, dp), rel=1e-9)
    assert float(a.log_prob[0]) == pytest.approx(float(b.log_prob[0]))  # the log-prob pass runs balanced shares


# ---- correlated lengths within a prompt; the fully-async parameter version -----------------------------------------

@pytest.mark.parametrize("mean,cap,prompts,samples", [(2048, 8192, 32, 16), (2048, 20480, 32, 12), (500, 4000, 8, 4)])
def test_correlated_longest_runs_from_independent_draws_to_one_draw_per_prompt(mean, cap, prompts, samples):
    independent = R.expected_longest(mean, cap, prompts * samples)
    per_prompt = R.expected_longest(mean, cap, prompts)
    near0 = R.expected_longest_correlated(mean, cap, prompts, samples, 1e-9)
    near1 = R.expected_longest_correlated(mean, cap, prompts, samples, 1 - 1e-6)
    assert near0 == pytest.approx(independent, rel=2e-3)  # the quadrature reproduces the closed form
    assert near1 == pytest.approx(per_prompt, rel=2e-2)  # one prompt's samples move together: one draw each
    values = [R.expected_longest_correlated(mean, cap, prompts, samples, r) for r in (0.0, 0.3, 0.6, 0.9)]
    assert values == sorted(values, reverse=True)  # fewer effectively independent draws, a shorter longest
    assert R.expected_longest_correlated(mean, cap, prompts, samples, 0.0) == independent


def test_correlated_lengths_give_spread_between_engines_where_the_cap_hid_it():
    # every engine reaches the cap among its independent draws, so no engine is slower than the mean; correlated
    # samples of whole prompts leave some engines short of it
    m = load_model("llama3-8b", ())
    hw = H100_NODE
    job = _job(prompts=256, samples=16, response_len=2048, max_response_len=8192)
    lay = RolloutLayout(tp=1, engines=8)
    independent = R.simulate(m, lay, hw, job)
    correlated = R.simulate(m, lay, hw, job, rho=0.9)
    assert independent.seconds - independent.mean_seconds < 1e-6 * independent.seconds
    assert correlated.seconds - correlated.mean_seconds > 0.0


def test_fully_async_version_streams_when_the_rollouter_may_run_ahead():
    from autoplan.rl import stream as ST

    # rollout faster than training: with a lead the trainer never waits after the first version
    v = ST.version(512, 4, 0.5, throughput_s=40.0, tail_s=120.0, trainer_s=100.0, sync_s=2.0)
    assert v.seconds == pytest.approx(102.0) and v.trainer_wait_s == pytest.approx(0.0)
    assert v.lead_prompts == pytest.approx(0.5 * 512)
    # staleness 0: each version starts empty; the first update waits for its prompts, the last for the tail
    s0 = ST.version(512, 4, 0.0, throughput_s=40.0, tail_s=120.0, trainer_s=100.0, sync_s=2.0)
    assert s0.trainer_wait_s == pytest.approx(10.0 + (120.0 - (10.0 + 75.0)))
    assert s0.seconds == pytest.approx(120.0 + 25.0 + 2.0)
    # rollout slower than training: the version is the rollout, the trainer waits the difference
    slow = ST.version(512, 4, 0.5, throughput_s=150.0, tail_s=300.0, trainer_s=100.0, sync_s=2.0)
    assert slow.seconds == pytest.approx(152.0) and slow.trainer_wait_s == pytest.approx(50.0)
    # a small lead (less than one local update's prompts) leaves a wait at each version's start
    small = ST.version(512, 4, 0.1, throughput_s=40.0, tail_s=120.0, trainer_s=100.0, sync_s=2.0)
    assert small.trainer_wait_s == pytest.approx((128 - 51.2) / 512 * 40.0)


def test_async_staleness_is_priced_by_the_version_model_and_refused_elsewhere():
    from autoplan.rl import stream as ST

    m = load_model("llama3-8b", ())
    c = load_cluster("h100", 16)
    fixed = Fixed(train={"tp": 1, "pp": 1}, offload="none", placement=Placement(kind="split", gpus=16, train_gpus=8),
                  rollout={"tp": 1, "engines": 8, "gpu_memory_utilization": 0.8})
    job = _job(mode="async").model_copy(update={"staleness": 0.0, "require_batches": 1, "mini_batches": 4})
    (plan,), _ = search(m, c, job, fixed, top_k=1)
    p = plan.phases
    sim = R.simulate(m, plan.rollout, hardware_of(c), job)
    v = ST.version(job.prompts, 4, 0.0, sim.throughput_seconds, sim.seconds, p["train"] + p["ref"] + p["reward"],
                   p["refit"] + p["switch"])
    assert plan.step_time_s == pytest.approx(v.seconds)
    assert plan.details["trainer_wait_s"] == pytest.approx(v.trainer_wait_s)
    with pytest.raises(ValueError, match="mode async only"):
        _job(staleness=0.5)
    with pytest.raises(ValueError, match="must divide"):
        _job(mode="async", mini_batches=4, require_batches=3)


def test_cli_async_streaming_settings_are_priced_and_emitted(tmp_path, capsys):
    extra = ["--mode", "async", "--placement", "split:8", "--mini-batches", "4", "--staleness", "0",
             "--require-batches", "2"]
    code, out, err = run_cli(BASE + extra + ["--emit", "verl", "--out", str(tmp_path / "verl"), "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["job"]["staleness"] == 0 and result["job"]["require_batches"] == 2
    text = (tmp_path / "verl" / "verl_overrides.txt").read_text()
    assert "async_training.staleness_threshold=0.0" in text and "async_training.require_batches=2" in text
    assert "async_training.trigger_parameter_sync_step=2" in text  # 4 mini-batches in local updates of 2
    code, _, err = run_cli(BASE + extra + ["--emit", "slime", "--out", str(tmp_path / "slime")], capsys)
    assert code == 2 and "slime has no flag" in err and "Traceback" not in err


HF = Path(__file__).parents[1] / "data" / "hf_configs"


# ---- hybrid models on SGLang: a state pool of slots beside the attention layers' token pool ----------------------

def _sglang_pools(rest_gib, per_req, cell, page=1, ratio=5, r=0.9, context=262144):
    """SGLang 0.5.15.post1 (slime's image), transcribed from model_runner_kv_cache_mixin.py in its own float GiB
    arithmetic: `handle_max_mamba_cache` (mamba_budget = rest x r / (1 + r); max_mamba_cache_size =
    int(mamba_budget_bytes // per_req); rest - max_mamba_cache_size x per_req / 2**30), the pool configurator's
    int(rest x 2**30) // cell // page x page, `_resolve_max_num_reqs` (min(clamp(int(tokens / context x 512), 2048,
    4096), tokens // 2, max_mamba_cache_size // ratio)). Returns (slots, tokens, max running requests)."""
    mamba_budget_bytes = rest_gib * r / (1 + r) * (1 << 30)
    slots = int(mamba_budget_bytes // per_req)
    rest = rest_gib - slots * per_req / (1 << 30)
    tokens = int(rest * (1 << 30)) // cell // page * page
    estimated = max(min(int(tokens / context * 512), 4096), 2048)
    return slots, tokens, min(estimated, tokens // 2, slots // ratio)


def test_sglang_hybrid_pools_follow_sglang():
    """Qwen3-Next-80B-A3B at tp 4: 36 Gated DeltaNet layers, each slot a bf16 conv state of (2 x 16 x 128 + 32 x
    128) / 4 x 3 elements and a float32 temporal state of 32 / 4 x 128 x 128 (SGLang's default without a
    mamba_ssm_dtype in the config); 12 attention layers of one KV head (2 of 16 heads at tp 4: one per rank) x
    (256 + 256) bf16 values. With 15.3 GiB of budget (0.7 x 79 GiB free - 40 GiB of weights) SGLang keeps 402 slots
    and 704,990 tokens and runs at most 80 requests (402 // 5: extra_buffer with the overlap scheduler); 402 without
    the radix cache; bf16 state 787 slots, 704,186 tokens, 157 requests; Blackwell's 64-token pages 704,960 tokens
    (hand-computed from the formulas of `_sglang_pools`)."""
    m = load_model(str(HF / "qwen3_next_80b_a3b.json"), ())
    assert m.mamba_ssm_dtype is None
    slot = 36 * ((2 * 16 * 128 + 32 * 128) // 4 * 3 * 2 + 32 // 4 * 128 * 128 * 4)
    cell = 12 * 1 * (256 + 256) * 2
    assert (slot, cell) == (19_316_736, 12_288)
    pools = R.cache_pages(m, 4, "sglang", False)
    assert pools == R.SglangHybridPools(slot, cell, 1, 262144)
    rest = 15.3 * GIB
    assert _sglang_pools(15.3, slot, cell) == (402, 704_990, 80)
    assert (pools.slots(rest), pools.tokens(rest), pools.running(rest)) == (402, 704_990, 80)
    for gib in (2.0, 9.7, 33.3, 70.1):
        k, tokens, running = _sglang_pools(gib, slot, cell)
        assert (pools.slots(gib * GIB), pools.tokens(gib * GIB), pools.running(gib * GIB)) == (k, tokens, running)
        assert pools.sequences(gib * GIB, 5120) == min(tokens // 5120, running)
    assert R.cache_pages(m, 4, "sglang", False, radix_cache=False).running(rest) == 402
    # --set mamba_ssm_dtype=bfloat16 (what a config's mamba_ssm_dtype says) halves the temporal state
    bf16 = R.cache_pages(m.model_copy(update={"mamba_ssm_dtype": "bfloat16"}), 4, "sglang", False)
    assert bf16.slot_bytes == 9_879_552
    assert (bf16.slots(rest), bf16.tokens(rest), bf16.running(rest)) == (787, 704_186, 157)
    # Blackwell: trtllm_mha's 64-token pages (Qwen3-Next / Qwen3.5 only)
    assert R.cache_pages(m, 4, "sglang", True).tokens(rest) == 704_960
    # vLLM keeps the temporal state in the model dtype whatever the config says
    f32 = m.model_copy(update={"mamba_ssm_dtype": "float32"})
    assert R.state_bytes_per_layer(m, 4, "vllm") == R.state_bytes_per_layer(f32, 4, "vllm") == 9_879_552 // 36
    assert R.state_bytes_per_layer(f32, 4, "sglang") == slot // 36


def test_sglang_nemotron_slot_by_hand():
    """Nemotron-3 Nano at tp 4: 23 Mamba-2 layers, each a bf16 conv state of 3 x (64 x 64 + 2 x 8 x 128) / 4 and a
    float32 temporal state of 64 / 4 heads x 64 x 128 (its config's mamba_ssm_cache_dtype is not the key SGLang
    reads); 6 attention layers of one KV head (2 over tp 4) x (128 + 128) bf16 values."""
    m = load_model(str(HF / "nemotron_3_nano_30b_a3b.json"), ())
    pools = R.cache_pages(m, 4, "sglang", True)
    assert (pools.slot_bytes, pools.token_bytes, pools.page_tokens) == (12_270_592, 6 * 256 * 2, 1)


def test_sglang_falcon_h1_state_in_every_layer():
    """Falcon-H1-7B runs Mamba-2 beside attention in all 44 layers; at tp 2 a slot holds, per layer, the bf16 conv
    state of 3 x (3072 + 2 x 2 x 256) / 2 channels (its one group widened to 2) and the float32 temporal state of
    12 heads x 128 x 256; a token 2 bytes x (128 + 128) x 1 KV head (2 of them over tp 2) in every layer. Triton
    attention on Blackwell keeps 1-token pages."""
    m = load_model(str(HF / "falcon_h1_7b.json"), ())
    pools = R.cache_pages(m, 2, "sglang", False)
    assert pools.slot_bytes == 44 * (3 * 2048 * 2 + 12 * 128 * 256 * 4) == 69_746_688
    assert pools.token_bytes == 44 * 2 * 128 * 2 == 22_528
    assert R.cache_pages(m, 2, "sglang", True).page_tokens == 1
    assert (pools.slots(20 * GIB), pools.tokens(20 * GIB), pools.running(20 * GIB)) == \
        _sglang_pools(20.0, 69_746_688, 22_528)


def test_sglang_allocates_a_request_table_beyond_its_budget():
    """SGLang's request table, (max running requests + 1) x (context + 4) int32, and a hybrid's padding state slot
    lie outside mem_fraction_static's budget: counted in the engine's runtime memory. Llama3-8B (8,192-token
    context) at tp 1: the estimate int(tokens / 8192 x 512) clamped to [2048, 4096]."""
    dense = load_model("llama3-8b", ())
    lay = RolloutLayout(engine="sglang", tp=1, dp=1, ep=1, engines=8, gpu_memory_utilization=0.8)
    tokens = R.kv_tokens_per_group(dense, lay, H100_NODE)
    running = max(min(int(tokens / 8192 * 512), 4096), 2048)
    assert R.engine_runtime_bytes(dense, lay, H100_NODE)["sglang_pools"] == (running + 1) * (8192 + 4) * 4
    assert R.engine_runtime_bytes(dense, lay.model_copy(update={"engine": "vllm"}), H100_NODE)["sglang_pools"] == 0
    m = load_model(str(HF / "qwen3_next_80b_a3b.json"), ())
    lay = RolloutLayout(engine="sglang", tp=4, dp=1, ep=1, engines=2, gpu_memory_utilization=0.7)
    pools, budget = R.cache_pages(m, 4, "sglang", False), R.kv_cache_bytes(m, lay, H100_NODE)
    assert R.engine_runtime_bytes(m, lay, H100_NODE)["sglang_pools"] == \
        (pools.running(budget) + 1) * (262144 + 4) * 4 + 19_316_736


def test_sglang_hybrid_decode_streams_its_float32_state():
    """A decode step reads and writes each running request's state at SGLang's dtype: the temporal state in float32
    doubles its bytes against vLLM's bf16."""
    m = load_model(str(HF / "nemotron_3_nano_30b_a3b.json"), ())
    lays = {e: RolloutLayout(engine=e, tp=2, dp=1, ep=1, engines=4, gpu_memory_utilization=0.8)
            for e in ("vllm", "sglang")}
    conv, temporal = R.state_elements(m, 2)
    got = {e: R.step_model(m, lay, H100_NODE, 64).state_bytes[64] for e, lay in lays.items()}
    assert got["vllm"] == pytest.approx(64 * 2 * R.state_layers(m) * (conv + temporal) * 2)
    assert got["sglang"] == pytest.approx(64 * 2 * R.state_layers(m) * (conv * 2 + temporal * 4))


def test_cli_plans_hybrid_rollouts_on_sglang_within_its_state_slots(capsys, tmp_path):
    """slime + SGLang plans Qwen3-Next and Nemotron-3 Nano; the batch an engine runs is at most its state pool's
    slots // 5 per attention group (// 1 without the radix cache), and at most slime's 512 requests in flight per
    engine."""
    hw = hardware_of(load_cluster("h100", 16))
    for config in ("nemotron_3_nano_30b_a3b.json", "qwen3_next_80b_a3b.json"):
        m = load_model(str(HF / config), ())
        args = ["rl", "--model", str(HF / config)] + BASE[3:] + ["--json", "--emit", "slime", "--out",
                                                                  str(tmp_path / config)]
        code, out, err = run_cli(args, capsys)
        assert code == 0, err
        best = json.loads(out)["plans"][0]
        r = best["rollout"]
        assert r["engine"] == "sglang" and best["estimate"]["fits"]
        lay = RolloutLayout(**r)
        pools = R.cache_pages(m, lay.tp, "sglang", False, lay.radix_cache)
        budget = R.kv_cache_bytes(m, lay, hw)
        assert 1 <= best["estimate"]["rollout_batch_per_engine"] <= min(pools.running(budget) * lay.dp, 512)
        assert (tmp_path / config / "run_slime.sh").exists()


def test_an_sglang_state_pool_without_room_for_one_request_is_named():
    """Too little budget for 5 slots: SGLang would cap the running requests at 0 (it refuses to start), named."""
    m = load_model(str(HF / "qwen3_next_80b_a3b.json"), ())
    lay = RolloutLayout(engine="sglang", tp=4, dp=1, ep=1, engines=2, gpu_memory_utilization=0.5)
    left = 0.15 * GIB  # a budget of 0.15 GiB after the weights and the CUDA context: 3 slots of 18.4 MiB
    util = (R.engine_weights(m, lay).total + R.CUDA_CONTEXT_GIB * GIB + left) / H100_NODE.capacity_bytes
    lay = lay.model_copy(update={"gpu_memory_utilization": util})
    pools = R.cache_pages(m, 4, "sglang", False)
    budget = R.kv_cache_bytes(m, lay, H100_NODE)
    assert budget == pytest.approx(left)
    assert pools.running(budget) == 0 and pools.tokens(budget) >= 5120
    why = R.cache_shortfall(m, lay, H100_NODE, 5120)
    assert "SGLang's state pool" in why and f"{pools.slots(budget)} slots" in why


# ---- hybrid models: vLLM's hybrid KV cache (Mamba-2 / Gated DeltaNet state beside attention KV) ----------------

def _vllm_hybrid_pages(attn_layers, state_layers, attn_bytes_1tok, state_page):
    """vLLM 0.11, as written there: HybridAttentionMambaModelConfig.verify_and_update_config (attention block size
    16 * cdiv(mamba_page, 16 * attn_page_1_token), the mamba page padded to the attention page) and
    kv_cache_utils._get_kv_cache_groups_uniform_page_size (group_size = min layers of a kind, cdiv(layers,
    group_size) groups per kind). Returns (block_size, page_size, group_size, groups per kind)."""
    block = 16 * -(-state_page // (16 * attn_bytes_1tok))
    group_size = min(attn_layers, state_layers)
    return block, block * attn_bytes_1tok, group_size, (-(-attn_layers // group_size), -(-state_layers // group_size))


@pytest.mark.parametrize("config, tp, state_elems", [
    # Qwen3-Next-80B-A3B: linear_num_key_heads 16, linear_num_value_heads 32, key/value head dim 128, conv kernel 4
    # (gated_delta_net_state_shape: conv (kernel - 1, conv_dim / tp), temporal (v heads / tp, k dim, v dim))
    ("qwen3_next_80b_a3b.json", 1, 3 * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128),
    ("qwen3_next_80b_a3b.json", 4, 3 * (2 * 16 * 128 + 32 * 128) // 4 + 8 * 128 * 128),
    # Nemotron-3 Nano: mamba_num_heads 64 x head dim 64, n_groups 8, ssm_state_size 128, conv kernel 4
    # (mamba2_state_shape: conv (kernel - 1, (d_inner + 2 G N) / tp), temporal (heads / tp, head dim, N))
    ("nemotron_3_nano_30b_a3b.json", 1, 3 * (64 * 64 + 2 * 8 * 128) + 64 * 64 * 128),
    ("nemotron_3_nano_30b_a3b.json", 2, 3 * (64 * 64 + 2 * 8 * 128) // 2 + 32 * 64 * 128),
    # Falcon-H1-7B: 24 heads x 128 (mamba_d_ssm 3072), n_groups 1 widened to tp (extra_groups_for_head_shards),
    # d_state 256: at tp 2 the conv holds d_inner + 2 * 2 * 256 channels
    ("falcon_h1_7b.json", 2, 3 * (3072 + 2 * 2 * 256) // 2 + 12 * 128 * 256),
])
def test_recurrent_state_and_pages_match_vllm(config, tp, state_elems):
    m = load_model(str(HF / config), ())
    assert sum(R.state_elements(m, tp)) == state_elems
    assert R.state_bytes_per_layer(m, tp) == 2 * state_elems  # bf16 ("auto": the model dtype)
    attn_1tok = 2 * max(1, m.num_query_groups // tp) * m.kv_channels * 2  # FullAttentionSpec, block_size 1
    block, page, group, (n_attn, n_state) = _vllm_hybrid_pages(R.attention_layers(m), R.state_layers(m), attn_1tok,
                                                               2 * state_elems)
    pages = R.cache_pages(m, tp)
    assert (pages.block_tokens, pages.page_bytes, pages.group_layers) == (block, page, group)
    assert (pages.attention_groups, pages.state_groups) == (n_attn, n_state)
    assert page >= 2 * state_elems and block % 16 == 0


def test_hybrid_layer_counts():
    nano = load_model(str(HF / "nemotron_3_nano_30b_a3b.json"), ())
    assert (R.attention_layers(nano), R.state_layers(nano)) == (nano.layer_count("*"), nano.layer_count("M")) == (6, 23)
    nxt = load_model(str(HF / "qwen3_next_80b_a3b.json"), ())
    assert (R.attention_layers(nxt), R.state_layers(nxt)) == (12, 36)  # full_attention_interval 4 of 48
    dense = load_model("llama3-8b", ())
    assert (R.attention_layers(dense), R.state_layers(dense)) == (32, 0)
    assert R.cache_pages(dense, 1) == R.CachePages(1, R.kv_bytes_per_token(dense, 1), 1, 1, 0)


def test_hybrid_sequences_follow_vllm_block_pool():
    """A sequence takes ceil(tokens / block) blocks in each attention group and one in each state group, from
    available // page // group_size blocks (kv_cache_utils.get_num_blocks; MambaSpec: one block per request):
    checked against drawing blocks for sequences one by one."""
    m = load_model(str(HF / "qwen3_next_80b_a3b.json"), ())
    pages = R.cache_pages(m, 2)
    cache = 20 * GIB
    blocks = int(cache // pages.page_bytes // pages.group_layers)
    assert pages.blocks(cache) == blocks
    for tokens in (1, 543, 544, 545, 5120, 17408):
        free, admitted = blocks, 0
        need = pages.attention_groups * -(-tokens // pages.block_tokens) + pages.state_groups
        while free >= need:
            free, admitted = free - need, admitted + 1
        assert pages.sequences(cache, tokens) == admitted
    # vLLM's log line "GPU KV cache size": num_blocks // len(kv_cache_groups) * block_size
    assert pages.tokens(cache) == blocks // 4 * pages.block_tokens


def test_hybrid_state_costs_memory_and_decode_time_per_sequence():
    """Beside per-token KV, each running sequence holds and streams its recurrent state: fewer sequences fit than
    the attention KV alone admits, and the decode step grows with the batch by the state's read and write."""
    m = load_model(str(HF / "nemotron_3_nano_30b_a3b.json"), ())
    lay = RolloutLayout(engine="vllm", tp=2, dp=1, ep=1, engines=4, gpu_memory_utilization=0.8)
    cache = R.kv_cache_bytes(m, lay, H100_NODE)
    tokens = 1024 + 4096
    attention_only = int(cache // (tokens * R.kv_bytes_per_token(m, 2)))
    assert 0 < R.sequences_per_group(m, lay, H100_NODE, tokens) < attention_only
    sm = R.step_model(m, lay, H100_NODE, 64)
    per_seq = 2 * R.state_layers(m) * R.state_bytes_per_layer(m, 2)
    assert sm.state_bytes[64] == pytest.approx(64 * per_seq)
    assert sm.kv_read_per_token == R.attention_layers(m) * R.kv_bytes_per_token_layer(m, 2)  # attention layers only


def test_cli_plans_hybrid_rollouts_on_vllm(capsys, tmp_path):
    for config in ("nemotron_3_nano_30b_a3b.json", "qwen3_next_80b_a3b.json"):
        args = ["rl", "--model", str(HF / config)] + BASE[3:] + ["--json", "--emit", "verl", "--out",
                                                                  str(tmp_path / config)]
        code, out, err = run_cli(args, capsys)
        assert code == 0, err
        best = json.loads(out)["plans"][0]
        assert best["rollout"]["engine"] == "vllm" and best["estimate"]["fits"]
        assert best["estimate"]["rollout_batch_per_engine"] >= 1


def test_cli_refuses_a_rollout_tp_that_does_not_split_the_recurrent_mixers(capsys):
    """40 Gated DeltaNet value heads do not split 16 ways (vLLM `divide` asserts), though the 16 attention heads
    do."""
    args = ["rl", "--model", str(HF / "qwen3_next_80b_a3b.json"), "--set", "gdn_num_value_heads=40"] + BASE[3:] + [
        "--rollout", "tp=16"]
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == "" and "tp=16" in err and "16 key and 40 value heads" in err
    assert len(err.strip().splitlines()) == 1


# ---- DeepSeek sparse attention on vLLM ---------------------------------------------------------------------------

def test_dsa_cache_is_vllms_fp8_latent_and_indexer_keys():
    """vLLM 0.11: 656 bytes of fp8_ds_mla latent per token and layer (MLAAttentionSpec.page_size_bytes) plus the
    indexer's uint8 keys, index_head_dim + index_head_dim // 128 * 4 bytes (DeepseekV32IndexerCache), in every
    layer with an indexer: GLM-5.2 has 21 of 78."""
    v32 = load_model(str(HF / "deepseek_v3_2.json"), ())
    assert R.kv_bytes_per_token(v32, 1) == R.kv_bytes_per_token(v32, 8) == 61 * (656 + 128 + 4)
    glm52 = load_model(str(HF / "glm5_2.json"), ())
    assert R.kv_bytes_per_token(glm52, 4) == 78 * 656 + 21 * 132
    assert R.cache_pages(glm52, 4).blocks(1e9) == int(1e9 // (78 * 656 + 21 * 132))


def test_dsa_decode_reads_indexer_keys_per_token_and_topk_latents_per_sequence():
    """The per-context-token term is the indexer's (its keys and scoring FLOPs); the attention's top-k reads are a
    per-sequence term, so doubling the context grows a step by the indexer's share only."""
    v32 = load_model(str(HF / "deepseek_v3_2.json"), ())
    lay = RolloutLayout(engine="vllm", tp=8, dp=1, ep=8, engines=1, gpu_memory_utilization=0.9)
    sm = R.step_model(v32, lay, H100_NODE, 64)
    assert sm.kv_read_per_token == 61 * 132
    assert sm.attn_flops_per_token == 2.0 * 61 * 64 * 128
    assert sm.sparse_attention[64] == pytest.approx(64 * sm.sparse_attention[1]) and sm.sparse_attention[1] > 0
    short, long = sm.time(64, 64 * 8192), sm.time(64, 64 * 16384)
    assert long - short == pytest.approx(sm.per_context_token * 64 * 8192)


def test_sglang_dsa_cache_is_fp8_on_blackwell_and_bf16_before():
    """SGLang 0.5.23 (srt/arg_groups/overrides.py): a DSA model's "auto" KV cache is fp8_e4m3 on compute capability
    >= 10 and bfloat16 elsewhere, raw kv_lora_rank + rope rows (calculate_mla_kv_cache_dim), beside the indexer's
    132 bytes per token in each indexer layer (elided where top-k is reused)."""
    glm52 = load_model(str(HF / "glm5_2.json"), ())
    b200 = hardware_of(load_cluster("b200", 32))
    lay = RolloutLayout(engine="sglang", tp=8, dp=4, ep=32, engines=1, gpu_memory_utilization=0.9)
    assert R.is_blackwell(b200) and not R.is_blackwell(H100_NODE)
    assert R.kv_bytes_per_token(glm52, 8, "sglang", False) == 78 * 576 * 2 + 21 * 132
    assert R.kv_bytes_per_token(glm52, 8, "sglang", True) == 78 * 576 + 21 * 132
    cache = R.kv_cache_bytes(glm52, lay, b200)
    assert cache > 0 and R.kv_tokens_per_group(glm52, lay, b200) == cache // (78 * 576 + 21 * 132)


def test_cli_plans_dsa_rollouts_on_vllm(capsys):
    args = ["rl", "--model", str(HF / "glm5.json"), "--cluster", "h100", "--gpus", "128", "--prompts", "64",
            "--samples", "8", "--prompt-len", "512", "--response-len", "1024", "--max-response-len", "4096", "--json"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    assert best["rollout"]["engine"] == "vllm" and best["estimate"]["fits"]


def test_rollout_tp_must_split_mamba_groups_or_they_must_be_one():
    """vLLM mamba_mixer2.py: 'If tensor parallel world size does not divide num_groups, then num_groups must equal
    1' (Nemotron-3 Nano: 8 groups)."""
    nano = load_model(str(HF / "nemotron_3_nano_30b_a3b.json"), ())
    assert [t for t in (1, 2, 4, 8, 16, 32) if R.state_tp_ok(nano, t)] == [1, 2, 4, 8]


def test_vllm_holds_dsa_topk_indices_outside_the_cache():
    """DeepseekV2Model's topk_indices_buffer: int32 [max_num_batched_tokens, index_topk]."""
    v32 = load_model(str(HF / "deepseek_v3_2.json"), ())
    v3 = v32.model_copy(update={"dsa_index_heads": 0, "dsa_index_head_dim": 0, "dsa_index_topk": 0})
    lay = RolloutLayout(engine="vllm", tp=8, dp=1, ep=8, engines=1, gpu_memory_utilization=0.9)
    dsa_weights = R.engine_weights(v32, lay).total - R.engine_weights(v3, lay).total
    assert R.kv_cache_bytes(v3, lay, H100_NODE) - R.kv_cache_bytes(v32, lay, H100_NODE) == \
        pytest.approx(dsa_weights + R.MAX_NUM_BATCHED_TOKENS * 2048 * 4)


def test_sglang_radix_cache_decides_a_hybrids_slots_per_request(capsys, tmp_path):
    """Without the radix cache SGLang gives a running request one state slot instead of five
    (`_calculate_mamba_ratio`), the pools themselves unchanged; the search tries both on a hybrid, the chosen
    setting is emitted (--sglang-disable-radix-cache), and vLLM refuses the setting by name."""
    m = load_model(str(HF / "qwen3_next_80b_a3b.json"), ())
    on, off = R.cache_pages(m, 4, "sglang", False), R.cache_pages(m, 4, "sglang", False, radix_cache=False)
    rest = 15.3 * GIB
    assert (off.slots(rest), off.tokens(rest)) == (on.slots(rest), on.tokens(rest))
    assert (on.running(rest), off.running(rest)) == (402 // 5, 402)
    assert parse_rollout("radix_cache=false") == {"radix_cache": False}
    args = ["rl", "--model", str(HF / "qwen3_next_80b_a3b.json")] + BASE[3:]
    code, out, err = run_cli(args + ["--rollout", "radix_cache=false"], capsys)
    assert code == 2 and out == "" and "radix_cache=false" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(args + ["--engine", "sglang", "--top", "50", "--json"], capsys)
    assert code == 0, err
    plans = json.loads(out)["plans"]
    assert {p["rollout"]["radix_cache"] for p in plans} == {True, False}
    # off only where it runs more requests than the same layout with the cache (the prefix reuse it loses is not
    # priced)
    for p in plans:
        if not p["rollout"]["radix_cache"]:
            on = RolloutLayout(**{**p["rollout"], "radix_cache": True})
            assert p["estimate"]["rollout_batch_per_engine"] > R.simulate(
                m, on, hardware_of(load_cluster("h100", 16)), _job(prompts=64, samples=8, prompt_len=512,
                                                                  response_len=1024, max_response_len=4096)).batch
    code, out, err = run_cli(args + ["--emit", "slime", "--rollout", "radix_cache=false", "--out", str(tmp_path),
                                     "--json"], capsys)
    assert code == 0, err
    assert all(not p["rollout"]["radix_cache"] for p in json.loads(out)["plans"])
    assert "--sglang-disable-radix-cache" in (tmp_path / "slime_args.txt").read_text().split()
    code, out, err = run_cli(args + ["--emit", "slime", "--rollout", "radix_cache=true", "--out", str(tmp_path / "on"),
                                     "--set", "mamba_ssm_dtype=bfloat16"], capsys)
    assert code == 0, err
    emitted = (tmp_path / "on" / "slime_args.txt").read_text().split()
    assert "--sglang-disable-radix-cache" not in emitted
    assert emitted[emitted.index("--sglang-mamba-ssm-dtype") + 1] == "bfloat16"  # the dtype it was priced with
