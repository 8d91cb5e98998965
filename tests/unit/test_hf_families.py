"""Hugging Face families beyond Llama: Phi-3, Gemma-2, Gemma-3 (text and multimodal), GLM-4, and the Llama keys
that change the block (hidden_act, mlp_bias, attention_bias) and NeoX's rotary_pct: read, or refused in one line;
what ModelSpec cannot express is named in `notes`. Fixtures and their sources: tests/data/hf_configs/README.md."""
import json
from pathlib import Path

import pytest

from autoplan.costmodel.params import count_parameters
from autoplan.errors import InputError
from autoplan.modelio import from_hf_config, load_model

HF = Path(__file__).parents[1] / "data" / "hf_configs"


def fields(spec, *names):
    return {n: getattr(spec, n) for n in names}


def hf(name):
    return json.loads((HF / f"{name}.json").read_text())


def test_phi3_fused_projections_are_llama_shapes():
    m = load_model(str(HF / "phi3_mini_4k_instruct.json"))
    assert fields(m, "num_layers", "hidden_size", "ffn_hidden_size", "num_query_groups", "kv_channels", "vocab_size",
                  "activation", "gate_activation", "tie_embeddings") == \
        dict(num_layers=32, hidden_size=3072, ffn_hidden_size=8192, num_query_groups=32, kv_channels=96,
             vocab_size=32064, activation="swiglu", gate_activation="silu", tie_embeddings=False)
    assert (m.sliding_window, m.num_sliding_window_layers) == (2047, 32)  # Phi3Attention passes it to every layer
    # Published 3,821,079,552 (microsoft/Phi-3-mini-4k-instruct, Hugging Face safetensors total). A sliding window
    # alone adds no weights: attention sinks are gpt-oss's (ModelSpec.attention_sinks), not Phi-3's.
    assert not m.attention_sinks and count_parameters(m)[0] == 3_821_079_552


def test_phi_partial_rotary_factor():
    cfg = {**hf("phi3_mini_4k_instruct"), "partial_rotary_factor": 0.75}
    assert from_hf_config(cfg, "phi4-mini-like").rotary_percent == 0.75


def test_gemma2_head_dim_geglu_tied_window_and_softcap():
    m = load_model(str(HF / "gemma2_9b.json"))
    assert fields(m, "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                  "vocab_size", "tie_embeddings", "gate_activation", "sandwich_norm", "logit_softcapping") == \
        dict(num_layers=42, hidden_size=3584, num_attention_heads=16, num_query_groups=8, kv_channels=256,
             vocab_size=256000, tie_embeddings=True, gate_activation="gelu_tanh", sandwich_norm=True,
             logit_softcapping=30.0)
    assert (m.sliding_window, m.num_sliding_window_layers) == (4096, 21)  # layers 0, 2, ..., 40
    assert any("attn_logit_softcapping 50.0" in n for n in m.notes)
    assert not any("sandwich_norm" in n for n in m.notes)  # priced now, nothing to note
    # Published 9,241,705,984 (google/gemma-2-9b, Hugging Face safetensors total; keras-hub's gemma2_9b_en preset
    # states the same): 4 RMSNorms of h per layer (2 of them the sandwich norms), no attention sinks.
    assert count_parameters(m)[0] == 9_241_705_984


def test_gemma3_text_layer_pattern_and_qk_norm():
    m = load_model(str(HF / "gemma3_1b_pt.json"))
    assert fields(m, "num_layers", "kv_channels", "num_query_groups", "vocab_size", "qk_layernorm", "tie_embeddings",
                  "rotary_base") == dict(num_layers=26, kv_channels=256, num_query_groups=1, vocab_size=262144,
                                         qk_layernorm=True, tie_embeddings=True, rotary_base=1e6)
    # (i + 1) % 6 != 0 slides: layers 5, 11, 17, 23 are global.
    assert (m.sliding_window, m.num_sliding_window_layers) == (512, 22)
    # Published 999,885,952 (google/gemma-3-1b-pt / -it, Hugging Face safetensors total; keras-hub gemma3_1b).
    assert count_parameters(m)[0] == 999_885_952


def test_gemma3_multimodal_reads_text_config_over_class_defaults():
    m = load_model(str(HF / "gemma3_4b_pt.json"))
    assert fields(m, "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                  "kv_channels", "vocab_size", "num_sliding_window_layers", "sliding_window") == \
        dict(num_layers=34, hidden_size=2560, ffn_hidden_size=10240, num_attention_heads=8, num_query_groups=4,
             kv_channels=256, vocab_size=262208, num_sliding_window_layers=29, sliding_window=1024)
    assert any("vision tower" in n for n in m.notes) and any("'linear'" in n for n in m.notes)
    with pytest.raises(InputError) as err:
        from_hf_config({"model_type": "gemma3"}, "x")
    assert "text_config" in str(err.value) and "\n" not in str(err.value)


def test_gemma_layer_types_list_wins():
    cfg = {**hf("gemma2_9b"), "layer_types": ["full_attention"] * 40 + ["sliding_attention"] * 2}
    assert from_hf_config(cfg, "g").num_sliding_window_layers == 2
    with pytest.raises(InputError, match="layer_types has 2 entries"):
        from_hf_config({**cfg, "layer_types": ["full_attention"] * 2}, "g")


@pytest.mark.parametrize("fixture, sandwich", [("glm_4_9b_hf", False), ("glm_4_9b_0414", True)])
def test_glm4_partial_rotary_qkv_bias(fixture, sandwich):
    m = load_model(str(HF / f"{fixture}.json"))
    assert fields(m, "num_layers", "num_query_groups", "kv_channels", "vocab_size", "add_qkv_bias", "add_bias_linear",
                  "rotary_percent", "sandwich_norm", "tie_embeddings") == \
        dict(num_layers=40, num_query_groups=2, kv_channels=128, vocab_size=151552, add_qkv_bias=True,
             add_bias_linear=False, rotary_percent=0.5, sandwich_norm=sandwich, tie_embeddings=False)
    # Published: glm-4-9b 9,399,951,360 (the trainable parameters transformers reports for THUDM/glm-4-9b-chat, the
    # "9.4B" of the model card); GLM-4-9B-0414 adds only its post-attention and post-MLP RMSNorms, 40 x 2 x 4096:
    # 9,400,279,040 (llama.cpp's n_params for the same 40-layer glm4 language model in GLM-4.6V-Flash's GGUF).
    assert count_parameters(m)[0] == (9_400_279_040 if sandwich else 9_399_951_360)


LLAMA = hf("llama3_8b")


@pytest.mark.parametrize("act, gate", [("silu", "silu"), ("gelu", "gelu"), ("gelu_pytorch_tanh", "gelu_tanh"),
                                       ("gelu_new", "gelu_tanh")])
def test_llama_hidden_act_maps_to_the_gated_mlp(act, gate):
    m = from_hf_config({**LLAMA, "hidden_act": act}, "l")
    assert (m.activation, m.gate_activation) == ("swiglu", gate)


@pytest.mark.parametrize("model_type, act", [("llama", "relu"), ("qwen2", "tanh"), ("gpt_neox", "relu")])
def test_unsupported_activation_is_refused(model_type, act):
    base = hf("gpt_neox_20b") if model_type == "gpt_neox" else LLAMA
    with pytest.raises(InputError) as err:
        from_hf_config({**base, "model_type": model_type, "hidden_act": act}, "m")
    assert f"hidden_act={act!r}" in str(err.value) and "supported" in str(err.value) and "\n" not in str(err.value)


def test_llama_biases_are_read_and_what_is_not_expressed_is_noted():
    both = from_hf_config({**LLAMA, "attention_bias": True, "mlp_bias": True}, "l")
    assert (both.add_bias_linear, both.add_qkv_bias, both.notes) == (True, True, ())
    mlp = from_hf_config({**LLAMA, "mlp_bias": True}, "l")
    assert mlp.add_bias_linear and any("over-counted" in n for n in mlp.notes)
    attn = from_hf_config({**LLAMA, "attention_bias": True}, "l")
    assert attn.add_qkv_bias and not attn.add_bias_linear and any("o_proj" in n for n in attn.notes)
    assert count_parameters(both)[0] > count_parameters(attn)[0] > count_parameters(from_hf_config(LLAMA, "l"))[0]


def test_neox_rotary_pct_is_read_or_refused():
    assert load_model(str(HF / "gpt_neox_20b.json")).rotary_percent == 0.25
    with pytest.raises(InputError, match=r"rotary_pct=1.5 must be a number in \(0, 1\]"):
        from_hf_config({**hf("gpt_neox_20b"), "rotary_pct": 1.5}, "n")


def test_rope_scaling_is_carried_or_noted():
    m = from_hf_config({**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "l")
    assert (m.rope_scaling, m.rope_scaling_factor) == ("llama3", 8.0)
    m = from_hf_config({**LLAMA, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "l")
    assert m.rope_scaling == "none" and any("'dynamic'" in n for n in m.notes)


def test_yarn_correction_range_is_read():
    assert load_model(str(HF / "gpt_oss_120b.json")).rope_truncate is False  # "truncate": false
    kimi = load_model(str(HF / "kimi_k2.json"))  # "beta_fast": 1.0, "beta_slow": 1.0
    assert kimi.rope_truncate and (kimi.rope_beta_fast, kimi.rope_beta_slow) == (1.0, 1.0)
    v3 = load_model(str(HF / "deepseek_v3.json"))  # "beta_fast": 32, "beta_slow": 1
    assert (v3.rope_beta_fast, v3.rope_beta_slow) == (32.0, 1.0)
    assert not any("beta" in n for n in kimi.notes + v3.notes)


def test_model_notes_reach_estimate_output(capsys):
    from autoplan.cli.main import main

    main(["estimate", "--model", str(HF / "gemma2_9b.json"), "--gpus", "8", "--seq", "4096", "--gbs", "64",
          "--strategy", "tp=1,pp=1,zero=1,mbs=1,recompute=full,fp8=none", "--json"])
    est = json.loads(capsys.readouterr().out)
    assert any("attn_logit_softcapping" in n for n in est["notes"])


ROUTING_FIELDS = ("moe_router_score_function", "moe_router_norm_topk_prob", "moe_router_expert_bias",
                  "moe_router_topk_scaling_factor", "moe_router_num_groups", "moe_router_group_topk",
                  "moe_router_group_by_max", "moe_load_balancing")


def routing(m):
    return {k: getattr(m, k) for k in ROUTING_FIELDS}


def test_routing_is_read_and_matches_the_catalogue():
    # deepseek_v3.json: scoring_func sigmoid, topk_method noaux_tc, routed_scaling_factor 2.5, n_group 8,
    # topk_group 4, norm_topk_prob true, no seq_aux (configuration_deepseek.py default true).
    v3 = load_model(str(HF / "deepseek_v3.json"))
    assert routing(v3) == dict(moe_router_score_function="sigmoid", moe_router_norm_topk_prob=True,
                               moe_router_expert_bias=True, moe_router_topk_scaling_factor=2.5,
                               moe_router_num_groups=8, moe_router_group_topk=4, moe_router_group_by_max=False,
                               moe_load_balancing="seq_aux_loss")
    assert routing(v3) == routing(load_model("deepseek-v3"))
    # kimi_k2.json: n_group 1 / topk_group 1 is no group limit; routed_scaling_factor 2.827.
    kimi = load_model(str(HF / "kimi_k2.json"))
    assert routing(kimi) == routing(load_model("kimi-k2"))
    assert (kimi.moe_router_topk_scaling_factor, kimi.moe_router_num_groups) == (2.827, 0)
    # deepseek_v2_lite.json: softmax, greedy, norm_topk_prob false, seq_aux true; Qwen1.5-MoE norm_topk_prob false.
    lite = load_model(str(HF / "deepseek_v2_lite.json"))
    assert (lite.moe_router_score_function, lite.moe_router_norm_topk_prob, lite.moe_router_expert_bias,
            lite.moe_load_balancing) == ("softmax", False, False, "seq_aux_loss")
    assert load_model(str(HF / "qwen1.5_moe_a2.7b.json")).moe_router_norm_topk_prob is False
    assert load_model(str(HF / "qwen3_30b_a3b.json")).moe_router_norm_topk_prob is True


def test_group_limited_greedy_is_read_and_megatron_refuses_it():
    from autoplan.integrations.megatron import inexpressible_problem

    v2 = load_model(str(HF / "deepseek_v2_lite.json"))  # 64 experts
    greedy_groups = from_hf_config({**hf("deepseek_v2_lite"), "topk_method": "group_limited_greedy", "n_group": 8,
                                    "topk_group": 3}, "v2")
    assert (greedy_groups.moe_router_num_groups, greedy_groups.moe_router_group_by_max) == (8, True)
    assert "moe_router_group_by_max=true" in inexpressible_problem(greedy_groups)
    assert inexpressible_problem(v2) is None
    with pytest.raises(InputError, match="topk_method='aux_free'"):
        from_hf_config({**hf("deepseek_v2_lite"), "topk_method": "aux_free"}, "v2")
