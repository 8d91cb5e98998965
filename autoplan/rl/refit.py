"""Refit: moving the updated weights from the training layout to the rollout layout, three ways.

- ipc (colocated; verl's hybrid engine, slime --colocate): each training rank rebuilds full tensors of the model
  tensor by tensor (all-gather over its TP and EP groups, broadcast from the other pipeline stages: verl
  `per_tensor_generator` in verl/utils/megatron_utils.py) and hands the colocated engine CUDA IPC handles; the
  engine copies the slice it holds. Every GPU thus receives the whole model once: the stage's tensors over TP/EP
  links, the other stages' over the PP link.
- broadcast (split pools; verl one-step-off / fully-async `sync_rollout_weights`, slime without --colocate
  `update_weights_from_distributed`): the full tensors, gathered on the training side, are broadcast in buckets over
  one NCCL group to every rollout GPU; each pipeline stage sends its own layers, so `pp` senders share the job. A
  pipelined broadcast moves the bytes once over each receiver's NIC.
- shard (shard-to-shard): each rollout GPU receives only the slice it holds, straight from the training ranks
  that own it; the training side sends its shard once per engine replica.

Bytes are bf16 weights (autoplan.rl.rollout.BF16)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from autoplan.costmodel.hardware import Hardware
from autoplan.costmodel.params import count_parameters
from autoplan.model import ModelSpec
from autoplan.rl.rollout import BF16, engine_weights
from autoplan.rl.spec import RolloutLayout

BUCKET_BYTES = 512 * 2**20  # verl's update_weights_bucket_megabytes default (512 MB)


@lru_cache(maxsize=4096)  # pure, of frozen inputs
def weight_tensors(model: ModelSpec) -> int:
    """Tensors a refit moves one by one, in Hugging Face naming (what the engines load): per layer the attention
    projections and norms (8: q, k, v, o or MLA's q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o, plus input and post
    norms, counted as 8), per MoE layer the router and gate/up/down of every routed and shared expert; embedding,
    final norm and head."""
    experts = model.num_experts + (1 if model.shared_expert_ffn_hidden_size else 0)
    per_moe = 1 + 3 * experts
    dense_mlp = 3
    return (model.num_layers * 8 + model.num_moe_layers * per_moe
            + (model.num_layers - model.num_moe_layers) * dense_mlp + 3)


@lru_cache(maxsize=4096)  # pure, of frozen inputs
def model_bytes(model: ModelSpec) -> float:
    """bf16 bytes of every weight of the model (what a rollout replica holds in all)."""
    return float(count_parameters(model)[0]) * BF16


@dataclass(frozen=True)
class RefitBytes:
    per_rollout_gpu: float  # bytes each rollout GPU receives
    per_train_gpu: float  # bytes each training GPU sends (shard) or receives (ipc gather)


def refit_bytes(model: ModelSpec, layout: RolloutLayout, method: str, train_tp: int, train_pp: int,
                train_ep: int) -> RefitBytes:
    full = model_bytes(model)
    if method == "ipc":
        return RefitBytes(per_rollout_gpu=full, per_train_gpu=full)
    if method == "broadcast":
        return RefitBytes(per_rollout_gpu=full, per_train_gpu=full / train_pp)
    if method == "shard":
        shard = engine_weights(model, layout).total
        train_shard = full / (train_tp * train_pp * max(train_ep // max(train_tp, 1), 1))
        return RefitBytes(per_rollout_gpu=shard, per_train_gpu=train_shard * layout.engines)
    raise ValueError(f"unknown refit method {method!r}")


@lru_cache(maxsize=4096)  # pure, of frozen inputs
def refit_seconds(model: ModelSpec, layout: RolloutLayout, hw: Hardware, method: str, train_tp: int,
                  train_pp: int, train_ep: int, pp_spans_network: bool) -> float:
    b = refit_bytes(model, layout, method, train_tp, train_pp, train_ep)
    nv = hw.nvlink_bytes_per_s * hw.nvlink_bus_eff
    net = hw.network_bytes_per_s * hw.network_bus_eff
    if method == "ipc":
        group = max(train_tp, train_ep)
        stage = b.per_rollout_gpu / train_pp
        gather = stage * (group - 1) / group / nv
        other = (b.per_rollout_gpu - stage) / (net if pp_spans_network else nv)
        # one all-gather per tensor over the TP/EP group, one broadcast step per tensor from the other stages
        steps = weight_tensors(model) * ((group - 1) * hw.nvlink_latency_s
                                         + (hw.network_latency_s if pp_spans_network else hw.nvlink_latency_s)
                                         * (train_pp > 1))
        return float(gather + other + steps)
    buckets = np.ceil(b.per_rollout_gpu / BUCKET_BYTES)
    latency = buckets * hw.network_latency_s
    if method == "broadcast":
        return float(max(b.per_rollout_gpu / net, b.per_train_gpu / net) + latency)
    return float(max(b.per_rollout_gpu, b.per_train_gpu) / net + latency)
