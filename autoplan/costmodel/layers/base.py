"""What every layer kind is priced with: the rank's share of a micro batch (`Shard`), one GEMM, an elementwise
pass, the per-op cost of a CUDA-graph part, the bytes of a saved GEMM input, and the mix of low-precision and bf16
layers.

GEMM shapes follow Megatron-LM's tensor-parallel layers (Shoeybi et al. 2019, sec. 3: column-parallel QKV/FC1,
row-parallel output/FC2) and MoE parallel folding (Liu et al. 2025, arXiv:2504.14960: experts sharded by ep x etp,
tokens routed by all-to-all). Times: GEMMs at a shape-dependent efficiency, elementwise work at HBM bandwidth, plus
a per-kernel launch floor."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autoplan import cuda_graphs as G
from autoplan.costmodel.calibration import Calibration
from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.layout import QUANTISED_BYTES, Layouts
from autoplan.model import ModelSpec


BF16 = 2  # bytes


FP32 = 4


FP8 = 1


@dataclass(frozen=True)
class Shard:
    """Per-rank sizes derived from a layout (arrays over candidates)."""

    tokens: np.ndarray  # tokens through a layer on this rank, one micro batch: mbs * seq / cp
    tokens_sp: np.ndarray  # tokens held between TP regions (tokens / tp with sequence parallel)
    heads: np.ndarray  # query heads per rank
    groups: np.ndarray  # KV heads per rank (replicated when groups < tp)
    expert_tokens: np.ndarray  # routed token copies computed by this rank's experts
    local_experts: np.ndarray
    routed_tokens: np.ndarray  # tokens this rank's router sees and dispatches: its own, sharded over tp


def shard_of(m: ModelSpec, lay: Layouts, seq_len: int) -> Shard:
    tokens = lay.mbs * seq_len / lay.cp
    tokens_sp = np.where(lay.sp, tokens / lay.tp, tokens)
    heads = m.num_attention_heads / lay.tp
    groups = np.maximum(m.num_query_groups / lay.tp, 1.0)
    # Each rank routes its own (SP-sharded) tokens; with etp > 1 the expert-TP group gathers them.
    routed_tokens = np.where(lay.tp > 1, tokens / lay.tp, tokens)
    if m.is_moe:
        expert_tokens = routed_tokens * m.moe_router_topk * lay.etp
        local_experts = m.num_experts / lay.ep
    else:
        expert_tokens = np.zeros_like(tokens)
        local_experts = np.zeros_like(tokens)
    return Shard(tokens, tokens_sp, heads, groups, expert_tokens, local_experts, routed_tokens)


def gemm_time(mm, nn, kk, lay: Layouts, hw: Hardware, cal: Calibration, fp8=None, eff_scale=1.0,
              norm_fused_input=False, dy_rows=None):
    """Seconds of one (mm x kk) @ (kk x nn) GEMM: compute at a size-dependent efficiency, HBM roofline, the FP8 /
    FP4 casts of its operands (`cast_bytes`: `norm_fused_input`, `dy_rows`), launch floor."""
    mm, nn, kk = (np.asarray(x, dtype=float) for x in (mm, nn, kk))
    flops = 2.0 * mm * nn * kk
    use_fp8 = lay.fp8 if fp8 is None else fp8
    use_fp4 = lay.fp4 & np.asarray(use_fp8, dtype=bool)  # NVFP4 runs the GEMMs an FP8 recipe would
    peak = np.where(use_fp8, hw.peak_flops_fp8 * hw.gemm_eff_fp8, hw.peak_flops_bf16 * hw.gemm_eff_bf16)
    peak = np.where(use_fp4, hw.peak_flops_fp4 * hw.gemm_eff_fp4 * (1 - cal.fp4_overhead), peak)
    harmonic = 3.0 / (1.0 / np.maximum(mm, 1) + 1.0 / np.maximum(nn, 1) + 1.0 / np.maximum(kk, 1))
    size_eff = harmonic / (harmonic + cal.gemm_half_dim)
    size_eff = size_eff * np.where(use_fp8, reduction_efficiency(mm, nn, kk, cal.lowp_gemm_half_k), 1.0)
    t_compute = flops / (peak * cal.gemm_scale * size_eff * eff_scale)
    t_memory = BF16 * (mm * kk + kk * nn + mm * nn) / (hw.hbm_bytes_per_s * cal.hbm_eff)
    t_cast = np.where(use_fp8, cast_bytes(mm, nn, kk, lay.quant_bytes, norm_fused_input, dy_rows), 0.0) / \
        (hw.hbm_bytes_per_s * cal.hbm_eff)
    return np.maximum(t_compute, t_memory) + t_cast + cal.kernel_overhead_s


def cast_bytes(mm, nn, kk, quant_bytes, norm_fused_input=False, dy_rows=None):
    """HBM bytes of the FP8 / FP4 casts of one GEMM's operands, as a forward equivalent (a third of the forward +
    backward total: the caller prices backward as twice the forward). TransformerEngine's Linear quantises its
    input x (mm x kk) in the forward and the output gradient dy (mm x nn) in the backward, each read in bf16 and
    written twice at the recipe's bytes per element (`quant_bytes`, scales included): row-wise for the forward /
    input-gradient GEMM and column-wise for the weight-gradient GEMM (transformer_engine/pytorch/module/linear.py:
    the input and grad-output quantizers set both usages; Hopper's FP8 GEMMs need the transposed copy, Blackwell's
    MXFP8 / NVFP4 blocks run along the reduction dimension). Weights are cast once per step and cached across micro
    batches (`is_first_microbatch`), so they are left out; so is per-tensor current scaling's separate amax pass.
    A norm fused into the GEMM's input (LayerNormLinear) writes x already quantised: only dy is cast then. A
    row-parallel GEMM under sequence parallelism casts its rank's shard of dy before the all-gather (`dy_rows`, the
    sequence-parallel tokens; TransformerEngine gathers the quantised gradient)."""
    per_element = BF16 + 2.0 * np.asarray(quant_bytes, dtype=float)
    x_elements = 0.0 if norm_fused_input else mm * kk
    dy_elements = (mm if dy_rows is None else dy_rows) * nn
    return per_element * (x_elements + dy_elements) / 3.0


REFERENCE_K = 8192.0  # reduction dimension at which reduction_efficiency is 1 (GPU profiles' MAMF shapes are large)


def reduction_efficiency(mm, nn, kk, half_k: float):
    """Rate of a low-precision GEMM's forward, its input gradient and its weight gradient relative to k = 8192,
    as one forward-equivalent factor (the caller prices backward as twice the forward): each of the three GEMMs
    reduces over its own dimension (forward kk, input gradient nn, weight gradient mm) and runs at
    d / (d + half_k) normalised at REFERENCE_K (calibration.lowp_gemm_half_k), so the factor is the harmonic mean
    of the three."""
    ref = REFERENCE_K / (REFERENCE_K + half_k)

    def slowdown(d):
        d = np.maximum(np.asarray(d, dtype=float), 1.0)
        return ref * (d + half_k) / d

    return 3.0 / (slowdown(kk) + slowdown(nn) + slowdown(mm))


def elementwise_time(num_bytes, hw: Hardware, cal: Calibration, kernels):
    return num_bytes / (hw.hbm_bytes_per_s * cal.hbm_eff) + kernels * cal.kernel_overhead_s


def scoped(cal: Calibration, lay: Layouts, part: str) -> Calibration:
    """`cal` with the per-op cost of the ops of `part` (a key of autoplan.cuda_graphs.COVERED_BY): the host's
    dispatch of each op (`kernel_overhead_s`) unless the candidate captures that part in a CUDA graph, whose replay
    launches its kernels with no host work (`graph_kernel_s`)."""
    if not np.any(lay.cuda_graph_modules):
        return cal
    return replace(cal, kernel_overhead_s=np.where(G.captured(lay.cuda_graph_modules, part), cal.graph_kernel_s,
                                                   cal.kernel_overhead_s))


def kernel_costs(lay: Layouts, cal: Calibration, counts) -> np.ndarray:
    """Fixed cost of `counts` ((part, kernels) pairs) of memory-bound kernels, each at its part's per-op cost."""
    return sum(k * scoped(cal, lay, part).kernel_overhead_s for part, k in counts)


@dataclass(frozen=True)
class LayerTime:
    """Forward seconds of one decoder layer, by part; backward is derived (2x GEMMs, attention ratio)."""

    attn_gemm: np.ndarray
    attn_core: np.ndarray
    mlp_gemm: np.ndarray
    elementwise: np.ndarray
    scan: np.ndarray = 0.0  # Mamba-2 SSD scan of hybrid models (autoplan/costmodel/mamba.py)

    @property
    def fwd(self):
        return self.attn_gemm + self.attn_core + self.mlp_gemm + self.elementwise + self.scan

    def bwd(self, cal: Calibration):
        # dgrad + wgrad: two GEMMs per forward GEMM; flash backward ~attention_bwd_ratio x forward; the SSD scan's
        # backward kernels are tiled like flash attention's and take the same ratio (assumed).
        return 2.0 * (self.attn_gemm + self.mlp_gemm + self.elementwise) + \
            cal.attention_bwd_ratio * (self.attn_core + self.scan)


def without_low_precision(lay: Layouts) -> Layouts:
    """`lay` with every GEMM in bf16 (the layers an FP8/FP4 recipe leaves in bf16)."""
    return replace(lay, fp8=np.zeros_like(lay.fp8), fp4=np.zeros_like(lay.fp4))


def module_layouts(m: ModelSpec, lay: Layouts, module: str) -> Layouts:
    """`lay` for the GEMMs of `module` (autoplan.model.QUANT_OVERRIDE_MODULES) under the model's per-module
    quantization recipe (Megatron-Core quant_recipe, megatron/core/extensions/transformer_engine.py
    `_get_fp8_autocast_for_quant_recipe`): bf16 (`ModelSpec.bf16_modules`: fp8_autocast(enabled=False)), or MXFP8
    where the run quantises (`ModelSpec.mxfp8_modules`: MXFP8BlockScaling, so FP8 rate, MXFP8 casts and saved
    inputs instead of NVFP4's); otherwise the run's recipe."""
    if module in m.bf16_modules:
        return without_low_precision(lay)
    if module in m.mxfp8_modules:
        return replace(lay, fp4=np.zeros_like(lay.fp4), fp8_delayed=np.zeros_like(lay.fp8_delayed),
                       quant_bytes=np.where(lay.fp8, QUANTISED_BYTES["mxfp8"], lay.quant_bytes))
    return lay


def mix_bf16_layers(m: ModelSpec, lay: Layouts, per_layer):
    """`per_layer(layouts)` (a tuple of per-candidate arrays) averaged over the layers an FP8/FP4 recipe runs in low
    precision and those `ModelSpec.bf16_first_layers/bf16_last_layers` keep in bf16, by their share of the model.
    That is exact on a rank holding every layer (pp = 1); a pipeline stage's own share is not known here, so there
    the larger of the two is taken (for memory, an upper bound)."""
    low, high = per_layer(lay), per_layer(without_low_precision(lay))
    f = m.bf16_layer_fraction
    return tuple(np.where(lay.pp == 1, (1 - f) * a + f * b, np.maximum(a, b)) for a, b in zip(low, high))


def gemm_input_bytes(lay: Layouts):
    """Bytes per element of a saved GEMM input: TransformerEngine's Linear / LayerNormLinear / GroupedLinear save
    the quantised input (not the bf16 one) for the weight-gradient GEMM when FP8/FP4 is on
    (transformer_engine/pytorch/module/linear.py `ctx.save_for_backward(inputmat, ...)` after quantisation), its
    scales included (`lay.quant_bytes`: 1 for per-tensor scaling, + 1/32 for MXFP8, 0.5625 for NVFP4)."""
    return np.where(lay.fp8, lay.quant_bytes, BF16)


def norm_linear_input_bytes(lay: Layouts):
    """Bytes per element of the normalised input a fused norm + linear (TransformerEngine LayerNormLinear: Megatron's
    QKV, dense FC1 and Mamba in_proj) saves for its weight gradient: the local, pre-gather shard, as
    `gemm_input_bytes`, except under NVFP4 with sequence parallelism, where it keeps both its row- and column-wise
    copies (transformer_engine/pytorch/module/layernorm_linear.py forward: `ln_out.update_usage(rowwise_usage=False)`
    only for MXFP8 / blockwise storage or without the all-gather; NVFP4 needs the column-wise copy, its quantizer
    not supporting a row-wise-only gather), 2 x 0.5625 bytes; TE 2.8-2.20 alike."""
    return np.where(lay.fp4 & lay.sp, 2.0 * lay.quant_bytes, gemm_input_bytes(lay))


def dropout_mask_bytes(m: ModelSpec, elements):
    """One byte per element of a hidden-dropout mask (Korthikanti Table 2); none at p = 0: torch's dropout
    returns its input unchanged when p = 0 and saves no mask (torch/nn/functional.py `dropout`,
    aten native_dropout). Attention dropout stores no mask under flash attention (Dao et al. 2022 sec. 3.1:
    regenerated from the RNG state)."""
    return elements if m.hidden_dropout > 0 else 0.0 * elements
