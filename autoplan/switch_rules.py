"""The switches' engine rules, each written once in two forms: `needs(model, view, v)` marks the candidates that may
carry value v of the switch (a mask over a batch of `Layouts`, or a truth value for one strategy's view), and
`message(case)` is the one line `validate` raises for one strategy that breaks it. `validate` (autoplan/validate.py)
checks them in its rule order; the search (solvers/space.py) keeps only the candidates every rule of a `--fix`ed
switch allows. A view is anything with the `Layouts` column names: a `Layouts`, or `layout_rules.strategy_view` of one
strategy (validate's `Case.view`). The layout and batch rules are written in the same two forms in
autoplan/layout_rules.py; that DeepSpeed has no counterpart of a key at all is a rule of autoplan/deepspeed_rules.py,
generated from the key's registry entry (autoplan/keys.py `deepspeed_lacks`).
Sources are cited in validate.py beside the place each rule is checked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from autoplan import cuda_graphs as G
from autoplan import keys as K
from autoplan import recompute as R

RECOMPUTE_CODES = K.RECOMPUTE_CODES


@dataclass(frozen=True)
class Rule:
    key: str
    needs: Callable[[Any, Any, Any], Any]
    message: Optional[Callable[[Any], str]]

    def broken(self, model, view, value) -> bool:
        """Whether one strategy's view with value `value` (on) breaks the rule."""
        return not bool(self.needs(model, view, value))


def _graphs(value, *names: str):
    """Whether a cuda_graph_modules bit mask captures any of `names`."""
    return np.bitwise_and(value, G.mask(names)) > 0


def _shown(case) -> str:
    return "+".join(case.strategy.cuda_graph_modules or ())


def _moe_ep(key: str) -> Rule:
    return Rule(key, lambda m, v, x: m.is_moe & (v.ep > 1),
                lambda c: f"{key}=true needs an MoE model with ep>1 (ep={c.strategy.ep}); set {key}=false or ep>1")


# Full recompute runs only under the full-iteration CUDA graph (the search also prunes its recompute options by it).
FULL_RECOMPUTE_GRAPH = Rule(
    "cuda_graph_modules", lambda m, v, x: (v.recompute != 2) | (np.asarray(x) == G.BIT["full_iteration"]),
    lambda c: "recompute=full with CUDA graphs needs cuda_graph_modules=full_iteration; "
              "use full_iteration or selective recompute")
RULES: Tuple[Rule, ...] = (
    # 1F1B all-to-all overlap: MoE with ep > 1, interleaving when pp > 1, no full recompute.
    _moe_ep("moe_a2a_overlap"),
    Rule("moe_a2a_overlap", lambda m, v, x: ~((v.pp > 1) & (v.vpp == 1)),
         lambda c: f"moe_a2a_overlap=true with pp={c.strategy.pp} needs the interleaved schedule (vpp>1); "
                   f"set vpp>1 or moe_a2a_overlap=false"),
    Rule("moe_a2a_overlap", lambda m, v, x: v.recompute != 2,
         lambda c: "moe_a2a_overlap=true cannot be combined with recompute=full; "
                   "use recompute=selective/none or moe_a2a_overlap=false"),
    # The flex dispatcher deduplicates tokens across expert-parallel ranks.
    _moe_ep("moe_flex_dispatcher"),
    Rule("tp_comm_overlap", lambda m, v, x: v.sp,
         lambda c: "tp_comm_overlap=true needs sequence parallelism; set sp=true or tp_comm_overlap=false"),
    Rule("overlap_param_gather", lambda m, v, x: v.zero >= 1,
         lambda c: "overlap_param_gather=true needs the distributed optimizer; set zero>=1 or "
                   "overlap_param_gather=false"),
    Rule("fp8_param", lambda m, v, x: v.fp8 & (v.zero >= 1),
         lambda c: f"fp8_param=true (--fp8-param-gather) needs fp8 and the distributed optimizer (got "
                   f"fp8={c.strategy.fp8}, zero={c.strategy.zero}); set fp8=hybrid and zero>=1, or fp8_param=false"),
    Rule("cpu_offload_layers", lambda m, v, x: v.pp == 1,
         lambda c: f"cpu_offload_layers={c.strategy.cpu_offload_layers} needs pp=1 (Megatron has no CPU offloading "
                   f"with pipeline parallelism, pp={c.strategy.pp}); use pp=1 or cpu_offload_layers=0"),
    Rule("cpu_offload_layers", lambda m, v, x: np.asarray(x) < m.num_layers,
         lambda c: f"cpu_offload_layers={c.strategy.cpu_offload_layers} must be below "
                   f"num_layers={c.model.num_layers}; use at most {c.model.num_layers - 1}"),
    Rule("overlap_param_gather", lambda m, v, x: v.overlap_grad_reduce,
         lambda c: "overlap_param_gather=true needs overlap_grad_reduce=true; set overlap_grad_reduce=true or "
                   "overlap_param_gather=false"),
    Rule("adam_bf16_states", lambda m, v, x: np.where(v.deepspeed, (v.zero >= 1) & v.bf16_master_weights,
                                                       v.zero == 1),
         lambda c: f"adam_bf16_states=true needs Megatron's distributed optimizer (zero=1; "
                   f"--use-precision-aware-optimizer with bf16 moments) or DeepSpeed's bf16 master weights (zero>=1 "
                   f"and bf16_master_weights=true: runtime/config.py asserts bf16_optimizer_states needs "
                   f"bf16_master_weights_and_grads) (got zero={c.strategy.zero}, engine={c.engine}, "
                   f"bf16_master_weights={str(c.strategy.bf16_master_weights).lower()}); set them so, or "
                   f"adam_bf16_states=false"),
    # DeepSpeed runtime/config.py: bf16_master_weights_and_grads "is only supported with ZeRO Stage 1, 2, or 3".
    Rule("bf16_master_weights", lambda m, v, x: v.deepspeed & (v.zero >= 1),
         lambda c: f"bf16_master_weights=true is DeepSpeed's bf16.bf16_master_weights_and_grads, which needs ZeRO "
                   f"stage 1, 2 or 3 (got engine={c.engine}, zero={c.strategy.zero}); use engine deepspeed with "
                   f"zero>=1, or bf16_master_weights=false"),
    # base_optimizer.py _configure_master_weights: bf16 master weights with fp32 optimizer states need ZeRO-Offload
    # with DeepSpeedCPUAdam (stage_1_and_2.py / stage3.py pass it their offload check), which autoplan neither prices
    # nor writes.
    Rule("bf16_master_weights", lambda m, v, x: v.adam_bf16_states,
         lambda c: "bf16_master_weights=true with fp32 Adam moments needs DeepSpeed's ZeRO-Offload with "
                   "DeepSpeedCPUAdam (base_optimizer.py _configure_master_weights), which autoplan does not price or "
                   "write; set adam_bf16_states=true (bf16.bf16_optimizer_states) or bf16_master_weights=false"),
    Rule("fused_weighted_squared_relu", lambda m, v, x: ~v.deepspeed & (m.is_moe and not m.gated_mlp),
         lambda c: f"fused_weighted_squared_relu=true needs a Megatron MoE model with non-gated experts (got "
                   f"engine={c.engine}, moe={c.model.is_moe}, activation={c.model.activation}); set "
                   f"fused_weighted_squared_relu=false"),
    # TransformerEngine's fused cross entropy is a Megatron switch (--cross-entropy-fusion-impl te); the DeepSpeed
    # files write nothing for it, so only the search holds it to Megatron (no message: validate does not refuse it).
    Rule("te_cross_entropy", lambda m, v, x: ~v.deepspeed, None),
    # CUDA graphs (value: a bit mask of autoplan/cuda_graphs.py MODULES; sources in validate._cuda_graphs, which
    # checks these after the rules that read the model alone; that DeepSpeed has none is the registry's
    # `deepspeed_lacks`, a rule of autoplan/deepspeed_rules.py): full recompute only under the full-iteration graph;
    # no CPU offloading; the all-to-all overlap excludes capturing the mlp/moe halves; moe recompute excludes a
    # moe_router graph; with hidden dropout no captured mlp/moe block is recomputed.
    FULL_RECOMPUTE_GRAPH,
    Rule("cuda_graph_modules", lambda m, v, x: v.cpu_offload_layers == 0,
         lambda c: f"cpu_offload_layers={c.strategy.cpu_offload_layers} cannot be combined with CUDA graphs "
                   f"(cuda_graph_modules={_shown(c)}); set cpu_offload_layers=0 or drop cuda_graph_modules"),
    Rule("cuda_graph_modules", lambda m, v, x: ~(v.moe_a2a_overlap & _graphs(x, "mlp", "moe")),
         lambda c: "cuda_graph_modules mlp/moe cannot be combined with moe_a2a_overlap=true; "
                   "capture attn+moe_router+moe_preprocess or set moe_a2a_overlap=false"),
    Rule("cuda_graph_modules", lambda m, v, x: ~(_graphs(x, "moe_router") & (v.recompute == 1)
                                                 & R.has(v.recompute_modules, "moe")),
         lambda c: "recompute module moe cannot be combined with cuda_graph_modules moe_router; recompute moe_act "
                   "or drop moe_router"),
    Rule("cuda_graph_modules", lambda m, v, x: ~((m.hidden_dropout > 0) & _graphs(x, "full_iteration", "mlp", "moe")
                                                 & (v.recompute == 1) & R.has(v.recompute_modules, "mlp", "moe")),
         lambda c: f"hidden_dropout={c.model.hidden_dropout} forbids recomputing a captured mlp/moe block "
                   f"(cuda_graph_modules={_shown(c)}); drop mlp/moe from recompute_modules or the graph"),
)

BY_KEY: Dict[str, Tuple[Rule, ...]] = {}
for _rule in RULES:
    BY_KEY[_rule.key] = BY_KEY.get(_rule.key, ()) + (_rule,)
del _rule


def allowed(key: str, model, layouts, value, rules=None) -> np.ndarray:
    """The candidates of `layouts` that may carry `value` of switch `key` (off always may): every rule of the key,
    or those of `rules`."""
    keep = np.ones(len(layouts.recompute), bool)
    if np.all(np.asarray(value) == 0):
        return keep
    for rule in BY_KEY.get(key, ()) if rules is None else rules:
        keep &= np.broadcast_to(np.asarray(rule.needs(model, layouts, value), bool), keep.shape)
    return keep


def check(case, key: str, index: int, on=None):
    """(broken, message) for validate's rule list: rule `index` of switch `key` for one strategy, its value the
    strategy's. `on` says whether the switch counts as set (default: its value is not off)."""
    value = getattr(case.strategy, key)
    if not (bool(value) if on is None else on):
        return False, None
    value = K.BY_KEY[key].coded(value)  # as the column holds it (a module set as its bit mask)
    rule = BY_KEY[key][index]
    return rule.broken(case.model, case.view, value), lambda: rule.message(case)
