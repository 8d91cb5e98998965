"""What each training engine can express, as pure checks shared by the emitters, the importers and the search.

`deepspeed_unsupported(strategy, model)` (one strategy, for the emitter and `estimate`) and `deepspeed_blocked`
(a column of candidates, for the search under `--engine deepspeed`) read one list of rules (autoplan/deepspeed_rules.py,
written in the rule book's two forms), so the search returns only what the DeepSpeed emitter writes; they only read
fields (no engine import, no I/O)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import numpy as np

from autoplan import deepspeed_rules as DS
from autoplan.cluster import GpuSpec
from autoplan.errors import InputError, did_you_mean
from autoplan.model import ModelSpec
from autoplan.layout_rules import Env, holds, strategy_view
from autoplan.strategy import Strategy
from autoplan.validate import is_blackwell


# Top-level keys DeepSpeed reads, from deepspeed 0.19.8: runtime/constants.py, runtime/config.py
# (DeepSpeedConfig._initialize_params), runtime/precision_config.py, runtime/activation_checkpointing/config.py,
# runtime/swap_tensor/constants.py, profiling/constants.py, autotuning/constants.py, monitor/config.py,
# comm/config.py, compression/constants.py, runtime/data_pipeline/constants.py, elasticity/constants.py.
# DeepSpeed ignores any other top-level key without a word, so a typo would silently drop a setting.
DEEPSPEED_TOP_LEVEL_KEYS = frozenset({
    "activation_checkpointing", "aio", "amp", "autotuning", "bf16", "bfloat16", "checkpoint", "comet",
    "comms_logger", "communication_data_type", "compile", "compression_training", "csv_monitor",
    "curriculum_learning", "data_efficiency", "data_types", "dataloader_drop_last", "datastates_ckpt",
    "disable_allgather", "disable_python_gc", "dump_state", "eigenvalue", "elasticity", "expert_parallel",
    "flops_profiler", "fp16", "gradient_accumulation_steps", "gradient_allreduce_op", "gradient_clipping",
    "gradient_predivide_factor", "graph_harvesting", "hybrid_engine", "log_level", "managed_gradient_accumulation",
    "memory_breakdown", "nebula", "optimizer", "pipeline", "prescale_gradients", "progressive_layer_drop",
    "quantize_training", "scheduler", "seq_parallel_communication_data_type", "sequence_parallel_size",
    "sparse_attention", "sparse_gradients", "steps_per_print", "tensor_parallel", "tensorboard", "timers",
    "torch_autocast", "train_batch_size", "train_micro_batch_size_per_gpu", "use_data_before_expert_parallelism",
    "vocabulary_size", "wall_clock_breakdown", "wandb", "weight_quantization", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "zero_optimization",
})


def check_deepspeed_keys(config: Dict[str, Any], source: str = "ds_config") -> None:
    """Reject top-level keys DeepSpeed does not know (it would ignore them silently)."""
    unknown = sorted(set(config) - DEEPSPEED_TOP_LEVEL_KEYS)
    if unknown:
        key = unknown[0]
        raise InputError(f"{source}: unknown DeepSpeed config key {key!r}"
                         f"{did_you_mean(key, DEEPSPEED_TOP_LEVEL_KEYS)}; DeepSpeed would ignore it silently, "
                         f"remove or fix it")


def ignored_deepspeed_keys(config: Dict[str, Any], source: str = "ds_config") -> List[str]:
    """Notes for the top-level keys of a user's config that DeepSpeed ignores (an example's own settings such as
    `cuda_visible_devices` or `bert_model_config`): nothing DeepSpeed runs depends on them. A key that is a near
    miss of one DeepSpeed reads (`zero_optimisation`) is refused instead: the setting it meant would be lost."""
    import difflib

    notes = []
    for key in sorted(set(config) - DEEPSPEED_TOP_LEVEL_KEYS):
        near = difflib.get_close_matches(key.lower(), sorted(DEEPSPEED_TOP_LEVEL_KEYS), n=1, cutoff=0.8)
        if near:
            raise InputError(f"{source}: unknown DeepSpeed config key {key!r}; did you mean {near[0]!r}? DeepSpeed "
                             f"would ignore it silently, remove or fix it")
        notes.append(f"{source}: key {key!r} is not a DeepSpeed setting (DeepSpeed ignores it); not priced")
    return notes


def is_blackwell_or_newer(gpu: GpuSpec) -> bool:
    """Whether the GPU is compute capability 10 or later (Blackwell). Megatron-LM's validate_args drops its
    CUDA_DEVICE_MAX_CONNECTIONS=1 requirement from this architecture on (megatron/training/arguments.py)."""
    return is_blackwell(gpu.id)


def deepspeed_unsupported(strategy: Strategy, model: ModelSpec) -> Optional[str]:
    """A one-line reason why DeepSpeed (config + `deepspeed.initialize` + ds_train.py) cannot run `strategy`, or
    None: the first rule of autoplan/deepspeed_rules.py that its view breaks (the rules `deepspeed_blocked` applies
    to the search's candidates under `--engine deepspeed`)."""
    env, view = Env(model, engine="deepspeed"), strategy_view(strategy, "deepspeed")
    case = SimpleNamespace(strategy=strategy, model=model)
    return next((rule.message(case) for rule in DS.RULES if rule.broken(env, view)), None)


def deepspeed_blocked(layouts: Any, model: ModelSpec) -> np.ndarray:
    """Per candidate of `layouts` (autoplan.costmodel.layout.Layouts): True where `deepspeed_unsupported` would
    refuse it. The search drops these rows, so every plan it returns under --engine deepspeed is emitted."""
    keep = holds(Env(model, engine="deepspeed"), DS.RULES, layouts)
    return ~np.broadcast_to(keep, (len(layouts),))
