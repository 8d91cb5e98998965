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

exec deepspeed --hostfile "$HOSTFILE" --num_nodes 2 \
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
  "$HERE/ds_train.py" --deepspeed_config "$HERE/ds_config.json" --model-json "$HERE/model.json" --seq-len 4096 --iters 1000 --recompute full --recompute-method uniform --recompute-layers 1 "$@"
