"""The layout, batch and DeepSpeed rules are each written once (autoplan/layout_rules.py, deepspeed_rules.py): the
mask the search applies to a batch of candidates and the verdict on one strategy that validate and the DeepSpeed
emitter read are the same rule."""
import numpy as np
import pytest

from autoplan import deepspeed_rules as DS
from autoplan import layout_rules as LR
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.integrations.engines import deepspeed_blocked, deepspeed_unsupported
from autoplan.strategy import Strategy

from conftest import make_dense, make_moe

LAYOUT_RULES = [r for r in vars(LR).values() if isinstance(r, LR.Rule)]


def _strategies():
    return [Strategy(tp=tp, sp=sp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs=mbs, zero=zero, fp8=fp8,
                     recompute=rc, recompute_method="block" if rc == "full" else None,
                     recompute_layers=1 if rc == "full" else None)
            for tp, sp in ((1, False), (2, True), (4, True), (3, True)) for pp, vpp in ((1, 1), (2, 1), (4, 2), (3, 1))
            for cp in (1, 2) for ep, etp in ((1, 1), (2, 1), (4, 2)) for mbs in (1, 3) for zero in (1, 3)
            for fp8 in ("none", "hybrid") for rc in ("none", "full")]


@pytest.mark.parametrize("engine", ["megatron", "deepspeed"])
@pytest.mark.parametrize("make", [make_dense, make_moe])
def test_every_rule_reads_alike_for_a_batch_and_for_one_strategy(engine, make):
    model, strategies, world = make(add_bias_linear=True), _strategies(), 48
    env = LR.Env(model, world, seq_len=4096 + 4, gbs=96, engine=engine)
    lay = layouts_from_strategies(strategies, world, engine=engine)
    assert len(LAYOUT_RULES) >= 15
    broken_somewhere = set()
    for rule in LAYOUT_RULES + list(DS.RULES):
        batch = np.broadcast_to(np.asarray(rule.mask(env, lay), bool), (len(lay),))
        one = [not rule.broken(env, LR.strategy_view(s, engine, world)) for s in strategies]
        assert list(batch) == one, rule.name
        if not batch.all():
            broken_somewhere.add(rule.name)
    assert len(broken_somewhere) >= 6, broken_somewhere  # the strategies exercise the rules both ways


def test_the_deepspeed_emitter_and_search_read_one_rule_list():
    """deepspeed_unsupported (one strategy) names a rule exactly where deepspeed_blocked (the search) drops the row."""
    strategies = _strategies()
    for model in (make_dense(), make_moe()):
        blocked = deepspeed_blocked(layouts_from_strategies(strategies, 48, engine="deepspeed"), model)
        assert list(blocked) == [deepspeed_unsupported(s, model) is not None for s in strategies]
        assert blocked.any() and not blocked.all()
