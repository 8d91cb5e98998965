"""Pricing of the token mixers of recent families (autoplan/costmodel/layers/mixers.py): Llama-4's chunked attention,
Qwen3-Next's Gated DeltaNet and gated attention, Falcon-H1's parallel Mamba mixer, DeepSeek-V3.2's sparse attention;
and `plan` / `estimate` of the twelve families from their config.json."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoplan.costmodel.flops import model_flops_per_token
from autoplan.costmodel.layers.base import shard_of
from autoplan.costmodel.layers.dense import attention_activation_bytes
from autoplan.costmodel.layers.mixers import (chunked_keys, dsa_activation_bytes, dsa_keys, gdn_activation_bytes,
                                              mixer_activation_bytes)
from autoplan.costmodel.layers.mamba import mamba_activation_bytes
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.modelio import from_hf_config, load_model
from autoplan.strategy import Strategy
from tests.conftest import run_cli

HF = Path(__file__).parents[1] / "data" / "hf_configs"


def model(name, **update):
    return load_model(str(HF / f"{name}.json")).model_copy(update=update)


def test_chunked_and_sparse_key_counts():
    # Chunk c: positions 1..c attend 1..c keys, mean (c + 1) / 2, per whole chunk.
    assert chunked_keys(8192, 4096) == pytest.approx(4097 / 2)
    assert chunked_keys(8192, 32768) == pytest.approx(8193 / 2)
    assert chunked_keys(4, 6) == pytest.approx((1 + 2 + 3 + 4 + 1 + 2) / 6)
    # DSA: query i attends min(i + 1, k) keys.
    assert dsa_keys(4, 6) == pytest.approx((1 + 2 + 3 + 4 + 4 + 4) / 6)
    assert dsa_keys(2048, 1024) == pytest.approx(1025 / 2)


def test_chunked_attention_stops_growing_past_the_chunk():
    all_chunked = model("llama4_scout_17b_16e", num_chunked_attention_layers=48)
    full = model("llama4_scout_17b_16e", num_chunked_attention_layers=0, attention_chunk_size=0)
    grow = lambda m: model_flops_per_token(m, 65536) - model_flops_per_token(m, 32768)  # noqa: E731
    assert grow(all_chunked) == pytest.approx(0.0, abs=1.0)
    assert grow(full) > 0
    scout = model("llama4_scout_17b_16e")  # 36 chunked + 12 full layers
    assert grow(scout) == pytest.approx(grow(full) * 12 / 48)


def test_gated_deltanet_layers_are_linear_in_sequence():
    qwen = model("qwen3_next_80b_a3b")
    softmax_only = qwen.model_copy(update={"linear_attention_layers": 0})
    grow = lambda m: model_flops_per_token(m, 65536) - model_flops_per_token(m, 32768)  # noqa: E731
    # Only the 12 attention layers of 48 grow with the sequence.
    assert grow(qwen) == pytest.approx(grow(softmax_only) * 12 / 48)


def test_dsa_attends_topk_keys_and_indexes_every_key():
    v32 = model("deepseek_v3_2", mtp_num_layers=0)  # the 61 decoder layers; an MTP depth would be a 62nd
    dense = v32.model_copy(update={"dsa_index_heads": 0, "dsa_index_head_dim": 0, "dsa_index_topk": 0})
    # Past the top-k, DSA's main attention stops growing; the indexer (64 heads x 128, per key, forward and the
    # two backward passes, 61 layers) is what still grows.
    grow = lambda m: model_flops_per_token(m, 65536) - model_flops_per_token(m, 32768)  # noqa: E731
    indexer = 3 * 61 * 2.0 * 64 * 128 * (65536 - 32768) / 2
    attention = 3 * 61 * 2.0 * 128 * (128 + 64 + 128) * (dsa_keys(2048, 65536) - dsa_keys(2048, 32768))
    assert grow(v32) == pytest.approx(indexer + attention)
    assert grow(v32) < grow(dense)


@pytest.fixture
def shard():
    def make(m, seq, **kw):
        lay = layouts_from_strategies([Strategy(**{"tp": 1, "pp": 1, "mbs": 1, **kw})], 8)
        return lay, shard_of(m, lay, seq)
    return make


def test_memory_takes_the_larger_mixer_and_adds_parallel_ones(shard):
    qwen = model("qwen3_next_80b_a3b")
    lay, sh = shard(qwen, 4096)
    attention = attention_activation_bytes(qwen, sh, lay)
    held = mixer_activation_bytes(qwen, sh, lay, attention)
    # A pipeline stage may hold only Gated DeltaNet layers or only attention layers: the larger of the two.
    assert np.all(held >= gdn_activation_bytes(qwen, sh, lay)) and np.all(held >= attention)
    falcon = model("falcon_h1_7b")
    lay, sh = shard(falcon, 4096)
    attention = attention_activation_bytes(falcon, sh, lay)
    both = mixer_activation_bytes(falcon, sh, lay, attention)
    assert np.all(both > attention) and np.all(both > mamba_activation_bytes(falcon, sh, lay))


@pytest.mark.parametrize("name, stats_per_token", [("qwen3_30b_a3b", 32 + 4), ("minimax_m2", 2)])
def test_qk_norm_keeps_a_second_copy_of_q_and_k(name, stats_per_token, shard):
    m = model(name)
    lay, sh = shard(m, 4096)
    extra = attention_activation_bytes(m, sh, lay) - \
        attention_activation_bytes(m.model_copy(update={"qk_layernorm": False}), sh, lay)
    # The norm keeps the QKV output's q and k; flash attention saves the normed, rotated copy: (heads + groups) x d
    # more bf16 per token, and the norm's fp32 1/rms per head (Qwen3) or per projection (MiniMax-M2's q and k).
    heads_and_groups = m.num_attention_heads + m.num_query_groups
    assert np.allclose(extra, 4096 * (2 * heads_and_groups * m.kv_channels + 4 * stats_per_token))


def test_dsa_memory_is_quadratic_in_sequence(shard):
    v32 = model("deepseek_v3_2")
    lay, sh = shard(v32, 4096)
    small = dsa_activation_bytes(v32, sh, lay)
    lay, sh = shard(v32, 8192)
    large = dsa_activation_bytes(v32, sh, lay)
    assert np.all(large / small > 3.9)


# ---------------------------------------------------------------- the twelve families, from config.json

CASES = [  # fixture, GPUs
    ("olmo2_1124_13b", 16), ("granite_3_1_8b_instruct", 16), ("llama4_scout_17b_16e", 64), ("glm4_5_air", 64),
    ("qwen3_next_80b_a3b", 64), ("minimax_m2", 64), ("falcon_h1_7b", 16), ("deepseek_v3_2", 256),
    ("llama3_8b", 16), ("qwen3_30b_a3b", 32), ("deepseek_v3", 256), ("gpt_oss_120b", 64),
]


@pytest.mark.parametrize("name, gpus", CASES)
def test_family_is_planned_and_estimated_from_its_config(name, gpus, capsys):
    job = ["--model", str(HF / f"{name}.json"), "--cluster", "h100", "--gpus", str(gpus), "--seq", "4096",
           "--gbs", "256"]
    code, out, err = run_cli(["plan", *job, "--top", "1"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["estimate", *job], capsys)
    assert code == 0, err
    assert "step time" in out and name in out


@pytest.mark.parametrize("name", ["qwen3_next_80b_a3b", "deepseek_v3_2"])
def test_context_parallel_is_refused_for_mixers_without_a_cp_path(name, capsys):
    code, out, err = run_cli(["estimate", "--model", str(HF / f"{name}.json"), "--cluster", "h100", "--gpus", "256",
                              "--seq", "4096", "--gbs", "256", "--strategy", "tp=8,pp=8,cp=2,ep=8"], capsys)
    assert code == 2
    assert "cp=2 is not supported" in err and "no CP path" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name, feature", [
    ("olmo2_1124_13b", "qk_norm_scope=all_heads"), ("granite_3_1_8b_instruct", "Granite's"),
    ("llama4_scout_17b_16e_text", "attention_chunk_size"), ("falcon_h1_7b", "parallel_mamba"),
])
def test_megatron_launch_files_refuse_what_they_would_not_build(name, feature):
    # No release's arguments build these (megatron_releases/*.txt): written without them the emitted pretrain_gpt.py
    # arguments would train another model, so they are refused, named.
    from autoplan.integrations.megatron import inexpressible_problem

    problem = inexpressible_problem(load_model(str(HF / f"{name}.json"), ()))
    assert problem is not None and feature in problem


def test_gated_deltanet_placed_off_the_interval_is_refused():
    from autoplan.integrations.megatron import inexpressible_problem

    cfg = json.loads((HF / "qwen3_next_80b_a3b.json").read_text())
    cfg["layer_types"] = ["full_attention"] * 12 + ["linear_attention"] * 36  # no full_attention_interval pattern
    m = from_hf_config(cfg, "qwen3-next-front")
    assert (m.linear_attention_layers, m.linear_attention_freq) == (36, 0)
    assert "linear_attention_freq=0" in inexpressible_problem(m)
    periodic = dict(cfg, layer_types=["full_attention" if (i + 1) % 3 == 0 else "linear_attention"
                                      for i in range(48)])
    assert from_hf_config(periodic, "qwen3-next-3").linear_attention_freq == 3


def test_families_megatron_builds_are_not_refused():
    from autoplan.integrations.megatron import inexpressible_problem

    for name in ("llama3_8b", "qwen3_30b_a3b", "glm4_5_air", "qwen3_next_80b_a3b", "deepseek_v3_2"):
        assert inexpressible_problem(load_model(str(HF / f"{name}.json"), ())) is None, name


def test_dsa_indexer_is_whole_on_every_tensor_parallel_rank():
    """Megatron builds the lightning indexer's linears with parallel_mode="duplicated" (dsa.py DSAIndexer, core
    0.16.1 and 0.19.0): each tensor-parallel rank holds all of it, as it holds the norms, while the rest of the
    attention is split tp ways."""
    from autoplan.clusterio import load_cluster
    from autoplan.costmodel import rank as E
    from autoplan.costmodel.hardware import hardware_of
    from autoplan.costmodel.params import attention_params, dsa_indexer_params, layer_params
    from autoplan.costmodel.stages import stage_layers

    m = load_model(str(HF / "glm5.json"))
    lp = layer_params(m, True)
    assert lp.indexer == dsa_indexer_params(m) == 2048 * 32 * 128 + 6144 * 128 + 2 * 128 + 6144 * 32
    assert lp.attention == attention_params(m)  # the tp-split part holds no indexer weight
    held = {}
    for tp in (1, 8):
        s = Strategy(tp=tp, pp=1, ep=8, sp=tp > 1, zero=1, recompute="full")
        clus = load_cluster("h100", 64)
        lay = layouts_from_strategies([s], clus.num_gpus)
        st = stage_layers(m, lay, np.zeros(1, int))
        vocab = E._vocab_params(m, lay, st)
        dense, _, _ = E._rank_params(m, hardware_of(clus), lay, st, vocab)
        held[tp] = float(dense[0] - vocab[0])
    n = m.num_layers
    # going from tp 1 to 8 removes 7/8 of the split weights and none of the indexers'
    split = held[1] - held[8]
    moe, dense_l = layer_params(m, True), layer_params(m, False)
    tp_split = (n - m.num_moe_layers) * (dense_l.attention + dense_l.dense_mlp) + \
        m.num_moe_layers * (moe.attention + moe.shared_experts)
    from autoplan.costmodel.params import mtp_params
    tp_split += mtp_params(m)[0]
    assert split == pytest.approx(tp_split * 7 / 8)
    assert held[8] >= n * lp.indexer
