"""The cost model by layer kind, each module importing only those before it: `base` (the rank's shard, one GEMM,
an elementwise pass, saved-input bytes), `dense` (attention and the dense MLP), `moe` (the expert block, on
`dense`), `mamba` (a hybrid's Mamba, attention, MLP and MoE layers, on `dense` and `moe`), `mixers` (Gated DeltaNet,
gated, chunked and DeepSeek-sparse attention and a parallel Mamba mixer inside a standard layer, on `mamba`) and
`mtp` (the multi-token-prediction depths, on `mamba`). Parameter counts of every kind are in
`costmodel/params.py`, which imports none of them."""
