"""Numerics are never changed silently: estimate prices the precision, FP8 recipe and optimizer-state dtype as
written (bf16 GEMMs and fp32 Adam states when left out), plan searches FP8 only when --precision allows it, and a
full recompute written alone is every layer recomputed."""
import json
import subprocess
import sys

import pytest

from autoplan.modelio import load_model
from autoplan.clusterio import load_cluster
from autoplan.complete import complete_strategy
from autoplan.errors import InputError
from autoplan.solvers.api import solve
from autoplan.solvers.space import Problem, enumerate_grid
from autoplan.workload import Workload
from conftest import deadline_s


def run(*args):
    p = subprocess.run([sys.executable, "-m", "autoplan.cli.main", *args], capture_output=True, text=True,
                       timeout=deadline_s(100))
    return p.returncode, p.stdout, p.stderr


BASE = ["--model", "llama3-8b", "--cluster", "h100", "--gpus", "16", "--seq", "4096", "--gbs", "64"]


@pytest.fixture(scope="module")
def setup():
    return load_model("llama3-8b"), load_cluster("h100", 16), Workload(seq_len=4096, global_batch_size=64)


def test_partial_strategy_keeps_bf16_and_fp32_states(setup):
    s, notes = complete_strategy(*setup, {"tp": 2, "pp": 2})
    assert s.fp8 == "none" and s.fp8_recipe is None
    assert not s.adam_bf16_states and not s.grad_reduce_bf16 and not s.fp8_param
    assert any("bf16 GEMMs (fp8=none)" in n and "fp32 Adam states" in n for n in notes)


def test_written_fp8_is_kept_and_memory_switches_are_named(setup):
    s, notes = complete_strategy(*setup, {"tp": 2, "pp": 2, "fp8": "e4m3"})
    assert s.fp8 == "e4m3"
    memory = [n for n in notes if n.startswith("memory-only switches turned on")]
    assert memory and "fp8_param=true" in memory[0] and "te_cross_entropy=true" in memory[0]
    assert s.fp8_param and s.te_cross_entropy and s.expandable_segments


def test_full_recompute_alone_is_every_layer(setup):
    alone, _ = complete_strategy(*setup, {"tp": 2, "pp": 2, "recompute": "full"})
    written, _ = complete_strategy(*setup, {"tp": 2, "pp": 2, "recompute": "full", "recompute_method": "uniform",
                                            "recompute_layers": 1})
    assert (alone.recompute_method, alone.recompute_layers) == ("uniform", 1)
    assert alone == written


def test_estimate_full_recompute_alone_prices_as_uniform_one():
    rc, out, err = run("estimate", *BASE, "--strategy", "tp=2,pp=2,recompute=full", "--json")
    assert rc == 0, err
    rc2, out2, err2 = run("estimate", *BASE, "--strategy",
                          "tp=2,pp=2,recompute=full,recompute_method=uniform,recompute_layers=1", "--json")
    assert rc2 == 0, err2
    alone, written = json.loads(out), json.loads(out2)
    assert alone["strategy"]["recompute_method"] == "uniform" and alone["strategy"]["recompute_layers"] == 1
    assert alone["step_time_s"] == written["step_time_s"] and alone["peak_mem_gib"] == written["peak_mem_gib"]


def test_estimate_partial_strategy_prices_bf16():
    rc, out, err = run("estimate", *BASE, "--strategy", "tp=2,pp=2", "--json")
    assert rc == 0, err
    est = json.loads(out)
    assert est["strategy"]["fp8"] == "none"
    assert "fp8_param" not in est["strategy"] and "adam_bf16_states" not in est["strategy"]


def _fp8_set(problem):
    grid = enumerate_grid(problem)
    return set(bool(v) for v in grid.layouts.fp8)


def test_plan_default_searches_bf16_only(setup):
    assert _fp8_set(Problem(*setup)) == {False}
    plans = solve(Problem(*setup), "enumerate", top_k=5).plans
    assert plans and all(p.strategy.fp8 == "none" for p in plans)


def test_precision_any_and_fp8(setup):
    assert _fp8_set(Problem(*setup, precision="any")) == {False, True}
    assert _fp8_set(Problem(*setup, precision="fp8")) == {True}
    plans = solve(Problem(*setup, precision="fp8"), "enumerate", top_k=5).plans
    assert plans and all(p.strategy.fp8 != "none" for p in plans)
    # A fixed fp8 is the user's precision when --precision is not given.
    assert _fp8_set(Problem(*setup, fixed={"fp8": ["hybrid"]})) == {True}


@pytest.mark.parametrize("precision, fixed, words", [
    ("bf16", {"fp8": ["hybrid"]}, "--precision bf16"),
    ("fp8", {"fp8": ["none"]}, "--precision fp8"),
    ("fp16", {}, "must be one of"),
])
def test_precision_contradictions_are_input_errors(setup, precision, fixed, words):
    with pytest.raises(InputError, match=words):
        Problem(*setup, fixed=fixed, precision=precision)


def test_precision_fp8_needs_fp8_hardware():
    m, wl = load_model("llama3-8b"), Workload(seq_len=4096, global_batch_size=64)
    with pytest.raises(InputError, match="FP8 tensor cores"):
        Problem(m, load_cluster("a100-80g", 16), wl, precision="fp8")


@pytest.mark.slow
def test_plan_cli_precision_and_table_marks_fp8():
    rc, out, err = run("plan", *BASE, "--solver", "enumerate", "--top", "3", "--json")
    assert rc == 0, err
    assert all(p["strategy"]["fp8"] == "none" for p in json.loads(out)["plans"])
    rc, out, err = run("plan", *BASE, "--solver", "enumerate", "--top", "3", "--precision", "fp8")
    assert rc == 0, err
    rows = [line for line in out.splitlines() if line.startswith("│") and "mbs" in line]
    assert rows and all("│ fp8 " in r for r in rows)
    rc, out, err = run("plan", *BASE, "--solver", "enumerate", "--top", "3")
    rows = [line for line in out.splitlines() if line.startswith("│") and "mbs" in line]
    assert rc == 0 and rows and all("│ bf16 " in r for r in rows)
    rc, out, err = run("plan", "--help")
    assert "--precision" in out and "bf16 (default" in out
