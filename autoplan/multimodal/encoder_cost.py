"""Time and memory of the vision encoder and projector for one micro batch.

FLOPs reuse the language model's counts (autoplan/costmodel/flops.py) on the encoder written as a `ModelSpec`:
its GEMMs per patch are `attention_linear_flops_per_token` + `mlp_flops_per_token`; attention is bidirectional over
the patches of one image (`attention_core_flops_per_token` at 2n gives n keys per query; windowed layers attend to
`window_patches` keys). GEMMs run at the calibrated GEMM rate (costmodel/layers/base.py `gemm_time` terms: the
profile's MAMF efficiency x `gemm_scale` x the size term), attention at `attention_eff_fwd` x the GPU's
`attention_efficiency` with the head-dim term (costmodel/calibration.py). Backward: two GEMM passes (data and weight
gradients) and `attention_bwd_ratio` attention passes; a frozen part skips its weight gradients, and a part with no
trainable part in front of it skips its data gradients too (autograd computes neither).

Saved activations per patch and layer, bf16: the inputs of both norms, the qkv input, q, k and v, the attention
output, the MLP input, and the MLP's inner tensors (fc1 output and its activation; gate, up and their product when
gated): 8h + 2f (3f gated) elements. With f = 4h this is Korthikanti et al. 2022 (arXiv:2205.05198) eq. 1 with flash
attention and no dropout: 32 h bytes per token and layer."""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster import ClusterSpec
from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.costmodel.collectives import collective_time
from autoplan.costmodel.flops import (attention_core_flops_per_token, attention_linear_flops_per_token,
                                      mlp_flops_per_token)
from autoplan.costmodel.hardware import hardware_of
from autoplan.model import ModelSpec
from autoplan.multimodal.params import projector_params, vision_params
from autoplan.multimodal.spec import Freeze, ImageLoad, MultimodalSpec, VisionSpec

BF16 = 2
# Mixed-precision Adam per trainable parameter: fp32 main gradient (4) + fp32 master weight and two moments (12),
# as autoplan/costmodel/memory.py prices the language model's.
GRAD_BYTES, OPTIMIZER_BYTES = 4, 12


def encoder_as_model(v: VisionSpec) -> ModelSpec:
    """The encoder in ModelSpec terms, so the language model's FLOP counts apply to it."""
    return ModelSpec(name="vision", num_layers=v.num_layers, hidden_size=v.hidden_size,
                     ffn_hidden_size=v.ffn_hidden_size, num_attention_heads=v.num_heads,
                     num_query_groups=v.num_heads, kv_channels=v.hidden_size // v.num_heads, vocab_size=1,
                     max_position_embeddings=1, activation="swiglu" if v.gated_mlp else "gelu",
                     normalization=v.normalization, add_bias_linear=True)


@dataclass(frozen=True)
class EncoderFlops:
    gemm: float  # forward GEMM FLOPs (blocks, patch embedding, projector)
    attention: float  # forward attention FLOPs (QK^T and PV)
    patches: float


def image_flops(spec: MultimodalSpec, tokens_per_image: float) -> EncoderFlops:
    """Forward FLOPs of one image that becomes `tokens_per_image` language-model tokens."""
    v = spec.vision
    vm = encoder_as_model(v)
    n = tokens_per_image * v.patches_per_token
    if v.class_token:
        n += 1
    per_patch = attention_linear_flops_per_token(vm) + mlp_flops_per_token(vm, v.ffn_hidden_size)
    windowed = v.num_layers - v.full_attention_layers if v.window_patches else 0
    attn = (v.num_layers - windowed) * attention_core_flops_per_token(vm, 2 * n) + \
        windowed * attention_core_flops_per_token(vm, 2 * n, window=v.window_patches)
    embed = 2.0 * v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * v.hidden_size
    # The projector runs once per language token, i.e. per patches_per_token patches.
    proj = 2.0 * projector_params(spec.projector) / max(v.patches_per_token, 1)
    return EncoderFlops(gemm=n * (v.num_layers * per_patch + embed + proj), attention=n * attn, patches=n)


@dataclass(frozen=True)
class EncoderTime:
    fwd: float
    bwd: float
    tp_comm: float

    @property
    def total(self) -> float:
        return self.fwd + self.bwd + self.tp_comm


def _rates(spec: MultimodalSpec, cluster: ClusterSpec, cal: Calibration, tokens: float):
    hw = hardware_of(cluster)
    v = spec.vision
    harmonic = 3.0 / (1.0 / max(tokens, 1.0) + 1.0 / v.hidden_size + 1.0 / v.ffn_hidden_size)
    gemm_rate = hw.peak_flops_bf16 * hw.gemm_eff_bf16 * cal.gemm_scale * harmonic / (harmonic + cal.gemm_half_dim)
    d = v.hidden_size / v.num_heads
    head = (d / (d + cal.attention_head_dim_half)) / (128 / (128 + cal.attention_head_dim_half))
    attn_rate = hw.peak_flops_bf16 * cal.attention_eff_fwd * hw.attention_scale * head
    return hw, gemm_rate, attn_rate


def encoder_time(spec: MultimodalSpec, cluster: ClusterSpec, load: ImageLoad, samples: float, freeze: Freeze, *,
                 tp: int = 1, recompute: bool = False, cal: Calibration = DEFAULT) -> EncoderTime:
    """Seconds of the encoder and projector for `samples` samples of `load` on one rank of a `tp`-wide group
    (tp = 1: the whole tower on every rank, as Megatron-Bridge's Hugging Face towers run)."""
    images = samples * load.images_per_sample
    f = image_flops(spec, load.tokens_per_image)
    hw, gemm_rate, attn_rate = _rates(spec, cluster, cal, f.patches * images / tp)
    fwd = images * (f.gemm / gemm_rate + f.attention / attn_rate) / tp
    vision_trains, proj_trains = not freeze.vision_model, not freeze.vision_projection
    bwd = images * (2.0 * f.gemm / gemm_rate + cal.attention_bwd_ratio * f.attention / attn_rate) / tp \
        if vision_trains else 0.0
    if proj_trains and not vision_trains:  # only the projector's weight gradients
        bwd += images * 2.0 * projector_params(spec.projector) / max(spec.vision.patches_per_token, 1) * \
            f.patches / gemm_rate / tp
    if recompute and vision_trains:
        bwd += fwd
    comm = 0.0
    if tp > 1:  # Megatron-style TP: two all-reduces of the activations per layer forward, two backward
        size = f.patches * images * spec.vision.hidden_size * BF16
        one = float(collective_time("all_reduce", size, tp, tp > hw.domain_size, hw))
        comm = spec.vision.num_layers * one * (2 + (2 if vision_trains else 0))
    return EncoderTime(fwd=fwd, bwd=bwd, tp_comm=comm)


def activation_bytes(spec: MultimodalSpec, load: ImageLoad, samples: float, *, tp: int = 1,
                     recompute: bool = False, trains: bool = True) -> float:
    """Saved activations of one micro batch (see the module docstring); with recompute each layer keeps only its
    input, plus one layer's full set while it is recomputed; nothing when no part needs a backward pass."""
    if not trains:
        return 0.0
    v = spec.vision
    patches = samples * load.images_per_sample * (load.tokens_per_image * v.patches_per_token)
    full = (8 * v.hidden_size + (3 if v.gated_mlp else 2) * v.ffn_hidden_size) * BF16 / tp
    per_layer = full if not recompute else v.hidden_size * BF16
    held = v.num_layers * per_layer + (full if recompute else 0.0)
    return patches * held


@dataclass(frozen=True)
class EncoderMemory:
    weights: float
    grads: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations


def encoder_memory(spec: MultimodalSpec, load: ImageLoad, samples: float, freeze: Freeze, *, tp: int, dp: int,
                   distributed_optimizer: bool, in_flight: int, recompute: bool) -> EncoderMemory:
    """Bytes of the encoder and projector on one rank: bf16 weights (split over tp), fp32 gradients and Adam states
    of the trainable parts only (states split over dp with the distributed optimizer), and `in_flight` micro
    batches of saved activations."""
    vision, proj = vision_params(spec.vision), projector_params(spec.projector)
    trainable = (0 if freeze.vision_model else vision) + (0 if freeze.vision_projection else proj)
    shard = dp if distributed_optimizer else 1
    acts = in_flight * activation_bytes(spec, load, samples, tp=tp, recompute=recompute,
                                        trains=not freeze.vision_model)
    return EncoderMemory(weights=(vision + proj) * BF16 / tp, grads=trainable * GRAD_BYTES / tp,
                         optimizer=trainable * OPTIMIZER_BYTES / tp / shard, activations=acts)


def boundary_bytes(spec: MultimodalSpec, load: ImageLoad, samples: float) -> float:
    """Encoder output handed to the language model for `samples` samples: one bf16 vector of the language width per
    image token, per projector (DeepStack adds one per merger)."""
    return samples * load.image_tokens * spec.llm.hidden_size * BF16 * spec.projector.copies
