"""`--fix` / `--exclude` and partial `--strategy` keys take effect on every plan, or are refused with the rule."""
import subprocess
import sys

import pytest

from autoplan.solvers.policy import search_constraints, why_nothing_is_legal
from autoplan.complete import complete_strategy
from autoplan.errors import InputError
from autoplan.solvers.api import solve
from autoplan.solvers.space import Problem, parse_constraints
from autoplan.validate import validate

from conftest import cluster, deadline_s, make_dense, make_moe, workload


def _plans(model, n, fix=(), exclude=(), top=5, **kw):
    fixed, excluded = search_constraints(parse_constraints(list(fix), "--fix"),
                                         parse_constraints(list(exclude), "--exclude"))
    problem = Problem(model, cluster(n, **kw), workload(2048, 32), fixed=fixed, excluded=excluded)
    return problem, solve(problem, "enumerate", top_k=top)


@pytest.mark.parametrize("item, key, value", [
    ("moe_a2a_overlap=true", "moe_a2a_overlap", True),
    ("cpu_offload_layers=4", "cpu_offload_layers", 4),
    ("te_cross_entropy=false", "te_cross_entropy", False),
    ("expandable_segments=false", "expandable_segments", False),
    ("tp_comm_overlap=false", "tp_comm_overlap", False),
])
def test_fixed_switch_is_on_every_plan(item, key, value):
    problem, result = _plans(make_moe(), 16, fix=[item])
    assert result.plans
    for p in result.plans:
        got = p.strategy.tp_overlap_on if key == "tp_comm_overlap" else getattr(p.strategy, key)
        assert got == value
        validate(problem.model, problem.cluster, problem.workload, p.strategy)


@pytest.mark.parametrize("item, key, value", [("fp8_recipe=tensorwise", "fp8_recipe", "tensorwise"),
                                              ("fp8=e4m3", "fp8", "e4m3")])
def test_fixed_fp8_label_is_on_every_plan(item, key, value):
    problem, result = _plans(make_dense(), 8, fix=[item])
    assert result.plans
    for p in result.plans:
        assert getattr(p.strategy, key) == value and p.strategy.uses_fp8


def test_excluding_a_switch_fixes_the_other_value():
    _, result = _plans(make_dense(), 8, exclude=["te_cross_entropy=true"])
    assert result.plans and not any(p.strategy.te_cross_entropy for p in result.plans)


def test_keys_the_search_cannot_honour_are_refused():
    with pytest.raises(InputError, match="dp is derived"):
        search_constraints({"dp": [4]}, {})
    with pytest.raises(InputError, match="does not vary cpu_offload_layers"):
        search_constraints({}, {"cpu_offload_layers": [4]})
    with pytest.raises(InputError, match="give one value"):
        search_constraints({"cpu_offload_layers": [2, 4]}, {})


@pytest.mark.parametrize("item, words", [
    ("fp8=e4m3", "FP8 tensor cores"),
    ("cpu_offload_layers=8", "must be below num_layers=8"),
    ("moe_a2a_overlap=true", "needs an MoE model"),
])
def test_nothing_legal_names_the_rule_of_the_fixed_key(item, words):
    kw = {"peak_tflops": {"bf16": 312.0}, "gemm_efficiency": {"bf16": 0.7}} if "fp8" in item else {}
    problem, result = _plans(make_dense(), 8, fix=[item], **kw)
    assert result.space_size == 0
    assert words in why_nothing_is_legal(problem)


def test_partial_strategy_keeps_the_keys_it_gives():
    s, notes = complete_strategy(make_dense(), cluster(8), workload(2048, 32),
                                 {"tp": 2, "cpu_offload_layers": 4, "fp8": "e4m3"})
    assert s.cpu_offload_layers == 4 and s.fp8 == "e4m3" and s.tp == 2


def run(*args):
    p = subprocess.run([sys.executable, "-m", "autoplan.cli.main", *args], capture_output=True, text=True,
                       timeout=deadline_s(100))
    return p.returncode, p.stdout, p.stderr


def test_cli_fix_refused_with_one_line_rule():
    rc, out, err = run("plan", "--model", "llama3-8b", "--cluster", "a100-80g", "--gpus", "8", "--seq", "4096",
                       "--gbs", "64", "--fix", "fp8=e4m3")
    assert rc == 2 and "FP8 tensor cores" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_estimate_keeps_cpu_offload_layers():
    import json

    rc, out, err = run("estimate", "--model", "llama3-8b", "--cluster", "h100", "--gpus", "8", "--seq", "4096",
                       "--gbs", "64", "--strategy", "tp=2,pp=1,cpu_offload_layers=8", "--json")
    assert rc == 0, err
    assert json.loads(out)["strategy"]["cpu_offload_layers"] == 8


def test_fixing_a_full_recompute_detail_fixes_full_recompute():
    problem, result = _plans(make_dense(), 8, fix=["recompute_method=block"])
    assert result.plans and all(p.strategy.recompute == "full" and p.strategy.recompute_method == "block"
                                for p in result.plans)
    with pytest.raises(InputError, match="applies only to recompute=full"):
        search_constraints({"recompute_layers": [2], "recompute": ["selective"]}, {})
