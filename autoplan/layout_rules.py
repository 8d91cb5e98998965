"""Megatron-LM's layout and batch rules, each written once in two forms: `ok(env, v)` marks the candidates that keep
the rule — a mask over a batch of candidates' columns (the search, solvers/space.py) or a truth value for one
strategy's view (`validate`) — and `message(case)` is the one line `validate` raises for one strategy that breaks
it. `env` is what the rule reads besides the candidate (`Env`: the model, the GPU count, the sequence length and
global batch, the engine); `v` is anything with the `Layouts` column names a rule reads: a `Layouts`, the search's
partial columns (`columns`), or `strategy_view` of one strategy. Each `ok` uses only comparisons joined by & and |
(no `and`/`or` on the candidate), so it holds for numpy scalars and arrays alike.

A rule with `engine` set binds that engine only (the DeepSpeed rules, autoplan/deepspeed_rules.py, are written in
the same form). Sources are cited in validate.py beside the place each rule is checked."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional

import numpy as np

from autoplan import keys as K
from autoplan import valid_values as vv


@dataclass(frozen=True)
class Env:
    """What a rule reads besides the candidate."""

    model: Any
    world: int = 0
    seq_len: int = 0
    gbs: int = 0
    engine: str = "megatron"


@dataclass(frozen=True)
class Rule:
    """One rule: `ok(env, v)` (a mask or a truth value), `message(case)` for one strategy that breaks it, and the
    engine it binds (None: every engine)."""

    name: str
    ok: Callable[[Env, Any], Any]
    message: Optional[Callable[[Any], str]] = None
    engine: Optional[str] = None

    def mask(self, env: Env, v) -> Any:
        """Where the rule holds (everywhere under an engine it does not bind)."""
        if self.engine is not None and env.engine != self.engine:
            return np.asarray(True)
        return self.ok(env, v)

    def broken(self, env: Env, v) -> bool:
        """Whether one strategy's view (see `strategy_view`) breaks the rule."""
        return not bool(np.all(self.mask(env, v)))


def strategy_view(s, engine: str = "megatron", num_gpus: Optional[int] = None) -> SimpleNamespace:
    """One strategy as one candidate: every key column as autoplan/keys.py encodes it (dp derived from `num_gpus`,
    else 1; `first`/`last` the uneven stage sizes the strategy states, -1 when it states none) and the engine's
    `deepspeed` column; `sp` as stated (the column clears it at tp=1, where `SP_NEEDS_TP` refuses it)."""
    row = SimpleNamespace(num_gpus=num_gpus or s.tp * s.pp * s.cp,
                          ends=(-1 if s.first_stage_layers is None else s.first_stage_layers,
                                -1 if s.last_stage_layers is None else s.last_stage_layers))
    cols = {**K.columns_of([s], [row]), "sp": np.array([s.sp])}
    return SimpleNamespace(**cols, deepspeed=np.array([engine == "deepspeed"]))


def columns(**cols) -> SimpleNamespace:
    """Partial candidates for a generator's pruning: the named columns as arrays."""
    return SimpleNamespace(**{k: np.asarray(v) for k, v in cols.items()})


def holds(env: Env, rules, v) -> np.ndarray:
    """Where every rule of `rules` holds."""
    keep = np.asarray(True)
    for rule in rules:
        keep = keep & np.asarray(rule.mask(env, v), bool)
    return keep


def keep_values(env: Env, rules, key: str, values, **fixed) -> list:
    """The values of column `key` (the other columns `fixed`) that every rule of `rules` allows, in order."""
    values = list(values)
    if not values:
        return values
    mask = np.broadcast_to(holds(env, rules, columns(**{key: values}, **fixed)), (len(values),))
    return [v for v, ok in zip(values, mask) if ok]


# ---- world size ---------------------------------------------------------------------------------------------

def _world_message(c) -> str:
    s = c.strategy
    return (f"world size {c.world} must be divisible by tp*pp*cp={s.tp}*{s.pp}*{s.cp}={c.model_parallel}; "
            f"{vv.world_alternatives(c.model, c.world, s.tp, s.pp, s.cp)}")


WORLD_TILES = Rule("world_tiles", lambda e, v: e.world % (v.tp * v.pp * v.cp) == 0, _world_message)


# ---- tensor parallelism -------------------------------------------------------------------------------------

def _valid_tp(c) -> str:
    return vv.join(vv.valid_tp(c.model, c.world, c.strategy.pp, c.strategy.cp))


TP_HEADS = Rule(
    "tp_heads", lambda e, v: e.model.num_attention_heads % v.tp == 0,
    lambda c: f"tp={c.strategy.tp} must divide num_attention_heads={c.model.num_attention_heads}; "
              f"valid tp: {_valid_tp(c)}")
TP_GROUPS = Rule(
    "tp_groups", lambda e, v: vv.gqa_allows_tp(e.model, v.tp),
    lambda c: f"num_query_groups={c.model.num_query_groups} must be a multiple or a divisor of tp={c.strategy.tp}; "
              f"valid tp: {_valid_tp(c)}")


def _mixer_message(c) -> str:
    m = c.model
    heads = (f"Gated DeltaNet (key {m.gdn_num_key_heads}, value {m.gdn_num_value_heads})"
             if m.linear_attention_layers else f"Mamba mixer (heads {m.mamba_num_heads}, groups {m.mamba_num_groups})")
    return f"tp={c.strategy.tp} must divide the heads and groups of {m.name}'s {heads}; valid tp: {_valid_tp(c)}"


TP_MIXER = Rule("tp_mixer", lambda e, v: vv.mixer_allows_tp(e.model, v.tp), _mixer_message)


# ---- mixture of experts -------------------------------------------------------------------------------------

EXPERT_GRID = Rule(
    "expert_grid", lambda e, v: ~np.asarray(e.model.is_moe) | (e.world % (v.etp * v.ep * v.pp) == 0),
    lambda c: (f"world size {c.world} must be divisible by etp*ep*pp={c.strategy.etp}*{c.strategy.ep}*{c.strategy.pp}"
               f"={c.strategy.etp * c.strategy.ep * c.strategy.pp} (expert-DP = world/(etp*ep*pp)); "
               f"{vv.expert_grid_alternatives(c.model, c.world, c.strategy.ep, c.strategy.etp, c.strategy.pp)}"))
MOE_NEEDS_SP = Rule(
    "moe_needs_sp", lambda e, v: ~(np.asarray(e.model.is_moe) & (v.tp > 1) & ~np.asarray(v.sp, bool)),
    lambda c: f"an MoE model with tp={c.strategy.tp} needs sequence parallelism; set sp=true or tp=1",
    engine="megatron")
BIASED_EXPERTS_ETP = Rule(
    "biased_experts_etp", lambda e, v: ~np.asarray(e.model.is_moe and e.model.add_bias_linear) | (v.etp == 1),
    lambda c: f"etp={c.strategy.etp} is not allowed: MoE layers with biases (add_bias_linear) need etp=1")


# ---- pipeline -----------------------------------------------------------------------------------------------

EVEN_LAYERS = Rule("even_layers", lambda e, v: e.model.num_layers % v.pp == 0)  # message: validate._pipeline_split
VPP_NEEDS_PP = Rule(
    "vpp_needs_pp", lambda e, v: (v.vpp == 1) | (v.pp > 1),
    lambda c: f"vpp={c.strategy.vpp} needs pp>1 (the interleaved schedule splits pipeline stages); use vpp=1 or pp>1")
VPP_DIVIDES_RANK = Rule(
    "vpp_divides_rank", lambda e, v: (e.model.num_layers // v.pp) % v.vpp == 0,
    lambda c: (f"vpp={c.strategy.vpp} must divide the layers per pipeline rank num_layers/pp={c.model.num_layers}/"
               f"{c.strategy.pp}={c.model.num_layers // c.strategy.pp}; "
               f"valid vpp: {vv.join(vv.divisors(c.model.num_layers // c.strategy.pp))}"))
ZERO3_NO_PP = Rule(
    "zero3_no_pp", lambda e, v: ~((v.zero == 3) & (v.pp > 1)),
    lambda c: f"zero=3 (fully sharded parameters) cannot be combined with pipeline parallelism (pp={c.strategy.pp}) "
              f"in Megatron-LM or DeepSpeed; use zero=1 or pp=1")


# ---- sequence, sequence parallel, batch ---------------------------------------------------------------------

CP_MIXERS = Rule(
    "cp_mixers", lambda e, v: (v.cp == 1) | ~np.asarray(bool(e.model.context_parallel_blocker)),
    lambda c: f"cp={c.strategy.cp} is not supported for {c.model.name}: {c.model.context_parallel_blocker}; use cp=1")
CP_SEQ = Rule(
    "cp_seq", lambda e, v: (v.cp == 1) | (e.seq_len % (2 * v.cp) == 0),
    lambda c: (f"seq_len={c.workload.seq_len} must be divisible by 2*cp=2*{c.strategy.cp}={2 * c.strategy.cp}; "
               f"valid cp: {vv.join(vv.valid_cp(c.workload.seq_len, c.world, c.strategy.tp, c.strategy.pp))}"))
SP_NEEDS_TP = Rule(
    "sp_needs_tp", lambda e, v: ~(np.asarray(v.sp, bool) & (v.tp == 1)),
    lambda c: "sp=true needs tp>1 (Megatron would silently turn it off); set sp=false or tp>1")
SP_SPLITS_SEQ = Rule(
    "sp_splits_seq", lambda e, v: ~(np.asarray(v.sp, bool) & ((e.seq_len // v.cp) % v.tp != 0)),
    lambda c: (f"sp=true needs seq_len/cp={c.workload.seq_len}/{c.strategy.cp}={c.workload.seq_len // c.strategy.cp} "
               f"divisible by tp={c.strategy.tp}; use a seq_len that is a multiple of {c.strategy.cp * c.strategy.tp}, "
               f"or sp=false"))
# The message (with the batch sizes that would work) is validate._batch's.
BATCH_DIVIDES = Rule("batch_divides", lambda e, v: e.gbs % (v.mbs * v.dp) == 0)
