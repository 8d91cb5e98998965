"""autoplan's per-rank memory next to Megatron-LM's theoretical estimate.

`megatron_theoretical` re-derives, from ModelSpec fields, what Megatron-LM's
megatron/training/theoretical_memory_usage.py reports (`report_theoretical_memory`):
- weights + optimizer of the most loaded shard (first pipeline stage: its layers, the embedding, and the output
  layer when pp = 1 and untied), at 18 bytes/param, or 6 + 12/dp with the distributed optimizer; expert params
  use the expert-data-parallel size;
- activations of the first pipeline stage, Korthikanti et al. 2022 Table 2: with SP and selective recompute
  sbh(18 + 4 ffn/h) per layer / tp; otherwise sbh(10 + 24/tp) per layer plus a 5% allowance; times all L layers
  (p micro batches in flight x L/p layers), the interleaving penalty 1 + (p-1)/(p v), or min(1, m/p) for 1F1B
  with m < p micro batches; plus embedding input/dropout and, when pp = 1, the output layer and loss.

    python -m benchmarks.memory_vs_megatron
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Dict, List, Tuple

from autoplan.clusterio import load_cluster
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.hardware import GIB
from autoplan.costmodel.params import layer_params, norm_params
from autoplan.model import ModelSpec
from autoplan.modelio import load_model
from autoplan.strategy import Strategy
from autoplan.workload import Workload


def padded_vocab(m: ModelSpec, tp: int, multiple: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x tp (megatron/training/tokenizer `_vocab_size_with_padding`)."""
    step = multiple * tp
    return int(math.ceil(m.vocab_size / step) * step)


def megatron_weights_and_optimizer(m: ModelSpec, s: Strategy, world: int) -> float:
    """Bytes of weights + grads + optimizer state on Megatron's most loaded shard."""
    dense, moe = layer_params(m, False), layer_params(m, True) if m.is_moe else None
    n_moe = m.num_moe_layers
    n_dense = m.num_layers - n_moe
    tp_sharded = (dense.attention + dense.dense_mlp) * n_dense
    replicated = (dense.norms + dense.indexer) * n_dense + norm_params(m)
    expert = 0.0
    if moe:
        tp_sharded += (moe.attention + moe.shared_experts) * n_moe
        replicated += (moe.norms + moe.router + moe.indexer) * n_moe
        expert = moe.experts * n_moe
    embedding = m.hidden_size * padded_vocab(m, s.tp)
    tp_shard = (tp_sharded / s.pp + embedding) / s.tp
    if not m.tie_embeddings and s.pp == 1:
        tp_shard += embedding / s.tp
    repl_shard = replicated / s.pp
    expert_shard = expert / s.pp / (s.etp * s.ep)
    dp = world // (s.tp * s.pp * s.cp)
    edp = world // (s.etp * s.ep * s.pp)

    def per_param(d: int) -> float:
        return 6.0 + 12.0 / d if s.zero >= 1 else 18.0

    return (tp_shard + repl_shard) * per_param(dp) + expert_shard * per_param(edp)


def megatron_activations(m: ModelSpec, s: Strategy, seq: int, num_microbatches: int) -> float:
    """Bytes of activations on Megatron's first pipeline stage."""
    sbh = seq * s.mbs * m.hidden_size
    sp_selective = s.sp and s.recompute == "selective"
    if sp_selective:
        per_layer = sbh * (18 + 4 * m.ffn_hidden_size / m.hidden_size)
    else:
        per_layer = sbh * (10 + 24 / s.tp)
    act = per_layer * m.num_layers
    act += 8 * seq * s.mbs * s.pp + sbh * s.pp  # token ids and embedding dropout, pp micro batches in flight
    if s.vpp > 1:
        act *= 1 + (s.pp - 1) / (s.pp * s.vpp)
    elif s.pp > 1:
        act *= min(1.0, num_microbatches / s.pp)
    vocab = padded_vocab(m, s.tp)
    if sp_selective:
        if s.pp == 1:
            act += sbh * 4 * (1 + vocab / m.hidden_size)
        return act / s.tp
    if s.pp == 1:
        act += (seq * s.mbs * vocab / s.tp + sbh) * 2
    return act * 1.05


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    gpu: str
    num_gpus: int
    strategy: Strategy
    workload: Workload


CASES: Tuple[Case, ...] = (
    Case("dense llama3-8b, GQA, tp4 SP + selective", "llama3-8b", "h100", 8,
         Strategy(tp=4, sp=True, recompute="selective"), Workload(seq_len=8192, global_batch_size=16)),
    Case("dense llama3-70b, GQA, tp4 pp4 vpp5 SP + selective", "llama3-70b", "h100", 64,
         Strategy(tp=4, pp=4, vpp=5, sp=True, recompute="selective"), Workload(seq_len=8192, global_batch_size=128)),
    Case("MoE mixtral-8x7b, tp2 ep4 SP + selective", "mixtral-8x7b", "h100", 32,
         Strategy(tp=2, pp=2, ep=4, sp=True, recompute="selective"), Workload(seq_len=4096, global_batch_size=64)),
    Case("dense llama2-7b, tp2, no SP, no recompute", "llama2-7b", "h100", 8,
         Strategy(tp=2, sp=False, recompute="none"), Workload(seq_len=4096, global_batch_size=32)),
    Case("dense gpt3-175b (MHA, GELU), tp8 pp8 SP + selective", "gpt3-175b", "h100", 128,
         Strategy(tp=8, pp=8, sp=True, recompute="selective"), Workload(seq_len=2048, global_batch_size=256)),
    Case("1F1B with m=2 < pp=8: llama2-13b tp2 pp8", "llama2-13b", "h100", 16,
         Strategy(tp=2, pp=8, sp=True, recompute="selective"), Workload(seq_len=4096, global_batch_size=2)),
)


def compare(case: Case) -> Dict[str, float]:
    # Megatron's formula counts Korthikanti's dropout masks, i.e. a model run at its default --hidden-dropout 0.1.
    m = load_model(case.model).model_copy(update={"hidden_dropout": 0.1})
    cluster = load_cluster(case.gpu, case.num_gpus)
    est = estimate(m, cluster, case.strategy, case.workload)
    first = est.stage_memory[0].breakdown_gib
    states = first["weights"] + first["grads"] + first["optimizer"]
    activations = first["activations"] + first["logits"]
    meg_states = megatron_weights_and_optimizer(m, case.strategy, case.num_gpus) / GIB
    meg_act = megatron_activations(m, case.strategy, case.workload.seq_len, est.num_microbatches) / GIB
    return {
        "autoplan_states": states, "megatron_states": meg_states,
        "autoplan_activations": activations, "megatron_activations": meg_act,
        "autoplan_other": sum(first.values()) - states - activations,
        "autoplan_stage0_total": sum(first.values()), "megatron_total": meg_states + meg_act,
        "autoplan_peak_total": est.peak_mem_gib, "microbatches": est.num_microbatches,
    }


def main(argv=None) -> int:
    rows: List[Tuple[Case, Dict[str, float]]] = [(c, compare(c)) for c in CASES]
    print("First pipeline stage, GiB. states = weights + grads + optimizer; act = activations (+ logits);")
    print("other = transients, CUDA context, NCCL, fragmentation (autoplan only).")
    print(f"{'case':52s} {'states ap/mg':>14s} {'act ap/mg':>14s} {'other':>6s} {'total ap/mg':>15s} {'peak':>6s}")
    for case, r in rows:
        print(f"{case.label[:52]:52s} {r['autoplan_states']:6.1f}/{r['megatron_states']:<7.1f}"
              f"{r['autoplan_activations']:6.1f}/{r['megatron_activations']:<7.1f}{r['autoplan_other']:6.1f} "
              f"{r['autoplan_stage0_total']:7.1f}/{r['megatron_total']:<7.1f}{r['autoplan_peak_total']:6.1f}")
    below = [c.label for c, r in rows if r["autoplan_stage0_total"] < r["megatron_total"]]
    print("autoplan below Megatron on total: " + (", ".join(below) if below else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
