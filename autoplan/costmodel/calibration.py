"""Efficiency constants of the analytic model. Each states where its starting value came from; the values marked
'fitted' were fitted once over the published-runs set by `benchmarks/calibrate.py` (global constants, one set for
every row; no per-row factor) and the figures it printed are recorded in `benchmarks/README.md`."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Calibration:
    # GEMM: achieved = peak * MAMF efficiency (gpu profile) * gemm_scale * k/(k + gemm_half_dim) where k is the
    # GEMM's harmonic mean dimension; the saturating form models tile/wave quantisation of skinny GEMMs
    # (Calculon, Isaev et al. SC'23, uses a similar size-dependent efficiency table).
    gemm_scale: float = 0.82  # refitted 2026-12-03 with FP8 casts as traffic and measured Blackwell attention (was 0.90)
    gemm_half_dim: float = 212.0  # refitted 2026-12-03, off its bound since the casts are traffic (was 400, at its bound)
    # FP8 / FP4 GEMMs lose rate as their reduction dimension k shrinks, k / (k + lowp_gemm_half_k) normalised at
    # k = 8192 (compute.reduction_efficiency): each output tile pays a fixed prologue and epilogue beside a main loop
    # that grows with k. Measured, not fitted: DeepGEMM's published H800 FP8 tables
    # (profiles/microbenchmarks/grouped_gemm_deepgemm_h800_fp8.yaml) run (m, 7168, 2048) GEMMs at 0.79-0.85 of the
    # rate of (m, 4096, 7168) ones of the same m, where the shape term alone gives 0.97; least squares over the three
    # such pairs with the shape term above (at the gemm_half_dim above; 536 at 400) gives 589 (benchmarks/microbench.py
    # `lowp_gemm_half_k`). Applied to FP8 and
    # FP4 GEMMs on every GPU (that Blackwell's FP8 / FP4 kernels lose the same share is assumed, not measured); bf16 GEMMs get
    # none: torchao's published B200 bf16 GEMMs (pytorch/ao PR #2427) run within 4.3% of one rate from k = 3072 to
    # 8192 (profiles/microbenchmarks/gemm_square_torchao_b200.yaml).
    lowp_gemm_half_k: float = 589.0
    # Flash-attention forward, fraction of the bf16 peak at head dim 128 on H100 (other GPUs scale it by their
    # profile's attention_efficiency). Measured, not fitted: FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608)
    # Fig. 5, panel "Attention forward speed, head dim 128 (H100 80GB SXM5)", BF16, sequence 8k: cuDNN
    # (TransformerEngine's fused-attention backend, which Megatron uses) 600 TFLOP/s, FlashAttention-3 646, of 989
    # -> 0.61 (cuDNN); pytorch/benchmark commit ff65cb67 measures FlashAttention-3 at 621 TFLOP/s for (1, 16,
    # 16384, 128). The transcription read does not say whether that panel is the causal or the non-causal one (the
    # paper gives both; non-causal peaks higher, up to 740 TFLOP/s), so 0.61 may sit a little above the causal rate
    # priced here. Was fitted (0.60 on all rows; 0.46 on the training rows, which hold no long sequence). The Mamba-2
    # SSD scan's FLOP rate uses it too (layers/mamba.py; the scan is priced by its HBM traffic in every published row).
    # Backward is ~2.5x the forward FLOPs (recomputes P) at slightly lower efficiency.
    attention_eff_fwd: float = 0.61
    attention_bwd_ratio: float = 2.5
    # Head-dim dependence of that efficiency, d / (d + attention_head_dim_half) normalised at d = 128: FA3 Fig. 5
    # (H100, causal fwd, 8k) gives ~0.75x at d = 64 and ~1.15x at d = 256; d0 = 64 reproduces both.
    attention_head_dim_half: float = 64.0
    # Grouped expert GEMMs run below dense GEMMs (MegaBlocks, Gale et al. 2023, sec. 6).
    grouped_gemm_eff: float = 0.68  # refitted 2026-12-03 with FP8 casts as traffic and measured attention (was 0.64)
    # Rows per expert at which a grouped expert GEMM runs at half its large-m rate (compute.grouped_token_efficiency;
    # MegaBlocks sec. 5.1). 0 = no dependence on tokens per expert beyond the dense GEMM size term. Measured, not
    # fitted: DeepGEMM's published grouped-GEMM tables (H800 FP8, 256 to 8192 rows per expert;
    # profiles/microbenchmarks/grouped_gemm_deepgemm_h800_fp8.yaml) are matched best with m0 = 33 beside the shape
    # term at the gemm_half_dim above (m0 = 0 at 400; benchmarks/microbench.py: least squares over m0 >= 0). Was 450,
    # fitted on the published runs.
    grouped_gemm_half_tokens: float = 33.0
    # Memory-bound elementwise work: fraction of HBM peak reached (torchao roofline uses 0.92 on H100).
    hbm_eff: float = 0.80
    # Fixed cost per op (GPU launch floor and the host's dispatch of the op in eager PyTorch), s; paid by every GEMM
    # (each local expert's GEMM on its own, compute.moe_gemm_time) and every elementwise kernel not captured in a
    # CUDA graph (captured ones pay graph_kernel_s below). The fit lands well
    # above a bare launch (a few us): small ops are host-bound in eager mode (TransformerEngine issue #1499:
    # GroupedLinear's time is dominated by PyTorch op overheads on the CPU; issue #2897: hundreds of us of host
    # work per grouped MLP block on GB200). Cross-check, not used in the fit: TransformerEngine PR #3134 measures
    # 32 us per expert GEMM issued by its per-expert grouped GEMM on SM100 (8 experts x 128 tokens in 0.267 ms vs
    # 0.069 ms as one kernel; profiles/microbenchmarks/grouped_linear_multistream_sm100_nvfp4.yaml,
    # benchmarks/microbench.py).
    kernel_overhead_s: float = 3.0e-5  # refitted 2026-12-03 with CUDA graphs priced, at its bound (was 26 us)
    # Fixed cost per op replayed from a CUDA graph (Strategy.cuda_graph_modules): no host dispatch, only the GPU's
    # launch of each kernel node. Measured, not fitted: NVIDIA developer blog "Getting Started with CUDA Graphs"
    # (A. Gray, 2019): 20 kernels of 2.9 us each take 3.8 us per kernel streamed and 3.4 us per kernel replayed
    # from a graph, i.e. 0.5 us per graph node (a V100-era figure; no Hopper / Blackwell figure was found).
    graph_kernel_s: float = 0.5e-6
    # Fraction of TP communication hidden when tp_comm_overlap is on (userbuffers overlap; Megatron-LM
    # docs, "Communication overlaps"); the rest is exposed.
    tp_overlap_hidden: float = 0.95  # refitted 2026-12-02 (at its bound)
    # Fraction of EP all-to-all hidden with moe_a2a_overlap (DeepSeek-V3 DualPipe / Megatron 1F1B a2a overlap).
    a2a_overlap_hidden: float = 0.75  # refitted 2026-12-03 (was 0.88); the hidden part is also capped by MoE compute
    # Flex token dispatcher (DeepEP / HybridEP) bottleneck bandwidths as fractions of the link rates, counted as
    # collectives.flex_all_to_all_time counts bytes. Measured, not fitted: DeepEP V1 normal kernels on H800
    # (profiles/gpu_reference.md sec. 3 rows "H800 intra-/inter-node EP all-to-all", S3: deepseek-ai/DeepEP
    # docs/legacy.md): NVLink 153 (dispatch) and 158 (combine) GB/s at EP8 of H800's 200 GB/s per direction
    # (profiles/gpus/h800.yaml) -> 155.5 / 200 = 0.78; RDMA 43, 43 (EP16), 58, 57 (EP32), 51, 50 (EP64) GB/s of the
    # CX7 400 Gb/s NIC's 50 GB/s -> mean 50.3 / 50 = 1.01 (above 1: DeepEP counts the tokens bound for the own node
    # in its RDMA bytes, as the pricing does).
    flex_nvlink_eff: float = 0.78
    flex_network_eff: float = 1.01
    # Fraction of the last-microbatch backward (forward) during which DP grad reduce (param gather) can overlap.
    dp_overlap_window: float = 0.85
    # Megatron's default DP bucket is 40M parameters (megatron/core/distributed/distributed_data_parallel_config.py
    # bucket_size = max(40M, 1M * dp)); the last bucket is always exposed.
    dp_bucket_params: float = 40e6
    # Adam step: bytes moved per locally-owned parameter (read fp32 param, grad, m, v; write param, m, v,
    # bf16 copy): 4*4 + 3*4 + 2 = 30.
    optimizer_bytes_per_param: float = 30.0
    # FP8 GEMMs also pay their operands' casts: priced as HBM traffic per GEMM (layers/base.cast_bytes), not as a share
    # of the GEMM time (a flat 10% until 2026-12-03).
    # NVFP4 GEMMs (Blackwell, 16-element blocks with an FP8 scale each plus a per-tensor scale) pay more per
    # GEMM than their casts' traffic: amax, two-level scaling and the random Hadamard transform of the wgrad inputs (NVIDIA,
    # "Pretraining Large Language Models with NVFP4", arXiv:2509.25149) are memory-bound passes while the
    # GEMM itself is twice as fast. Fraction of the FP4 GEMM rate lost to them (the GEMM's own rate is the profiles'
    # measured NVFP4 fraction, b200.yaml); no published microbenchmark separates the casts, so it is fitted with the
    # other constants (benchmarks/calibrate.py; the hold-out check refits it on the training rows only).
    fp4_overhead: float = 0.26  # refitted 2026-12-03 with the casts priced as traffic (was 0.34; 0.47 over the assumed FP4 rate)
    # Memory terms, GiB.
    cuda_context_gib: float = 0.6  # CUDA context + cuBLAS/cuDNN workspaces not seen by the caching allocator
    nccl_gib_per_group: float = 0.15  # NCCL buffers per communicator (NCCL_BUFFSIZE 4 MiB x channels x peers)
    # Caching-allocator overhead, fraction of activations + logits + transients. Measured on one H200 (torch 2.11,
    # cu130; `python -m benchmarks.allocator_fragmentation`, benchmarks/results/allocator_fragmentation_h200_2026-12-04.txt)
    # as (peak reserved - peak allocated) / activation peak: 0.172-0.177 with the default allocator, 0.093-0.119 with
    # expandable segments. Those are upper bounds (reserved includes cached blocks the allocator frees and retries
    # before an out-of-memory error), and the published recipes bound it from the other side: at the measured upper
    # bounds 16 of 169 published recipes that ran (Llama3-70B on 64 GB200/GB300, Llama3.1-405B on 256 GB200) would be
    # predicted not to fit by 1.4-7.2% (benchmarks/README.md, "Fragmentation allowance"). The allowance stays at 8%
    # (none with expandable segments) until a measurement under memory pressure (alloc retries > 0) separates the two.
    fragmentation: float = 0.08
    fragmentation_expandable: float = 0.0


DEFAULT = Calibration()


def with_overrides(**kwargs) -> Calibration:
    return replace(DEFAULT, **kwargs)
