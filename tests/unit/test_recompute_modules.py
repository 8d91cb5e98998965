"""Megatron's per-module selective recompute (`recompute_modules`): strategy, rules, cost, search, emit, import."""
import pytest

from autoplan import recompute as R
from autoplan.costmodel import compute as C
from autoplan.costmodel import memory as M
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.layout import layouts_from_strategies
from autoplan.errors import InputError
from autoplan.strategy import Strategy, parse_strategy_text, strategy_from_mapping
from autoplan.validate import first_broken_rule

from conftest import cluster, make_dense, make_moe, workload


def sel(*mods, **kw):
    return Strategy(recompute="selective", recompute_modules=mods or None, **kw)


def test_strategy_parses_canonicalises_and_labels_modules():
    s = strategy_from_mapping(parse_strategy_text("recompute=selective,recompute_modules=moe_act+core_attn+layernorm"))
    assert s.recompute_modules == ("core_attn", "layernorm", "moe_act")
    assert "rc-sel(attn+ln+act)" in s.label() and s.to_dict()["recompute_modules"] == s.recompute_modules
    assert Strategy(recompute="selective").label().endswith("rc-sel")
    with pytest.raises(InputError, match="apply only to recompute=selective"):
        strategy_from_mapping({"recompute": "full", "recompute_modules": ["moe_act"]})
    with pytest.raises(InputError, match="did you mean 'moe_act'"):
        strategy_from_mapping({"recompute": "selective", "recompute_modules": ["moe_ac"]})


def test_layout_round_trips_the_module_mask():
    for s in (sel("layernorm", "moe_act"), Strategy(recompute="selective"), Strategy()):
        lay = layouts_from_strategies([s], 8)
        assert lay.strategy(0).recompute_modules == s.recompute_modules
    assert layouts_from_strategies([Strategy(recompute="selective")], 8).recompute_modules[0] == R.BIT["core_attn"]


@pytest.mark.parametrize("model,strategy,message", [
    (make_dense(), sel("moe_act"), "need an MoE model"),
    (make_dense(), sel("mla_up_proj"), "needs multi-latent attention"),
    (make_moe(), sel("shared_experts", ep=8), "needs shared experts"),
    (make_moe(), sel("moe", ep=8, moe_a2a_overlap=True), "cannot be combined with moe_a2a_overlap"),
])
def test_module_rules(model, strategy, message):
    msg = first_broken_rule(model, cluster(8), workload(), strategy)
    assert msg and message in msg


def test_fp8_delayed_scaling_rejects_norm_and_activation_recompute():
    s = sel("layernorm", fp8="hybrid")  # default recipe before Blackwell: delayed
    assert "fp8_recipe=delayed" in first_broken_rule(make_dense(), cluster(8), workload(), s)
    ok = sel("layernorm", fp8="hybrid", fp8_recipe="tensorwise")
    assert first_broken_rule(make_dense(), cluster(8), workload(), ok) is None


def test_more_modules_hold_less_and_recompute_more():
    m = make_moe(shared_expert_ffn_hidden_size=1024)
    ladder = [Strategy(), sel(), sel("core_attn", "layernorm", "moe_act"),
              sel("core_attn", "layernorm", "moe_act", "moe")]
    ests = [estimate(m, cluster(8), s.model_copy(update=dict(ep=8)), workload()) for s in ladder]
    acts = [e.memory_breakdown["activations"] for e in ests]
    rec = [e.time_breakdown["recompute"] for e in ests]
    assert acts == sorted(acts, reverse=True) and len(set(acts)) == 4
    assert rec == sorted(rec) and rec[0] == 0.0


def test_dropped_bytes_are_the_module_tensors():
    """moe_act drops exactly the routed experts' activation output (FC2 input); layernorm the two norm outputs."""
    m = make_moe()
    base = layouts_from_strategies([sel()], 8)
    act = layouts_from_strategies([sel("core_attn", "moe_act")], 8)
    ln = layouts_from_strategies([sel("core_attn", "layernorm")], 8)
    sh = C.shard_of(m, base, 2048)
    d0 = M.selective_dropped_bytes(m, sh, base, moe=True)[0]
    assert M.selective_dropped_bytes(m, sh, act, moe=True)[0] - d0 == pytest.approx(
        2 * float(sh.expert_tokens[0]) * m.moe_ffn_hidden_size)
    region = float(sh.tokens_sp[0]) * m.hidden_size
    assert M.selective_dropped_bytes(m, sh, ln, moe=True)[0] - d0 == pytest.approx(2 * region + 2 * region)
    # "mlp" is the dense MLP only (transformer_layer.py: not on MoE layers).
    mlp = layouts_from_strategies([sel("core_attn", "mlp")], 8)
    assert M.selective_dropped_bytes(m, sh, mlp, moe=True)[0] == pytest.approx(d0)
    assert M.selective_dropped_bytes(m, sh, mlp, moe=False)[0] > M.selective_dropped_bytes(m, sh, base,
                                                                                           moe=False)[0]


def test_search_uses_cheap_modules_before_full_recompute():
    from autoplan.solvers.api import solve
    from autoplan.solvers.space import Problem, recompute_options

    m = make_moe(num_layers=8)
    p = Problem(m, cluster(8), workload(), fixed={"tp": 1, "pp": 1, "ep": 8})
    opts = recompute_options(p, 8)
    selective = [names for code, _, _, bits in opts if code == 1 for names in [R.names_of(bits)]]
    assert selective == [("core_attn",), ("core_attn", "layernorm", "moe_act")]
    assert opts.index(next(o for o in opts if o[0] == 2)) > len(selective)  # full comes after
    best = solve(p, "enumerate", top_k=1).plans[0]
    assert first_broken_rule(m, p.cluster, p.workload, best.strategy) is None


def test_emit_and_import_round_trip():
    from autoplan.integrations.importers import from_megatron_args
    from autoplan.integrations.megatron import megatron_args
    from engine_checks.plans import LLAMA_8B, make_plan

    plan = make_plan(LLAMA_8B, 8, 4096, 32, recompute="selective", recompute_modules=("core_attn", "layernorm"),
                     fp8="none")
    args = megatron_args(plan)
    i = args.index("--recompute-modules")
    assert args[i + 1:i + 3] == ["core_attn", "layernorm"]
    imported = from_megatron_args(" ".join(args))
    assert imported.strategy["recompute_modules"] == ("core_attn", "layernorm")


def test_deepspeed_refuses_modules():
    from autoplan.integrations.engines import deepspeed_unsupported
    from engine_checks.plans import LLAMA_8B

    s = Strategy(recompute="selective", recompute_modules=("core_attn", "layernorm"))
    assert "per-module" in deepspeed_unsupported(s, LLAMA_8B)
    assert deepspeed_unsupported(Strategy(recompute="selective"), LLAMA_8B) is None
