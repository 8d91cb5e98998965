"""The values a broken layout rule would accept instead: the "valid ..." part of each validation message.

Pure arithmetic on the model, the world size and the other degrees; `autoplan.validate` calls these only after a
rule has failed, so none of them is on the search's hot path. Each helper applies the rules that `validate`
checks before the one that failed, so a value offered here does not fail an earlier rule."""
from __future__ import annotations

import math
from typing import Iterable, List, Optional, Tuple

import numpy as np

from autoplan.model import ModelSpec


def divisors(n: int, upto: Optional[int] = None) -> List[int]:
    """Positive divisors of n, ascending, only those <= `upto` when given; [] for n < 1. The loop runs
    min(sqrt(n), upto) times, so a huge n (a typo'd GPU count or batch) costs no more than its square root."""
    if n < 1:
        return []
    limit = n if upto is None else min(n, upto)
    root = math.isqrt(n)
    if limit <= root:
        return [d for d in range(1, limit + 1) if n % d == 0]
    small = [d for d in range(1, root + 1) if n % d == 0]
    return sorted(v for v in set(small) | {n // d for d in small} if v <= limit)


def join(values: Iterable[object]) -> str:
    """'1, 2, 4', or 'none' when there is nothing to offer."""
    text = ", ".join(str(v) for v in values)
    return text or "none"


def gqa_allows_tp(model: ModelSpec, tp: int) -> bool:
    """Query groups must be a multiple or a divisor of tp (TransformerConfig.__post_init__)."""
    groups = model.num_query_groups
    return (groups % tp == 0) | (tp % groups == 0)  # | : a truth value per tp of an array too


def mixer_allows_tp(model: ModelSpec, tp: int) -> bool:
    """Gated DeltaNet's key and value heads divisible by tp (TransformerConfig.__post_init__ for
    experimental_attention_variant gated_delta_net); a parallel Mamba mixer's heads and groups divisible by tp
    (megatron/core/ssm/mamba_mixer.py `nheads % tp_size`, `ngroups % tp_size`)."""
    ok = np.asarray(True)  # a truth value per tp of an array too
    if model.linear_attention_layers:
        ok = ok & (model.gdn_num_key_heads % tp == 0) & (model.gdn_num_value_heads % tp == 0)
    if model.parallel_mamba:
        ok = ok & (model.mamba_num_heads % tp == 0) & (model.mamba_num_groups % tp == 0)
    return ok


def attention_tp(model: ModelSpec) -> List[int]:
    """tp values the attention shape allows: divisors of the heads that suit the query groups and the other
    mixers' heads."""
    return [t for t in divisors(model.num_attention_heads) if gqa_allows_tp(model, t) and mixer_allows_tp(model, t)]


def valid_tp(model: ModelSpec, world: int, pp: int, cp: int) -> List[int]:
    """tp values the attention shape allows that also tile the world with the given pp and cp."""
    fits = [t for t in attention_tp(model) if world % (t * pp * cp) == 0]
    return fits or [t for t in attention_tp(model) if t <= world]


def world_alternatives(model: ModelSpec, world: int, tp: int, pp: int, cp: int) -> str:
    """'valid pp for tp=8, cp=2: 1, 2, 3, 6' — the first degree that can be changed alone to tile the world
    (tp values also suit the attention shape)."""
    if world % (tp * cp) == 0:
        return f"valid pp for tp={tp}, cp={cp}: {join(divisors(world // (tp * cp)))}"
    if world % (tp * pp) == 0:
        return f"valid cp for tp={tp}, pp={pp}: {join(divisors(world // (tp * pp)))}"
    if world % (pp * cp) == 0:
        tps = [t for t in attention_tp(model) if world % (t * pp * cp) == 0]
        return f"valid tp for pp={pp}, cp={cp}: {join(tps)}"
    return f"tp*pp*cp must be one of: {join(divisors(world))}"


def valid_ep(model: ModelSpec, world: int, etp: int, pp: int) -> List[int]:
    """ep values that divide the experts and tile the world with etp and pp."""
    return [e for e in divisors(model.num_experts) if world % (etp * e * pp) == 0]


def expert_grid_alternatives(model: ModelSpec, world: int, ep: int, etp: int, pp: int) -> str:
    """'valid ep for etp=1, pp=4: 1, 2, 4' or, when no ep works, the etp values that do."""
    if world % (etp * pp) == 0:
        return f"valid ep for etp={etp}, pp={pp}: {join(valid_ep(model, world, etp, pp))}"
    return f"valid etp for ep={ep}, pp={pp}: {join(divisors(world // (ep * pp)) if world % (ep * pp) == 0 else [])}"


def stage_layer_counts(num_layers: int, pp: int, first: Optional[int], last: Optional[int]) -> List[int]:
    """Decoder layers on each pipeline rank as Megatron builds them (transformer_block.get_num_layers_to_build).

    Assumes the split is legal (see `autoplan.validate`)."""
    if first is None and last is None:
        return [num_layers // pp] * pp
    explicit = [n for n in (first, last) if n is not None]
    middle_ranks = pp - len(explicit)
    middle = (num_layers - sum(explicit)) // middle_ranks if middle_ranks else 0
    counts = [middle] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def uneven_split_problem(num_layers: int, pp: int, vpp: int, first: Optional[int],
                         last: Optional[int]) -> Optional[str]:
    """Why an explicit first/last stage split is illegal, or None. TransformerConfig.__post_init__ (uneven PP):
    each given stage has >= 1 layer and a multiple of vpp; the layers left over fill the middle ranks evenly, a
    multiple of vpp each, and there are middle layers exactly when there are middle ranks."""
    given = {"first_stage_layers": first, "last_stage_layers": last}
    for name, count in given.items():
        if count is not None and count < 1:
            return f"{name}={count} must be >= 1 (Megatron builds no empty pipeline stage)"
        if count is not None and vpp > 1 and count % vpp:
            return f"{name}={count} must be divisible by vpp={vpp}"
    explicit = [n for n in given.values() if n is not None]
    middle_ranks, rest = pp - len(explicit), num_layers - sum(explicit)
    if middle_ranks == 0 and rest != 0:
        return (f"first_stage_layers + last_stage_layers = {sum(explicit)} must equal num_layers={num_layers} "
                f"when pp={pp} leaves no middle stage")
    if middle_ranks > 0 and (rest <= 0 or rest % middle_ranks):
        return (f"the {rest} layers left after the first/last stages must split evenly over the "
                f"{middle_ranks} middle pipeline ranks")
    if middle_ranks > 0 and vpp > 1 and (rest // middle_ranks) % vpp:
        return f"the {rest // middle_ranks} layers on each middle pipeline rank must be divisible by vpp={vpp}"
    return None


def suggest_uneven_split(num_layers: int, pp: int, vpp: int = 1) -> Optional[Tuple[int, int]]:
    """A legal (first_stage_layers, last_stage_layers) close to an even split, or None (pp > 1 only).
    Among equally close splits the end stages get the fewer layers: they also hold the embedding and the loss."""
    if pp < 2:
        return None
    base = max(1, num_layers // pp)
    near = range(max(1, base - 2 * vpp), base + 2 * vpp + 1)
    pairs = sorted(((f, la) for f in near for la in near),
                   key=lambda p: (max(abs(p[0] - base), abs(p[1] - base)), p[0] + p[1] > 2 * base, p))
    return next((p for p in pairs if uneven_split_problem(num_layers, pp, vpp, *p) is None), None)


def layer_split_fix(num_layers: int, pp: int, vpp: int) -> str:
    """How to place `num_layers` on `pp` ranks with first/last stages sized explicitly, or '' when no way is
    close to even: with this vpp, else with vpp=1."""
    split = suggest_uneven_split(num_layers, pp, vpp)
    if split:
        return f"first_stage_layers={split[0]}, last_stage_layers={split[1]}"
    split = suggest_uneven_split(num_layers, pp, 1) if vpp > 1 else None
    return f"vpp=1 with first_stage_layers={split[0]}, last_stage_layers={split[1]}" if split else ""


def valid_pp(num_layers: int, world: int, tp: int, cp: int) -> List[int]:
    """pp values that split the layers evenly and tile the world with tp and cp."""
    return [p for p in divisors(world // (tp * cp)) if num_layers % p == 0]


def valid_cp(seq_len: int, world: int, tp: int, pp: int) -> List[int]:
    """cp values with seq_len divisible by 2*cp (cp=1 always works) that tile the world with tp and pp."""
    return [c for c in divisors(world // (tp * pp)) if c == 1 or seq_len % (2 * c) == 0]


def gbs_near(gbs: int, step: int) -> List[int]:
    """The multiples of `step` just below (when positive) and just above `gbs`."""
    below = gbs // step * step
    return [v for v in (below, below + step) if v > 0]
