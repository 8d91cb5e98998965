"""The cost model: pure functions from (model, cluster, strategy, workload) to time and memory.

Modules, each importing only those listed before it:
- `hardware` (units to SI, once), `calibration` (the fitted constants), `layout` (strategies as arrays over
  candidates), `params` (parameter counts of every layer kind) and `flops` (model FLOPs per token);
- `collectives` (one alpha-beta function per collective), `schedule` (the pipeline bubble), `stages` (layers per
  pipeline stage);
- `layers/` by layer kind: `base` (the rank's shard, one GEMM, an elementwise pass), `dense`, `moe`, `mamba`,
  `mtp`;
- `compute` (per-layer forward time, head, embedding, recompute) and `memory` (saved activations, logits, model
  state), which combine the layer kinds;
- `measured` (a measured layer profile, in place of the analytic layer times);
- `rank` (one pipeline rank's time and memory, `rank_cost`) and `estimate` (`evaluate`, vectorised over
  candidates, and the `Estimate` of one).
"""
