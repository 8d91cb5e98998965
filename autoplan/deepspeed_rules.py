"""What DeepSpeed (its config + `deepspeed.initialize` + autoplan's ds_train.py) cannot run, as rules of the one rule
book (autoplan/layout_rules.py `Rule`, bound to engine deepspeed): each `ok(env, v)` reads the `Layouts` column
names, so the emitter's check of one strategy (integrations/engines.py `deepspeed_unsupported`, through
`layout_rules.strategy_view`) and the search's mask over its candidates (`deepspeed_blocked`) are the same rule.
`message(case)` reads `case.strategy` and `case.model` only.

Sources: deepspeed 0.19.8 runtime/pipe/engine.py (PipelineEngine asserts ZeRO stage < 2), runtime/pipe/module.py
(PipelineModule has no interleaved schedule and partitions by method, not by explicit counts;
activation_checkpoint_interval checkpoints every k layers), runtime/engine.py (AutoEP/native MoE set expert
parallelism in model code, which ds_train.py does not build: its experts are replicated), module_inject/tp_shard.py
(AutoTP shards K/V by whole heads). Features with no DeepSpeed counterpart at all are refused: context parallel and
Megatron sequence parallel here, and every key the registry declares `deepspeed_lacks` (autoplan/keys.py:
TransformerEngine FP8, userbuffer TP overlap, CUDA graphs, ...) by the rule `LACKS` generates from its entry."""
from __future__ import annotations

from typing import Tuple

import numpy as np

from autoplan import keys as K
from autoplan import recompute as R
from autoplan.layout_rules import Rule

_ALT = "use --engine megatron or"


def _rule(name: str, blocked, message) -> Rule:
    """A DeepSpeed rule from the candidates it cannot run (`blocked(env, v)`) and its message."""
    return Rule(name, lambda e, v: ~np.asarray(blocked(e, v), bool), message, engine="deepspeed")


def _shown(value) -> str:
    """A key's value as a strategy states it: module names joined by +, a set switch as true."""
    if isinstance(value, tuple):
        return "+".join(value)
    return "true" if isinstance(value, bool) or value is None else str(value)


def _lacks(key: K.Key) -> Rule:
    """The rule of a key DeepSpeed has no counterpart of (its registry entry's `deepspeed_lacks`): blocked wherever
    its column is set."""
    column = key.column_name
    return _rule(f"ds_no_{column}", lambda e, v: getattr(v, column) != 0,
                 lambda c: key.deepspeed_lacks.format(shown=f"{key.name}={_shown(getattr(c.strategy, key.name))}",
                                                      flag=K.flag(key.name)))


LACKS = {k.name: _lacks(k) for k in K.KEYS if k.deepspeed_lacks}


def autotp_kv_heads_reason(tp: int, groups: int) -> str:
    # module_inject/tp_shard.py get_shard_size splits K/V by whole key-value heads; runtime/engine.py
    # _apply_autotp_partitioning leaves ranks past the kv-head count without an attention shard (Megatron instead
    # replicates K/V heads when tp is a multiple of num_query_groups).
    valid = ", ".join(str(t) for t in range(1, groups + 1) if groups % t == 0)
    return (f"DeepSpeed AutoTP splits K/V by whole key-value heads, so tp must divide num_query_groups "
            f"(tp={tp}, num_query_groups={groups}); use tp in {{{valid}}} or --engine megatron")


def _moe(e) -> np.ndarray:
    return np.asarray(bool(e.model.is_moe))


NO_CP = _rule("ds_no_cp", lambda e, v: v.cp > 1,
              lambda c: f"DeepSpeed cannot run context parallelism (cp={c.strategy.cp}); {_ALT} cp=1")
NO_VPP = _rule("ds_no_vpp", lambda e, v: v.vpp > 1,
               lambda c: f"DeepSpeed's pipeline has no interleaved schedule (vpp={c.strategy.vpp}); {_ALT} vpp=1")
NO_SP = _rule("ds_no_sp", lambda e, v: (v.sp != 0) & (v.tp > 1),
              lambda c: f"DeepSpeed cannot run Megatron sequence parallelism (sp=true, tp={c.strategy.tp}); "
                        f"{_ALT} sp=false")
NO_FP8, NO_OFFLOAD, NO_TP_OVERLAP, NO_FLEX = (LACKS[k] for k in ("fp8", "cpu_offload_layers", "tp_comm_overlap",
                                                               "moe_flex_dispatcher"))
NO_EP = _rule("ds_no_ep", lambda e, v: v.ep > 1,
              lambda c: f"DeepSpeed cannot set expert parallelism from its config for this model "
                        f"(ep={c.strategy.ep}); {_ALT} ep=1")
NO_ETP = _rule("ds_no_etp", lambda e, v: (v.etp > 1) & _moe(e),
               lambda c: f"DeepSpeed cannot shard experts with tensor parallelism (etp={c.strategy.etp}); "
                         f"{_ALT} etp=1")
NO_A2A_OVERLAP = _rule("ds_no_a2a_overlap", lambda e, v: (v.moe_a2a_overlap != 0) & _moe(e),
                       lambda c: f"DeepSpeed cannot overlap the MoE all-to-all (moe_a2a_overlap=true); "
                                 f"{_ALT} moe_a2a_overlap=false")
NO_UNEVEN = _rule("ds_no_uneven", lambda e, v: (v.first >= 0) | (v.last >= 0),
                  lambda c: f"DeepSpeed's PipelineModule cannot place uneven first/last stages "
                            f"(first_stage_layers={c.strategy.first_stage_layers}, "
                            f"last_stage_layers={c.strategy.last_stage_layers}); {_ALT} drop them")
PIPE_ZERO = _rule("ds_pipe_zero", lambda e, v: (v.pp > 1) & (v.zero >= 2),
                  lambda c: f"DeepSpeed's pipeline engine allows ZeRO stage 0 or 1 only (zero={c.strategy.zero}, "
                            f"pp={c.strategy.pp}); use zero=1 or pp=1")
PIPE_TP = _rule("ds_pipe_tp", lambda e, v: (v.pp > 1) & (v.tp > 1),
                lambda c: f"DeepSpeed AutoTP cannot be combined with its pipeline engine (tp={c.strategy.tp}, "
                          f"pp={c.strategy.pp}); {_ALT} tp=1 or pp=1")
KV_HEADS = _rule("ds_kv_heads", lambda e, v: (v.tp > 1) & (e.model.num_query_groups % v.tp != 0),
                 lambda c: autotp_kv_heads_reason(c.strategy.tp, c.model.num_query_groups))
# Layouts hold Megatron's default module set as its bit mask (Layouts.strategy writes it as None).
NO_MODULES = _rule("ds_no_modules", lambda e, v: (v.recompute == 1) & (v.recompute_modules != R.mask(R.DEFAULT)),
                   lambda c: f"DeepSpeed has no per-module selective recompute "
                             f"(recompute_modules={'+'.join(c.strategy.recompute_modules or ())}); use recompute=full "
                             f"or the megatron engine")
NO_HYBRID = _rule("ds_no_hybrid", lambda e, v: np.asarray(bool(e.model.is_hybrid)),
                  lambda c: f"ds_train.py builds decoder layers of attention + MLP, not {c.model.name}'s Mamba / "
                            f"attention hybrid pattern; use --engine megatron")
NO_MTP = _rule("ds_no_mtp", lambda e, v: np.asarray(e.model.mtp_num_layers > 0),
               lambda c: f"ds_train.py builds no multi-token-prediction depth (mtp_num_layers="
                         f"{c.model.mtp_num_layers}); use --engine megatron or plan the model with mtp_num_layers=0")
NO_GRAPHS, NO_OP_FUSER = LACKS["cuda_graph_modules"], LACKS["te_op_fuser"]
PIPE_BLOCK = _rule("ds_pipe_block", lambda e, v: (v.pp > 1) & (v.recompute == 2) & (v.recompute_block != 0),
                   lambda c: f"DeepSpeed's pipeline checkpoints every k layers, not the first k (recompute_method="
                             f"block, pp={c.strategy.pp}); use recompute_method=uniform")

# In the order the emitter names them; a key the registry declares `deepspeed_lacks` later is named after these.
_NAMED = (NO_CP, NO_VPP, NO_SP, NO_FP8, NO_OFFLOAD, NO_TP_OVERLAP, NO_FLEX, NO_EP, NO_ETP, NO_A2A_OVERLAP, NO_UNEVEN,
          PIPE_ZERO, PIPE_TP, KV_HEADS, NO_MODULES, NO_HYBRID, NO_MTP, NO_GRAPHS, NO_OP_FUSER, PIPE_BLOCK)
RULES: Tuple[Rule, ...] = _NAMED + tuple(r for r in LACKS.values() if r not in _NAMED)
