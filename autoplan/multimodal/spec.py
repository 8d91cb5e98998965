"""What a vision-language model and its image data are: frozen specs, one fact each."""
from __future__ import annotations

from typing import Literal, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoplan.model import ModelSpec

VisionFamily = Literal["qwen2_5_vl", "qwen3_vl", "internvit", "clip", "siglip", "moonvit"]


class VisionSpec(BaseModel):
    """A ViT encoder: pre-norm blocks over image patches (attention is bidirectional within one image)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: VisionFamily = Field(description="Which tower: fixes the small shapes each family adds.")
    num_layers: int = Field(gt=0, description="Encoder blocks (HF depth / num_hidden_layers).")
    hidden_size: int = Field(gt=0, description="Encoder width.")
    ffn_hidden_size: int = Field(gt=0, description="MLP inner width (per branch when gated).")
    num_heads: int = Field(gt=0, description="Attention heads.")
    gated_mlp: bool = Field(description="Gated MLP (gate, up, down) instead of fc1, fc2.")
    normalization: Literal["rmsnorm", "layernorm"] = Field(description="Norm kind (LayerNorm carries a bias).")
    patch_size: int = Field(gt=0, description="Pixels per patch side.")
    temporal_patch_size: int = Field(1, gt=0, description="Frames per patch (Qwen's Conv3d; 1 = Conv2d).")
    in_channels: int = Field(3, gt=0, description="Image channels.")
    patch_bias: bool = Field(description="The patch-embedding convolution has a bias.")
    position_embeddings: int = Field(0, ge=0, description="Learned position vectors (0 = rotary only).")
    class_token: bool = Field(False, description="A learned class token is prepended (CLIP, InternViT).")
    layer_scale: bool = Field(False, description="Per-channel layer scale on both residual branches (InternViT).")
    final_norms: int = Field(0, ge=0, description=(
        "Norms over the width outside the blocks (CLIP pre and post, SigLIP post)."))
    pooling_head: bool = Field(False, description=(
        "SigLIP's attention-pooling head (vision_use_head): parameters counted, its one-query attention not timed."))
    window_patches: int = Field(0, ge=0, description="Patches per attention window on windowed layers; 0 = none.")
    full_attention_layers: int = Field(0, ge=0, description="Layers with full attention when windowed.")
    patches_per_token: int = Field(gt=0, description="Encoder patches merged into one language-model token.")
    deepstack_layers: int = Field(0, ge=0, description="Qwen3-VL DeepStack: layers whose features get a merger.")


class ProjectorSpec(BaseModel):
    """The vision-to-language projector (merger): an optional norm, then linear layers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    norm_width: int = Field(ge=0, description="Width of the norm in front (0 = none).")
    norm_bias: bool = Field(description="The norm carries a bias (LayerNorm).")
    widths: Tuple[int, ...] = Field(description="in, hidden..., out widths of the linear layers.")
    bias: bool = Field(description="The linear layers carry biases.")
    copies: int = Field(1, ge=1, description="How many such projectors (1 + Qwen3-VL DeepStack mergers).")
    deepstack_norm_width: int = Field(0, ge=0, description="Norm width of the DeepStack mergers (post-shuffle).")
    newline_width: int = Field(0, ge=0, description="LLaVA-OneVision's learned image_newline vector (0 = none).")


class MultimodalSpec(BaseModel):
    """A vision encoder, its projector and a language model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    model_type: str = Field(description="HF model_type of the whole model (qwen2_5_vl, llava, ...).")
    vision: VisionSpec
    projector: ProjectorSpec
    llm: ModelSpec
    notes: Tuple[str, ...] = ()


class Freeze(BaseModel):
    """Which parts train (Megatron-Bridge's freeze_vision_model, freeze_vision_projection, freeze_language_model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vision_model: bool = False
    vision_projection: bool = False
    language_model: bool = False


class ImageLoad(BaseModel):
    """Images in one sample and language-model tokens per image (after the merge)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    images_per_sample: float = Field(ge=0)
    tokens_per_image: float = Field(ge=0)

    @property
    def image_tokens(self) -> float:
        return self.images_per_sample * self.tokens_per_image


class ImageData(BaseModel):
    """The image distribution: its mean and a tail point (the step the pipeline must not stall on)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mean: ImageLoad
    tail: ImageLoad
    tail_percentile: float = Field(gt=0, lt=100)
    source: str = Field("", description="Where the numbers came from (flags or a histogram file).")
    histogram: Optional[Tuple[Tuple[float, float, float], ...]] = Field(
        None, description="(images per sample, tokens per image, weight) rows when read from a histogram.")

    @model_validator(mode="after")
    def _tail_not_below_mean(self):
        if self.tail.image_tokens < self.mean.image_tokens:
            raise ValueError(f"tail image tokens per sample ({self.tail.image_tokens:g}) must not be below the mean "
                             f"({self.mean.image_tokens:g})")
        return self
