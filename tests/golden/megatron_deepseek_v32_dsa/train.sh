#!/usr/bin/env bash
# autoplan training run: deepseek_v3_2 on 64 x h100, seq 4096, global batch 256
# strategy: tp2 pp1 ep32 etp1 mbs1 sp z1
# predicted: 1.000 s/step, 125 tokens/s/GPU, peak 10.0 GiB
# for Megatron-LM core_v0.19.0 (NVIDIA/Megatron-LM commit 5be9626709af2722333bf54797c954c09edeada3): its arguments.py accepts every flag here
# Usage: MEGATRON_LM=/path/to/Megatron-LM [NNODES=.. NODE_RANK=.. MASTER_ADDR=..] bash train.sh [extra args]
# Real data: set DATA_PATH (and TOKENIZER_MODEL, optionally TOKENIZER_TYPE); otherwise mock data is used.
# Checkpoints: CHECKPOINT_DIR (default ./checkpoints beside this script), every SAVE_INTERVAL iterations.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (the folder holding pretrain_gpt.py)}"
NNODES=${NNODES:-8}
NODE_RANK=${NODE_RANK:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
export CUDA_DEVICE_MAX_CONNECTIONS=1  # TP/CP on pre-Blackwell GPUs (Megatron validate_args)
INFO="$MEGATRON_LM/megatron/core/package_info.py"
FOUND="$(sed -n 's/^MAJOR = //p' "$INFO" 2>/dev/null || true).$(sed -n 's/^MINOR = //p' "$INFO" 2>/dev/null || true)"
if [[ "$FOUND" != "0.19" ]]; then
  echo "warning: megatron_args.txt was checked against Megatron-LM core_v0.19.0; $MEGATRON_LM is version $FOUND," >&2
  echo "  whose parser may reject or rename flags; re-emit with --megatron-version" >&2
fi

CHECKPOINT_DIR="${CHECKPOINT_DIR:-$HERE/checkpoints}"  # --save/--load in megatron_args.txt
SAVE_INTERVAL="${SAVE_INTERVAL:-500}"  # --save-interval, iterations

# megatron_args.txt holds one flag per line in shell quoting; each line is read as shell words.
ARGS=()
while IFS= read -r line || [[ -n "$line" ]]; do
  [[ -z "$line" || "$line" == "#"* ]] && continue
  if [[ -n "${DATA_PATH:-}" && ( "$line" == "--mock-data" || "$line" == "--tokenizer-type "* ) ]]; then continue; fi
  eval "ARGS+=($line)"
done < "$HERE/megatron_args.txt"
if [[ -n "${DATA_PATH:-}" ]]; then
  ARGS+=(--data-path $DATA_PATH --tokenizer-type "${TOKENIZER_TYPE:-HuggingFaceTokenizer}"
         --tokenizer-model "${TOKENIZER_MODEL:?set TOKENIZER_MODEL with DATA_PATH}")
fi

exec torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$GPUS_PER_NODE" \
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
  "$MEGATRON_LM/pretrain_gpt.py" "${ARGS[@]}" "$@"
