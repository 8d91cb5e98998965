"""Hugging Face configs with a `vision_config` -> `MultimodalSpec`: the vision tower and projector read here, the
language model by autoplan/hf_config.py from the text part. Field names and defaults follow transformers 4.57
(configuration_qwen2_5_vl.py, configuration_qwen3_vl.py, configuration_qwen3_vl_moe.py, configuration_qwen3_5.py,
configuration_qwen3_5_moe.py, configuration_kimi_k25.py, configuration_llava.py, configuration_clip.py,
configuration_siglip.py, configuration_gemma3.py) and OpenGVLab's configuration_internvl_chat.py /
configuration_intern_vit.py for `internvl_chat`."""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Tuple

from pydantic import ValidationError

from autoplan.errors import InputError
from autoplan.hf_config import SUPPORTED_MODEL_TYPES
from autoplan.hf_fields import Config
from autoplan.model import ModelSpec
from autoplan.multimodal.spec import MultimodalSpec, ProjectorSpec, VisionSpec

# LlamaConfig defaults (configuration_llama.py): llava-hf configs list only what differs from them.
LLAMA_DEFAULTS = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      max_position_embeddings=2048, vocab_size=32000)
# CLIPVisionConfig defaults (configuration_clip.py).
CLIP_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                     image_size=224, patch_size=32, num_channels=3)
# SiglipVisionConfig defaults (configuration_siglip.py).
SIGLIP_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       image_size=224, patch_size=16, num_channels=3)


def is_multimodal(cfg: Mapping[str, Any]) -> bool:
    return isinstance(cfg.get("vision_config"), Mapping)


def _section(cfg: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = cfg.get(key)
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: model_type {cfg.get('model_type')!r} needs a {key!r} mapping, which is missing; "
                         f"fix the config")
    return value


def _llm(text: Mapping[str, Any], model_type: str, name: str, where: str) -> ModelSpec:
    from autoplan.modelio import from_hf_config

    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InputError(f"{where}: the language model's model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    return from_hf_config({**text, "model_type": model_type}, name, where=f"{where} (language model)")


def _grid(value: Any) -> int:
    """image_size / patch_size may be an int or [h, w] (square images only)."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise InputError(f"non-square size {value!r} is not supported; use a square image or patch size")
        value = value[0]
    return int(value)


def _qwen2_5_vl(cfg, name, where) -> Tuple[VisionSpec, ProjectorSpec, ModelSpec]:
    v = Config(_section(cfg, "vision_config", where), "qwen2_5_vl", f"{where} vision_config")
    text = cfg.get("text_config") or cfg  # transformers >= 4.50 nests text_config; released configs are flat
    llm = _llm(text, "qwen2", name, where)
    h, merge, patch = v.int_req("hidden_size"), v.int_opt("spatial_merge_size", 2), v.int_opt("patch_size", 14)
    window_side = v.int_opt("window_size", 112) // patch  # modeling_qwen2_5_vl.py get_window_index: in patches
    full = v.get("fullatt_block_indexes", [7, 15, 23, 31])
    vision = VisionSpec(
        family="qwen2_5_vl", num_layers=v.int_req("depth"), hidden_size=h,
        ffn_hidden_size=v.int_req("intermediate_size"), num_heads=v.int_req("num_heads"), gated_mlp=True,
        normalization="rmsnorm", patch_size=patch,
        temporal_patch_size=v.int_opt("temporal_patch_size", 2), in_channels=v.int_opt("in_chans", 3),
        patch_bias=False, window_patches=window_side ** 2, full_attention_layers=len(full),
        patches_per_token=merge ** 2)
    proj = ProjectorSpec(norm_width=h, norm_bias=False, widths=(h * merge ** 2, h * merge ** 2,
                         v.int_req("out_hidden_size")), bias=True)
    return vision, proj, llm


# The language model's reader for each Qwen3-VL-style model_type. The vision tower is the same in all four
# (modeling_qwen3_vl.py, modeling_qwen3_vl_moe.py, modeling_qwen3_5.py, modeling_qwen3_5_moe.py: Qwen3VL-style
# VisionModel and PatchMerger); Qwen3.5's lists no deepstack layers.
QWEN3_VL_TEXT = {"qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3_vl_moe_text", "qwen3_5": "qwen3_5_text",
                 "qwen3_5_moe": "qwen3_5_moe_text"}


def _qwen3_vl(cfg, name, where):
    v = Config(_section(cfg, "vision_config", where), "qwen3_vl", f"{where} vision_config")
    # tie_word_embeddings sits at the top level of released Qwen3-VL configs (false in 8B, true in 2B/4B).
    text = {"tie_word_embeddings": cfg.get("tie_word_embeddings", False), **_section(cfg, "text_config", where)}
    llm = _llm(text, QWEN3_VL_TEXT[cfg["model_type"]], name, where)
    h, merge = v.int_req("hidden_size"), v.int_opt("spatial_merge_size", 2)
    indexes = v.get("deepstack_visual_indexes", [])
    if not isinstance(indexes, list):
        raise InputError(f"{where}: vision_config deepstack_visual_indexes={indexes!r} must be a list of layer "
                         f"indices; fix the config")
    deepstack = len(indexes)
    vision = VisionSpec(
        family="qwen3_vl", num_layers=v.int_req("depth"), hidden_size=h, ffn_hidden_size=v.int_req("intermediate_size"),
        num_heads=v.int_req("num_heads"), gated_mlp=False, normalization="layernorm",
        patch_size=v.int_opt("patch_size", 16), temporal_patch_size=v.int_opt("temporal_patch_size", 2),
        in_channels=v.int_opt("in_channels", 3), patch_bias=True,
        position_embeddings=v.int_opt("num_position_embeddings", 2304), patches_per_token=merge ** 2,
        deepstack_layers=deepstack)
    wide = h * merge ** 2
    proj = ProjectorSpec(norm_width=h, norm_bias=True, widths=(wide, wide, v.int_req("out_hidden_size")), bias=True,
                         copies=1 + deepstack, deepstack_norm_width=wide)
    return vision, proj, llm


def _internvl_chat(cfg, name, where):
    raw = _section(cfg, "vision_config", where)
    v = Config(raw, "intern_vit_6b", f"{where} vision_config")
    text = _section(cfg, "llm_config", where)
    llm = _llm(text, str(text.get("model_type")), name, where)
    if raw.get("qk_normalization"):
        raise InputError(f"{where}: vision_config qk_normalization=true (InternViT-6B) is not supported; "
                         f"InternViT-300M towers are")
    h = v.int_req("hidden_size")
    image, patch = _grid(cfg.get("force_image_size") or v.int_req("image_size")), _grid(v.int_req("patch_size"))
    ratio = float(cfg.get("downsample_ratio", 0.5))
    shuffle = round(1 / ratio) ** 2  # pixel shuffle: 1/ratio^2 patches per token (modeling_internvl_chat.py)
    vision = VisionSpec(
        family="internvit", num_layers=v.int_req("num_hidden_layers"), hidden_size=h,
        ffn_hidden_size=v.int_req("intermediate_size"), num_heads=v.int_req("num_attention_heads"), gated_mlp=False,
        normalization="rmsnorm" if raw.get("norm_type") == "rms_norm" else "layernorm", patch_size=patch,
        in_channels=v.int_opt("num_channels", 3), patch_bias=True, position_embeddings=(image // patch) ** 2 + 1,
        class_token=True, layer_scale=True, patches_per_token=shuffle)
    proj = ProjectorSpec(norm_width=h * shuffle, norm_bias=True, widths=(h * shuffle, llm.hidden_size,
                         llm.hidden_size), bias=True)
    return vision, proj, llm


def _vit(raw: Mapping[str, Any], family: str, defaults: Dict[str, int], where: str) -> Tuple[Dict[str, Any], int]:
    """The shape fields shared by CLIP and SigLIP towers, and the patches per image."""
    v = Config({**defaults, **raw}, family, f"{where} vision_config")
    image, patch = _grid(v.req("image_size")), _grid(v.req("patch_size"))
    return dict(num_layers=v.int_req("num_hidden_layers"), hidden_size=v.int_req("hidden_size"),
                   ffn_hidden_size=v.int_req("intermediate_size"), num_heads=v.int_req("num_attention_heads"),
                   gated_mlp=False, normalization="layernorm", patch_size=patch,
                   in_channels=v.int_opt("num_channels", 3)), (image // patch) ** 2


def _tower(raw, where):
    """A LLaVA-style tower: CLIP (class token, no conv bias, pre and post LayerNorm) or SigLIP (conv bias, post
    LayerNorm, no class token)."""
    kind = raw.get("model_type", "clip_vision_model")
    if kind == "clip_vision_model":
        fields, patches = _vit(raw, kind, CLIP_DEFAULTS, where)
        return VisionSpec(family="clip", patch_bias=False, position_embeddings=patches + 1, class_token=True,
                          final_norms=2, patches_per_token=1, **fields), patches + 1
    if kind == "siglip_vision_model":
        fields, patches = _vit(raw, kind, SIGLIP_DEFAULTS, where)
        return VisionSpec(family="siglip", patch_bias=True, position_embeddings=patches, final_norms=1,
                          pooling_head=bool(raw.get("vision_use_head", True)),  # SiglipVisionConfig default True
                          patches_per_token=1, **fields), patches
    raise InputError(f"{where}: vision_config model_type {kind!r} is not supported; supported: clip_vision_model, "
                     f"siglip_vision_model")


def _llava(cfg, name, where):
    text = dict(_section(cfg, "text_config", where))
    text_type = str(text.get("model_type", "llama"))
    if text_type == "llama":
        text = {**LLAMA_DEFAULTS, **text}
    llm = _llm(text, text_type, name, where)
    vision, _ = _tower(_section(cfg, "vision_config", where), where)
    layers = cfg.get("vision_feature_layer", -2)
    n_features = len(layers) if isinstance(layers, list) else 1
    # LLaVA-OneVision adds a learned image_newline vector of the text width (modeling_llava_onevision.py).
    proj = ProjectorSpec(norm_width=0, norm_bias=False, widths=(vision.hidden_size * n_features, llm.hidden_size,
                         llm.hidden_size), bias=bool(cfg.get("multimodal_projector_bias", True)),
                         newline_width=llm.hidden_size if cfg.get("model_type") == "llava_onevision" else 0)
    return vision, proj, llm


def _gemma3(cfg, name, where):
    from autoplan.modelio import from_hf_config

    llm = from_hf_config(cfg, name, where=f"{where} (language model)")  # the gemma3 parser reads text_config
    vision, patches = _tower(_section(cfg, "vision_config", where), where)
    tokens = int(cfg.get("mm_tokens_per_image", 256))
    vision = vision.model_copy(update=dict(patches_per_token=patches // tokens))  # avg-pooled to mm_tokens_per_image
    # Gemma3MultiModalProjector: RMSNorm over the vision width, then one matrix (no bias) to the text width.
    proj = ProjectorSpec(norm_width=vision.hidden_size, norm_bias=False, widths=(vision.hidden_size, llm.hidden_size),
                         bias=False)
    return vision, proj, llm


def _kimi_k25(cfg, name, where):
    """Kimi-K2.5 (modeling_kimi_k25.py): a MoonViT tower (Conv2d patches with a bias, a learned 2-D position grid of
    init_pos_emb_height x width, LayerNorm pre-norm blocks with biased q/k/v/o and a GELU fc1/fc2 MLP, a final
    LayerNorm; 2-D rotary attention) and a patch merger (LayerNorm over the tower width, then Linear(4h, 4h), GELU,
    Linear(4h, text width), biased) over 2 x 2 patches; the language model is Kimi-K2's (DeepSeek-V3 blocks)."""
    raw = _section(cfg, "vision_config", where)
    v = Config(raw, "kimi_k25_vision", f"{where} vision_config")
    if raw.get("mm_projector_type", "patchmerger") != "patchmerger":
        raise InputError(f"{where}: vision_config mm_projector_type={raw.get('mm_projector_type')!r} is not "
                         f"supported; supported: patchmerger")
    text = {"tie_word_embeddings": cfg.get("tie_word_embeddings", False), **_section(cfg, "text_config", where)}
    llm = _llm(text, str(text.get("model_type", "kimi_k2")), name, where)
    h = v.int_req("vt_hidden_size")
    kernel = v.get("merge_kernel_size", [2, 2])
    sizes = list(kernel) if isinstance(kernel, (list, tuple)) else []
    merge = sizes[0] * sizes[1] if len(sizes) == 2 and all(isinstance(k, int) and not isinstance(k, bool)
                                                           and k > 0 for k in sizes) else 0
    if merge <= 0:
        raise InputError(f"{where}: vision_config merge_kernel_size={kernel!r} must be two positive sizes; fix the "
                         f"config")
    vision = VisionSpec(
        family="moonvit", num_layers=v.int_req("vt_num_hidden_layers"), hidden_size=h,
        ffn_hidden_size=v.int_req("vt_intermediate_size"), num_heads=v.int_req("vt_num_attention_heads"),
        gated_mlp=False, normalization="layernorm", patch_size=_grid(v.int_req("patch_size")), patch_bias=True,
        position_embeddings=v.int_opt("init_pos_emb_height", 64) * v.int_opt("init_pos_emb_width", 64),
        final_norms=1, patches_per_token=merge)
    proj = ProjectorSpec(norm_width=v.int_opt("mm_hidden_size", h), norm_bias=True,
                         widths=(h * merge, h * merge, v.int_opt("text_hidden_size", llm.hidden_size)), bias=True)
    return vision, proj, llm


READERS: Dict[str, Callable[..., Tuple[VisionSpec, ProjectorSpec, ModelSpec]]] = {
    "qwen2_5_vl": _qwen2_5_vl,
    "qwen3_vl": _qwen3_vl,
    "qwen3_vl_moe": _qwen3_vl,
    "qwen3_5": _qwen3_vl,
    "qwen3_5_moe": _qwen3_vl,
    "internvl_chat": _internvl_chat,
    "llava": _llava,
    "llava_onevision": _llava,
    "gemma3": _gemma3,
    "kimi_k25": _kimi_k25,
}
NOT_READ = {
    "kimi_k3": "Kimi-K3's language model (KimiLinearForCausalLM: linear-attention layers) and its patchmergerv2 "
               "projector are not read",
    "llama4": "Llama-4's vision tower (llama4_vision_model) is not read; `autoplan plan --model` prices its "
              "language model (text_config) alone",
    "internvl": "the transformers-native InternVL layout (model_type internvl) is not read; pass the OpenGVLab "
                "release config (model_type internvl_chat)",
}


def read_multimodal(cfg: Mapping[str, Any], name: str, where: str) -> MultimodalSpec:
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type in NOT_READ:
        raise InputError(f"{where}: model_type {model_type!r} is not supported: {NOT_READ[model_type]}")
    reader = READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        raise InputError(f"{where}: multimodal model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(READERS)}")
    try:
        vision, proj, llm = reader(cfg, name, where)
    except ValidationError as e:  # a vision_config value the tower's spec refuses (a zero patch size, ...)
        from autoplan.modelio import validation_message

        model = VisionSpec if e.title == VisionSpec.__name__ else ProjectorSpec
        raise InputError(validation_message(e, f"{where} vision_config", model)) from None
    # The text reader's note that a gemma3 config's vision tower goes unpriced does not hold here.
    notes = tuple(n for n in (llm.notes or ()) if "vision tower" not in n)
    return MultimodalSpec(name=name, model_type=model_type, vision=vision, projector=proj, llm=llm, notes=notes)


def load_multimodal(path: str) -> MultimodalSpec:
    from pathlib import Path

    from autoplan.modelio import _name_for, _read_mapping, hub_config

    cached = hub_config(path)  # a Hub id (`Qwen/Qwen3-VL-8B-Instruct`) read from the local cache
    p = cached or Path(path)
    if not p.is_file():
        raise InputError(f"--model {path!r}: no such file; pass a Hugging Face config.json with a vision_config")
    cfg = _read_mapping(p)
    if not is_multimodal(cfg):
        raise InputError(f"--model {path}: no vision_config in this config; `autoplan plan` plans text models")
    return read_multimodal(cfg, path.split("/")[1] if cached else _name_for(p), str(p))
