"""slime launch arguments for an RL plan (THUDM/slime @ 624b824a: slime/utils/arguments.py, the Megatron arguments
it passes through and SGLang's server arguments with the --sglang- prefix; scripts/run-deepseek-r1.sh shows the
same flags). `--rollout-num-gpus-per-engine` is SGLang's tp_size, i.e. the engine's GPUs (tp x dp here); with
dp > 1 the attention runs data-parallel (--sglang-enable-dp-attention --sglang-dp-size)."""
from __future__ import annotations

from typing import Dict, List

from autoplan import keys as K
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.rl.rollout import state_layers
from autoplan.rl.spec import RLJob


def arguments(plan, model: ModelSpec, job: RLJob, model_path: str, gpus_per_node: int) -> List[str]:
    from autoplan.rl.emit_verl import pools

    s, lay, pl = plan.strategy, plan.rollout, plan.placement
    if job.staleness is not None or job.require_batches is not None:  # verl fully-async settings; slime has none
        raise InputError("--staleness / --require-batches are verl fully-async settings that slime has no flag "
                         "for; drop them or pass --emit verl")
    nodes, per_node, _, _ = pools(pl, min(gpus_per_node, pl.gpus))
    a = ["--hf-checkpoint", model_path,
         "--actor-num-nodes", str(nodes), "--actor-num-gpus-per-node", str(per_node),
         "--rollout-batch-size", str(job.prompts), "--n-samples-per-prompt", str(job.samples),
         "--rollout-max-response-len", str(job.max_response_len),
         "--global-batch-size", str(job.sequences // job.mini_batches),
         "--advantage-estimator", "grpo" if job.algo == "grpo" else "ppo",
         *(arg for key in ("tp", "pp", "cp", "ep", "etp") for arg in K.valued(key, getattr(s, key))),
         "--use-dynamic-batch-size", "--max-tokens-per-gpu",
         str(job.micro_batch_tokens or job.prompt_len + job.max_response_len)]
    if s.sp:
        a += K.written("sp")
    if s.last_stage_layers is not None:
        a += K.valued("last_stage_layers", s.last_stage_layers)
    if s.recompute == "full":
        a += K.valued("recompute", "full") + K.valued("recompute_method", "uniform") + K.valued("recompute_layers", 1)
    elif s.recompute == "selective":
        a += K.valued("recompute", "selective")
        if s.recompute_modules:
            a += [K.flag("recompute_modules"), *s.recompute_modules]
    if job.use_ref:
        # slime_validate_args (slime/utils/arguments.py) refuses a KL loss without --ref-load, the reference
        # model's Megatron checkpoint; slime's scripts name it after the HF checkpoint with a _torch_dist suffix
        # (scripts/run-qwen3-30B-A3B.sh CKPT_ARGS: --hf-checkpoint /root/Qwen3-30B-A3B, --ref-load
        # /root/Qwen3-30B-A3B_torch_dist).
        a += ["--use-kl-loss", "--ref-load", f"{model_path.rstrip('/')}_torch_dist"]
    if plan.offload in ("optimizer", "all"):
        a += ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"]
    if pl.kind == "colocated":
        a.append("--colocate")
    else:
        a += ["--rollout-num-gpus", str(pl.rollout_gpus)]
    a += ["--rollout-num-gpus-per-engine", str(lay.gpus_per_engine),
          "--sglang-mem-fraction-static", str(lay.gpu_memory_utilization)]
    if lay.dp > 1:
        a += ["--sglang-enable-dp-attention", "--sglang-dp-size", str(lay.dp)]
    if lay.ep > 1:
        a += ["--sglang-ep-size", str(lay.ep)]
    if not lay.cuda_graphs:
        a.append("--sglang-disable-cuda-graph")
    if not lay.radix_cache:
        a.append("--sglang-disable-radix-cache")
    if model.mamba_ssm_dtype and state_layers(model):
        # the recurrent state's dtype the rollout was priced with (autoplan/rl/rollout.py ssm_state_bytes): SGLang
        # reads the checkpoint config's mamba_ssm_dtype itself, the flag carries a value set with --set too
        a += ["--sglang-mamba-ssm-dtype", model.mamba_ssm_dtype]
    return a


def render(plan, model: ModelSpec, job: RLJob, model_path: str, gpus_per_node: int) -> Dict[str, str]:
    args = arguments(plan, model, job, model_path, gpus_per_node)
    pairs, i = [], 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            pairs.append(args[i])
            i += 1
    body = " \\\n    ".join(pairs)
    script = ("#!/usr/bin/env bash\n"
              f"# slime: {plan.placement.kind} placement, predicted step {plan.step_time_s:.1f} s\n"
              "# MODEL_ARGS: the model's Megatron arguments (slime scripts/models/<model>.sh)\n"
              "set -euo pipefail\n"
              "# Megatron's validation requires it with tp or cp > 1 (megatron/training/arguments.py); slime's own\n"
              "# scripts set it for every run (scripts/run-qwen3-30B-A3B.sh RUNTIME_ENV_JSON)\n"
              "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
              f"python3 train.py ${{MODEL_ARGS[@]}} \\\n    {body} \"$@\"\n")
    return {"slime_args.txt": "\n".join(args) + "\n", "run_slime.sh": script}
