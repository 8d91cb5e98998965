"""verl launch settings for an RL plan: Hydra overrides of verl 0.7.0's `ppo_megatron_trainer` config (and of its
recipes' `one_step_off_ppo_megatron_trainer` / `fully_async_ppo_megatron_trainer` for split placements), one per
line, and a run script. Keys are those of the pinned release (verl v0.7.0: verl/trainer/config/
_generated_ppo_megatron_trainer.yaml, recipe/one_step_off_policy/config/, recipe/fully_async_policy/config/)."""
from __future__ import annotations

from typing import Dict, List

from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.rl.spec import RLJob

VERL_VERSION = "0.7.0"
ENTRY = {"on-policy": ("verl.trainer.main_ppo", "ppo_megatron_trainer"),
         "one-step-off": ("recipe.one_step_off_policy.main_ppo", "one_step_off_ppo_megatron_trainer"),
         "async": ("recipe.fully_async_policy.fully_async_main", "fully_async_ppo_megatron_trainer")}


def _megatron(prefix: str, s, offload: str, ref: bool = False) -> List[str]:
    out = [f"{prefix}.megatron.tensor_model_parallel_size={s.tp}",
           f"{prefix}.megatron.pipeline_model_parallel_size={s.pp}",
           f"{prefix}.megatron.expert_model_parallel_size={s.ep}",
           f"{prefix}.megatron.expert_tensor_parallel_size={s.etp}",
           f"{prefix}.megatron.context_parallel_size={s.cp}",
           f"{prefix}.megatron.param_offload={offload in ('all', 'swap')}"]
    if not ref:
        out += [f"{prefix}.megatron.grad_offload={offload in ('all', 'swap')}",
                f"{prefix}.megatron.optimizer_offload={offload != 'none'}"]
    return out


def pools(pl, gpn: int):
    """(trainer nodes, trainer GPUs per node, rollout nodes, rollout GPUs per node): whole nodes for each pool, or
    the same share of every node (verl's resource pools take nnodes x n_gpus_per_node)."""
    if pl.kind == "colocated":
        return max(1, pl.gpus // gpn), min(gpn, pl.gpus), 0, 0
    if pl.train_gpus % gpn == 0 and pl.rollout_gpus % gpn == 0:
        return pl.train_gpus // gpn, gpn, pl.rollout_gpus // gpn, gpn
    nodes = max(1, pl.gpus // gpn)
    if pl.gpus % nodes == 0 and pl.train_gpus % nodes == 0:
        return nodes, pl.train_gpus // nodes, nodes, pl.rollout_gpus // nodes
    raise InputError(f"verl places each pool as nodes x GPUs per node; a {pl.train_gpus} + {pl.rollout_gpus} split of "
                     f"{pl.gpus} GPUs is neither whole nodes of {gpn} nor the same share of every node; pass "
                     f"--placement split:N with N a multiple of {gpn} or of {nodes}")


def overrides(plan, model: ModelSpec, job: RLJob, model_path: str, gpus_per_node: int) -> List[str]:
    s, lay, pl = plan.strategy, plan.rollout, plan.placement
    gpn = min(gpus_per_node, pl.gpus)
    if pl.kind == "split" and job.mode == "on-policy":
        raise InputError("verl runs split rollout/training pools only in its one-step-off and fully-async recipes; "
                         "pass --mode one-step-off or --mode async, or --placement colocated")
    train_nodes, train_per_node, roll_nodes, roll_per_node = pools(pl, gpn)
    a = "actor_rollout_ref"
    o = [f"data.train_batch_size={job.prompts}", f"data.max_prompt_length={job.prompt_len}",
         f"data.max_response_length={job.max_response_len}",
         f"algorithm.adv_estimator={'grpo' if job.algo == 'grpo' else 'gae'}",
         f"{a}.model.path={model_path}",
         f"{a}.actor.ppo_mini_batch_size={max(1, job.prompts // job.mini_batches)}",
         f"{a}.actor.use_kl_loss={job.use_ref}", f"{a}.actor.use_dynamic_bsz=True"]
    if job.micro_batch_tokens is not None:  # the log-prob passes take the actor's cap (generated config lines 141,
        # 228: log_prob_max_token_len_per_gpu = oc.select(actor.ppo_max_token_len_per_gpu)); the critic has its own
        o.append(f"{a}.actor.ppo_max_token_len_per_gpu={job.micro_batch_tokens}")
        if job.algo == "ppo":
            o.append(f"critic.ppo_max_token_len_per_gpu={job.micro_batch_tokens}")
    o += _megatron(f"{a}.actor", s, plan.offload)
    if s.recompute == "full":
        o += [f"+{a}.actor.megatron.override_transformer_config.recompute_granularity=full",
              f"+{a}.actor.megatron.override_transformer_config.recompute_method=uniform",
              f"+{a}.actor.megatron.override_transformer_config.recompute_num_layers=1"]
    if s.recompute == "selective":
        o.append(f"+{a}.actor.megatron.override_transformer_config.recompute_granularity=selective")
        if s.recompute_modules:
            o.append(f"+{a}.actor.megatron.override_transformer_config.recompute_modules="
                     f"[{','.join(s.recompute_modules)}]")
    if s.last_stage_layers is not None:
        o.append(f"+{a}.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage="
                 f"{s.last_stage_layers}")
    if plan.offload in ("optimizer", "all"):
        o += [f"+{a}.actor.optim.override_optimizer_config.optimizer_cpu_offload=True",
              f"+{a}.actor.optim.override_optimizer_config.optimizer_offload_fraction=1.0",
              f"+{a}.actor.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=True",
              f"+{a}.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True"]
    if job.use_ref:
        o += _megatron(f"{a}.ref", s, "all" if pl.kind == "colocated" else "none", ref=True)
    if job.algo == "ppo":
        o += _megatron("critic", s, plan.offload)
    o += [f"{a}.rollout.name=vllm", f"{a}.rollout.n={job.samples}",
          f"{a}.rollout.tensor_model_parallel_size={lay.tp}", f"{a}.rollout.data_parallel_size={lay.dp}",
          f"{a}.rollout.expert_parallel_size={lay.ep}",
          f"{a}.rollout.gpu_memory_utilization={lay.gpu_memory_utilization}",
          f"{a}.rollout.enforce_eager={not lay.cuda_graphs}",
          f"trainer.n_gpus_per_node={train_per_node}", f"trainer.nnodes={train_nodes}"]
    if pl.kind == "split":
        o += [f"{a}.hybrid_engine=False", f"rollout.n_gpus_per_node={roll_per_node}", f"rollout.nnodes={roll_nodes}"]
    # the fully-async trainer's streaming settings the plan was priced with (autoplan/rl/stream.py; the keys of
    # verl/experimental/fully_async_policy/config/fully_async_ppo_megatron_trainer.yaml lines 9-22 at b178a3cd): a
    # parameter version of mini_batches mini-batches in local updates of require_batches; partial rollout on, as
    # the price assumes for a staleness above 0
    if job.staleness is not None:
        o += [f"async_training.staleness_threshold={job.staleness}", "async_training.partial_rollout=True"]
    if job.require_batches is not None:
        o += [f"async_training.require_batches={job.require_batches}",
              f"async_training.trigger_parameter_sync_step={job.mini_batches // job.require_batches}"]
    return o


def render(plan, model: ModelSpec, job: RLJob, model_path: str, gpus_per_node: int) -> Dict[str, str]:
    o = overrides(plan, model, job, model_path, gpus_per_node)
    module, config = ENTRY[job.mode]
    config_path = "" if job.mode == "on-policy" else " --config-path=config"
    lines = ["#!/usr/bin/env bash",
             f"# verl {VERL_VERSION}: {plan.placement.kind} placement, predicted step {plan.step_time_s:.1f} s "
             f"({plan.samples_per_s:.2f} samples/s)",
             "set -euo pipefail",
             f"python3 -m {module}{config_path} --config-name={config} \\"]
    lines += [f"    '{x}' \\" for x in o[:-1]] + [f"    '{o[-1]}' \"$@\""]
    return {"verl_overrides.txt": "\n".join(o) + "\n", "run_verl.sh": "\n".join(lines) + "\n"}
