"""The profiler: measures per-layer forward/backward time, activation and weight memory, GEMM throughput and
collective bandwidth on the local device, and writes a versioned `MeasuredProfile` that the cost model reads.

Modules: `schema` (the profile's pydantic models, no torch), `interpolate` (log-log lookup, numpy only),
`layers` (one rank's TP/EP shard of each layer kind in PyTorch), `timing` (timers and memory probes), `gemm`
(GEMM shapes and their throughput), `run` (the profiling grid), `comm` (collectives under torchrun) and `fp8`
(Transformer Engine detection). Only `schema` and `interpolate` are imported by the cost model; the others import
torch, which is an optional extra (`pip install autoplan[torch]`).

Layer kinds and what they hold (per decoder layer, one micro batch of `mbs` sequences of `seq` tokens, one rank):
- "attention": input norm + QKV (or MLA down/up) projections + rotary + causal SDPA + output projection.
- "mlp": pre-MLP norm + dense MLP (SwiGLU or GELU).
- "moe": pre-MLP norm + router + top-k + token permutation + grouped expert GEMMs + shared experts + combine.
- "embedding": word (+ learned position) embedding lookup, once per model.
- "head": final norm + LM head + cross-entropy, once per model.
Norms are folded into the layer that follows them, so there is no separate "norm" kind.
"""
