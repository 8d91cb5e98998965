#!/usr/bin/env bash
# autoplan training run: gpt2-small on 8 x h100, seq 1024, global batch 32
# strategy: tp1 pp2 mbs4 z1
# Usage: bash launch.sh [extra training-script args]   (HOSTFILE, MASTER_ADDR, MASTER_PORT from the environment)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HOSTFILE="${HOSTFILE:-$HERE/hostfile}"
if [[ -n "${SLURM_JOB_NODELIST:-}" && 1 -gt 1 ]]; then
  HOSTFILE="$(mktemp)"
  scontrol show hostnames "$SLURM_JOB_NODELIST" | sed 's/$/ slots=8/' > "$HOSTFILE"
fi
MASTER_ADDR="${MASTER_ADDR:-$(grep -v '^#' "$HOSTFILE" | head -n 1 | cut -d' ' -f1)}"
MASTER_PORT="${MASTER_PORT:-29500}"

exec deepspeed --hostfile "$HOSTFILE" --num_nodes 1 --num_gpus 8 \
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
  "$HERE/ds_train.py" --deepspeed_config "$HERE/ds_config.json" --model-json "$HERE/model.json" --seq-len 1024 --iters 1000 "$@"
