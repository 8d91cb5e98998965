"""The structural reader: a Hugging Face `config.json` read by `transformers`' own configuration class for its
`model_type` (offline, from the mapping) and the model built on the `meta` device (shapes only: no weights, no
memory), then walked layer by layer. It gives every decoder layer's token mixers (softmax attention MHA / GQA /
MLA, with DSA's lightning indexer; Gated DeltaNet; Mamba-2), its attention span (full, sliding window, chunked),
its MLP (dense, or MoE with experts, top-k and shared experts) and the exact parameter count, and names every module
kind the cost model cannot price.

It checks the hand-written readers (autoplan/hf_config.py, hf_families.py, hf_recent.py): `compare` lists where
the ModelSpec they read differs from the built model, layer by layer and in the parameter count
(tests/unit/test_hf_meta.py runs it per family). For a `model_type` none of them reads, `spec_fields` maps a structure
whose every layer the cost model prices onto ModelSpec fields, and refuses in one line naming what it cannot price.

`transformers` is an optional dependency (the `hf` extra, pyproject.toml); without it `load_structure` raises an
InputError saying how to install it. The hand-written readers need nothing of it."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from autoplan.errors import InputError
from autoplan.model import ModelSpec

# Decoder-layer children the walk recognises, by what they hold (attribute names of the transformers modelling
# files: modeling_llama.py, modeling_deepseek_v3.py, modeling_deepseek_v32.py, modeling_qwen3_next.py,
# modeling_falcon_h1.py, modeling_llama4.py, modeling_mixtral.py, modeling_glm4_moe.py, modeling_minimax_m2.py,
# modeling_qwen3_5.py, modeling_nemotron_h.py).
_ATTENTION = (("q_proj", "o_proj"), ("qkv_proj", "o_proj"), ("c_attn", "c_proj"), ("query_key_value", "dense"))
_MLA = ("kv_a_proj_with_mqa",)
_GDN = (("in_proj_qkvz",), ("in_proj_qkv", "in_proj_z"))  # Qwen3-Next's fused projection; Qwen3.5's split one
_MAMBA = ("A_log", "in_proj", "conv1d")
_DENSE_MLP = (("down_proj",), ("c_fc", "c_proj"), ("dense_h_to_4h", "dense_4h_to_h"))
_EXPERTS = ("experts",)


@dataclass(frozen=True)
class LayerRecord:
    """One decoder layer as the structure gives it and as the cost model prices it."""

    mixers: Tuple[str, ...]  # sorted: "attention", "mla", "mla+dsa", "gated_deltanet", "mamba2"; () in a hybrid's
    # MLP-only block
    span: str  # "full", "sliding", "chunked", or "none" (no softmax attention)
    mlp: str  # "dense", "moe", or "none" (a hybrid's mixer-only block)
    dense_ffn: int = 0
    experts: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0


@dataclass(frozen=True)
class Structure:
    model_type: str
    total_params: int
    layers: Tuple[LayerRecord, ...]
    unpriced: Tuple[str, ...]  # module kinds (class names) the cost model has no price for
    hidden_size: int
    vocab_size: int
    topk: int
    heads: int  # softmax-attention query heads (0 when no layer has attention)
    kv_heads: int
    head_dim: int
    tied: bool  # the LM head is the input embedding
    layernorm: bool  # the layer norms carry a bias (LayerNorm), not only a scale (RMSNorm)
    qk_norm: str = ""  # "", "head" (q_norm / k_norm over one head's d) or "all_heads" (over the whole projection)
    qkv_bias: bool = False  # q_proj / k_proj / v_proj carry biases (and o_proj none)
    window: int = 0  # the config's sliding_window, the span of the "sliding" layers


def available() -> bool:
    """Whether transformers (and torch) can be imported, without importing them."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("transformers", "torch"))


def _transformers():
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        raise InputError(f"the structural reader needs transformers ({exc.name} is not installed); install it with "
                         f"pip install 'autoplan[hf]'") from None
    return transformers


def load_structure(cfg: Mapping[str, Any], where: str) -> Structure:
    """The structure of the model a config mapping describes, built on the meta device."""
    transformers = _transformers()
    import torch

    model_type = cfg.get("model_type")
    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            config = transformers.AutoConfig.for_model(model_type, **fields)
            text = config.get_text_config()
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(text)
    except Exception as exc:  # noqa: BLE001 - a modelling file's constructor rejects a bad config in its own way
        # (ValueError, KeyError, AssertionError on padding_idx, ...): each is the user's config, said in one line.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = first.split(". Should contain one of")[0]  # transformers lists every model type after this
        raise InputError(f"{where}: transformers {transformers.__version__} cannot build model_type "
                         f"{model_type!r}: {first}") from None
    return _walk(model, text, str(model_type))


def _decoder_layers(model):
    import torch.nn as nn

    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        raise InputError(f"{type(model).__name__}: no decoder layers found")
    return max(lists, key=len)


def _has(module, names) -> bool:
    return all(hasattr(module, n) for n in names)


def _out_features(module) -> int:
    weight = getattr(module, "weight", None)
    return int(weight.shape[0]) if weight is not None else 0


@dataclass
class _Layer:
    """What the walk finds in one decoder layer's children."""

    mixers: List[str]
    mlp: Optional[str] = None
    dense_ffn: int = 0
    experts: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    attention: Tuple[int, int, int] = (0, 0, 0)  # heads, kv heads, head dim of a q/k/v/o attention
    qk_norm: str = ""
    qkv_bias: bool = False
    layernorm: bool = False
    unpriced: Tuple[str, ...] = ()


def _classify(layer, hidden: int) -> _Layer:
    """Each child of a decoder layer by what it holds: a token mixer, a dense MLP, an MoE block, a norm, or a kind
    the cost model has no price for."""
    found = _Layer([])
    unpriced = []
    for child in layer.children():
        kind = type(child).__name__
        if _has(child, _MLA):
            # a layer that reuses another's DSA top-k has the attribute but no indexer (modeling_glm_moe_dsa.py)
            found.mixers.append("mla" if not hasattr(child, "indexer") else
                                "mla+dsa" if child.indexer is not None else "mla+dsa-shared")
        elif any(_has(child, names) for names in _ATTENTION):
            found.mixers.append("attention")
            d = int(getattr(child, "head_dim", 0) or 0)
            if d and _has(child, ("q_proj", "k_proj", "o_proj")):
                # o_proj's input is heads x d (a gated q_proj is twice as wide)
                found.attention = (int(child.o_proj.weight.shape[1]) // d, _out_features(child.k_proj) // d, d)
                # q_norm over one head's d values (Qwen3) or over the whole projection (OLMo-2, OLMoE)
                width = _out_features(getattr(child, "q_norm", None))
                found.qk_norm = "" if not width else "head" if width == d else "all_heads"
                found.qkv_bias = getattr(child.q_proj, "bias", None) is not None and \
                    getattr(child.o_proj, "bias", None) is None
        elif any(_has(child, names) for names in _GDN):
            found.mixers.append("gated_deltanet")
        elif _has(child, _MAMBA):
            found.mixers.append("mamba2")
        elif _has(child, _EXPERTS):
            found.mlp = "moe"
            # A latent MoE's experts run on the latent width (modeling_nemotron_h.py NemotronHMoE.fc1_latent_proj).
            latent = _out_features(getattr(child, "fc1_latent_proj", None))
            found.experts, found.expert_ffn = _experts_shape(child.experts, latent or hidden)
            shared = getattr(child, "shared_experts", None) or getattr(child, "shared_expert", None)
            found.shared_ffn = _mlp_width(shared) if shared is not None else 0
        elif any(_has(child, names) for names in _DENSE_MLP):
            found.mlp, found.dense_ffn = "dense", _mlp_width(child)
        elif "Norm" in kind or sum(p.numel() for p in child.parameters()) == 0:
            found.layernorm = found.layernorm or getattr(child, "bias", None) is not None
        else:
            unpriced.append(kind)
    if found.mlp is None:  # a hybrid's mixer-only block (Nemotron-H), or an MLP the walk does not know
        found.mlp = "none"
    found.unpriced = tuple(unpriced)
    return found


def _walk(model, config, model_type: str) -> Structure:
    layers = _decoder_layers(model)
    embedding = model.get_input_embeddings().weight
    hidden = int(embedding.shape[1])
    layer_types = list(getattr(config, "layer_types", None) or [])
    # Without layer_types (Mistral, Phi-3) a sliding_window applies to every layer.
    default = "sliding_attention" if getattr(config, "sliding_window", None) and \
        getattr(config, "use_sliding_window", True) else "full_attention"
    records: List[LayerRecord] = []
    unpriced: Counter = Counter()
    attention, layernorm, qk_norm, qkv_bias = (0, 0, 0), False, "", False
    for index, layer in enumerate(layers):
        found = _classify(layer, hidden)
        unpriced.update(found.unpriced)
        if found.attention[2]:
            attention, qk_norm, qkv_bias = found.attention, found.qk_norm, found.qkv_bias
        layernorm = layernorm or found.layernorm
        kind = layer_types[index] if index < len(layer_types) else default
        span = {"sliding_attention": "sliding", "chunked_attention": "chunked"}.get(kind, "full")
        if not any(m in ("attention", "mla", "mla+dsa", "mla+dsa-shared") for m in found.mixers):
            span = "none"
        records.append(LayerRecord(tuple(sorted(found.mixers)), span, found.mlp, found.dense_ffn, found.experts,
                                   found.expert_ffn, found.shared_ffn))
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding
    topk = int(getattr(config, "num_experts_per_tok", 0) or getattr(config, "moe_topk", 0) or 0)
    window = int(getattr(config, "sliding_window", 0) or 0)
    return Structure(model_type, sum(p.numel() for p in model.parameters()), tuple(records),
                     tuple(f"{k} x{n}" for k, n in sorted(unpriced.items())), hidden, int(embedding.shape[0]), topk,
                     *attention, tied, layernorm, qk_norm, qkv_bias, window)


def _mlp_width(mlp) -> int:
    """Inner width of a gated MLP (gate_proj / up_proj / down_proj, or a fused gate_up_proj)."""
    down = getattr(mlp, "down_proj", None) or getattr(mlp, "dense_4h_to_h", None)
    if down is not None and getattr(down, "weight", None) is not None:
        return int(down.weight.shape[1])
    fc = getattr(mlp, "c_fc", None)  # GPT-2's Conv1D keeps its weight as [in, out]
    return int(fc.weight.shape[1]) if fc is not None else 0


def _experts_shape(experts, hidden: int) -> Tuple[int, int]:
    """(experts, expert inner width) of a fused experts module (down_proj [E, h, f] or [E, f, h]: the width is its
    dimension other than h, the experts' input width: the hidden size, or a latent MoE's latent size) or a
    ModuleList of expert MLPs."""
    import torch.nn as nn

    if isinstance(experts, nn.ModuleList):
        return len(experts), _mlp_width(experts[0])
    down = getattr(experts, "down_proj", None)
    if down is not None and down.dim() == 3:
        a, b = int(down.shape[1]), int(down.shape[2])
        return int(down.shape[0]), b if a == hidden else a
    raise InputError(f"{type(experts).__name__}: an experts module of unknown layout")


def spec_records(m: ModelSpec) -> Tuple[LayerRecord, ...]:
    """The cost model's layer records of a ModelSpec, in the same terms as `Structure.layers`: which layers are MoE
    (`is_moe_layer`), how many use each mixer and span (the cost model prices them by count, so `compare` takes
    them as a multiset)."""
    attention = ("mla+dsa" if m.dsa_index_heads else "mla") if m.multi_latent_attention else "attention"
    if m.is_hybrid:  # one block per symbol: a pre-norm and one mixer (ModelSpec.hybrid_layer_pattern)
        blocks = {"M": (("mamba2",), "none", "none"), "*": ((attention,), "full", "none"), "-": ((), "none", "dense"),
                  "E": ((), "none", "moe")}
        return tuple(LayerRecord(blocks[x][0], blocks[x][1], blocks[x][2], m.ffn_hidden_size if x == "-" else 0,
                                 *((m.num_experts, m.moe_ffn_hidden_size, m.shared_expert_ffn_hidden_size)
                                   if x == "E" else (0, 0, 0)))
                     for x in m.hybrid_layer_pattern)
    records = []
    n_linear = m.linear_attention_layers
    for i in range(m.num_layers):
        linear = i < n_linear
        own = attention
        if m.dsa_index_heads and not m.dsa_computes_topk(i):
            own = "mla+dsa-shared"
        mixers = ["gated_deltanet"] if linear else [own]
        if m.parallel_mamba:
            mixers.append("mamba2")
        span = "none" if linear else "full"
        if not linear and i - n_linear < m.num_chunked_attention_layers:
            span = "chunked"
        if not linear and m.sliding_window and i - n_linear < m.num_sliding_window_layers:
            span = "sliding"
        moe = m.is_moe_layer(i)
        records.append(LayerRecord(
            tuple(sorted(mixers)), span, "moe" if moe else "dense", 0 if moe else m.ffn_hidden_size,
            m.num_experts if moe else 0, m.moe_ffn_hidden_size if moe else 0,
            m.shared_expert_ffn_hidden_size if moe else 0))
    return tuple(records)


def compare(m: ModelSpec, s: Structure) -> List[str]:
    """Where ModelSpec `m` (MTP depths left out: transformers builds none) differs from structure `s`: the MoE
    layers by index, the multisets of per-layer mixers and spans and of MLPs, top-k, the parameter count. Empty
    when they agree."""
    from autoplan.costmodel.params import count_parameters

    diffs = []
    mine, theirs = spec_records(m), s.layers
    if len(mine) != len(theirs):
        return [f"{len(mine)} layers read, {len(theirs)} built"]
    moe_mine = [i for i, r in enumerate(mine) if r.mlp == "moe"]
    moe_theirs = [i for i, r in enumerate(theirs) if r.mlp == "moe"]
    if moe_mine != moe_theirs:
        diffs.append(f"MoE layers read {moe_mine[:8]}..., built {moe_theirs[:8]}...")
    # The cost model prices mixers and spans by count, independently of the MLP kinds (placed by index above).
    for what, key in (("mixers", lambda r: (r.mixers, r.span)),
                      ("MLPs", lambda r: (r.mlp, r.dense_ffn, r.experts, r.expert_ffn, r.shared_ffn))):
        a, b = Counter(map(key, mine)), Counter(map(key, theirs))
        if a != b:
            diffs.append(f"layer {what} read {dict(a - b)}, built {dict(b - a)}")
    if m.is_moe and m.moe_router_topk != s.topk:
        diffs.append(f"top-k read {m.moe_router_topk}, built {s.topk}")
    total = count_parameters(m.model_copy(update={"mtp_num_layers": 0}))[0]
    if total != s.total_params:
        diffs.append(f"parameters read {total:,}, built {s.total_params:,}")
    if s.unpriced:
        diffs.append(f"module kinds the cost model cannot price: {', '.join(s.unpriced)}")
    return diffs


def spec_fields(s: Structure, where: str, max_positions: int) -> Dict[str, Any]:
    """ModelSpec fields for a structure the cost model prices as a standard decoder (softmax GQA/MHA attention with
    optional q/k norms and q/k/v biases, full or sliding spans, dense or MoE gated MLPs with one router); InputError
    naming what it cannot price otherwise. The caller checks the parameter count against the built model
    (`check_fields`)."""
    problems = list(s.unpriced)
    if not s.heads:
        problems.append("no attention with separate q_proj / k_proj / o_proj to read the heads from")
    kinds = sorted({m for r in s.layers for m in r.mixers} - {"attention"})
    if kinds:
        problems.append("mixers " + ", ".join(kinds) + " (read by no hand-written reader for this model_type)")
    spans = sorted({r.span for r in s.layers} - {"full", "none", "sliding"})
    if spans:
        problems.append("attention spans " + ", ".join(spans))
    sliding = sum(r.span == "sliding" for r in s.layers)
    if sliding and not s.window:
        problems.append("sliding-window layers without a sliding_window size")
    for what, n in (("without an MLP", sum(r.mlp == "none" for r in s.layers)),
                    ("without a token mixer", sum(not r.mixers for r in s.layers))):
        if n:
            problems.append(f"{n} of {len(s.layers)} layers {what}")
    if problems:
        raise InputError(f"{where}: model_type {s.model_type!r} has what the cost model cannot price from its "
                         f"structure: {'; '.join(problems)}; pass a native model YAML of ModelSpec fields")
    moe = [i for i, r in enumerate(s.layers) if r.mlp == "moe"]
    first_k = moe[0] if moe else 0
    freq = (moe[1] - moe[0]) if len(moe) > 1 else 1
    if moe and moe != list(range(first_k, len(s.layers), freq)):
        raise InputError(f"{where}: MoE layers {moe} are not a leading dense run then every {freq}-th layer; pass a "
                         f"native model YAML of ModelSpec fields")
    dense = next((r.dense_ffn for r in s.layers if r.mlp == "dense"), 0)
    expert = next((r for r in s.layers if r.mlp == "moe"), None)
    return dict(
        num_layers=len(s.layers), hidden_size=s.hidden_size, ffn_hidden_size=dense or expert.expert_ffn,
        num_attention_heads=s.heads, num_query_groups=s.kv_heads, kv_channels=s.head_dim,
        vocab_size=s.vocab_size, max_position_embeddings=max_positions, tie_embeddings=s.tied,
        normalization="layernorm" if s.layernorm else "rmsnorm",
        qk_layernorm=bool(s.qk_norm), qk_norm_scope=s.qk_norm or "head", add_qkv_bias=s.qkv_bias,
        **(dict(sliding_window=s.window, num_sliding_window_layers=sliding) if sliding else {}),
        **(dict(num_experts=expert.experts, moe_router_topk=s.topk, moe_ffn_hidden_size=expert.expert_ffn,
                shared_expert_ffn_hidden_size=expert.shared_ffn, first_k_dense_layers=first_k,
                moe_layer_freq=freq) if expert else {}))


def check_fields(m: ModelSpec, s: Structure, where: str) -> Optional[str]:
    """None when ModelSpec `m` prices exactly the parameters of structure `s`; else the one-line reason."""
    diffs = compare(m, s)
    return f"{where}: read from its structure, {'; '.join(diffs)}" if diffs else None
