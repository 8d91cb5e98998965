"""The cost model: pure functions from (model, cluster, strategy, workload) to time and memory.

Modules: `hardware` (units to SI, once), `params` and `flops` (per-layer records), `collectives` (one alpha-beta
function), `compute`, `memory`, `pipeline`, and `estimate` (which combines them, vectorised over candidates)."""
