"""What each training engine can express, as pure checks shared by the emitters, the importers and the search.

`deepspeed_unsupported(strategy, model)` is called once per candidate by the search under `--engine deepspeed`,
so it only reads fields (no engine import, no I/O)."""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

from autoplan.cluster import GpuSpec
from autoplan.errors import InputError, did_you_mean
from autoplan.model import ModelSpec
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


def is_blackwell_or_newer(gpu: GpuSpec) -> bool:
    """Whether the GPU is compute capability 10 or later (Blackwell). Megatron-LM's validate_args drops its
    CUDA_DEVICE_MAX_CONNECTIONS=1 requirement from this architecture on (megatron/training/arguments.py)."""
    return is_blackwell(gpu.id)


def _first(reasons: Iterable[Optional[str]]) -> Optional[str]:
    return next((r for r in reasons if r), None)


def _autotp_kv_heads_reason(tp: int, groups: int) -> str:
    # module_inject/tp_shard.py get_shard_size splits K/V by whole key-value heads; runtime/engine.py
    # _apply_autotp_partitioning leaves ranks past the kv-head count without an attention shard (Megatron instead
    # replicates K/V heads when tp is a multiple of num_query_groups).
    valid = ", ".join(str(t) for t in range(1, groups + 1) if groups % t == 0)
    return (f"DeepSpeed AutoTP splits K/V by whole key-value heads, so tp must divide num_query_groups "
            f"(tp={tp}, num_query_groups={groups}); use tp in {{{valid}}} or --engine megatron")


def deepspeed_unsupported(strategy: Strategy, model: ModelSpec) -> Optional[str]:
    """A one-line reason why DeepSpeed (config + `deepspeed.initialize`) cannot run `strategy`, or None.

    Sources: deepspeed 0.19.8 runtime/pipe/engine.py (PipelineEngine asserts ZeRO stage < 2), runtime/engine.py
    (AutoEP/native MoE set expert parallelism in model code), runtime/pipe/module.py (PipelineModule has no interleaved
    schedule and partitions by method, not by explicit counts). Features with no DeepSpeed counterpart at all
    (context parallel, Megatron sequence parallel, TransformerEngine FP8, userbuffer TP overlap) are rejected.
    Tensor parallelism is AutoTP (`tensor_parallel.autotp_size`), trained by integrations/ds_train.py."""
    s = strategy
    alt = "use --engine megatron or"
    return _first((
        s.cp > 1 and f"DeepSpeed cannot run context parallelism (cp={s.cp}); {alt} cp=1",
        s.vpp > 1 and f"DeepSpeed's pipeline has no interleaved schedule (vpp={s.vpp}); {alt} vpp=1",
        s.sp and s.tp > 1 and f"DeepSpeed cannot run Megatron sequence parallelism (sp=true, tp={s.tp}); {alt} sp=false",
        s.uses_fp8 and f"DeepSpeed has no TransformerEngine FP8 training (fp8={s.fp8}); {alt} fp8=none",
        s.cpu_offload_layers and f"DeepSpeed's config cannot offload the activations of chosen layers "
                                 f"(cpu_offload_layers={s.cpu_offload_layers}); {alt} cpu_offload_layers=0",
        s.tp_comm_overlap and f"DeepSpeed cannot overlap TP communication with GEMMs (tp_comm_overlap=true); "
                              f"{alt} tp_comm_overlap=false",
        s.moe_flex_dispatcher and f"DeepSpeed has no DeepEP / HybridEP token dispatcher (moe_flex_dispatcher=true); "
                                  f"{alt} moe_flex_dispatcher=false",
        s.ep > 1 and f"DeepSpeed cannot set expert parallelism from its config for this model (ep={s.ep}); {alt} ep=1",
        s.etp > 1 and model.is_moe and f"DeepSpeed cannot shard experts with tensor parallelism (etp={s.etp}); "
                                       f"{alt} etp=1",
        s.moe_a2a_overlap and model.is_moe and f"DeepSpeed cannot overlap the MoE all-to-all (moe_a2a_overlap=true); "
                                               f"{alt} moe_a2a_overlap=false",
        (s.first_stage_layers is not None or s.last_stage_layers is not None)
        and f"DeepSpeed's PipelineModule cannot place uneven first/last stages "
            f"(first_stage_layers={s.first_stage_layers}, last_stage_layers={s.last_stage_layers}); "
            f"{alt} drop them",
        s.pp > 1 and s.zero >= 2 and f"DeepSpeed's pipeline engine allows ZeRO stage 0 or 1 only (zero={s.zero}, "
                                     f"pp={s.pp}); use zero=1 or pp=1",
        s.pp > 1 and s.tp > 1 and f"DeepSpeed AutoTP cannot be combined with its pipeline engine (tp={s.tp}, pp={s.pp}); "
                                  f"{alt} tp=1 or pp=1",
        s.tp > 1 and model.num_query_groups % s.tp and _autotp_kv_heads_reason(s.tp, model.num_query_groups),
        s.recompute == "selective" and s.recompute_modules is not None
        and f"DeepSpeed has no per-module selective recompute (recompute_modules={'+'.join(s.recompute_modules)}); "
            f"use recompute=full or the megatron engine",
        s.pp > 1 and s.recompute == "full" and s.recompute_method == "block"
        and f"DeepSpeed's pipeline checkpoints every k layers, not the first k (recompute_method=block, pp={s.pp}); "
            f"use recompute_method=uniform",
    ))
