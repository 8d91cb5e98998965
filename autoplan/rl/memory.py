"""Memory of an RL step per phase: GPU memory while generating and while training, and the host RAM the offloaded
states take on a node.

- Colocated, while the engine generates: what training leaves on the GPU (offload "all" or "swap": nothing, verl's
  param_offload + grad_offload + optimizer_offload, slime's torch_memory_saver; "optimizer": weights and gradients;
  "none": weights, gradients and optimizer states) beside the engine's memory (`rollout.rollout_gpu_bytes`). While
  training: the engine sleeps (vLLM sleep mode: KV cache freed, weights discarded at level 2 or moved to the host
  at level 1; SGLang release_memory_occupation), so training has the GPU.
- Colocated, while the weights are synced into the engine (verl `ActorRolloutRefWorker.rollout_mode`,
  verl/workers/megatron_workers.py lines 676-736 at b178a3cd): the actor's weights come back to the GPU when
  offloaded (`load_megatron_model_to_gpu(..., load_grad=False)`, line 682), the engine's weights are resumed, the
  weights pass through one bucket of update_weights_bucket_megabytes (refit.BUCKET_BYTES; vllm_rollout.py
  `ServerAdapter.update_weights` allocates it on the GPU, lines 156-158), and only after the actor's weights are
  offloaded again (line 732) is the KV cache resumed: `refit_bytes`.
- Split: each pool holds only its own phase.
- Host RAM per node: the ranks on the node times what each keeps on the host: CPU Adam states (fp32 param, grad, m,
  v: train.CPU_ADAM_STATE_BYTES_PER_PARAM) when the optimizer is offloaded; bf16 weights and the gradients when
  offload is "all"; the reference model's weights (verl ref param_offload) and, when colocated, the sleeping
  engine's weights if it keeps them on the host (rollout.WEIGHTS_ON_HOST_ASLEEP; the caller passes 0 otherwise).
  The peak rank's figures stand for every rank on the node, which never under-counts."""
from __future__ import annotations

import numpy as np

from autoplan.rl.train import CPU_ADAM_STATE_BYTES_PER_PARAM, TrainPhases


def resident_during_rollout(tp: TrainPhases, i: int, offload: str) -> float:
    """Bytes training leaves on a GPU while a colocated engine generates: its process's CUDA context and NCCL
    buffers always (the worker lives on), and the states its offload setting keeps."""
    context = float(tp.context_bytes[i])
    if offload in ("all", "swap"):
        return context
    kept = context + float(tp.weights_bytes[i] + tp.grads_bytes[i])
    return kept if offload == "optimizer" else kept + float(tp.optimizer_bytes[i])


def refit_bytes(tp: TrainPhases, i: int, offload: str, engine_weight_bytes: float, engine_runtime_bytes: float,
                bucket_bytes: float) -> float:
    """GPU bytes of a colocated refit (see module doc): what training keeps, its weights brought back when they
    were offloaded, the engine's weights and runtime memory, one transfer bucket; no KV cache yet."""
    back = float(tp.weights_bytes[i]) if offload in ("all", "swap") else 0.0
    return resident_during_rollout(tp, i, offload) + back + engine_weight_bytes + engine_runtime_bytes + bucket_bytes


def host_bytes_per_rank(tp: TrainPhases, i: int, offload: str, colocated: bool, use_ref: bool,
                        engine_weight_bytes: float) -> float:
    params = float(tp.params_per_gpu[i])
    host = 0.0
    if offload in ("optimizer", "all"):
        host += params * CPU_ADAM_STATE_BYTES_PER_PARAM
    if offload in ("all", "swap"):
        host += float(tp.weights_bytes[i] + tp.grads_bytes[i])
    if offload == "swap":
        host += float(tp.optimizer_bytes[i])
    if colocated:
        host += engine_weight_bytes
        if use_ref:
            host += float(tp.weights_bytes[i])
    return host


def fits_device(needed_bytes: float, capacity_bytes: float) -> bool:
    return bool(np.isfinite(needed_bytes) and needed_bytes <= capacity_bytes)
