"""Readers shared by the Hugging Face `config.json` parsers (autoplan/hf_config.py, autoplan/hf_families.py): a
config mapping that names the file in its errors and keeps notes, and the fields most families share (head size,
gated activation, RoPE scaling, the Llama-style block)."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping

from autoplan.errors import InputError
from autoplan.model import SSM_STATE_DTYPES

_MISSING = object()

# transformers 5 keeps these RoPE settings inside `rope_parameters` (modeling_rope_utils.py RopeParameters:
# rope_theta, partial_rotary_factor) and writes them only there when it saves a config; 4.x configs keep them at the
# top level. Config.get reads either, the top level first.
ROPE_PARAMETER_KEYS = ("rope_theta", "partial_rotary_factor")

# Function on the gate of a gated (Llama-style) MLP, by HF hidden_act name (transformers activations.py ACT2FN).
GATE_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                    "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}


class Config:
    """A config mapping that names the model type and the file in its error messages, and collects notes on
    what reading it assumed."""

    def __init__(self, cfg: Mapping[str, Any], model_type: str, where: str):
        self.cfg, self.model_type, self.where = cfg, model_type, where
        self.notes: List[str] = []

    def derived(self, defaults: Mapping[str, Any] = {}, fixed: Mapping[str, Any] = {}) -> "Config":
        """The same config with `defaults` under it (null counts as absent) and `fixed` over it, for a family whose
        class defaults or modelling file settle values the file may leave out or contradict; notes are shared."""
        merged = Config({**defaults, **{k: v for k, v in self.cfg.items() if v is not None}, **fixed},
                        self.model_type, self.where)
        merged.notes = self.notes
        return merged

    def req(self, *keys: str) -> Any:
        """The first of `keys` present (aliases, e.g. `n_layer` / `num_hidden_layers`); InputError when none is."""
        for key in keys:
            value = self.cfg.get(key, _MISSING)
            if value is not _MISSING and value is not None:
                return value
        raise InputError(f"{self.where}: model_type {self.model_type!r} needs field {keys[0]!r}, which is missing; "
                         f"add it to the config")

    def get(self, key: str, default: Any) -> Any:
        """`key`, or `default` when it is absent or null (a RoPE setting also from `rope_parameters`)."""
        value = self.cfg.get(key)
        if value is None and key in ROPE_PARAMETER_KEYS and isinstance(self.cfg.get("rope_parameters"), Mapping):
            value = self.cfg["rope_parameters"].get(key)
        return default if value is None else value

    def int_req(self, *keys: str) -> int:
        """A required count: a positive integer."""
        value = self.req(*keys)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{self.where}: field {keys[0]!r}={value!r} must be a positive integer; fix the config")
        return value

    def int_opt(self, key: str, default: Any) -> Any:
        """`key` as an integer (an integral float such as 4096.0 is taken), or `default` when it is absent or null;
        any other value is a one-line InputError naming the field."""
        value = self.get(key, default)
        if value is default:
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{self.where}: field {key!r}={value!r} must be an integer; fix the config")
        return value

    def num(self, key: str, default: Any) -> Any:
        """`key` as a finite number, or `default` when it is absent or null; InputError otherwise."""
        value = self.get(key, default)
        if value is default:
            return value
        try:
            number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        except OverflowError:
            number = None
        if number is None or not math.isfinite(number):
            raise InputError(f"{self.where}: field {key!r}={value!r} must be a finite number; fix the config")
        return number

    def fraction(self, key: str, default: float) -> float:
        """A value in (0, 1] (rotary fractions); InputError otherwise."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise InputError(f"{self.where}: {key}={value!r} must be a number in (0, 1]; fix the config")
        return float(value)


def ssm_state_dtype(c: Config) -> Dict[str, Any]:
    """The config's `mamba_ssm_dtype` (ModelSpec.mamba_ssm_dtype), when it states one SGLang knows."""
    value = c.get("mamba_ssm_dtype", None)
    if value is None:
        return {}
    if value not in SSM_STATE_DTYPES:  # SGLang warns and keeps its float32 default (mamba2_state_dtype)
        c.notes.append(f"mamba_ssm_dtype={value!r} is none of {', '.join(SSM_STATE_DTYPES)}: SGLang ignores it and keeps "
                       f"the recurrent state in float32, as priced")
        return {}
    return {"mamba_ssm_dtype": value}


def head_dim(c: Config, hidden: int, heads: int) -> int:
    """Explicit `head_dim` when given (Qwen3, gpt-oss, Gemma, Mistral-Nemo), else hidden / heads."""
    value = c.int_opt("head_dim", None)
    if value is not None:
        return value
    if hidden % heads:
        raise InputError(f"{c.where}: hidden_size={hidden} is not divisible by num_attention_heads={heads} and "
                         f"there is no head_dim; add head_dim to the config")
    return hidden // heads


def gate_activation(c: Config, *keys: str) -> str:
    """The gate function of a gated MLP from the first of `keys` present (default silu): silu is SwiGLU, the GELU
    variants GeGLU (same three matrices); any other activation is refused rather than priced as SwiGLU."""
    name = next((c.cfg[k] for k in keys if c.cfg.get(k)), "silu")
    if name not in GATE_ACTIVATIONS:
        raise InputError(f"{c.where}: {keys[0]}={name!r} is not supported for a gated MLP; supported: "
                         f"{', '.join(GATE_ACTIVATIONS)} (or pass a native model YAML)")
    return GATE_ACTIVATIONS[name]


def rope_scaling(c: Config) -> Dict[str, Any]:
    """RoPE scaling (`rope_scaling`, or transformers 5's `rope_parameters`): llama3 and yarn carried to ModelSpec;
    other kinds (linear, dynamic, longrope) change no time or memory and are named in a note."""
    scaling = c.get("rope_scaling", None) or c.get("rope_parameters", None) or {}
    if not isinstance(scaling, Mapping):
        raise InputError(f"{c.where}: rope_scaling={scaling!r} must be a mapping or null; fix the config")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return {}
    sc = Config(scaling, c.model_type, f"{c.where} rope_scaling")
    factor = sc.num("factor", 1.0)
    if kind == "llama3":
        return dict(rope_scaling="llama3", rope_scaling_factor=factor)
    if kind == "yarn":  # defaults as transformers' _compute_yarn_parameters: mscale 1 (0 = unused), betas 32 and 1
        return dict(rope_scaling="yarn", rope_scaling_factor=factor,
                    rope_beta_fast=sc.num("beta_fast", None) or 32.0,
                    rope_beta_slow=sc.num("beta_slow", None) or 1.0,
                    rope_original_max_position_embeddings=sc.int_opt("original_max_position_embeddings", 0),
                    rope_mscale=sc.num("mscale", None) or 1.0,
                    rope_mscale_all_dim=sc.num("mscale_all_dim", None) or 0.0,
                    rope_truncate=bool(scaling.get("truncate", True)))
    c.notes.append(f"rope_scaling {kind!r} is not carried: it changes no time or memory, and emitted launch files "
                   f"use RoPE without it")
    return {}


def llama_like(c: Config, activation_keys: tuple = ("hidden_act",)) -> Dict[str, Any]:
    """Fields shared by the Llama family: pre-norm RMSNorm, RoPE, gated MLP, GQA, optional qkv bias."""
    hidden = c.int_req("hidden_size")
    heads = c.int_req("num_attention_heads")
    return dict(
        num_layers=c.int_req("num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=c.int_req("intermediate_size"),
        num_attention_heads=heads,
        num_query_groups=c.int_opt("num_key_value_heads", heads),  # absent in old configs = MHA
        kv_channels=head_dim(c, hidden, heads),
        vocab_size=c.int_req("vocab_size"),
        max_position_embeddings=c.int_req("max_position_embeddings"),
        activation="swiglu",
        gate_activation=gate_activation(c, *activation_keys),
        normalization="rmsnorm",
        position_embedding="rope",
        rotary_base=c.num("rope_theta", 10000.0),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        add_qkv_bias=bool(c.get("attention_bias", False)),
        **rope_scaling(c),
    )


def sliding_window_all_layers(c: Config, num_layers: int) -> Dict[str, Any]:
    """Mistral / Phi-3 apply `sliding_window` to every layer; Qwen2 only when `use_sliding_window` is true."""
    window = c.int_opt("sliding_window", 0)
    if not window or not c.get("use_sliding_window", True):
        return {}
    return dict(sliding_window=window, num_sliding_window_layers=num_layers)


def count_sliding_layers(c: Config, num_layers: int, default_pattern) -> int:
    """Layers with sliding-window attention: from `layer_types` when the config lists them, else from the family's
    default rule `default_pattern(i) -> True when layer i slides`."""
    layer_types = c.get("layer_types", None)
    if layer_types:
        if not isinstance(layer_types, list):
            raise InputError(f"{c.where}: layer_types={layer_types!r} must be a list of layer kinds; fix the config")
        if len(layer_types) != num_layers:
            raise InputError(f"{c.where}: layer_types has {len(layer_types)} entries for num_hidden_layers="
                             f"{num_layers}; fix the config")
        return sum(t == "sliding_attention" for t in layer_types)
    return sum(bool(default_pattern(i)) for i in range(num_layers))


# HF topk_method (DeepSeek configuration_deepseek.py / modeling_deepseek.py MoEGate): greedy = plain top-k,
# group_limited_greedy = groups ranked by their best score (DeepSeek-V2), noaux_tc = sigmoid scores plus the
# e_score_correction_bias for selection, groups ranked by the sum of their top-2 scores (DeepSeek-V3).
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def moe_routing(c: Config, norm_default: bool, seq_aux_default: bool = False) -> Dict[str, Any]:
    """ModelSpec's router fields from scoring_func, topk_method, routed_scaling_factor, n_group, topk_group,
    norm_topk_prob and seq_aux (DeepSeek's configuration_deepseek.py names; Qwen-MoE and others set only
    norm_topk_prob, whose default is the family's: `norm_default`)."""
    score = c.get("scoring_func", "softmax")
    method = c.get("topk_method", "greedy")
    if score not in ("softmax", "sigmoid"):
        raise InputError(f"{c.where}: scoring_func={score!r} is not supported; supported: softmax, sigmoid")
    if method not in TOPK_METHODS:
        raise InputError(f"{c.where}: topk_method={method!r} is not supported; supported: {', '.join(TOPK_METHODS)}")
    groups, chosen = c.int_opt("n_group", 1) or 1, c.int_opt("topk_group", 1) or 1
    grouped = method != "greedy" and groups > 1  # greedy ignores the groups (MoEGate.forward)
    out: Dict[str, Any] = dict(
        moe_router_score_function=score, moe_router_expert_bias=method == "noaux_tc",
        moe_router_norm_topk_prob=bool(c.get("norm_topk_prob", norm_default)),
        moe_router_topk_scaling_factor=c.num("routed_scaling_factor", 1.0),
        moe_load_balancing="seq_aux_loss" if c.get("seq_aux", seq_aux_default) else "aux_loss")
    if grouped and method == "noaux_tc" and c.int_opt("num_experts_per_tok", 0) != 2 * chosen:
        c.notes.append(f"topk_method noaux_tc ranks groups by their top-2 scores; Megatron ranks them by their top "
                       f"num_experts_per_tok/topk_group, which differs here (topk_group={chosen})")
    if grouped:
        out.update(moe_router_num_groups=groups, moe_router_group_topk=chosen,
                   moe_router_group_by_max=method == "group_limited_greedy")
    return out


def text_model(c: Config, family: str, text_type: str, parse: Callable[[Config], Dict[str, Any]]) -> Dict[str, Any]:
    """A multimodal config's language model (its `text_config`, read as `text_type` by `parse`); the vision tower and
    projector are named as not priced."""
    text = c.cfg.get("text_config")
    if not isinstance(text, dict):
        raise InputError(f"{c.where}: a {family} config needs its text_config (the language model) to be priced; "
                         f"pass the text config (model_type {text_type})")
    inner = Config(text, text_type, f"{c.where} text_config")
    fields = parse(inner)
    c.notes.extend(inner.notes)
    c.notes.append(f"{family}: only the language model (text_config) is priced; the vision tower and projector are "
                   f"not")
    return fields
