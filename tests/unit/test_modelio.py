"""Model inputs: Hugging Face configs of every supported model_type, the catalogue, native files, overrides,
and a one-line InputError for every bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.costmodel.params import count_parameters
from autoplan.errors import InputError
from autoplan.hf_config import SUPPORTED_MODEL_TYPES
from autoplan.modelio import from_hf_config, load_model

HF = Path(__file__).parents[1] / "data" / "hf_configs"


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message
    return message


def fields(spec, *names):
    return {n: getattr(spec, n) for n in names}


def same_architecture(a, b) -> bool:
    return a.model_dump(exclude={"name", "notes"}) == b.model_dump(exclude={"name", "notes"})  # notes: how it was read


# ---------------------------------------------------------------- one fixture per model_type

def test_fixtures_cover_every_supported_model_type():
    """Each reader has a fixture: a text config here, or (the language models only vision-language models have) the
    text_config of a released config in tests/data/vlm."""
    types = {json.loads(p.read_text())["model_type"] for p in HF.glob("*.json")}
    assert types <= set(SUPPORTED_MODEL_TYPES)
    texts = [json.loads(p.read_text()).get("text_config") for p in (HF.parent / "vlm").glob("*.json")]
    types |= {t["model_type"] for t in texts if isinstance(t, dict) and "model_type" in t}
    assert set(SUPPORTED_MODEL_TYPES) <= types


@pytest.mark.parametrize("fixture, catalogue_name", [
    ("llama3_8b", "llama3-8b"),
    ("mixtral_8x7b", "mixtral-8x7b"),
    ("qwen3_30b_a3b", "qwen3-30b-a3b"),
    ("deepseek_v3", "deepseek-v3"),
    ("kimi_k2", "kimi-k2"),
    ("gpt_oss_120b", "gpt-oss-120b"),
])
def test_hf_config_matches_catalogue_entry(fixture, catalogue_name):
    assert same_architecture(load_model(str(HF / f"{fixture}.json")), load_model(catalogue_name))


def test_llama_exact_count():
    m = load_model(str(HF / "llama3_8b.json"))
    assert m.name == "llama3_8b"
    assert fields(m, "num_query_groups", "kv_channels", "rotary_base", "tie_embeddings") == \
        dict(num_query_groups=8, kv_channels=128, rotary_base=500000.0, tie_embeddings=False)
    assert count_parameters(m)[0] == 8_030_261_248  # HF meta-llama/Meta-Llama-3-8B safetensors count


def test_mistral_sliding_window():
    m = load_model(str(HF / "mistral_7b_v0.1.json"))
    assert fields(m, "sliding_window", "num_sliding_window_layers", "num_query_groups") == \
        dict(sliding_window=4096, num_sliding_window_layers=32, num_query_groups=8)
    # HF mistralai/Mistral-7B-v0.1: 7,241,732,096; a sliding window adds no weights (no attention sinks).
    assert not m.attention_sinks and count_parameters(m)[0] == 7_241_732_096


def test_qwen2_has_qkv_bias_and_no_window():
    m = load_model(str(HF / "qwen2.5_7b.json"))
    assert fields(m, "add_qkv_bias", "sliding_window", "kv_channels") == \
        dict(add_qkv_bias=True, sliding_window=0, kv_channels=128)
    assert abs(count_parameters(m)[0] / 7.61e9 - 1) < 0.01  # Qwen2.5-7B model card: 7.61B


def test_qwen3_qk_norm_and_head_dim():
    m = load_model(str(HF / "qwen3_8b.json"))
    assert fields(m, "qk_layernorm", "add_qkv_bias", "kv_channels") == \
        dict(qk_layernorm=True, add_qkv_bias=False, kv_channels=128)
    assert abs(count_parameters(m)[0] / 8.2e9 - 1) < 0.01  # Qwen3-8B model card: 8.2B


def test_qwen2_moe_shared_expert():
    m = load_model(str(HF / "qwen1.5_moe_a2.7b.json"))
    assert fields(m, "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "shared_expert_ffn_hidden_size",
                  "add_qkv_bias", "first_k_dense_layers", "moe_layer_freq") == \
        dict(num_experts=60, moe_router_topk=4, moe_ffn_hidden_size=1408, shared_expert_ffn_hidden_size=5632,
             add_qkv_bias=True, first_k_dense_layers=0, moe_layer_freq=1)
    total, active = count_parameters(m)
    # Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated.
    assert abs(total / 14.3e9 - 1) < 0.01 and abs(active / 2.7e9 - 1) < 0.01


def test_deepseek_v2_lite_full_rank_query():
    m = load_model(str(HF / "deepseek_v2_lite.json"))
    assert fields(m, "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
                  "shared_expert_ffn_hidden_size", "first_k_dense_layers", "num_moe_layers") == \
        dict(q_lora_rank=None, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
             shared_expert_ffn_hidden_size=2 * 1408, first_k_dense_layers=1, num_moe_layers=26)
    assert abs(count_parameters(m)[0] / 15.7e9 - 1) < 0.01  # DeepSeek-V2-Lite model card: 15.7B


def test_gpt_oss_layer_types_and_default_alternation():
    cfg = json.loads((HF / "gpt_oss_120b.json").read_text())
    assert load_model(str(HF / "gpt_oss_120b.json")).num_sliding_window_layers == 18
    del cfg["layer_types"]
    cfg["num_hidden_layers"] = 5  # default pattern: layers 0, 2, 4 slide
    assert from_hf_config(cfg, "x").num_sliding_window_layers == 3


def test_gpt2_exact_count_and_defaults():
    m = load_model(str(HF / "gpt2.json"))
    assert fields(m, "ffn_hidden_size", "position_embedding", "normalization", "activation", "tie_embeddings",
                  "add_bias_linear", "max_position_embeddings") == \
        dict(ffn_hidden_size=3072, position_embedding="learned", normalization="layernorm", activation="gelu",
             tie_embeddings=True, add_bias_linear=True, max_position_embeddings=1024)
    assert count_parameters(m)[0] == 124_439_808  # HF openai-community/gpt2 (GPT-2 small, "124M")
    assert m.hidden_dropout == 0.1  # resid_pdrop
    assert load_model(str(HF / "llama3_8b.json")).hidden_dropout == 0.0


def test_gpt_neox_exact_count():
    m = load_model(str(HF / "gpt_neox_20b.json"))
    assert fields(m, "position_embedding", "tie_embeddings", "add_bias_linear", "kv_channels") == \
        dict(position_embedding="rope", tie_embeddings=False, add_bias_linear=True, kv_channels=96)
    assert count_parameters(m)[0] == 20_554_567_680  # GPT-NeoX-20B paper (arXiv:2204.06745), Table 1


def test_missing_kv_heads_means_mha():
    cfg = json.loads((HF / "llama3_8b.json").read_text())
    del cfg["num_key_value_heads"]
    assert from_hf_config(cfg, "x").num_query_groups == 32


def test_qwen_moe_sparse_step_and_leading_dense_layers():
    cfg = json.loads((HF / "qwen3_30b_a3b.json").read_text())
    m = from_hf_config({**cfg, "decoder_sparse_step": 2}, "x")  # layers 1, 3, 5, ... are sparse
    assert (m.first_k_dense_layers, m.moe_layer_freq, m.num_moe_layers) == (1, 2, 24)
    m = from_hf_config({**cfg, "mlp_only_layers": [0, 1]}, "x")
    assert (m.first_k_dense_layers, m.num_moe_layers) == (2, 46)
    with pytest.raises(InputError) as e:
        from_hf_config({**cfg, "mlp_only_layers": [3, 7]}, "x")
    assert "mlp_only_layers=[3, 7]" in one_line_error(e)


# ---------------------------------------------------------------- HF config errors

def test_unknown_model_type_lists_supported(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    with pytest.raises(InputError) as e:
        load_model(str(path))
    message = one_line_error(e)
    assert "'bert'" in message and "llama" in message and "deepseek_v3" in message and str(path) in message


def test_missing_required_field_names_field_and_file(tmp_path):
    cfg = json.loads((HF / "mixtral_8x7b.json").read_text())
    del cfg["num_local_experts"]
    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError) as e:
        load_model(str(path))
    message = one_line_error(e)
    assert "num_local_experts" in message and str(path) in message


def test_non_integer_field(tmp_path):
    cfg = json.loads((HF / "llama3_8b.json").read_text())
    cfg["hidden_size"] = "big"
    with pytest.raises(InputError) as e:
        from_hf_config(cfg, "x")
    assert "hidden_size" in one_line_error(e)


# ---------------------------------------------------------------- catalogue names

@pytest.mark.parametrize("ref", ["llama3-70b", "LLAMA3-70B", "llama3_70b", " Llama3_70B "])
def test_catalogue_name_is_case_and_underscore_insensitive(ref):
    assert load_model(ref).name == "llama3-70b"


def test_unknown_catalogue_name_suggests_and_points_to_models():
    with pytest.raises(InputError) as e:
        load_model("llama3-7b")
    message = one_line_error(e)
    assert "did you mean" in message and "autoplan models" in message


# ---------------------------------------------------------------- native files and file errors

def test_native_yaml_and_json(tmp_path):
    spec = load_model("llama2-7b").model_dump(exclude={"name"})
    (tmp_path / "mine.yaml").write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in spec.items()))
    (tmp_path / "mine.json").write_text(json.dumps({**spec, "name": "custom"}))
    assert same_architecture(load_model(str(tmp_path / "mine.yaml")), load_model("llama2-7b"))
    assert load_model(str(tmp_path / "mine.yaml")).name == "mine"
    assert load_model(str(tmp_path / "mine.json")).name == "custom"


def test_directory_with_config_json_uses_it(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text((HF / "llama3_8b.json").read_text())
    assert load_model(str(folder)).name == "Meta-Llama-3-8B"


@pytest.mark.parametrize("content, expect", [
    (None, "does not exist"),
    ("DIR", "is a directory"),
    ('{"model_type": "llama",', "not valid JSON"),
    ("[1, 2, 3]", "not a mapping"),
])
def test_bad_json_files(tmp_path, content, expect):
    path = tmp_path / "model.json"
    if content == "DIR":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(InputError) as e:
        load_model(str(path))
    message = one_line_error(e)
    assert expect in message and str(path) in message


@pytest.mark.parametrize("content, expect", [
    ("num_layers: [1,\n", "not valid YAML"),
    ("- a\n- b\n", "not a mapping"),
    ("num_layers: 2\n", "hidden_size"),  # missing required fields
    ("num_layer: 2\n", "did you mean 'num_layers'"),  # unknown field
])
def test_bad_yaml_files(tmp_path, content, expect):
    path = tmp_path / "model.yaml"
    path.write_text(content)
    with pytest.raises(InputError) as e:
        load_model(str(path))
    message = one_line_error(e)
    assert expect in message and str(path) in message


def test_empty_ref():
    with pytest.raises(InputError) as e:
        load_model("  ")
    one_line_error(e)


# ---------------------------------------------------------------- overrides

def test_overrides_are_typed():
    m = load_model("llama3-8b", ["num_layers=40", "tie_embeddings=true", "rotary_base=1e6", "activation=gelu"])
    assert fields(m, "num_layers", "tie_embeddings", "rotary_base", "activation") == \
        dict(num_layers=40, tie_embeddings=True, rotary_base=1e6, activation="gelu")


def test_optional_override_accepts_none():
    assert load_model("deepseek-v3", ["q_lora_rank=none"]).q_lora_rank is None
    assert load_model("deepseek-v3", ["q_lora_rank=768"]).q_lora_rank == 768


@pytest.mark.parametrize("override, expect", [
    ("num_layer=40", "did you mean 'num_layers'"),
    ("num_layers", "key=value"),
    ("num_layers=forty", "expected an integer"),
    ("tie_embeddings=maybe", "expected a boolean"),
    ("rotary_base=fast", "expected a number"),
    ("activation=relu", "activation='relu'"),
    ("num_layers=0", "greater than 0"),
    ("moe_router_topk=9", "moe_router_topk=9 must be in 1..num_experts=8"),
])
def test_bad_overrides(override, expect):
    with pytest.raises(InputError) as e:
        load_model("mixtral-8x7b", [override])
    assert expect in one_line_error(e)


# ---------------------------------------------------------------- Hugging Face Hub ids, from the local cache

def _cache(root: Path, repo: str, config: Path) -> None:
    """A config.json laid out as huggingface_hub caches it: models--ORG--NAME/refs/main names the snapshot."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0123abcd")
    (folder / "snapshots" / "0123abcd").mkdir(parents=True)
    (folder / "snapshots" / "0123abcd" / "config.json").write_bytes(config.read_bytes())


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    return tmp_path


def test_hub_id_is_read_from_the_local_cache(hub_cache):
    _cache(hub_cache, "Qwen/Qwen3-8B", HF / "qwen3_8b.json")
    m = load_model("Qwen/Qwen3-8B")
    assert m.name == "Qwen3-8B" and same_architecture(m, load_model(str(HF / "qwen3_8b.json")))


def test_uncached_hub_id_says_how_to_fetch_it_and_downloads_nothing(hub_cache):
    with pytest.raises(InputError) as e:
        load_model("Qwen/Qwen3-8B")
    message = one_line_error(e)
    assert "hf download Qwen/Qwen3-8B config.json" in message and str(hub_cache) in message


def test_a_missing_file_path_is_not_taken_for_a_hub_id(hub_cache):
    with pytest.raises(InputError) as e:
        load_model("models/foo.yaml")
    assert "does not exist" in one_line_error(e)


def test_vision_language_hub_id_is_read_from_the_local_cache(hub_cache):
    from autoplan.multimodal.reader import load_multimodal

    _cache(hub_cache, "Qwen/Qwen3-VL-8B-Instruct", HF.parent / "vlm" / "qwen3_vl_8b_instruct.json")
    spec = load_multimodal("Qwen/Qwen3-VL-8B-Instruct")
    assert spec.name == "Qwen3-VL-8B-Instruct" and spec.model_type == "qwen3_vl"
