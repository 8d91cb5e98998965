#!/usr/bin/env bash
# autoplan training run: deepseek_v3_2 on 64 x h100, seq 4096, global batch 256
# strategy: tp2 pp1 ep32 etp1 mbs1 sp z1
# predicted: 1.000 s/step, 125 tokens/s/GPU, peak 10.0 GiB
# for Megatron-LM core_v0.19.0 (NVIDIA/Megatron-LM commit 5be9626709af2722333bf54797c954c09edeada3): its arguments.py accepts every flag here
# Submit from this folder: sbatch sbatch.sh   (needs MEGATRON_LM in the environment)
#SBATCH --job-name=autoplan-deepseek_v3_2
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
set -euo pipefail
RUN_DIR="${RUN_DIR:-$SLURM_SUBMIT_DIR}"
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_PORT="${MASTER_PORT:-6000}"
export NNODES="$SLURM_JOB_NUM_NODES" GPUS_PER_NODE=8 RUN_DIR

srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'NODE_RANK="$SLURM_NODEID" bash "$RUN_DIR/train.sh"'
