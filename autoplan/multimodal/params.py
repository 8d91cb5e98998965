"""Parameter counts of the vision tower and the projector, from the Hugging Face modelling files of each family
(transformers 4.57: modeling_qwen2_5_vl.py Qwen2_5_VisionTransformerPretrainedModel / Qwen2_5_VLPatchMerger,
modeling_qwen3_vl.py Qwen3VLVisionModel / Qwen3VLVisionPatchMerger, modeling_clip.py CLIPVisionTransformer,
modeling_siglip.py SiglipVisionTransformer, modeling_gemma3.py Gemma3MultiModalProjector, modeling_llava.py
LlavaMultiModalProjector; InternViT: OpenGVLab's modeling_intern_vit.py InternVisionModel and the `mlp1` projector
of modeling_internvl_chat.py). Every linear layer of these towers carries a bias (qkv, proj, fc1/fc2 or
gate/up/down). The language model is counted by autoplan/costmodel/params.py."""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.costmodel.params import count_parameters
from autoplan.multimodal.spec import MultimodalSpec, ProjectorSpec, VisionSpec


def norm_params(width: int, layernorm: bool) -> int:
    return width * (2 if layernorm else 1)


def vision_block_params(v: VisionSpec) -> int:
    """One encoder block: qkv + output projection with biases, the MLP with biases, two norms, layer scale."""
    h, f = v.hidden_size, v.ffn_hidden_size
    attention = 4 * h * h + 4 * h
    mlp = 3 * h * f + 2 * f + h if v.gated_mlp else 2 * h * f + f + h
    norms = 2 * norm_params(h, v.normalization == "layernorm")
    scale = 2 * h if v.layer_scale else 0
    return attention + mlp + norms + scale


def vision_embedding_params(v: VisionSpec) -> int:
    """Patch embedding (a convolution over in_channels x temporal x patch x patch), learned positions, class
    token, and the norms outside the blocks."""
    h = v.hidden_size
    conv = v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * h + (h if v.patch_bias else 0)
    extra = v.final_norms * norm_params(h, v.normalization == "layernorm")
    return conv + v.position_embeddings * h + (h if v.class_token else 0) + extra


def pooling_head_params(v: VisionSpec) -> int:
    """SiglipMultiheadAttentionPoolingHead (modeling_siglip.py): a probe vector, nn.MultiheadAttention (in_proj 3h x h
    and out_proj h x h, with biases), a LayerNorm and a biased fc1/fc2 MLP."""
    if not v.pooling_head:
        return 0
    h, f = v.hidden_size, v.ffn_hidden_size
    return h + (4 * h * h + 4 * h) + 2 * h + (2 * h * f + f + h)


def vision_params(v: VisionSpec) -> int:
    return v.num_layers * vision_block_params(v) + vision_embedding_params(v) + pooling_head_params(v)


def _linears(widths, bias: bool) -> int:
    return sum(a * b + (b if bias else 0) for a, b in zip(widths, widths[1:]))


def projector_params(p: ProjectorSpec) -> int:
    """The main projector plus the DeepStack mergers (same linears, their own post-shuffle LayerNorm)."""
    main = norm_params(p.norm_width, p.norm_bias) + _linears(p.widths, p.bias)
    deepstack = (p.copies - 1) * (norm_params(p.deepstack_norm_width, p.norm_bias) + _linears(p.widths, p.bias))
    return main + deepstack + p.newline_width


@dataclass(frozen=True)
class ParamSplit:
    vision: int
    projector: int
    language: int

    @property
    def total(self) -> int:
        return self.vision + self.projector + self.language


def param_split(spec: MultimodalSpec) -> ParamSplit:
    return ParamSplit(vision_params(spec.vision), projector_params(spec.projector), count_parameters(spec.llm)[0])
