"""Cross-node expert parallelism, the flex dispatcher and the 1F1B all-to-all overlap are in the default search,
set where the engine runs them; `estimate` fills the two switches as the search would unless they are stated."""
import numpy as np
from autoplan.complete import complete_strategy
from autoplan.strategy import parse_strategy_text
from autoplan.solvers.space import Problem, enumerate_grid
from autoplan.validate import validate
from conftest import cluster, make_moe, workload


def moe_problem(**kw):
    return Problem(make_moe(num_experts=16), cluster(16, nvlink_domain_size=8), workload(gbs=32), **kw)


def test_expert_parallelism_leaves_the_nvlink_domain_without_being_asked():
    lay = enumerate_grid(moe_problem()).layouts
    assert (lay.ep * lay.etp > 8).any()
    # --allow ep-outside-domain is accepted and changes nothing.
    wide = enumerate_grid(moe_problem(allow=frozenset({"ep-outside-domain"}))).layouts
    assert len(wide) == len(lay)


def test_flex_and_overlap_are_on_exactly_where_megatron_runs_them():
    p = moe_problem()
    lay = enumerate_grid(p).layouts
    assert (lay.moe_flex_dispatcher == (lay.ep > 1)).all()
    legal = (lay.ep > 1) & ~((lay.pp > 1) & (lay.vpp == 1)) & (lay.recompute != 2)
    assert (lay.moe_a2a_overlap == legal).all() and lay.moe_a2a_overlap.any()
    for i in np.flatnonzero(lay.moe_a2a_overlap)[:20]:
        validate(p.model, p.cluster, p.workload, lay.strategy(int(i)))
    # DeepSpeed runs neither.
    ds = enumerate_grid(moe_problem(engine="deepspeed")).layouts
    assert not ds.moe_flex_dispatcher.any() and not ds.moe_a2a_overlap.any()


def test_a_fixed_cuda_graph_scope_over_the_experts_turns_the_overlap_off_instead_of_dropping_candidates():
    p = Problem(make_moe(first_k_dense_layers=1), cluster(16, nvlink_domain_size=8), workload(gbs=32),
                fixed={"cuda_graph_modules": ("attn", "mlp")})
    lay = enumerate_grid(p).layouts
    assert (lay.ep > 1).any() and not lay.moe_a2a_overlap.any()


def test_estimate_fills_unstated_switches_as_the_search_does_and_keeps_stated_ones():
    m, c, wl = make_moe(), cluster(16, nvlink_domain_size=8), workload(gbs=32)
    given = parse_strategy_text("tp=1,pp=1,vpp=1,cp=1,ep=8,etp=1,mbs=1,sp=false,zero=1,recompute=none,fp8=none")
    s, notes = complete_strategy(m, c, wl, given)
    assert s.moe_flex_dispatcher and s.moe_a2a_overlap
    assert any("moe_a2a_overlap=true" in n and "moe_flex_dispatcher=true" in n for n in notes)
    stated = {**given, "moe_flex_dispatcher": False, "moe_a2a_overlap": False}
    s, notes = complete_strategy(m, c, wl, stated)
    assert not s.moe_flex_dispatcher and not s.moe_a2a_overlap
    assert not any("set as the search sets them" in n for n in notes)
    # Full recompute: the overlap cannot run, so only the dispatcher is filled.
    s, _ = complete_strategy(m, c, wl, {**given, "recompute": "full"})
    assert s.moe_flex_dispatcher and not s.moe_a2a_overlap


def test_an_imported_megatron_config_states_its_dispatcher():
    from autoplan.integrations.megatron_flags import megatron_strategy, parse_flags

    flags = parse_flags("--num-layers 4 --num-experts 8 --expert-model-parallel-size 8 "
                        "--moe-token-dispatcher-type alltoall".split())
    s = megatron_strategy(flags, 4, True)
    assert s["moe_flex_dispatcher"] is False and s["moe_a2a_overlap"] is False
