"""The estimate and plan commands end to end (subprocess on the installed console script)."""
import json
import subprocess
import sys

import pytest

from autoplan.results import ESTIMATE_CONTRACT_KEYS
from autoplan.strategy import CONTRACT_KEYS
from conftest import deadline_s


def run(*args):
    p = subprocess.run([sys.executable, "-m", "autoplan.cli.main", *args], capture_output=True, text=True,
                       timeout=deadline_s(100))
    return p.returncode, p.stdout, p.stderr


BASE = ["--model", "llama3-8b", "--cluster", "h100", "--gpus", "16", "--seq", "4096", "--gbs", "64"]


def test_estimate_json_contract():
    rc, out, err = run("estimate", *BASE, "--strategy", "tp=2,pp=2,mbs=1,sp=true,zero=1,recompute=selective",
                       "--json")
    assert rc == 0, err
    est = json.loads(out)
    assert set(ESTIMATE_CONTRACT_KEYS) <= set(est)
    assert est["fits"] is True and est["step_time_s"] > 0
    assert abs(sum(est["time_breakdown"].values()) - est["step_time_s"]) < 1e-6 * est["step_time_s"]
    assert set(CONTRACT_KEYS) <= set(est["strategy"])


def test_estimate_reports_chosen_keys():
    rc, out, err = run("estimate", *BASE, "--strategy", "tp=2", "--json")
    assert rc == 0, err
    est = json.loads(out)
    assert est["strategy"]["tp"] == 2
    assert any("chosen for you" in n for n in est["notes"])


def test_estimate_table_reads_well():
    rc, out, err = run("estimate", *BASE, "--strategy", "tp=2,pp=2,sp=true")
    assert rc == 0, err
    for word in ("step time", "throughput", "peak memory", "Time per step", "Memory per pipeline rank"):
        assert word in out


@pytest.mark.parametrize("args, words", [
    (["--strategy", "tp=3"], ["tp"]),
    (["--strategy", "tp=2,sp=false,ep=2"], ["ep"]),
    (["--strategy", "tp=2,mbs=3"], ["mbs"]),
    (["--strategy", "bogus=1"], ["unknown strategy key"]),
])
def test_bad_strategy_is_one_line_exit_2(args, words):
    rc, out, err = run("estimate", *BASE, *args)
    assert rc == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1
    for w in words:
        assert w in lines[0]


@pytest.mark.parametrize("args", [
    ["--model", "llama9-70b"], ["--cluster", "h1000"], ["--gpus", "-3"], ["--gpus", "0"], ["--seq", "-5"],
    ["--model", "/nonexistent/config.json"],
])
def test_bad_inputs_are_clean_errors(args):
    merged = dict(zip(BASE[::2], BASE[1::2]))
    merged.update(dict(zip(args[::2], args[1::2])))
    flat = [x for kv in merged.items() for x in kv]
    rc, out, err = run("plan", *flat)
    assert rc == 2, (args, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_plan_json_contract():
    rc, out, err = run("plan", *BASE, "--top", "3", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert 1 <= len(data["plans"]) <= 3
    steps = [p["estimate"]["step_time_s"] for p in data["plans"]]
    assert steps == sorted(steps)
    for p in data["plans"]:
        assert set(ESTIMATE_CONTRACT_KEYS) <= set(p["estimate"])
        assert set(CONTRACT_KEYS) <= set(p["strategy"])
    assert data["search"]["space_size"] >= data["search"]["evaluated"] > 0


def test_plan_no_feasible_exit_1_says_what_blocked():
    rc, out, err = run("plan", "--model", "llama3.1-405b", "--cluster", "h100", "--gpus", "8", "--seq", "8192",
                       "--gbs", "16")
    assert rc == 1
    assert "no strategy fits" in err and "GiB" in err and "Traceback" not in err


def test_plan_explain_and_baseline():
    rc, out, err = run("plan", *BASE, "--explain", "--baseline", "tp=4,pp=1,sp=true,mbs=1,zero=1,recompute=full")
    assert rc == 0, err
    assert "Why #1 wins" in out and "baseline" in out and "faster" in out


def test_plan_deepspeed_engine_only_returns_what_deepspeed_runs():
    from autoplan.integrations.engines import deepspeed_unsupported
    from autoplan.modelio import load_model
    from autoplan.strategy import Strategy

    rc, out, err = run("plan", *BASE, "--engine", "deepspeed", "--top", "5", "--json")
    assert rc == 0, err
    model = load_model("llama3-8b")
    for p in json.loads(out)["plans"]:
        assert deepspeed_unsupported(Strategy(**p["strategy"]), model) is None


@pytest.mark.slow
def test_plan_cost_objective_tries_smaller_clusters():
    rc, out, err = run("plan", *BASE, "--objective", "cost", "--top", "5", "--json")
    assert rc == 0, err
    plans = json.loads(out)["plans"]
    per_gpu = [p["estimate"]["tokens_per_s_per_gpu"] for p in plans]
    assert per_gpu == sorted(per_gpu, reverse=True)
    assert all(p["num_gpus"] in (16, 8, 4, 2, 1) for p in plans)
    rc, out, err = run("plan", *BASE, "--top", "1", "--json")
    fastest_total = json.loads(out)["plans"][0]
    # The cheapest plan is never worse per GPU than the fastest plan on all 16 GPUs.
    assert per_gpu[0] >= fastest_total["estimate"]["tokens_per_s_per_gpu"] - 1e-9


def test_plan_says_up_front_when_megatron_cannot_express_the_model():
    """Gemma-2's GeGLU / sandwich norms have no pretrain_gpt.py argument: the plans are priced and the refusal
    the emitter would give is said at plan time."""
    from pathlib import Path

    config = Path(__file__).parents[1] / "data" / "hf_configs" / "gemma2_9b.json"
    rc, out, err = run("plan", "--model", str(config), "--cluster", "h100", "--gpus", "8", "--seq", "4096", "--gbs",
                       "64", "--top", "1", "--json")
    assert rc == 0, err
    assert "emit --format megatron` will refuse" in err and "GeGLU" in err
    assert len(json.loads(out)["plans"]) == 1
