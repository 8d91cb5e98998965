"""Hugging Face `config.json` -> `ModelSpec`, one small parser per `model_type`.

Field names and defaults follow the `transformers` configuration classes of each model type
(`configuration_llama.py`, `configuration_mixtral.py`, `configuration_qwen2_moe.py`, `configuration_deepseek_v3.py`,
`configuration_gpt_oss.py`, `configuration_gpt2.py`, `configuration_gpt_neox.py`, `configuration_deepseek_v32.py`,
`configuration_qwen3_next.py`; Phi-3, Gemma-2/3 and GLM-4 in autoplan/hf_families.py; OLMo-2, Granite,
Llama-4, GLM-4.5, MiniMax-M2 and Falcon-H1 in autoplan/hf_recent.py). Keys that change the shapes, the activation,
the positions or the dropout are read or refused with a one-line error; what a family has that ModelSpec cannot
express is named in `ModelSpec.notes`. Keys with no effect on time, memory or the emitted run (attention dropout,
router jitter, initialisation) are not read. DeepSeek's and GLM-4.5's `num_nextn_predict_layers` are
read as MTP depths; the structural reader (autoplan/hf_meta.py) checks every parser against the model transformers
builds."""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping

from autoplan.errors import InputError
from autoplan.hf_fields import Config as _Config
from autoplan.hf_fields import count_sliding_layers, gate_activation, head_dim, llama_like, moe_routing, rope_scaling
from autoplan.hf_fields import sliding_window_all_layers, ssm_state_dtype
from autoplan.hf_families import FAMILIES
from autoplan.hf_recent import FAMILIES as RECENT_FAMILIES
from autoplan.model import computes_topk


def _llama(c: _Config) -> Dict[str, Any]:
    fields = {**llama_like(c), **_llama_biases(c)}
    return {**fields, **sliding_window_all_layers(c, fields["num_layers"])}


def _llama_biases(c: _Config) -> Dict[str, Any]:
    """Llama's attention_bias puts biases on q, k, v and o (modeling_llama.py LlamaAttention); mlp_bias on the
    three MLP matrices (LlamaMLP). ModelSpec holds qkv biases or biases on every linear layer."""
    attention, mlp = bool(c.get("attention_bias", False)), bool(c.get("mlp_bias", False))
    if mlp:
        if not attention:
            c.notes.append("mlp_bias without attention_bias: priced with biases on every linear layer (the "
                           "attention biases, 4h per layer, are over-counted)")
        return dict(add_bias_linear=True, add_qkv_bias=True)
    if attention and c.model_type == "llama":
        c.notes.append("attention_bias: the o_proj bias (h per layer) is not counted; q, k, v biases are")
    return {}


def _qwen2(c: _Config) -> Dict[str, Any]:
    # Qwen2 / Qwen2.5: q, k and v projections carry biases (modeling_qwen2.py, Qwen2Attention).
    return {**_llama(c), "add_qkv_bias": True}


def _qwen3(c: _Config) -> Dict[str, Any]:
    # Qwen3: no qkv bias, per-head RMSNorm on q and k (modeling_qwen3.py, Qwen3Attention.q_norm/k_norm).
    return {**_llama(c), "add_qkv_bias": bool(c.get("attention_bias", False)), "qk_layernorm": True}


def _mixtral(c: _Config) -> Dict[str, Any]:
    fields = _llama(c)
    return {**fields, "num_experts": c.int_req("num_local_experts"),
            "moe_router_topk": c.int_req("num_experts_per_tok"), "moe_ffn_hidden_size": fields["ffn_hidden_size"],
            **_aux_loss(c, "router_aux_loss_coef")}


def _aux_loss(c: _Config, key: str) -> Dict[str, float]:
    """The load-balancing loss weight (router_aux_loss_coef; DeepSeek aux_loss_alpha) when the config sets it."""
    value = c.num(key, None)
    return {} if value is None else {"moe_aux_loss_coeff": value}


def _leading_dense_layers(c: _Config, num_layers: int, step: int) -> Dict[str, int]:
    """Qwen-MoE layer rule: layer i is sparse when i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    (modeling_qwen2_moe.py, Qwen2MoeDecoderLayer). Maps to ModelSpec's first_k_dense_layers / moe_layer_freq."""
    dense = c.get("mlp_only_layers", [])
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise InputError(f"{c.where}: mlp_only_layers={dense!r} must be a list of layer indices; fix the config")
    dense = sorted(dense)
    if not dense:
        return dict(first_k_dense_layers=step - 1, moe_layer_freq=step)
    if step == 1 and dense == list(range(len(dense))) and len(dense) < num_layers:
        return dict(first_k_dense_layers=len(dense), moe_layer_freq=1)
    raise InputError(f"{c.where}: mlp_only_layers={dense} with decoder_sparse_step={step} is not a leading run of "
                     f"dense layers, the only pattern supported; edit mlp_only_layers or pass a native model YAML")


def _qwen_moe(c: _Config, qkv_bias: bool, qk_norm: bool) -> Dict[str, Any]:
    fields = _llama(c)
    step = c.int_opt("decoder_sparse_step", 1)
    return {
        **fields,
        "add_qkv_bias": qkv_bias,
        "qk_layernorm": qk_norm,
        # transformers 5 saves Qwen-MoE's num_experts as num_local_experts (Qwen3MoeConfig.attribute_map).
        "num_experts": c.int_req("num_experts", "num_local_experts"),
        "moe_router_topk": c.int_req("num_experts_per_tok"),
        "moe_ffn_hidden_size": c.int_req("moe_intermediate_size"),
        # Qwen2-MoE's shared expert has a 1-wide sigmoid gate, Linear(h, 1) (modeling_qwen2_moe.py
        # Qwen2MoeSparseMoeBlock.shared_expert_gate); Qwen3-MoE has no shared expert.
        "shared_expert_ffn_hidden_size": c.int_opt("shared_expert_intermediate_size", 0),
        "shared_expert_gate": bool(c.int_opt("shared_expert_intermediate_size", 0)),
        **_leading_dense_layers(c, fields["num_layers"], step),
        **_aux_loss(c, "router_aux_loss_coef"),
        **moe_routing(c, norm_default=False),  # configuration_qwen2_moe.py / qwen3_moe.py default false
    }


def _qwen2_moe(c: _Config) -> Dict[str, Any]:
    return _qwen_moe(c, qkv_bias=True, qk_norm=False)


def _qwen3_moe(c: _Config) -> Dict[str, Any]:
    return _qwen_moe(c, qkv_bias=bool(c.get("attention_bias", False)), qk_norm=True)


def _deepseek(c: _Config) -> Dict[str, Any]:
    """DeepSeek-V2/V3 (and Kimi K2, which reuses the V3 architecture): MLA + fine-grained MoE with shared experts.
    `num_nextn_predict_layers` is read as the MTP depths: HF transformers skips those weights at inference, but
    DeepSeek's training and the Megatron-Bridge recipes train them (mtp_num_layers=1); set 0 to plan without."""
    hidden = c.int_req("hidden_size")
    heads = c.int_req("num_attention_heads")
    num_layers = c.int_req("num_hidden_layers")
    first_k = c.int_opt("first_k_dense_replace", 0)
    freq = c.int_opt("moe_layer_freq", 1)
    # modeling_deepseek.py: MoE when idx >= first_k_dense_replace and idx % moe_layer_freq == 0; ModelSpec counts
    # the period from the first sparse layer, which agrees only when first_k is a multiple of the period.
    if freq > 1 and first_k % freq:
        raise InputError(f"{c.where}: moe_layer_freq={freq} with first_k_dense_replace={first_k} is not supported; "
                         f"first_k_dense_replace must be a multiple of moe_layer_freq")
    n_shared = c.int_opt("n_shared_experts", 0)
    moe_ffn = c.int_req("moe_intermediate_size")
    return dict(
        num_layers=num_layers,
        hidden_size=hidden,
        ffn_hidden_size=c.int_req("intermediate_size"),
        num_attention_heads=heads,
        num_query_groups=c.int_opt("num_key_value_heads", heads),
        kv_channels=c.int_req("v_head_dim"),  # Megatron's --kv-channels for MLA models
        vocab_size=c.int_req("vocab_size"),
        max_position_embeddings=c.int_req("max_position_embeddings"),
        rotary_base=c.num("rope_theta", 10000.0),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        multi_latent_attention=True,
        q_lora_rank=c.int_opt("q_lora_rank", None) or None,  # null in DeepSeek-V2-Lite: full-rank q
        kv_lora_rank=c.int_req("kv_lora_rank"),
        qk_head_dim=c.int_req("qk_nope_head_dim"),
        qk_pos_emb_head_dim=c.int_req("qk_rope_head_dim"),
        v_head_dim=c.int_req("v_head_dim"),
        num_experts=c.int_req("n_routed_experts"),
        moe_router_topk=c.int_req("num_experts_per_tok"),
        moe_ffn_hidden_size=moe_ffn,
        shared_expert_ffn_hidden_size=n_shared * moe_ffn,
        first_k_dense_layers=first_k,
        moe_layer_freq=freq,
        mtp_num_layers=c.int_opt("num_nextn_predict_layers", 0),
        gate_activation=gate_activation(c, "hidden_act"),
        **_aux_loss(c, "aux_loss_alpha"),
        **moe_routing(c, norm_default=False, seq_aux_default=True),  # configuration_deepseek.py defaults
        **rope_scaling(c),
    )


def _deepseek_v32(c: _Config) -> Dict[str, Any]:
    """DeepSeek-V3.2: DeepSeek-V3 with DeepSeek Sparse Attention (modeling_deepseek_v32.py): a lightning indexer
    (index_n_heads x index_head_dim) scores every earlier key and each query attends to its index_topk best."""
    return {**_deepseek(c), "dsa_index_heads": c.int_req("index_n_heads"),
            "dsa_index_head_dim": c.int_req("index_head_dim"), "dsa_index_topk": c.int_req("index_topk")}


def _glm_moe_dsa(c: _Config) -> Dict[str, Any]:
    """GLM-5 / GLM-5.2 (modeling_glm_moe_dsa.py): DeepSeek-V3.2's blocks (MLA with DSA's lightning indexer, DeepSeek
    routing, `first_k_dense_replace` dense layers, MTP depths) at GLM's sizes. `mlp_layer_types` must be the dense
    run then sparse layers that `first_k_dense_replace` gives; which layers run their own indexer is read by
    `_dsa_sharing`."""
    fields = _deepseek_v32(c)
    layers, first_k = fields["num_layers"], fields["first_k_dense_layers"]
    mlp_types = c.get("mlp_layer_types", None)
    if mlp_types is not None and mlp_types != ["dense"] * first_k + ["sparse"] * (layers - first_k):
        raise InputError(f"{c.where}: mlp_layer_types is not {first_k} dense layers then sparse ones "
                         f"(first_k_dense_replace={first_k}); the only placement supported; fix the config")
    return {**fields, **_dsa_sharing(c, layers)}


def _dsa_sharing(c: _Config, layers: int) -> Dict[str, Any]:
    """Which layers run their own DSA indexer and which reuse the last such layer's top-k (GLM-5.2): transformers
    reads `indexer_types` ("full" / "shared" per layer), else `index_topk_pattern` (F / S per layer), else derives
    it from `index_topk_freq` and `index_skip_topk_offset` (layer i, from 0, is full when max(i - offset + 1, 0) %
    freq == 0, offset 2 when not given; configuration_glm_moe_dsa.py `__post_init__`). The pattern is kept as
    Megatron writes it, --dsa-indexer-topk-freq and --dsa-indexer-skip-topk-offset (ModelSpec.dsa_computes_topk);
    one Megatron cannot write is refused."""
    types = c.get("indexer_types", None)
    if types is None and c.get("index_topk_pattern", None) is not None:
        pattern = c.get("index_topk_pattern")
        if not isinstance(pattern, str) or set(pattern) - {"F", "S"}:
            raise InputError(f"{c.where}: index_topk_pattern must be a string of F (full) and S (shared), one per "
                             f"layer; fix the config")
        types = ["full" if ch == "F" else "shared" for ch in pattern]
    if types is None:
        freq = c.get("index_topk_freq", None) or 1
        offset = c.get("index_skip_topk_offset", None)
        offset = 2 if offset is None else offset
        if not isinstance(freq, int) or not isinstance(offset, int) or freq < 1 or offset < 0:
            raise InputError(f"{c.where}: index_topk_freq={freq!r} / index_skip_topk_offset={offset!r} must be whole "
                             f"numbers >= 1 / >= 0; fix the config")
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or not all(t in ("full", "shared") for t in types):
        raise InputError(f"{c.where}: indexer_types must list 'full' or 'shared' for each of the {layers} layers; "
                         f"fix the config")
    full = [t == "full" for t in types]
    if all(full):
        return {}
    given = c.get("index_skip_topk_offset", None)
    offsets = ([given] if isinstance(given, int) and given >= 0 else []) + list(range(layers + 1))
    for freq in range(2, layers + 1):
        for offset in offsets:
            megatron = [computes_topk(i, freq, offset) for i in range(layers)]
            if megatron == full:
                return {"dsa_indexer_topk_freq": freq, "dsa_indexer_skip_topk_offset": offset}
    first = next(i for i, f in enumerate(full) if not f)
    raise InputError(f"{c.where}: indexer_types gives {full.count(False)} of {layers} layers no indexer of their own "
                     f"(the first: layer {first}) in a pattern Megatron's --dsa-indexer-topk-freq / "
                     f"--dsa-indexer-skip-topk-offset cannot write (one computing layer every n after an offset); "
                     f"pass a native model YAML of ModelSpec fields")


def _gated_deltanet(c: _Config, num_layers: int) -> Dict[str, Any]:
    """Qwen3-Next's token mixers (modeling_qwen3_next.py): Gated DeltaNet linear attention on most layers and gated
    softmax attention (per-head q/k norm, output gate, partial RoPE) on every `full_attention_interval`-th layer
    (configuration_qwen3_next.py default 4), or as `layer_types` lists them; zero-centred norms."""
    layer_types = c.get("layer_types", None)
    if layer_types:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise InputError(f"{c.where}: layer_types must list one kind per layer ({num_layers}); fix the config")
        bad = sorted(set(layer_types) - {"linear_attention", "full_attention"})
        if bad:
            raise InputError(f"{c.where}: layer_types has {bad}; supported: linear_attention, full_attention")
        linear = sum(t == "linear_attention" for t in layer_types)
        # The interval whose pattern the list is, if any: Megatron writes that pattern as --linear-attention-freq.
        interval = next((n for n in range(1, num_layers + 1) if layer_types == [
            "full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(num_layers)]), 0)
    else:
        interval = c.int_opt("full_attention_interval", 4)
        linear = sum((i + 1) % interval != 0 for i in range(num_layers))
    return {"rotary_percent": c.fraction("partial_rotary_factor", 0.25), "attention_output_gate": True,
            # Qwen3NextRMSNorm: output * (1 + weight), weight initialised to zeros.
            "layernorm_zero_centered": True,
            "linear_attention_layers": linear, "linear_attention_freq": interval,
            "gdn_num_key_heads": c.int_req("linear_num_key_heads"),
            "gdn_num_value_heads": c.int_req("linear_num_value_heads"),
            "gdn_key_head_dim": c.int_req("linear_key_head_dim"),
            "gdn_value_head_dim": c.int_req("linear_value_head_dim"),
            "gdn_conv_kernel": c.int_opt("linear_conv_kernel_dim", 4), **ssm_state_dtype(c)}


def _qwen3_next(c: _Config) -> Dict[str, Any]:
    """Qwen3-Next (modeling_qwen3_next.py): Qwen3-MoE routing with a gated shared expert and Gated DeltaNet layers."""
    fields = _qwen3_moe(c)
    c.notes.append("qwen3_next: its zero-centred RMSNorm scales (1 + w) cost as plain RMSNorm; MTP layers are not "
                   "built by transformers and not priced")
    return {**fields, **_gated_deltanet(c, fields["num_layers"])}


def _qwen3_5_mtp_note(c: _Config, family: str) -> None:
    c.notes.append(f"{family}: its zero-centred RMSNorm scales (1 + w) cost as plain RMSNorm; its "
                   f"{c.int_opt('mtp_num_hidden_layers', 0)} MTP layer(s) are not built by transformers and not priced")


def _qwen3_5_text(c: _Config) -> Dict[str, Any]:
    """Qwen3.5 dense language model (modeling_qwen3_5.py, the text_config of model_type qwen3_5): Qwen3-Next's mixers
    with a SwiGLU MLP in every layer."""
    fields = _qwen3(c)
    _qwen3_5_mtp_note(c, "qwen3_5")
    return {**fields, **_gated_deltanet(c, fields["num_layers"])}


def _qwen3_5_moe_text(c: _Config) -> Dict[str, Any]:
    """Qwen3.5 MoE language model (modeling_qwen3_5_moe.py): Qwen3-Next's mixers and gated shared expert, MoE in every
    layer (the configuration deletes decoder_sparse_step and mlp_only_layers), and a router that always renormalises
    its top-k weights (Qwen3_5MoeTopKRouter.forward, whatever norm_topk_prob says)."""
    fields = _qwen3_moe(c.derived(defaults={"intermediate_size": c.get("moe_intermediate_size", None)},  # no dense
                                  fixed={"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}))
    _qwen3_5_mtp_note(c, "qwen3_5_moe")
    return {**fields, **_gated_deltanet(c, fields["num_layers"])}


def _gpt_oss(c: _Config) -> Dict[str, Any]:
    """gpt-oss: alternating sliding-window / full attention, attention sinks, biased linears and experts
    (modeling_gpt_oss.py)."""
    fields = llama_like(c)
    # configuration_gpt_oss.py default layer_types: even layers (0, 2, ...) slide.
    num_sliding = count_sliding_layers(c, fields["num_layers"], lambda i: i % 2 == 0)
    topk = c.int_req("num_experts_per_tok", "experts_per_token")
    return {
        **fields,
        "add_bias_linear": True,
        "add_qkv_bias": True,
        "num_experts": c.int_req("num_local_experts"),
        "moe_router_topk": topk,
        "moe_ffn_hidden_size": fields["ffn_hidden_size"],
        "sliding_window": c.int_req("sliding_window"),
        "num_sliding_window_layers": num_sliding,
        "attention_sinks": True,  # modeling_gpt_oss.py GptOssAttention.sinks, one learned logit per head
        "swiglu_limit": c.num("swiglu_limit", 7.0),  # configuration_gpt_oss.py default
        **_aux_loss(c, "router_aux_loss_coef"),
    }


def _gpt2(c: _Config) -> Dict[str, Any]:
    """GPT-2: learned positions, LayerNorm, GELU, biases everywhere, LM head tied to the embedding."""
    hidden = c.int_req("n_embd", "hidden_size")
    heads = c.int_req("n_head", "num_attention_heads")
    return dict(
        num_layers=c.int_req("n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=c.int_opt("n_inner", 4 * hidden),  # n_inner null = 4h (configuration_gpt2.py)
        num_attention_heads=heads,
        num_query_groups=heads,
        kv_channels=head_dim(c, hidden, heads),
        vocab_size=c.int_req("vocab_size"),
        max_position_embeddings=c.int_req("n_positions", "max_position_embeddings"),
        activation="gelu",
        normalization="layernorm",
        position_embedding="learned",
        tie_embeddings=bool(c.get("tie_word_embeddings", True)),
        add_bias_linear=True,
        hidden_dropout=c.num("resid_pdrop", 0.1),  # configuration_gpt2.py default 0.1
    )


def _gpt_neox(c: _Config) -> Dict[str, Any]:
    """GPT-NeoX / Pythia: partial rotary (`rotary_pct`), LayerNorm, GELU, biases, untied `embed_out`.
    The parallel-residual wiring changes no shapes and is ignored. Shapes as the Llama family (NeoX configs have
    no num_key_value_heads, so attention is MHA)."""
    act = c.get("hidden_act", "gelu")
    if act not in ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh"):
        raise InputError(f"{c.where}: hidden_act={act!r} is not supported for GPT-NeoX; supported: gelu, gelu_new, "
                         f"gelu_fast, gelu_pytorch_tanh (or pass a native model YAML)")
    return dict(
        llama_like(c, activation_keys=()),
        activation="gelu",
        # transformers 5 writes NeoX's rotary_pct as rope_parameters' partial_rotary_factor (Config.get reads it).
        rotary_percent=c.fraction("rotary_pct" if c.get("rotary_pct", None) is not None else
                                  "partial_rotary_factor", 0.25),  # configuration_gpt_neox.py default 0.25
        normalization="layernorm",
        position_embedding="rope",
        rotary_base=c.num("rotary_emb_base", None) or c.num("rope_theta", 10000.0),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        add_bias_linear=bool(c.get("attention_bias", True)),
        add_qkv_bias=False,  # NeoX's attention_bias is every linear's bias (add_bias_linear), not a q/k/v-only one
        hidden_dropout=c.num("hidden_dropout", 0.0),  # configuration_gpt_neox.py default 0.0
    )


PARSERS: Dict[str, Callable[[_Config], Dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "deepseek_v32": _deepseek_v32,
    "glm_moe_dsa": _glm_moe_dsa,
    "qwen3_next": _qwen3_next,
    "qwen3_5_text": _qwen3_5_text,
    "qwen3_5_moe_text": _qwen3_5_moe_text,
    "qwen3_vl_moe_text": _qwen3_moe,  # modeling_qwen3_vl_moe.py: Qwen3-MoE's blocks (q/k norm, no shared expert)
    "gpt_oss": _gpt_oss,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    **FAMILIES,
    **RECENT_FAMILIES,
}

SUPPORTED_MODEL_TYPES = tuple(PARSERS)


def hf_config_fields(cfg: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """ModelSpec fields (without `name`) read from a Hugging Face config mapping; `where` names it in errors."""
    model_type = cfg.get("model_type")
    parser = PARSERS.get(model_type) if isinstance(model_type, str) else None
    if parser is None and isinstance(cfg.get("vision_config"), Mapping):
        raise InputError(f"{where}: model_type {model_type!r} is a vision-language model; plan it with `autoplan vlm "
                         f"--model ...` (encoder and language model together)")
    if parser is None:
        raise InputError(f"{where}: model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)} (or pass a native model YAML of ModelSpec fields, or "
                         f"install autoplan[hf] to read other model types from the model transformers builds)")
    config = _Config(cfg, model_type, where)
    fields = parser(config)
    return {**fields, "notes": tuple(config.notes)} if config.notes else fields

