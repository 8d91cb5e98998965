"""Hugging Face parsers for OLMo-2, Granite, Llama-4 (text), GLM-4.5 MoE, MiniMax-M2 and Falcon-H1, following
`transformers` configuration_olmo2.py, configuration_granite.py, configuration_llama4.py, configuration_glm4_moe.py,
configuration_minimax_m2.py and configuration_falcon_h1.py (defaults as there). DeepSeek-V3.2 and Qwen3-Next,
which extend DeepSeek-V3 and Qwen-MoE, are read in autoplan/hf_config.py.

- OLMo-2: Llama shapes; RMSNorm on the whole q and k projections (`q_norm` over heads x d, `k_norm` over
  groups x d) and its two norms placed after attention and after the MLP instead of before (same weights, same
  saved tensors; named in a note).
- Granite: Llama shapes; its four scalar multipliers (embedding, residual, attention, logits) change no shape.
- Llama-4: a multimodal `llama4` config is read through its `text_config`. MoE on every
  `interleave_moe_layer_step`-th layer (the others a dense MLP of `intermediate_size_mlp`), one shared expert of
  `intermediate_size` beside top-k routed experts of `intermediate_size`; chunked attention
  (`attention_chunk_size`) on the RoPE layers, full attention on every `no_rope_layer_interval`-th (NoPE) layer;
  its q/k norm is a weightless L2 norm.
- GLM-4.5 (GLM-4.5-Air): GLM-4 attention (q/k/v biases, half-rotary, optional per-head q/k norm) with DeepSeek-style
  routing: `first_k_dense_replace` dense layers, then routed experts plus `n_shared_experts`; its MTP layers
  (`num_nextn_predict_layers`) are read as MTP depths, as DeepSeek's are.
- MiniMax-M2: every layer MoE with no shared expert; q/k RMSNorm over the whole projections
  (`qk_norm_type` per_layer); RoPE on `rotary_dim` of each head. Its MTP modules are not built by transformers and
  not priced (a note says so).
- Falcon-H1: every layer runs a Mamba-2 mixer and GQA attention side by side on the same normed input, then a SwiGLU
  MLP (ModelSpec.parallel_mamba); its muP multipliers change no shape.
- Nemotron-H / Nemotron-3 (configuration_nemotron_h.py, modeling_nemotron_h.py): one block per symbol of the hybrid
  pattern, each a pre-norm and one mixer (Mamba-2, GQA attention without position embedding, a squared-ReLU MLP,
  or a latent MoE of squared-ReLU experts with a shared expert and a sigmoid router with expert bias), as
  Megatron's hybrid model builds it (ModelSpec.hybrid_layer_pattern)."""
from __future__ import annotations

from typing import Any, Callable, Dict

from autoplan.errors import InputError
from autoplan.hf_fields import Config, gate_activation, head_dim, llama_like, moe_routing, ssm_state_dtype, text_model


def _olmo2(c: Config) -> Dict[str, Any]:
    fields = llama_like(c)
    c.notes.append("olmo2: the two norms of each layer sit after attention and after the MLP (post-norm); priced as "
                   "the same two norms before them (same weights and saved tensors)")
    if c.get("attention_bias", False):
        c.notes.append("attention_bias: the o_proj bias (h per layer) is not counted; q, k, v biases are")
    return {**fields, "qk_layernorm": True, "qk_norm_scope": "all_heads"}


def _granite(c: Config) -> Dict[str, Any]:
    fields = llama_like(c)
    if c.get("mlp_bias", False):
        raise InputError(f"{c.where}: mlp_bias=true is not supported for granite (ModelSpec prices biases on every "
                         f"linear or on q, k, v only); set it false or pass a native model YAML")
    if c.get("attention_bias", False):
        c.notes.append("attention_bias: the o_proj bias (h per layer) is not counted; q, k, v biases are")
    scales = [k for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
              if c.get(k, None) is not None]
    if scales:
        c.notes.append(f"granite {', '.join(scales)}: scalar multipliers, no time or memory; no emitted launch file "
                       f"sets them, so emitting refuses the model")
        return {**fields, "unexpressed": tuple(f"Granite's {k}={c.get(k, None)}" for k in scales)}
    return fields


# configuration_llama4.py Llama4TextConfig defaults for the fields the released config may leave out.
LLAMA4_NO_ROPE_INTERVAL = 4


def _llama4_text(c: Config) -> Dict[str, Any]:
    fields = llama_like(c)
    num_layers = fields["num_layers"]
    step = c.int_opt("interleave_moe_layer_step", 1)
    moe_layers = c.get("moe_layers", None)
    default_moe = list(range(step - 1, num_layers, step))  # Llama4TextConfig.moe_layers default
    if moe_layers is not None and list(moe_layers) != default_moe:
        raise InputError(f"{c.where}: moe_layers={moe_layers} is not every interleave_moe_layer_step={step}-th layer, "
                         f"the only pattern supported; pass a native model YAML")
    expert_ffn = c.int_req("intermediate_size")
    no_rope = c.get("no_rope_layers", None)
    if not no_rope:  # Llama4TextConfig: layer i uses RoPE (and chunked attention) unless (i + 1) % interval == 0
        interval = c.int_opt("no_rope_layer_interval", LLAMA4_NO_ROPE_INTERVAL)
        no_rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(no_rope) != num_layers:
        raise InputError(f"{c.where}: no_rope_layers has {len(no_rope)} entries for num_hidden_layers={num_layers}; "
                         f"fix the config")
    chunk = c.int_opt("attention_chunk_size", 0) or 0
    chunked = sum(bool(x) for x in no_rope) if chunk else 0
    if c.get("use_qk_norm", False):
        c.notes.append("llama4 use_qk_norm: a weightless L2 norm on q and k of the RoPE layers, priced as plain "
                       "attention")
    if c.get("attn_temperature_tuning", True):
        c.notes.append("llama4 attn_temperature_tuning: a per-position scale on the NoPE layers' queries, no time or "
                       "memory")
    return {
        **fields,
        "ffn_hidden_size": c.int_opt("intermediate_size_mlp", expert_ffn) or expert_ffn,
        "num_experts": c.int_req("num_local_experts"),
        "moe_router_topk": c.int_req("num_experts_per_tok"),
        "moe_ffn_hidden_size": expert_ffn,
        "shared_expert_ffn_hidden_size": expert_ffn,  # Llama4TextMoe.shared_expert: one MLP of intermediate_size
        "first_k_dense_layers": step - 1,
        "moe_layer_freq": step,
        "attention_chunk_size": chunk if chunked else 0,
        "num_chunked_attention_layers": chunked,
        **({"moe_aux_loss_coeff": c.num("router_aux_loss_coef", None)}
           if c.num("router_aux_loss_coef", None) is not None else {}),
    }


def _llama4(c: Config) -> Dict[str, Any]:
    return text_model(c, "llama4", "llama4_text", _llama4_text)


def _glm4_moe(c: Config) -> Dict[str, Any]:
    fields = llama_like(c)
    first_k = c.int_opt("first_k_dense_replace", 1)  # configuration_glm4_moe.py default 1
    moe_ffn = c.int_req("moe_intermediate_size")
    return {
        **fields,
        "add_qkv_bias": bool(c.get("attention_bias", False)),  # Glm4MoeAttention: q/k/v bias, o_proj none
        "qk_layernorm": bool(c.get("use_qk_norm", False)),  # per-head q_norm / k_norm over head_dim
        "rotary_percent": c.fraction("partial_rotary_factor", 0.5),
        "num_experts": c.int_req("n_routed_experts"),
        "moe_router_topk": c.int_req("num_experts_per_tok"),
        "moe_ffn_hidden_size": moe_ffn,
        "shared_expert_ffn_hidden_size": c.int_opt("n_shared_experts", 1) * moe_ffn,
        "first_k_dense_layers": first_k,
        "mtp_num_layers": c.int_opt("num_nextn_predict_layers", 0),
        **({"moe_aux_loss_coeff": c.num("router_aux_loss_coef", None)}
           if c.num("router_aux_loss_coef", None) is not None else {}),
    }


def _minimax_m2(c: Config) -> Dict[str, Any]:
    fields = llama_like(c)
    expert_ffn = c.int_req("intermediate_size")
    norm = c.get("qk_norm_type", "per_layer")
    use_qk_norm = bool(c.get("use_qk_norm", True))
    if use_qk_norm and norm != "per_layer":
        raise InputError(f"{c.where}: qk_norm_type={norm!r} is not supported; supported: per_layer")
    rotary_dim = c.int_opt("rotary_dim", fields["kv_channels"])
    if not 0 < rotary_dim <= fields["kv_channels"]:
        raise InputError(f"{c.where}: rotary_dim={rotary_dim} must be in 1..head_dim={fields['kv_channels']}; "
                         f"fix the config")
    if c.get("use_mtp", False) and c.int_opt("num_mtp_modules", 0):
        c.notes.append(f"minimax_m2: its {c.int_opt('num_mtp_modules', 0)} MTP modules are not built by transformers "
                       f"and not priced")
    if c.int_opt("shared_intermediate_size", 0):
        raise InputError(f"{c.where}: shared_intermediate_size > 0 is not built by transformers' MiniMax-M2; set 0")
    return {
        **fields,
        "ffn_hidden_size": expert_ffn,
        "qk_layernorm": use_qk_norm,
        "qk_norm_scope": "all_heads",
        "rotary_percent": rotary_dim / fields["kv_channels"],
        "num_experts": c.int_req("num_local_experts"),
        "moe_router_topk": c.int_req("num_experts_per_tok"),
        "moe_ffn_hidden_size": expert_ffn,
        **({"moe_aux_loss_coeff": c.num("router_aux_loss_coef", None)}
           if c.num("router_aux_loss_coef", None) is not None else {}),
    }


def _falcon_h1(c: Config) -> Dict[str, Any]:
    fields = llama_like(c)
    for key in ("attention_bias", "mlp_bias", "projectors_bias", "mamba_proj_bias"):
        if c.get(key, False):
            raise InputError(f"{c.where}: {key}=true is not supported for falcon_h1; set it false or pass a native "
                             f"model YAML")
    if c.get("attn_layer_indices", None) is not None:
        raise InputError(f"{c.where}: attn_layer_indices={c.get('attn_layer_indices', None)} is not supported; "
                         f"Falcon-H1 is priced with attention beside Mamba in every layer (null)")
    heads, head = c.int_req("mamba_n_heads"), c.int_req("mamba_d_head")
    d_ssm = c.int_opt("mamba_d_ssm", heads * head)
    if d_ssm != heads * head:
        raise InputError(f"{c.where}: mamba_d_ssm={d_ssm} must equal mamba_n_heads x mamba_d_head = {heads * head}; "
                         f"fix the config")
    if not c.get("mamba_conv_bias", True):
        c.notes.append("mamba_conv_bias false: the conv1d bias (d_inner + 2 G N per layer) is over-counted")
    c.notes.append("falcon_h1: its muP multipliers (embedding, attention, SSM, MLP, LM head) change no shape and are "
                   "not carried")
    return {
        **fields,
        "gate_activation": gate_activation(c, "hidden_act"),
        "parallel_mamba": True,
        "mamba_num_heads": heads,
        "mamba_head_dim": head,
        "mamba_state_dim": c.int_req("mamba_d_state"),
        "mamba_num_groups": c.int_opt("mamba_n_groups", 1),
        "mamba_conv_kernel": c.int_opt("mamba_d_conv", 4),
        "mamba_gated_norm": bool(c.get("mamba_rms_norm", False)),
        **ssm_state_dtype(c),
    }


# configuration_nemotron_h.py NemotronHConfig._pattern_to_list: hybrid symbol of each layers_block_type entry
# (its "linear_attention" is the Mamba-2 mixer), with the released files' older names that transformers remaps
# (configuration_utils.py _LEGACY_LAYER_TYPE_REMAP: mamba, attention).
NEMOTRON_H_BLOCKS = {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-", "mamba": "M",
                     "attention": "*"}


def _hybrid_symbols(c: Config, pattern_key: str, list_key: str, default: str) -> str:
    """A Nemotron-H layer pattern from its legacy string (`pattern_key`) or transformers 5's list (`list_key`)."""
    pattern, blocks = c.get(pattern_key, None), c.get(list_key, None)
    if pattern is None and blocks is None:
        return default
    if pattern is None:
        if not isinstance(blocks, list) or not all(isinstance(b, str) for b in blocks) or \
                set(blocks) - set(NEMOTRON_H_BLOCKS):
            named = isinstance(blocks, list) and all(isinstance(b, str) for b in blocks)
            bad = sorted(set(blocks) - set(NEMOTRON_H_BLOCKS)) if named else blocks
            raise InputError(f"{c.where}: {list_key} has {bad!r}; supported layer kinds: "
                             f"{', '.join(NEMOTRON_H_BLOCKS)}; fix the config")
        return "".join(NEMOTRON_H_BLOCKS[b] for b in blocks)
    if not isinstance(pattern, str) or set(pattern) - set(NEMOTRON_H_BLOCKS.values()):
        raise InputError(f"{c.where}: {pattern_key}={pattern!r} must be a string of M, E, * and -; fix the config")
    return pattern


def _nemotron_h(c: Config) -> Dict[str, Any]:
    pattern = _hybrid_symbols(c, "hybrid_override_pattern", "layers_block_type", "")
    if not pattern:
        raise InputError(f"{c.where}: model_type 'nemotron_h' needs field 'hybrid_override_pattern' (or "
                         f"layers_block_type), which is missing; add it to the config")
    if c.int_opt("num_hidden_layers", len(pattern)) != len(pattern):
        c.notes.append(f"num_hidden_layers={c.get('num_hidden_layers', None)} ignored: the pattern has "
                       f"{len(pattern)} layers (transformers and Megatron both take the pattern's length)")
    for key in ("attention_bias", "mlp_bias", "use_bias", "mamba_proj_bias"):
        if c.get(key, False):
            raise InputError(f"{c.where}: {key}=true is not supported for nemotron_h; set it false or pass a native "
                             f"model YAML")
    if not c.get("use_conv_bias", True):
        c.notes.append("use_conv_bias false: the conv1d bias (d_inner + 2 G N per Mamba layer) is over-counted")
    act = c.get("mlp_hidden_act", "relu2")
    if act != "relu2":
        raise InputError(f"{c.where}: mlp_hidden_act={act!r} is not supported for nemotron_h; supported: relu2")
    c.notes.append("nemotron_h: squared-ReLU MLPs priced as 2-matrix GELU MLPs (same shapes and GEMM FLOPs), and its "
                   "attention without position embedding as RoPE attention (no parameters either)")
    hidden = c.int_req("hidden_size")
    heads = c.int_req("num_attention_heads")
    d = c.int_opt("head_dim", None) or c.int_opt("attention_head_dim", None) or head_dim(c, hidden, heads)
    mamba_heads = c.int_req("mamba_num_heads")
    fields: Dict[str, Any] = dict(
        num_layers=len(pattern), hybrid_layer_pattern=pattern, hidden_size=hidden,
        ffn_hidden_size=c.int_req("intermediate_size"), num_attention_heads=heads,
        num_query_groups=c.int_opt("num_key_value_heads", heads), kv_channels=d,
        vocab_size=c.int_req("vocab_size"), max_position_embeddings=c.int_req("max_position_embeddings"),
        activation="gelu", normalization="rmsnorm", position_embedding="rope",
        tie_embeddings=bool(c.get("tie_word_embeddings", False)), hidden_dropout=c.num("hidden_dropout", 0.0),
        mamba_num_heads=mamba_heads, mamba_head_dim=c.int_opt("mamba_head_dim", 64),
        mamba_state_dim=c.int_opt("ssm_state_size", 128), mamba_num_groups=c.int_opt("n_groups", 8),
        mamba_conv_kernel=c.int_opt("conv_kernel", 4), **ssm_state_dtype(c))
    if "E" in pattern:
        # NemotronHTopkRouter: sigmoid scores, e_score_correction_bias added for the choice (DeepSeek-V3's noaux_tc).
        routing = c.derived(fixed={"scoring_func": "sigmoid", "topk_method": "noaux_tc"})
        fields.update(
            num_experts=c.int_req("n_routed_experts", "num_local_experts"),
            moe_router_topk=c.int_req("num_experts_per_tok"),
            moe_ffn_hidden_size=c.int_req("moe_intermediate_size"),
            shared_expert_ffn_hidden_size=c.int_opt("n_shared_experts", 1) * c.int_opt(
                "moe_shared_expert_intermediate_size", 7688),  # configuration_nemotron_h.py defaults
            moe_latent_size=c.int_opt("moe_latent_size", 0) or 0,
            **moe_routing(routing, norm_default=True))
    depths = c.int_opt("num_nextn_predict_layers", 0)
    if depths:
        fields.update(mtp_num_layers=depths,
                      mtp_layer_pattern=_hybrid_symbols(c, "mtp_hybrid_override_pattern", "mtp_layers_block_type",
                                                        "*E"))  # NemotronHConfig default ['full_attention', 'moe']
    return fields


FAMILIES: Dict[str, Callable[[Config], Dict[str, Any]]] = {
    "olmo2": _olmo2,
    "granite": _granite,
    "llama4": _llama4,
    "llama4_text": _llama4_text,
    "glm4_moe": _glm4_moe,
    "minimax_m2": _minimax_m2,
    "falcon_h1": _falcon_h1,
    "nemotron_h": _nemotron_h,
}
