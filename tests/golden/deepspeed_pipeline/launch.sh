#!/usr/bin/env bash
# autoplan probe run: gpt2-small on 8 x h100, seq 1024, global batch 32
# strategy: tp1 pp2 mbs4 z1
# ds_train.py: a stand-in for gpt2-small built from model.json, on random tokens
# Usage: bash launch.sh [extra training-script args]   (MASTER_PORT from the environment)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MASTER_PORT="${MASTER_PORT:-29500}"

exec deepspeed --hostfile /dev/null --num_gpus 8 --master_port "$MASTER_PORT" \
  "$HERE/ds_train.py" --deepspeed_config "$HERE/ds_config.json" --model-json "$HERE/model.json" --seq-len 1024 --iters 10 "$@"
