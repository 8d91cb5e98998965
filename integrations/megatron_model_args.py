"""The model a Megatron-LM argument list builds (ModelSpec), with Megatron's defaults for absent arguments
(megatron/training/arguments.py [V], TransformerConfig [TC]) and its vocabulary padding."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from pydantic import ValidationError

from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.integrations.megatron_flags import eval_pattern, pos_int, typed
from autoplan.integrations.megatron_tokenizers import padded_vocab, vocab_size

__all__ = ["megatron_model", "padded_vocab"]

# ---------------------------------------------------------------------------------------------- model
def _moe_layout(flags: Dict[str, Optional[str]], num_layers: int) -> Tuple[int, int]:
    """(first_k_dense_layers, moe_layer_freq) from --moe-layer-freq."""
    raw = flags.get("moe-layer-freq")
    if raw is None:
        return 0, 1
    if "[" not in raw:
        return 0, typed(flags, "moe-layer-freq", pos_int)  # [V] integer N: layer i is MoE when i % N == 0
    pattern = eval_pattern(raw, "moe-layer-freq")
    if len(pattern) != num_layers or 1 not in pattern:
        raise InputError(f"--moe-layer-freq pattern has {len(pattern)} entries and "
                         f"{sum(pattern)} MoE layers; it needs {num_layers} entries with at least one 1")
    first = pattern.index(1)
    ones = [i for i, v in enumerate(pattern) if v]
    freq = ones[1] - ones[0] if len(ones) > 1 else num_layers - first
    expected = [int(i >= first and (i - first) % freq == 0) for i in range(num_layers)]
    if expected != pattern:
        raise InputError(f"--moe-layer-freq {raw!r} is not 'k dense layers, then every n-th layer MoE'; "
                         f"autoplan models only that shape")
    return first, freq


def _window(flags: Dict[str, Optional[str]], num_layers: int) -> Tuple[int, int]:
    """(sliding_window, num_sliding_window_layers) from --window-size and --window-attn-skip-freq."""
    raw = flags.get("window-size")
    if raw is None:
        return 0, 0
    try:
        left = int(raw.strip("()").split(",")[0])
    except ValueError:
        raise InputError(f"--window-size expects 'left,right' integers, got {raw!r}") from None
    if left == -1:  # flash-attention's -1: no limit on the left, i.e. full causal attention
        return 0, 0
    if left < 0:
        raise InputError(f"--window-size left={left} must be >= 0 (keys before each query) or -1 (no window); "
                         f"fix the arguments")
    window = left + 1  # flash-attention's left keys plus the query itself: HF sliding_window (127,0 -> 128)
    skip = flags.get("window-attn-skip-freq")
    if skip is None:
        return window, num_layers
    # core/transformer/utils.py is_layer_window_attention: int N -> layer_number % N != 0; list -> entry != 0.
    pattern = eval_pattern(skip, "window-attn-skip-freq") if "[" in skip else \
        [int((i + 1) % typed(flags, "window-attn-skip-freq", pos_int) != 0) for i in range(num_layers)]
    return window, sum(pattern)


# Layer symbols of a hybrid pattern that the cost model has no layer record for
# (megatron/core/models/hybrid/hybrid_layer_allocation.py Symbols).
_UNPRICED_HYBRID = {"G": "Gated DeltaNet", "D": "DeepSeek sparse attention", "+": "multi-latent attention"}


def hybrid_pattern(f: Dict[str, Optional[str]]) -> Optional[str]:
    """The hybrid layer pattern: --hybrid-layer-pattern, or the deprecated --hybrid-override-pattern [V] (giving
    both is Megatron's error too)."""
    new, old = typed(f, "hybrid-layer-pattern", str), typed(f, "hybrid-override-pattern", str)
    if new and old:
        raise InputError("--hybrid-override-pattern and --hybrid-layer-pattern cannot both be given (Megatron "
                         "refuses it); keep --hybrid-layer-pattern")
    return new or old


def _hybrid(f: Dict[str, Optional[str]], pattern: str, notes: List[str]) -> Dict[str, Any]:
    """The hybrid fields of a Mamba / attention pattern [V] (arguments.py: the main pattern is the part before the
    first '/', each further '/' part is one MTP depth, '|' marks pipeline stages; num_layers is the main pattern's
    length and --num-layers is ignored) and the Mamba-2 sizes [TC] (mamba_state_dim 128, mamba_head_dim 64,
    mamba_num_groups 8; no --mamba-num-heads: 2 x hidden / head dim, megatron/core/ssm/mamba_mixer.py)."""
    main, *mtp = pattern.split("/")
    unpriced = sorted({_UNPRICED_HYBRID[c] for c in pattern if c in _UNPRICED_HYBRID})
    if unpriced:
        raise InputError(f"--hybrid-layer-pattern {pattern!r} holds {', '.join(unpriced)} layers, which autoplan "
                         f"does not price; it plans M (Mamba-2), * (attention), - (MLP) and E (MoE) layers")
    if "|" in main:
        raise InputError("--hybrid-layer-pattern with '|' pipeline stages is not read; drop the '|' marks and give "
                         "the layout with --strategy pp=N,vpp=V")
    if len(set(mtp)) > 1:
        raise InputError(f"--hybrid-layer-pattern {pattern!r}: MTP depths with different patterns are not priced")
    layers = typed(f, "num-layers", pos_int)
    if layers is not None and layers != len(main):
        notes.append(f"--num-layers {layers} ignored: the hybrid pattern has {len(main)} layers (as Megatron does)")
    hidden = typed(f, "hidden-size", pos_int)
    head_dim = typed(f, "mamba-head-dim", pos_int, 64)
    out: Dict[str, Any] = dict(
        hybrid_layer_pattern=main, num_layers=len(main), mamba_head_dim=head_dim,
        mamba_num_heads=typed(f, "mamba-num-heads", pos_int, 2 * (hidden or 0) // head_dim),
        mamba_state_dim=typed(f, "mamba-state-dim", pos_int, 128),
        mamba_num_groups=typed(f, "mamba-num-groups", pos_int, 8),
        moe_latent_size=typed(f, "moe-latent-size", int, 0))
    legacy_mtp = typed(f, "mtp-hybrid-override-pattern", str)
    if mtp:
        out.update(mtp_num_layers=len(mtp), mtp_layer_pattern=mtp[0])
    elif legacy_mtp and typed(f, "mtp-num-layers", int, 0):
        out.update(mtp_num_layers=typed(f, "mtp-num-layers", int), mtp_layer_pattern=legacy_mtp)
    return out


def megatron_model(f: Dict[str, Optional[str]], seq_len: int, tp: int, overrides: Dict[str, Any],
                   notes: List[str]) -> ModelSpec:
    """The ModelSpec the arguments build; `overrides` (--set) replace fields, vocab_size included."""
    pattern = hybrid_pattern(f)
    hybrid = _hybrid(f, pattern, notes) if pattern else {}
    layers = overrides.get("num_layers", hybrid.get("num_layers") or typed(f, "num-layers", pos_int))
    hidden = overrides.get("hidden_size", typed(f, "hidden-size", pos_int))
    heads = overrides.get("num_attention_heads", typed(f, "num-attention-heads", pos_int))
    for name, value in (("num-layers", layers), ("hidden-size", hidden), ("num-attention-heads", heads)):
        if value is None:
            raise InputError(f"Megatron arguments lack --{name}; add it (the model cannot be built without it)")
    gated = "swiglu" in f or "quick-geglu" in f  # [TC] gated_linear_unit: both have three MLP matrices
    if "squared-relu" in f and not gated:
        notes.append("--squared-relu priced as a 2-matrix MLP (activation gelu): same shapes and GEMM FLOPs")
    # [V] ffn default: 4h, or 2/3 of that rounded down to a multiple of 64 with SwiGLU.
    default_ffn = int(4 * hidden * 2 / 3 / 64) * 64 if gated else 4 * hidden
    ffn = typed(f, "ffn-hidden-size", pos_int, default_ffn)
    first_dense, freq = _moe_layout(f, layers)
    window, window_layers = _window(f, layers)
    experts = typed(f, "num-experts", int, 0) or 0
    mla = "multi-latent-attention" in f
    position = typed(f, "position-embedding-type", str, "learned_absolute")
    values: Dict[str, Any] = dict(
        name="imported-megatron", num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_query_groups=typed(f, "num-query-groups", pos_int, 1) if "group-query-attention" in f else heads,
        kv_channels=typed(f, "kv-channels", pos_int, hidden // heads),
        vocab_size=vocab_size(f, tp, overrides.get("vocab_size"), notes),
        max_position_embeddings=typed(f, "max-position-embeddings", pos_int, seq_len),
        activation="swiglu" if gated else "gelu",
        normalization="rmsnorm" if typed(f, "normalization", str, "LayerNorm") == "RMSNorm" else "layernorm",
        # "none" (hybrids) has no position parameters: priced as rope, which has none either.
        position_embedding="learned" if position == "learned_absolute" and "no-position-embedding" not in f
        else "rope",
        rotary_base=typed(f, "rotary-base", float, 10000.0), rotary_percent=typed(f, "rotary-percent", float, 1.0),
        hidden_dropout=typed(f, "hidden-dropout", float, 0.1),  # default: transformer_config.py
        tie_embeddings="untie-embeddings-and-output-weights" not in f,
        add_bias_linear="disable-bias-linear" not in f, add_qkv_bias="add-qkv-bias" in f,
        qk_layernorm="qk-layernorm" in f, multi_latent_attention=mla,
        num_experts=experts, sliding_window=window, num_sliding_window_layers=window_layers)
    values.update(_released_model_details(f, experts > 0, mla))
    if mla:  # defaults from MLATransformerConfig
        values.update(q_lora_rank=typed(f, "q-lora-rank", pos_int), kv_lora_rank=typed(f, "kv-lora-rank", int, 512),
                      qk_head_dim=typed(f, "qk-head-dim", int, 128),
                      qk_pos_emb_head_dim=typed(f, "qk-pos-emb-head-dim", int, 64),
                      v_head_dim=typed(f, "v-head-dim", int, 128))
    if experts:
        values.update(moe_router_topk=typed(f, "moe-router-topk", pos_int, 2),
                      moe_ffn_hidden_size=typed(f, "moe-ffn-hidden-size", pos_int, ffn),
                      shared_expert_ffn_hidden_size=typed(f, "moe-shared-expert-intermediate-size", int, 0),
                      first_k_dense_layers=first_dense, moe_layer_freq=freq)
    if not pattern:  # [V] --mtp-num-layers, default None: no MTP depth
        values["mtp_num_layers"] = typed(f, "mtp-num-layers", int, 0)
    values.update(_attention_variant(f, layers, experts > 0, mla))
    values.update(hybrid)
    values.update(overrides)
    try:
        return ModelSpec(**values)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"Megatron arguments give an invalid model: {err['msg']}") from None


def _attention_variant(f: Dict[str, Optional[str]], num_layers: int, is_moe: bool, mla: bool) -> Dict[str, Any]:
    """The recent families' attention variants the arguments build [TC] (transformer_config.py fields, defaults as
    there; integrations/megatron.py _mixer_args writes them): Gated DeltaNet on the layers
    get_linear_attention_pattern marks (experimental_attention_variant_module_specs.py: int N, layer i unless
    (i + 1) % N == 0; or a 0/1 list), DSA's indexer, the attention output gate, the shared-expert gate and
    zero-centred norm scales."""
    out: Dict[str, Any] = dict(attention_output_gate="attention-output-gate" in f,
                               layernorm_zero_centered="apply-layernorm-1p" in f)
    if is_moe and "moe-shared-expert-gate" in f:  # [TC] "Only effective when moe-shared-expert-intermediate-size"
        out["shared_expert_gate"] = bool(typed(f, "moe-shared-expert-intermediate-size", int, 0))
    variant = typed(f, "experimental-attention-variant", str)
    if variant is None:
        return out
    if variant == "gated_delta_net":
        raw = f.get("linear-attention-freq")
        if raw is None:  # [TC] asserts "linear_attention_freq must be set for linear gated_delta_net"
            raise InputError("--experimental-attention-variant gated_delta_net needs --linear-attention-freq "
                             "(Megatron refuses it without); add it")
        if "[" in raw:
            layout = eval_pattern(raw, "linear-attention-freq")
            if len(layout) != num_layers:
                raise InputError(f"--linear-attention-freq pattern has {len(layout)} entries for {num_layers} "
                                 f"layers; it needs one per layer")
            freq = next((n for n in range(1, num_layers + 1)
                         if layout == [int((i + 1) % n != 0) for i in range(num_layers)]), 0)
        else:
            freq = typed(f, "linear-attention-freq", pos_int)
            layout = [int((i + 1) % freq != 0) for i in range(num_layers)]
        return {**out, "linear_attention_layers": sum(layout), "linear_attention_freq": freq,
                "gdn_num_key_heads": typed(f, "linear-num-key-heads", pos_int, 16),
                "gdn_num_value_heads": typed(f, "linear-num-value-heads", pos_int, 32),
                "gdn_key_head_dim": typed(f, "linear-key-head-dim", pos_int, 128),
                "gdn_value_head_dim": typed(f, "linear-value-head-dim", pos_int, 128),
                "gdn_conv_kernel": typed(f, "linear-conv-kernel-dim", pos_int, 4)}
    if variant == "dsa":
        if not mla:  # experimental_attention_variant_module_specs.py: "Currently only MLA supports sparse attention."
            raise InputError("--experimental-attention-variant dsa needs --multi-latent-attention (Megatron builds "
                             "DSA on MLA only); add it")
        sizes = {key: typed(f, flag, pos_int) for key, flag in (
            ("dsa_index_heads", "dsa-indexer-n-heads"), ("dsa_index_head_dim", "dsa-indexer-head-dim"),
            ("dsa_index_topk", "dsa-indexer-topk"))}
        missing = [flag for flag, v in zip(("--dsa-indexer-n-heads", "--dsa-indexer-head-dim", "--dsa-indexer-topk"),
                                           sizes.values()) if v is None]
        if missing:  # [TC] None by default: the indexer cannot be built without them
            raise InputError(f"--experimental-attention-variant dsa lacks {', '.join(missing)}; add them")
        sharing = {key: value for key, value in (
            ("dsa_indexer_topk_freq", typed(f, "dsa-indexer-topk-freq", pos_int, 1)),
            ("dsa_indexer_skip_topk_offset", typed(f, "dsa-indexer-skip-topk-offset", int, 0))) if value}
        return {**out, **sizes, **sharing, "dsa_indexer_loss_coeff": typed(f, "dsa-indexer-loss-coeff", float)}
    raise InputError(f"--experimental-attention-variant {variant}: autoplan reads gated_delta_net or dsa; change the "
                     f"argument")


def _released_model_details(f: Dict[str, Optional[str]], is_moe: bool, mla: bool) -> Dict[str, Any]:
    """RoPE scaling, attention sinks, gpt-oss's clamped GLU and the aux-loss weight: no effect on the price, kept so
    that the model (and a launch emitted from it) is the one the arguments train."""
    out: Dict[str, Any] = {}
    mla_yarn = mla and typed(f, "rope-type", str, "yarn") == "yarn"
    if mla_yarn or (not mla and typed(f, "position-embedding-type", str) == "yarn"):
        # [V] --rotary-scaling-factor default 1.0, --mscale 1.0, --mscale-all-dim 0.0. MLA: [TC]
        # MLATransformerConfig: rope_type yarn unless --rope-type rope, original_max_position_embeddings 4096.
        # Other attention: [V] --position-embedding-type yarn with its own original length, correction-range
        # rounding and beta flags.
        out.update(rope_scaling="yarn", rope_scaling_factor=typed(f, "rotary-scaling-factor", float, 1.0),
                   rope_original_max_position_embeddings=4096 if mla_yarn else
                   typed(f, "yarn-original-max-position-embeddings", int, 0),
                   rope_mscale=typed(f, "mscale", float, 1.0),
                   rope_mscale_all_dim=typed(f, "mscale-all-dim", float, 0.0))
        if not mla_yarn:
            out.update(rope_truncate="no-yarn-correction-range-round-to-int" not in f,
                       rope_beta_fast=typed(f, "yarn-beta-fast", float, 32.0),  # [V] defaults 32 and 1
                       rope_beta_slow=typed(f, "yarn-beta-slow", float, 1.0))
    elif "use-rope-scaling" in f:  # [V] Llama-3.x frequency scaling, factor default 8
        out.update(rope_scaling="llama3", rope_scaling_factor=typed(f, "rope-scaling-factor", float, 8.0))
    if typed(f, "softmax-type", str, "vanilla") == "learnable":  # [TC] softmax_type: a learned sink per head
        out["attention_sinks"] = True
    if "quick-geglu" in f and "activation-func-clamp-value" in f:
        out["swiglu_limit"] = typed(f, "activation-func-clamp-value", float)
    if is_moe:  # [TC] moe_aux_loss_coeff default 0.0; nargs="+" (one per load-balancing type): the first
        out["moe_aux_loss_coeff"] = typed(f, "moe-aux-loss-coeff", lambda v: float(v.split()[0]), 0.0)
        out.update(_router(f))
    return out


def _router(f: Dict[str, Optional[str]]) -> Dict[str, Any]:
    """Routing and balancing, Megatron's defaults for absent flags [TC]: softmax after the top-k, no expert bias,
    no scaling, no groups, aux_loss (nargs="+" for the balancing type: the first is read). A sigmoid router
    renormalises its top-k weights with or without --moe-router-pre-softmax (moe_utils.py)."""
    balancing = typed(f, "moe-router-load-balancing-type", lambda v: v.split()[0], "aux_loss")
    if balancing not in ("aux_loss", "seq_aux_loss", "none"):
        raise InputError(f"--moe-router-load-balancing-type {balancing}: autoplan reads aux_loss, seq_aux_loss or "
                         f"none; change the argument")
    score = typed(f, "moe-router-score-function", str, "softmax")
    if score not in ("softmax", "sigmoid"):
        raise InputError(f"--moe-router-score-function {score}: autoplan reads softmax or sigmoid; change the "
                         f"argument")
    return dict(moe_router_score_function=score, moe_router_norm_topk_prob="moe-router-pre-softmax" not in f or score == "sigmoid",
                moe_router_expert_bias="moe-router-enable-expert-bias" in f,
                moe_router_topk_scaling_factor=typed(f, "moe-router-topk-scaling-factor", float, 1.0),
                moe_router_num_groups=typed(f, "moe-router-num-groups", int, 0) or 0,
                moe_router_group_topk=typed(f, "moe-router-group-topk", int, 0) or 0,
                moe_load_balancing=balancing)

