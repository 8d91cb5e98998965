#!/usr/bin/env bash
# Profile Llama-3-8B-like and Mixtral-8x7B-like layers on one H200 at TP-sharded shapes (tp 1,2,4,8; mbs 1,2;
# seq 4096,8192), bf16 and fp8 (fp8 only when Transformer Engine is installed), and write the profiles with all
# raw timings under $OUT (default ./gpu-profile-out). Budget: about 10 minutes on one H200; each step has its
# own time limit so a slow step cannot eat the rest.
#
# Run from the repository root:  OUT=/some/dir bash benchmarks/gpu_profile_h200.sh
# Afterwards copy $OUT/h200-*.json into profiles/measured/ to ship them (check their size first).
set -euo pipefail

OUT="${OUT:-$PWD/gpu-profile-out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
AUTOPLAN=(python -m autoplan.cli.main)
LOG="$OUT/gpu_profile_h200.log"

python - <<'EOF' 2>&1 | tee "$LOG"
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0),
      "capability", torch.cuda.get_device_capability(0))
try:
    import transformer_engine.pytorch  # noqa: F401
    print("transformer_engine: available (fp8 will be profiled)")
except ImportError:
    print("transformer_engine: not installed (fp8 will be skipped and noted in the profiles)")
EOF
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a "$LOG"

run() {  # run LIMIT_SECONDS CMD...: bounded step; a timeout is logged, the script goes on
    local limit="$1"; shift
    echo "+ $*" | tee -a "$LOG"
    local start=$SECONDS
    if timeout --signal=INT "$limit" "$@" 2>&1 | tee -a "$LOG"; then
        echo "step took $((SECONDS - start)) s" | tee -a "$LOG"
    else
        echo "step failed or hit its ${limit}s limit after $((SECONDS - start)) s" | tee -a "$LOG"
    fi
}

GRID=(--tp 1,2,4,8 --mbs 1,2 --seq 4096,8192 --dtype bf16,fp8 --device cuda --repeats 10 --warmup 3
      --gpu-id h200)

# Dense: attention (GQA 32/8 heads), SwiGLU MLP, embedding and LM head + cross-entropy (vocab 128256).
run 240 "${AUTOPLAN[@]}" profile --model llama3-8b "${GRID[@]}" --out "$OUT/h200-llama3-8b.json"

# MoE: 8 experts top-2 at expert-parallel 1 and 8 (one rank's E/ep experts, balanced load); the attention,
# embedding and head of Mixtral differ from Llama-3-8B only in vocabulary and rope base.
run 240 "${AUTOPLAN[@]}" profile --model mixtral-8x7b "${GRID[@]}" --ep 1,8 --out "$OUT/h200-mixtral-8x7b.json"

# Interpolation accuracy on held-out shapes (small model, so it fits in the remaining time).
run 90 python benchmarks/profile_accuracy.py --device cuda --quick --repeats 10 --out "$OUT"

ls -la "$OUT" | tee -a "$LOG"
