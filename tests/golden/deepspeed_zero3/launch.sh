#!/usr/bin/env bash
# autoplan training run: llama3-8b on 16 x h100, seq 4096, global batch 64
# strategy: tp1 pp1 mbs2 z3 rc-full1u
# Usage: bash launch.sh [extra training-script args]
# HOSTFILE, MASTER_ADDR and MASTER_PORT come from the environment when set.
# The hostfile's nodes must reach each other with passwordless ssh (DeepSpeed's pdsh launcher).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HOSTFILE="${HOSTFILE:-$HERE/hostfile}"
if [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then
  HOSTFILE="$(mktemp)"
  scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 2 \
    | awk 'NR < 2 {print $1" slots=8"} NR == 2 {print $1" slots=8"}' > "$HOSTFILE"
fi
MASTER_ADDR="${MASTER_ADDR:-$(grep -v '^#' "$HOSTFILE" | head -n 1 | cut -d' ' -f1)}"
MASTER_PORT="${MASTER_PORT:-29500}"

# Model: MODEL_CONFIG=<HF config.json or its folder> (fresh weights) or PRETRAINED=<HF checkpoint folder or id>.
# Data: DATA_PATH=<prefix> of a Megatron-LM indexed dataset, prefix.bin + prefix.idx (tools/preprocess_data.py).
# Checkpoints: CHECKPOINT_DIR (default ./checkpoints beside this script) every SAVE_INTERVAL steps; a rerun resumes.
: "${DATA_PATH:?set DATA_PATH to the prefix of a tokenized .bin/.idx dataset}"
if [[ -n "${PRETRAINED:-}" ]]; then MODEL_ARGS=(--pretrained "$PRETRAINED")
else MODEL_ARGS=(--model-config "${MODEL_CONFIG:?set MODEL_CONFIG (a Hugging Face config.json) or PRETRAINED}"); fi
CHECKPOINT_DIR="${CHECKPOINT_DIR:-$HERE/checkpoints}"
SAVE_INTERVAL="${SAVE_INTERVAL:-500}"
ITERS="${ITERS:-1000}"

exec deepspeed --hostfile "$HOSTFILE" --num_nodes 2 \
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
  "$HERE/ds_hf_train.py" --deepspeed_config "$HERE/ds_config.json" "${MODEL_ARGS[@]}" --data-path "$DATA_PATH" --seq-len 4096 --iters "$ITERS" --checkpoint-dir "$CHECKPOINT_DIR" --save-interval "$SAVE_INTERVAL" --recompute full "$@"
