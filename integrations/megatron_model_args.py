"""The model a Megatron-LM argument list builds (ModelSpec), with Megatron's defaults for absent arguments
(megatron/training/arguments.py [V], TransformerConfig [TC]) and its vocabulary padding."""
from __future__ import annotations

import math
from pathlib import PurePosixPath
from typing import Any, Dict, List, Optional, Tuple

from pydantic import ValidationError

from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.integrations.megatron_flags import eval_pattern, pos_int, typed

# Megatron's own tokenizers with a fixed vocabulary: GPT-2 BPE (gpt2-vocab.json, 50257 tokens) and the Llama-2
# SentencePiece model (32000 pieces) [megatron/core/tokenizers/utils/build_tokenizer.py].
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}
# Hugging Face tokenizers by repository id prefix (lower case): the embedding rows of the model's config.json
# (vocab_size), which is len(tokenizer) for Llama 3 / Mistral and an upper bound of it for DeepSeek-V3 / gpt-oss,
# so memory is never under-counted.
HF_TOKENIZER_VOCAB = {"meta-llama/meta-llama-3": 128256, "meta-llama/llama-3": 128256,
                      "deepseek-ai/deepseek-v3": 129280, "deepseek-ai/deepseek-r1": 129280,
                      "mistralai/mixtral-8x7b": 32000, "mistralai/mistral-7b": 32000, "openai/gpt-oss": 201088}


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


def _tokenizer_vocab(f: Dict[str, Optional[str]]) -> Tuple[Optional[int], str]:
    """(vocabulary of the tokenizer before padding, where it came from) or (None, why it is unknown)."""
    kind = f.get("tokenizer-type")
    if kind is None and f.get("vocab-file") and f.get("merge-file"):
        # A vocab file with BPE merges and no type: the GPT-2 BPE files (gpt2-vocab.json, gpt2-merges.txt).
        return TOKENIZER_VOCAB["GPT2BPETokenizer"], "--vocab-file/--merge-file without --tokenizer-type (GPT-2 BPE)"
    if kind in TOKENIZER_VOCAB:
        return TOKENIZER_VOCAB[kind], f"--tokenizer-type {kind}"
    model = (f.get("tokenizer-model") or "").lower()
    if kind == "HuggingFaceTokenizer":
        for prefix, size in HF_TOKENIZER_VOCAB.items():
            if model.startswith(prefix) or PurePosixPath(model).name.startswith(prefix.split("/")[1]):
                return size, f"--tokenizer-model {f['tokenizer-model']}"
    if kind is None:
        return None, "the arguments (no --vocab-size, no --tokenizer-type)"
    return None, f"--tokenizer-type {kind}" + (f" --tokenizer-model {f['tokenizer-model']}" if model else "")


def padded_vocab(vocab: int, f: Dict[str, Optional[str]], tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of make-vocab-size-divisible-by (default 128) x tp
    [megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding]."""
    multiple = typed(f, "make-vocab-size-divisible-by", pos_int, 128) * tp
    return int(math.ceil(vocab / multiple) * multiple)


def vocab_size(f: Dict[str, Optional[str]], tp: int, override: Optional[int], notes: List[str]) -> int:
    """The embedding rows the run allocates: --vocab-size or the tokenizer's size, padded as Megatron does."""
    if override is not None:
        return override
    given = typed(f, "vocab-size", pos_int)
    source = "--vocab-size"
    if given is None:
        given, source = _tokenizer_vocab(f)
        if given is None:
            raise InputError(f"cannot tell the vocabulary size from {source}; pass "
                             f"--set vocab_size=N (the tokenizer's size)")
    padded = padded_vocab(given, f, tp)
    if source != "--vocab-size":
        notes.append(f"vocab {given} from {source}")
    if padded != given:
        notes.append(f"vocab {given} padded to {padded} rows as Megatron does (make-vocab-size-divisible-by x tp)")
    return padded


def megatron_model(f: Dict[str, Optional[str]], seq_len: int, tp: int, overrides: Dict[str, Any],
                   notes: List[str]) -> ModelSpec:
    """The ModelSpec the arguments build; `overrides` (--set) replace fields, vocab_size included."""
    layers = overrides.get("num_layers", typed(f, "num-layers", pos_int))
    hidden = overrides.get("hidden_size", typed(f, "hidden-size", pos_int))
    heads = overrides.get("num_attention_heads", typed(f, "num-attention-heads", pos_int))
    for name, value in (("num-layers", layers), ("hidden-size", hidden), ("num-attention-heads", heads)):
        if value is None:
            raise InputError(f"Megatron arguments lack --{name}; add it (the model cannot be built without it)")
    gated = "swiglu" in f or "quick-geglu" in f  # [TC] gated_linear_unit: both have three MLP matrices
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
        position_embedding="rope" if position in ("rope", "yarn", "mrope") else "learned",
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
    if "hybrid-override-pattern" not in f:  # [V] --mtp-num-layers, default None: no MTP depth
        values["mtp_num_layers"] = typed(f, "mtp-num-layers", int, 0)
    values.update(overrides)
    try:
        return ModelSpec(**values)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"Megatron arguments give an invalid model: {err['msg']}") from None


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

