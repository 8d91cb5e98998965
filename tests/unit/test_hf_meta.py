"""The hand-written Hugging Face readers against the model transformers builds on the meta device (autoplan/hf_meta.py):
per family, the same layer records (mixers, spans, MoE layers, experts, top-k) and exactly the same parameter count,
and that count against the total the model's card publishes. Model types no hand-written reader knows are read from
the built model, or refused naming what the cost model cannot price. Fixtures and sources:
tests/data/hf_configs/README.md."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from autoplan.costmodel.params import count_parameters
from autoplan.errors import InputError
from autoplan.hf_meta import compare, load_structure
from autoplan.modelio import from_hf_config, load_model

HF = Path(__file__).parents[1] / "data" / "hf_configs"

# The eight families added with the structural reader, the two added since (glm_moe_dsa, nemotron_h) and four read
# before it. RELEASED are copies of released models' config.json files taken from public repositories
# (tests/data/hf_configs/README.md names each file's repository, commit and path); the other fixtures were written
# from published values.
RELEASED = ["deepseek_v3_2", "glm4_5", "minimax_m2_7", "llama4_scout_17b_16e_instruct",
            "llama4_maverick_17b_128e_instruct", "qwen3_next_80b_a3b", "olmo2_1124_13b",
            "granite_3_1_8b_instruct", "glm5", "glm5_2", "nemotron_3_nano_30b_a3b", "nemotron_3_super_120b_a12b_fp8",
            "nemotron_3_ultra_550b_a55b", "nemotron_h_56b_base_8k"]
FAMILIES = ["olmo2_1124_7b", "granite_3_1_8b", "llama4_scout_17b_16e", "llama4_scout_17b_16e_text", "glm4_5_air",
            "qwen3_next_80b_a3b", "minimax_m2", "falcon_h1_7b", "deepseek_v3_2",
            "glm4_5", "minimax_m2_7", "llama4_scout_17b_16e_instruct", "llama4_maverick_17b_128e_instruct",
            "olmo2_1124_13b", "granite_3_1_8b_instruct", "llama3_8b", "qwen3_30b_a3b", "deepseek_v3", "gpt_oss_120b",
            "glm5", "nemotron_3_nano_30b_a3b", "nemotron_3_super_120b_a12b_fp8", "nemotron_3_ultra_550b_a55b",
            "nemotron_h_56b_base_8k"]

# Published totals, in parameters, and the unit of the figure's last digit (a card's "106B" is 106 +- 1 billion):
# sources in tests/data/hf_configs/README.md. Llama-4's card counts its vision tower, so its built multimodal model
# is compared there.
PUBLISHED = {
    "olmo2_1124_7b": (7e9, 1e9),
    "olmo2_1124_13b": (13e9, 1e9),  # the OLMo 2 13B card
    "granite_3_1_8b": (8e9, 1e9),
    "granite_3_1_8b_instruct": (8e9, 1e9),  # the Granite-3.1-8B-Instruct card: "a 8B parameter ... model"
    "glm4_5_air": (106e9, 1e9),
    "qwen3_next_80b_a3b": (80e9, 1e9),
    "minimax_m2": (230e9, 10e9),
    "deepseek_v3_2": (671e9, 1e9),
    "minimax_m2_7": (229e9, 1e9),  # the Hub's 229B for MiniMaxAI/MiniMax-M2.7
    # Maverick's card: 400B total; its copy here holds the text_config only, so the language model is compared.
    "llama4_maverick_17b_128e_instruct": (400e9, 1e9),
    "llama3_8b": (8e9, 1e9),
    "qwen3_30b_a3b": (30.5e9, 0.1e9),  # Qwen3-30B-A3B card: 30.5B total
    "deepseek_v3": (671e9, 1e9),
    "gpt_oss_120b": (117e9, 1e9),  # gpt-oss-120b card: 117B parameters
}


def hf(name):
    return json.loads((HF / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def structures():
    return {name: load_structure(hf(name), name) for name in FAMILIES}


@pytest.mark.parametrize("name", FAMILIES)
def test_hand_written_reader_matches_the_meta_model(name, structures):
    s, m = structures[name], load_model(str(HF / f"{name}.json"))
    assert compare(m, s) == []
    # MTP depths are trained (ModelSpec) but not built by transformers.
    assert count_parameters(m.model_copy(update={"mtp_num_layers": 0}))[0] == s.total_params
    assert s.unpriced == ()


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_is_the_published_total(name):
    total, unit = PUBLISHED[name]
    m = load_model(str(HF / f"{name}.json"))
    assert abs(count_parameters(m.model_copy(update={"mtp_num_layers": 0}))[0] - total) < unit


def test_glm4_5_card_total_lies_between_the_model_without_and_with_its_mtp_layer():
    """GLM-4.5's card gives 355B; the built model (no MTP layer) is 352.8B and with its one MTP layer 356.8B: the
    card's figure is neither, so it is held between the two, not to a rounding of either."""
    m = load_model(str(HF / "glm4_5.json"))
    assert m.mtp_num_layers == 1
    without = count_parameters(m.model_copy(update={"mtp_num_layers": 0}))[0]
    assert without < 355e9 < count_parameters(m)[0]


@pytest.mark.parametrize("name", RELEASED)
def test_released_copies_are_unchanged_since_copied(name):
    """Each copy's row in the README names its source and the SHA-256 of the bytes copied; an edit shows here."""
    rows = [r for r in (HF / "README.md").read_text().splitlines() if r.startswith(f"| `{name}.json`")]
    assert len(rows) == 1 and "byte copy" in rows[0]
    assert hashlib.sha256((HF / f"{name}.json").read_bytes()).hexdigest() in rows[0]


@pytest.mark.parametrize("name, dtype, total_size", [
    ("olmo2_1124_13b", "float32", 54_864_793_600),
    ("granite_3_1_8b_instruct", "bfloat16", 16_341_696_512),
])
def test_released_count_is_its_checkpoints_size(name, dtype, total_size):
    """Each released copy's source repository holds the model's model.safetensors.index.json beside the config.json
    copied; its total_size is the checkpoint's bytes (README.md names each figure): 4 bytes a float32 parameter, 2 a
    bfloat16 one, tied embeddings stored once."""
    assert hf(name)["torch_dtype"] == dtype
    bytes_each = {"float32": 4, "bfloat16": 2}[dtype]
    assert count_parameters(load_model(str(HF / f"{name}.json")))[0] * bytes_each == total_size


@pytest.mark.parametrize("name", ["llama4_scout_17b_16e", "llama4_scout_17b_16e_instruct"])
def test_llama4_multimodal_total_is_the_published_109b(name, structures):
    cfg = hf(name)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        full = transformers.AutoModelForImageTextToText.from_config(config)
    total = sum(p.numel() for p in full.parameters())
    assert abs(total - 109e9) < 1e9
    # What autoplan prices is the language model: exactly the built text model, 17B active as the card says.
    m = load_model(str(HF / f"{name}.json"))
    assert count_parameters(m)[0] == structures[name].total_params < total
    assert abs(count_parameters(m)[1] - 17e9) < 1e9


def test_the_walk_finds_each_mixer_and_span(structures):
    kinds = {name: {(r.mixers, r.span) for r in structures[name].layers} for name in FAMILIES}
    assert kinds["qwen3_next_80b_a3b"] == {(("gated_deltanet",), "none"), (("attention",), "full")}
    assert kinds["falcon_h1_7b"] == {(("attention", "mamba2"), "full")}
    assert kinds["llama4_scout_17b_16e"] == {(("attention",), "chunked"), (("attention",), "full")}
    assert kinds["llama4_scout_17b_16e_instruct"] == kinds["llama4_scout_17b_16e"]
    maverick = structures["llama4_maverick_17b_128e_instruct"].layers  # MoE on every other layer
    assert [r.mlp for r in maverick[:4]] == ["dense", "moe", "dense", "moe"] and maverick[1].experts == 128
    assert maverick[0].dense_ffn == 16384 and maverick[1].expert_ffn == 8192
    assert kinds["deepseek_v3_2"] == {(("mla+dsa",), "full")}
    assert kinds["gpt_oss_120b"] == {(("attention",), "sliding"), (("attention",), "full")}
    glm = structures["glm4_5_air"].layers
    assert [r.mlp for r in glm[:2]] == ["dense", "moe"] and glm[1].experts == 128 and glm[1].shared_ffn == 1408
    glm45 = structures["glm4_5"].layers
    assert [r.mlp for r in glm45[:4]] == ["dense"] * 3 + ["moe"] and glm45[3].experts == 160


TINY_BASE = {"hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 64, "vocab_size": 1000, "max_position_embeddings": 4096, "pad_token_id": 0,
             "intermediate_size": 128}
TINY_LLAMA4 = {**TINY_BASE, "model_type": "llama4_text", "intermediate_size_mlp": 512, "num_local_experts": 4,
               "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "attention_chunk_size": 256}


@pytest.mark.parametrize("cfg", [
    TINY_LLAMA4,  # Llama-4 Maverick's layout: MoE on every other layer, the dense ones of intermediate_size_mlp
    {**TINY_BASE, "model_type": "qwen3_next", "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
     "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0], "linear_num_key_heads": 2,
     "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32},
    {**TINY_BASE, "model_type": "falcon_h1", "mamba_d_ssm": 512, "mamba_n_heads": 8, "mamba_d_head": 64,
     "mamba_d_state": 16, "mamba_n_groups": 2, "mamba_rms_norm": True},  # with the gated norm
    {**TINY_BASE, "model_type": "glm4_moe", "n_routed_experts": 8, "num_experts_per_tok": 2,
     "moe_intermediate_size": 64, "first_k_dense_replace": 2, "use_qk_norm": True, "attention_bias": True},
], ids=["llama4-interleaved", "qwen3_next-dense-first", "falcon_h1-gated-norm", "glm4_moe-qk-norm"])
def test_variants_of_the_families_match_the_meta_model(cfg):
    assert compare(from_hf_config(cfg, cfg["model_type"]), load_structure(cfg, cfg["model_type"])) == []


def test_a_reader_that_drops_a_module_is_caught(structures):
    m = load_model(str(HF / "qwen3_next_80b_a3b.json"))
    diffs = compare(m.model_copy(update={"shared_expert_gate": False}), structures["qwen3_next_80b_a3b"])
    assert diffs == [f"parameters read {79_674_391_296 - 48 * 2048:,}, built 79,674,391,296"]
    diffs = compare(m.model_copy(update={"linear_attention_layers": 24}), structures["qwen3_next_80b_a3b"])
    assert any(d.startswith("layer mixers read") for d in diffs)


# ---------------------------------------------------------------- model types no hand-written reader knows

TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=2048, pad_token_id=0)


def test_unknown_model_type_is_read_from_its_structure():
    m = from_hf_config({"model_type": "smollm3", **TINY}, "smollm3-tiny")
    s = load_structure({"model_type": "smollm3", **TINY}, "smollm3-tiny")
    assert (m.num_layers, m.hidden_size, m.num_query_groups, m.ffn_hidden_size) == (4, 256, 2, 512)
    assert count_parameters(m)[0] == s.total_params
    assert "read from the structure transformers builds" in m.notes[0]


@pytest.mark.parametrize("cfg, expect", [
    # OLMo-3: q/k RMSNorm over the whole projections, sliding-window attention on three of every four layers
    (dict(model_type="olmo3", sliding_window=512, **TINY),
     dict(qk_layernorm=True, qk_norm_scope="all_heads", sliding_window=512, num_sliding_window_layers=3)),
    # Seed-OSS: q, k and v projections with biases, o_proj without
    (dict(model_type="seed_oss", attention_bias=True, **TINY), dict(add_qkv_bias=True, qk_layernorm=False)),
    # OLMoE: MoE in every layer, whole-projection q/k norms
    (dict(model_type="olmoe", num_experts=8, num_experts_per_tok=2, **TINY),
     dict(num_experts=8, moe_router_topk=2, qk_norm_scope="all_heads")),
])
def test_structure_gives_qk_norms_qkv_biases_and_sliding_windows(cfg, expect):
    m = from_hf_config(cfg, "x")
    assert {k: getattr(m, k) for k in expect} == expect
    assert count_parameters(m)[0] == load_structure(cfg, "x").total_params


@pytest.mark.parametrize("cfg, named", [
    (dict(model_type="mamba2", hidden_size=256, num_hidden_layers=2, vocab_size=1000, num_heads=8, head_dim=64),
     "mamba2"),
    (dict(model_type="olmo", **TINY), "parameters read"),  # weightless LayerNorm: counts differ, refused
    (dict(model_type="no_such_type"), "cannot build model_type 'no_such_type'"),
])
def test_unknown_model_type_the_cost_model_cannot_price_is_refused_naming_it(cfg, named):
    with pytest.raises(InputError) as e:
        from_hf_config(cfg, "x")
    message = str(e.value)
    assert named in message and "\n" not in message


def test_listed_families_plan_without_transformers(tmp_path):
    """`pip install -e .` has no transformers: every listed family is read by the hand-written readers."""
    script = (
        "import sys; sys.modules['transformers'] = None\n"
        "from autoplan.modelio import load_model\n"
        "from autoplan.costmodel.params import count_parameters\n"
        f"for name in {FAMILIES!r}:\n"
        f"    print(name, count_parameters(load_model('{HF}/' + name + '.json'))[0])\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert len(out.splitlines()) == len(FAMILIES)


def saved_by_transformers(cfg):
    """`cfg` as the installed transformers writes it back (`save_pretrained` writes `to_dict()`): transformers 5
    moves rope_theta / partial_rotary_factor into `rope_parameters` and renames some keys (Qwen3-MoE's num_experts
    to num_local_experts)."""
    config = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items()
                                                                      if k != "model_type"})
    return json.loads(json.dumps(config.to_dict(), default=str))


# Every fixture whose model_type the installed transformers has a configuration class for (kimi_k2 ships its own).
RESAVED = sorted(p.stem for p in HF.glob("*.json") if json.loads(p.read_text())["model_type"] != "kimi_k2")


@pytest.mark.parametrize("name", RESAVED)
def test_a_config_resaved_by_transformers_reads_the_same(name):
    cfg = hf(name)
    resaved = saved_by_transformers(cfg)
    assert from_hf_config(resaved, "resaved").model_dump(exclude={"name", "notes"}) == \
        from_hf_config(cfg, "file").model_dump(exclude={"name", "notes"})


def test_rope_settings_are_read_from_rope_parameters():
    """Read as 10,000 and 1.0 before (the defaults), an emitted launch file would have trained another RoPE."""
    llama = saved_by_transformers(hf("llama3_8b"))
    assert "rope_theta" not in llama and llama["rope_parameters"]["rope_theta"] == 500000.0
    assert from_hf_config(llama, "x").rotary_base == 500000.0
    glm = {**hf("glm_4_9b_hf"), "rope_parameters": {"rope_theta": 1e6, "partial_rotary_factor": 0.25}}
    del glm["rope_theta"], glm["partial_rotary_factor"]
    m = from_hf_config(glm, "x")
    assert (m.rotary_base, m.rotary_percent) == (1e6, 0.25)


def test_glm5_is_deepseek_v32_blocks_at_glm_sizes():
    """Megatron-Bridge's GLM-5 page (tests/data/hf_configs/README.md): 78 layers, the first 3 dense, 256 routed
    experts top-8 and one shared expert, MLA with the DSA indexer; RoPE base 1e6 from rope_parameters."""
    m = load_model(str(HF / "glm5.json"))
    assert (m.num_layers, m.first_k_dense_layers, m.num_moe_layers, m.num_experts, m.moe_router_topk) == \
        (78, 3, 75, 256, 8)
    assert m.shared_expert_ffn_hidden_size == m.moe_ffn_hidden_size == 2048
    assert (m.multi_latent_attention, m.dsa_index_heads, m.dsa_index_topk, m.mtp_num_layers) == (True, 32, 2048, 1)
    assert m.rotary_base == 1e6


def test_glm5_2_shares_dsa_topk_as_megatron_writes_it():
    """GLM-5.2's indexer_types: 21 of 78 layers run their own indexer (the first 3, then every 4th), the others
    reuse the last one's top-k; Megatron writes it --dsa-indexer-topk-freq 4 --dsa-indexer-skip-topk-offset 3."""
    cfg = hf("glm5_2")
    m = load_model(str(HF / "glm5_2.json"))
    assert (m.dsa_indexer_topk_freq, m.dsa_indexer_skip_topk_offset, m.num_dsa_indexer_layers) == (4, 3, 21)
    assert [m.dsa_computes_topk(i) for i in range(78)] == [t == "full" for t in cfg["indexer_types"]]
    # transformers derives the same list from index_topk_freq / index_skip_topk_offset when indexer_types is absent
    derived = {k: v for k, v in cfg.items() if k != "indexer_types"}
    assert from_hf_config(derived, "x").model_dump(exclude={"name", "notes"}) == \
        m.model_dump(exclude={"name", "notes"})
    assert compare(m, load_structure(cfg, "glm5_2")) == []  # the model transformers builds, indexers included


def test_an_indexer_pattern_megatron_cannot_write_is_refused_naming_it():
    cfg = {**hf("glm5_2"), "indexer_types": ["full"] * 10 + ["shared"] + ["full"] * 67}  # one shared layer
    with pytest.raises(InputError) as e:
        from_hf_config(cfg, "glm5_2 edited")
    assert "1 of 78 layers no indexer" in str(e.value) and "layer 10" in str(e.value) and "--dsa-indexer-topk-freq" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name, catalogue", [("nemotron_3_nano_30b_a3b", "nemotron-3-nano"),
                                             ("nemotron_3_super_120b_a12b_fp8", "nemotron-3-super")])
def test_nemotron_3_released_file_is_the_megatron_bridge_provider(name, catalogue):
    """The released config.json read here against the ModelSpec written from Megatron-Bridge's providers
    (benchmarks/models/*.yaml): the same blocks and sizes. Those files leave the router at its defaults (the
    published runs they price do not turn on it) and Super's recipe trains two shared MTP depths where the released
    checkpoint has one."""
    mine = load_model(str(HF / f"{name}.json")).model_dump(exclude={"name", "notes"})
    bridge = load_model(str(Path(__file__).parents[2] / "benchmarks" / "models" / f"{catalogue}.yaml"))
    differ = {k for k, v in bridge.model_dump(exclude={"name", "notes"}).items() if mine[k] != v}
    assert differ <= {"moe_router_score_function", "moe_router_expert_bias", "moe_router_topk_scaling_factor",
                      "mtp_num_layers", "mtp_shared_weights"}
    assert (mine["moe_router_score_function"], mine["moe_router_expert_bias"]) == ("sigmoid", True)


def test_nemotron_3_nano_blocks_as_megatron_bridge_states():
    """Megatron-Bridge's Nemotron 3 Nano page: 23 Mamba-2 and 23 MoE blocks, 6 attention blocks, 128 experts and
    one shared expert (tests/data/hf_configs/README.md)."""
    m = load_model(str(HF / "nemotron_3_nano_30b_a3b.json"))
    assert [m.layer_count(x) for x in "ME*-"] == [23, 23, 6, 0]
    assert (m.num_experts, m.shared_expert_ffn_hidden_size > 0) == (128, True)
    assert round(count_parameters(m)[0] / 1e8) == 316  # the bf16 checkpoint's 31.6B


def test_nemotron_h_layer_kinds_outside_the_pattern_are_refused():
    cfg = {**hf("nemotron_3_ultra_550b_a55b")}
    cfg["layers_block_type"] = ["mamba", "sliding_attention"] + cfg["layers_block_type"][2:]
    with pytest.raises(InputError) as e:
        from_hf_config(cfg, "x")
    assert "layers_block_type has ['sliding_attention']" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["qwen3_next_80b_a3b", "nemotron_3_nano_30b_a3b", "falcon_h1_7b"])
def test_the_ssm_state_dtype_sglang_reads_is_carried(name):
    """A config's mamba_ssm_dtype (Qwen3.5's text_config sets float32) is the dtype SGLang keeps the recurrent
    state in (sglang/srt/configs/mamba_utils.py mamba2_state_dtype): carried as stated, None when absent, and a
    value SGLang does not know noted and left out (SGLang keeps float32 then)."""
    assert from_hf_config(hf(name), "x").mamba_ssm_dtype is None
    for dtype in ("float32", "bfloat16", "float16"):
        assert from_hf_config({**hf(name), "mamba_ssm_dtype": dtype}, "x").mamba_ssm_dtype == dtype
    unknown = from_hf_config({**hf(name), "mamba_ssm_dtype": "auto"}, "x")  # SGLang: a warning, then float32
    assert unknown.mamba_ssm_dtype is None and any("mamba_ssm_dtype='auto'" in n for n in unknown.notes)
