"""What each training engine can express, as pure checks shared by the emitters, the importers and the search.

`deepspeed_unsupported(strategy, model)` (one strategy, for the emitter and `estimate`) and `deepspeed_blocked`
(a column of candidates, for the search under `--engine deepspeed`) read one list of rules, so the search returns
only what the DeepSpeed emitter writes; they only read fields (no engine import, no I/O)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from autoplan import recompute as R
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


def _autotp_kv_heads_reason(tp: int, groups: int) -> str:
    # module_inject/tp_shard.py get_shard_size splits K/V by whole key-value heads; runtime/engine.py
    # _apply_autotp_partitioning leaves ranks past the kv-head count without an attention shard (Megatron instead
    # replicates K/V heads when tp is a multiple of num_query_groups).
    valid = ", ".join(str(t) for t in range(1, groups + 1) if groups % t == 0)
    return (f"DeepSpeed AutoTP splits K/V by whole key-value heads, so tp must divide num_query_groups "
            f"(tp={tp}, num_query_groups={groups}); use tp in {{{valid}}} or --engine megatron")


class _StrategyView:
    """A Strategy read through the field names the DeepSpeed rules use (those of `Layouts`), one candidate."""

    def __init__(self, s: Strategy):
        self.tp, self.pp, self.vpp, self.cp, self.ep, self.etp, self.zero = s.tp, s.pp, s.vpp, s.cp, s.ep, s.etp, s.zero
        self.sp, self.fp8, self.cpu_offload_layers = s.sp, s.uses_fp8, s.cpu_offload_layers
        self.tp_comm_overlap, self.moe_a2a_overlap = bool(s.tp_comm_overlap), s.moe_a2a_overlap
        self.moe_flex_dispatcher = s.moe_flex_dispatcher
        self.uneven = s.first_stage_layers is not None or s.last_stage_layers is not None
        self.full, self.block = s.recompute == "full", s.recompute_method == "block"
        self.custom_modules = s.recompute == "selective" and s.recompute_modules is not None
        self.cuda_graph = bool(s.cuda_graph_modules)
        self.te_op_fuser = s.te_op_fuser


class _LayoutsView:
    """`Layouts` (numpy columns, one entry per candidate) read through the same names as `_StrategyView`."""

    def __init__(self, lay: Any):
        self.tp, self.pp, self.vpp, self.cp, self.ep, self.etp = lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.etp
        self.zero, self.sp, self.fp8, self.cpu_offload_layers = lay.zero, lay.sp, lay.fp8, lay.cpu_offload_layers
        self.tp_comm_overlap, self.moe_a2a_overlap = lay.tp_comm_overlap, lay.moe_a2a_overlap
        self.moe_flex_dispatcher = lay.moe_flex_dispatcher
        self.uneven = (lay.first >= 0) | (lay.last >= 0)
        self.full, self.block = lay.recompute == 2, lay.recompute_block
        # Layouts hold Megatron's default module set as its bit mask; Layouts.strategy writes it as None.
        self.custom_modules = (lay.recompute == 1) & (lay.recompute_modules != R.mask(R.DEFAULT))
        self.cuda_graph = lay.cuda_graph_modules != 0
        self.te_op_fuser = lay.te_op_fuser


# What DeepSpeed (its config + `deepspeed.initialize` + autoplan's ds_train.py) cannot run: one list of
# (test, reason) pairs read by the emitter (`deepspeed_unsupported`, one strategy) and by the search
# (`deepspeed_blocked`, a column per candidate). Each test uses only comparisons joined by & and |, so it holds
# for Python scalars and numpy arrays alike. Sources: deepspeed 0.19.8 runtime/pipe/engine.py (PipelineEngine
# asserts ZeRO stage < 2), runtime/pipe/module.py (PipelineModule has no interleaved schedule and partitions by
# method, not by explicit counts; activation_checkpoint_interval checkpoints every k layers), runtime/engine.py
# (AutoEP/native MoE set expert parallelism in model code, which ds_train.py does not build: its experts are
# replicated), module_inject/tp_shard.py (AutoTP shards K/V by whole heads). Features with no DeepSpeed counterpart
# at all (context parallel, Megatron sequence parallel, TransformerEngine FP8, userbuffer TP overlap) are rejected.
_ALT = "use --engine megatron or"
_DEEPSPEED_RULES: Tuple[Tuple[Callable[[Any, ModelSpec], Any], Callable[[Strategy, ModelSpec], str]], ...] = (
    (lambda v, m: v.cp > 1, lambda s, m: f"DeepSpeed cannot run context parallelism (cp={s.cp}); {_ALT} cp=1"),
    (lambda v, m: v.vpp > 1,
     lambda s, m: f"DeepSpeed's pipeline has no interleaved schedule (vpp={s.vpp}); {_ALT} vpp=1"),
    (lambda v, m: (v.sp != 0) & (v.tp > 1),
     lambda s, m: f"DeepSpeed cannot run Megatron sequence parallelism (sp=true, tp={s.tp}); {_ALT} sp=false"),
    (lambda v, m: v.fp8 != 0,
     lambda s, m: f"DeepSpeed has no TransformerEngine FP8 training (fp8={s.fp8}); {_ALT} fp8=none"),
    (lambda v, m: v.cpu_offload_layers > 0,
     lambda s, m: f"DeepSpeed's config cannot offload the activations of chosen layers "
                  f"(cpu_offload_layers={s.cpu_offload_layers}); {_ALT} cpu_offload_layers=0"),
    (lambda v, m: v.tp_comm_overlap != 0,
     lambda s, m: f"DeepSpeed cannot overlap TP communication with GEMMs (tp_comm_overlap=true); "
                  f"{_ALT} tp_comm_overlap=false"),
    (lambda v, m: v.moe_flex_dispatcher != 0,
     lambda s, m: f"DeepSpeed has no DeepEP / HybridEP token dispatcher (moe_flex_dispatcher=true); "
                  f"{_ALT} moe_flex_dispatcher=false"),
    (lambda v, m: v.ep > 1,
     lambda s, m: f"DeepSpeed cannot set expert parallelism from its config for this model (ep={s.ep}); "
                  f"{_ALT} ep=1"),
    (lambda v, m: (v.etp > 1) & m.is_moe,
     lambda s, m: f"DeepSpeed cannot shard experts with tensor parallelism (etp={s.etp}); {_ALT} etp=1"),
    (lambda v, m: (v.moe_a2a_overlap != 0) & m.is_moe,
     lambda s, m: f"DeepSpeed cannot overlap the MoE all-to-all (moe_a2a_overlap=true); "
                  f"{_ALT} moe_a2a_overlap=false"),
    (lambda v, m: v.uneven,
     lambda s, m: f"DeepSpeed's PipelineModule cannot place uneven first/last stages "
                  f"(first_stage_layers={s.first_stage_layers}, last_stage_layers={s.last_stage_layers}); "
                  f"{_ALT} drop them"),
    (lambda v, m: (v.pp > 1) & (v.zero >= 2),
     lambda s, m: f"DeepSpeed's pipeline engine allows ZeRO stage 0 or 1 only (zero={s.zero}, pp={s.pp}); "
                  f"use zero=1 or pp=1"),
    (lambda v, m: (v.pp > 1) & (v.tp > 1),
     lambda s, m: f"DeepSpeed AutoTP cannot be combined with its pipeline engine (tp={s.tp}, pp={s.pp}); "
                  f"{_ALT} tp=1 or pp=1"),
    (lambda v, m: (v.tp > 1) & (m.num_query_groups % v.tp != 0),
     lambda s, m: _autotp_kv_heads_reason(s.tp, m.num_query_groups)),
    (lambda v, m: v.custom_modules,
     lambda s, m: f"DeepSpeed has no per-module selective recompute "
                  f"(recompute_modules={'+'.join(s.recompute_modules or ())}); use recompute=full or the megatron "
                  f"engine"),
    (lambda v, m: m.is_hybrid,
     lambda s, m: f"ds_train.py builds decoder layers of attention + MLP, not {m.name}'s Mamba / attention hybrid "
                  f"pattern; use --engine megatron"),
    (lambda v, m: m.mtp_num_layers > 0,
     lambda s, m: f"ds_train.py builds no multi-token-prediction depth (mtp_num_layers={m.mtp_num_layers}); "
                  f"use --engine megatron or plan the model with mtp_num_layers=0"),
    (lambda v, m: v.cuda_graph,
     lambda s, m: f"the DeepSpeed launch files capture no CUDA graphs (cuda_graph_modules="
                  f"{'+'.join(s.cuda_graph_modules or ())}); {_ALT} drop cuda_graph_modules"),
    (lambda v, m: v.te_op_fuser,
     lambda s, m: f"DeepSpeed has no TransformerEngine op fuser (te_op_fuser=true); {_ALT} te_op_fuser=false"),
    (lambda v, m: (v.pp > 1) & v.full & v.block,
     lambda s, m: f"DeepSpeed's pipeline checkpoints every k layers, not the first k (recompute_method=block, "
                  f"pp={s.pp}); use recompute_method=uniform"),
)


def deepspeed_unsupported(strategy: Strategy, model: ModelSpec) -> Optional[str]:
    """A one-line reason why DeepSpeed (config + `deepspeed.initialize` + ds_train.py) cannot run `strategy`, or
    None. The same rules as `deepspeed_blocked`, which the search applies under `--engine deepspeed`."""
    view = _StrategyView(strategy)
    return next((reason(strategy, model) for test, reason in _DEEPSPEED_RULES if bool(test(view, model))), None)


def deepspeed_blocked(layouts: Any, model: ModelSpec) -> np.ndarray:
    """Per candidate of `layouts` (autoplan.costmodel.layout.Layouts): True where `deepspeed_unsupported` would
    refuse it. The search drops these rows, so every plan it returns under --engine deepspeed is emitted."""
    view = _LayoutsView(layouts)
    blocked = np.zeros(len(layouts), dtype=bool)
    for test, _ in _DEEPSPEED_RULES:
        blocked |= np.broadcast_to(np.asarray(test(view, model), dtype=bool), blocked.shape)
    return blocked
