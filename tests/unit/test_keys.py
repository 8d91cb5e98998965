"""The strategy key registry (autoplan/keys.py): every key reaches Strategy, Layouts and back, the search's grid,
the rule book, the Megatron flags, --help and the README from its one declaration."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from autoplan import keys as K
from autoplan.costmodel.layout import Layouts, layouts_from_strategies
from autoplan.strategy import Strategy, parse_strategy_text, strategy_from_mapping

def _on_value(switch):
    return 1 if switch.dtype is np.int64 else (not switch.default if switch.default is not None else False)


@pytest.mark.parametrize("switch", K.SWITCHES, ids=lambda k: k.name)
def test_every_switch_is_a_strategy_field_with_its_declared_default(switch):
    field = Strategy.model_fields[switch.name]
    assert field.default == switch.default and field.description == switch.doc
    assert getattr(Strategy(), switch.name) == switch.default


@pytest.mark.parametrize("switch", K.SWITCHES, ids=lambda k: k.name)
def test_every_switch_survives_layouts_under_its_own_column_name(switch):
    # fp8 and tp/sp make every switch's encoding keep the value (fp8_param is carried under fp8 only).
    s = Strategy(tp=2, sp=True, fp8="hybrid", **{switch.name: _on_value(switch)})
    lay = layouts_from_strategies([s, Strategy()], 16)
    assert lay.strategy(0) == s.model_copy(update={"dp": 8}) and lay.strategy(1) == Strategy(dp=16)
    assert getattr(lay, switch.name)[0] != getattr(lay, switch.name)[1] or switch.name == "tp_comm_overlap"


@pytest.mark.parametrize("switch", K.SWITCHES, ids=lambda k: k.name)
def test_every_switch_reads_from_the_command_line_as_its_type(switch):
    text = "3" if switch.dtype is np.int64 else "true"
    assert parse_strategy_text(f"{switch.name}={text}")[switch.name] == (3 if switch.dtype is np.int64 else True)
    assert getattr(strategy_from_mapping({switch.name: text}), switch.name) in (3, True)


def test_a_switch_column_left_out_of_layouts_is_off():
    lay = layouts_from_strategies([Strategy()], 8)
    bare = Layouts(**{k: v for k, v in lay.__dict__.items() if k not in K.NAMES})
    for switch in K.SWITCHES:
        column = getattr(bare, switch.name)
        assert column.dtype == switch.dtype and not column.any()


def test_the_readme_key_table_is_the_generated_one():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("<!-- key table: python -m autoplan.keys -->\n")
    block = readme[readme.index("\n", start) + 1:readme.index("<!-- end of key table -->")]
    assert block == K.key_table()


def test_each_switch_rule_reads_alike_for_a_batch_and_for_one_strategy(moe):
    """A rule is written once: its mask over a batch of candidates and its verdict on one strategy agree."""
    from autoplan import layout_rules as LR
    from autoplan import switch_rules as SR

    strategies = [Strategy(tp=tp, sp=sp, pp=pp, vpp=vpp, ep=ep, zero=zero, fp8=fp8, recompute=rc,
                           overlap_grad_reduce=ogr)
                  for tp, sp in ((1, False), (2, True)) for pp, vpp in ((1, 1), (2, 1), (2, 2)) for ep in (1, 2)
                  for zero in (0, 1) for fp8 in ("none", "hybrid") for rc in ("none", "full") for ogr in (True, False)]
    for engine in ("megatron", "deepspeed"):
        lay = layouts_from_strategies(strategies, 64, engine=engine)
        for rule in SR.RULES:
            value = 3 if rule.key == "cpu_offload_layers" else True
            batch = np.broadcast_to(np.asarray(rule.needs(moe, lay, value), bool), (len(lay),))
            one = [not rule.broken(moe, LR.strategy_view(s, engine), value) for s in strategies]
            assert list(batch) == one, (rule.key, engine)


# A value other than the default for every key, as one strategy that carries all of them at once where they combine.
_SET = {"tp": 2, "pp": 2, "vpp": 1, "cp": 2, "ep": 2, "etp": 2, "dp": 4, "mbs": 2, "sp": True, "zero": 0,
        "recompute": "full", "recompute_method": "block", "recompute_layers": 3, "fp8": "hybrid",
        "fp8_recipe": "blockwise", "first_stage_layers": 5, "last_stage_layers": 6,
        "cuda_graph_modules": ("attn", "mlp")}
_APART = [{"recompute": "selective", "recompute_modules": ("core_attn", "mlp")},
          {"pp": 2, "account_for_embedding": True, "account_for_loss": True},
          {"pp": 2, "vpp": 2, "pipeline_layout": "Et|t|t|tL"}]


def test_every_strategy_key_is_declared_once_in_field_order():
    assert tuple(Strategy.model_fields) == tuple(k.name for k in K.KEYS)
    for key in K.KEYS:
        field = Strategy.model_fields[key.name]
        assert field.default == key.default and field.description == key.doc and key.role in K.ROLES


@pytest.mark.parametrize("key", K.KEYS, ids=lambda k: k.name)
def test_every_strategy_key_survives_layouts(key):
    given = [s for s in [_SET] + _APART if key.name in s] or [{"tp": 2, "sp": True, "fp8": "hybrid",
                                                               key.name: _on_value(key)}]
    strategies = [Strategy(**values) for values in given]
    lay = layouts_from_strategies(strategies + [Strategy()], 16)
    for i, s in enumerate(strategies):
        assert lay.strategy(i) == s.model_copy(update={"dp": s.dp or 16 // (s.tp * s.pp * s.cp)}), key.name
    assert lay.strategy(len(strategies)) == Strategy(dp=16)


def test_the_fixed_fp8_recipe_reaches_the_searched_plans_from_layouts(dense):
    """The search's candidates carry the recipe as written: no plan needs it added back."""
    from autoplan.solvers.space import Problem, enumerate_grid
    from conftest import cluster, workload

    problem = Problem(dense, cluster(8), workload(), fixed={"fp8_recipe": ["tensorwise"], "tp": [2], "pp": [1]})
    lay = enumerate_grid(problem).layouts
    assert len(lay) and {lay.strategy(i).fp8_recipe for i in range(len(lay))} == {"tensorwise"}


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_help_names_every_strategy_key(command, capsys):
    from conftest import run_cli

    code, out, _ = run_cli([command, "--help"], capsys)
    text = " ".join(out.replace("\u2502", " ").split())  # the help panel's borders and wrapping taken out
    assert code == 0
    for key in K.KEYS:
        assert f"{key.name} (" in text


def test_the_cuda_graph_rules_read_alike_for_a_batch_and_for_one_strategy():
    """CUDA-graph rules that read the rest of the strategy are written once (switch_rules.py): the search's mask and
    validate's verdict on one strategy agree, for every module set, with and without hidden dropout."""
    from autoplan import cuda_graphs as G
    from autoplan import layout_rules as LR
    from autoplan import switch_rules as SR
    from conftest import make_moe

    strategies = [Strategy(recompute=rc, recompute_modules=mods, moe_a2a_overlap=a2a, cpu_offload_layers=off, ep=2)
                  for rc, mods in (("none", None), ("full", None), ("selective", ("moe",)), ("selective", ("mlp",)),
                                   ("selective", ("core_attn",)))
                  for a2a in (False, True) for off in (0, 2)]
    sets = [("full_iteration",), ("attn", "mlp"), ("attn", "moe_router", "moe_preprocess"), ("moe",)]
    assert len(SR.BY_KEY["cuda_graph_modules"]) == 5
    for model in (make_moe(), make_moe(hidden_dropout=0.1)):
        for engine in ("megatron", "deepspeed"):
            lay = layouts_from_strategies(strategies, 64, engine=engine)
            for names in sets:
                value = G.mask(names)
                for rule in SR.BY_KEY["cuda_graph_modules"]:
                    batch = np.broadcast_to(np.asarray(rule.needs(model, lay, value), bool), (len(lay),))
                    one = [not rule.broken(model, LR.strategy_view(s, engine), value) for s in strategies]
                    assert list(batch) == one, (names, engine, model.hidden_dropout)


_LACKED = {"fp8": "hybrid", "cpu_offload_layers": 2, "tp_comm_overlap": True, "moe_flex_dispatcher": True,
           "te_op_fuser": True, "cuda_graph_modules": ("attn",)}  # a set value of each `deepspeed_lacks` key


@pytest.mark.parametrize("key", [k for k in K.KEYS if k.deepspeed_lacks], ids=lambda k: k.name)
def test_a_key_deepspeed_lacks_is_refused_by_its_registry_line_and_left_out_of_its_search(key, moe):
    """The registry's `deepspeed_lacks` is the whole declaration: the DeepSpeed emitter's check names the key in the
    entry's words, and the search's rows for DeepSpeed cannot carry it."""
    from autoplan import deepspeed_rules as DS
    from autoplan import layout_rules as LR
    from autoplan.integrations.engines import deepspeed_blocked, deepspeed_unsupported

    value = _LACKED[key.name]
    extra = {"tp_comm_overlap": dict(tp=2, sp=True), "moe_flex_dispatcher": dict(ep=2)}.get(key.name, {})
    s = Strategy(**extra, **{key.name: value})
    shown = "+".join(value) if isinstance(value, tuple) else str(value).lower()
    line = key.deepspeed_lacks.format(shown=f"{key.name}={shown}", flag=K.flag(key.name))
    rule, env = DS.LACKS[key.name], LR.Env(moe, engine="deepspeed")
    assert rule in DS.RULES and rule.message(SimpleNamespace(strategy=s, model=moe)) == line
    assert rule.broken(env, LR.strategy_view(s, "deepspeed"))
    off = {"fp8": "none", "cpu_offload_layers": 0, "cuda_graph_modules": None}.get(key.name, False)
    assert not rule.broken(env, LR.strategy_view(Strategy(**extra, **{key.name: off}), "deepspeed"))
    # TP overlap needs Megatron's sequence parallelism, which DeepSpeed's rules name first.
    first = "sequence parallelism" if key.name == "tp_comm_overlap" else line
    assert first in deepspeed_unsupported(s, moe)
    assert deepspeed_blocked(layouts_from_strategies([s], 8, engine="deepspeed"), moe).tolist() == [True]


@pytest.mark.parametrize("key, line", [
    ("te_op_fuser", "te_op_fuser=true is Megatron's --use-transformer-engine-op-fuser; DeepSpeed has none; set "
                    "te_op_fuser=false or use engine megatron"),
    ("cuda_graph_modules", "cuda_graph_modules is a Megatron-LM feature (--cuda-graph-impl); drop it or use engine "
                           "megatron")])
def test_validate_refuses_the_op_fuser_and_cuda_graphs_on_deepspeed_with_the_registry_line(key, line, moe):
    """validate reads the same DeepSpeed rule for the two keys it refuses on DeepSpeed, and the search under
    --engine deepspeed has no row with them fixed."""
    from autoplan.solvers.space import Problem, enumerate_grid
    from autoplan.validate import first_broken_rule
    from conftest import cluster, workload

    s = Strategy(**{key: _LACKED[key]})
    assert first_broken_rule(moe, cluster(8), workload(), s, engine="deepspeed") == line
    assert first_broken_rule(moe, cluster(8), workload(), s, engine="megatron") is None
    for engine, some in (("megatron", True), ("deepspeed", False)):
        grid = enumerate_grid(Problem(moe, cluster(8), workload(), fixed={key: [_LACKED[key]]}, engine=engine))
        assert bool(len(grid.layouts)) is some


@pytest.mark.parametrize("key", [k for k in K.KEYS if k.passthrough], ids=lambda k: k.name)
def test_every_plain_flag_key_is_emitted_and_read_back_by_megatron(key):
    """A key the registry marks `passthrough` is written as its flags by the Megatron emitter and read back from
    them by the Megatron importer, with no code of its own in either."""
    from autoplan.integrations import importers
    from autoplan.integrations.megatron import megatron_args
    from engine_checks.plans import LLAMA_8B, make_plan

    both = {k: True for k in K.names("split")} if key.role == "split" else {}  # 32 layers + 2 split over pp=2
    plan = make_plan(LLAMA_8B, 16, 4096, 64, tp=2, pp=2, sp=True, **{**both, key.name: True})
    args = megatron_args(plan)
    assert all(f.split()[0] in args for f in key.megatron)
    assert importers.from_megatron_args(" ".join(args)).strategy.get(key.name) is True
