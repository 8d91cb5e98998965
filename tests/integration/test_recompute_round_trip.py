"""A selective-recompute module set round-trips exactly: `estimate --strategy` keeps it (or refuses it with the rule
that forbids it), the Megatron emitter writes it and the Megatron importer reads it back."""
import json
import subprocess
import sys

import pytest

from autoplan.integrations.importers import from_megatron_args
from autoplan.integrations.megatron import emit_megatron
from autoplan.modelio import load_model
from autoplan.cluster import ClusterSpec
from autoplan.clusterio import load_gpu
from autoplan.results import Plan
from autoplan.strategy import Strategy
from autoplan.workload import Workload
from engine_checks.plans import estimate as minimal_estimate
from conftest import deadline_s

MIXTRAL = ["--model", "mixtral-8x7b", "--cluster", "h100", "--gpus", "64", "--seq", "4096", "--gbs", "256"]
LLAMA = ["--model", "llama3-8b", "--cluster", "h100", "--gpus", "16", "--seq", "4096", "--gbs", "64"]
DEEPSEEK = ["--model", "deepseek-v3", "--cluster", "h800", "--gpus", "1024", "--seq", "4096", "--gbs", "1024"]


def estimate_json(inputs, strategy):
    out = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "estimate", *inputs, "--strategy", strategy,
                          "--json"], capture_output=True, text=True, timeout=deadline_s(100))
    return out.returncode, out.stdout, out.stderr


def round_trip(inputs, strategy_text):
    rc, out, err = estimate_json(inputs, strategy_text)
    assert rc == 0, err
    chosen = Strategy(**json.loads(out)["strategy"])
    opts = dict(zip(inputs[::2], inputs[1::2]))
    plan = Plan(model=load_model(opts["--model"]),
                cluster=ClusterSpec(gpu=load_gpu(opts["--cluster"]), num_gpus=int(opts["--gpus"])),
                workload=Workload(seq_len=int(opts["--seq"]), global_batch_size=int(opts["--gbs"])),
                strategy=chosen, estimate=minimal_estimate())
    args = emit_megatron(plan)["megatron_args.txt"]
    imported = from_megatron_args(args).strategy
    return chosen, args, imported


@pytest.mark.parametrize("inputs, given", [
    (MIXTRAL, ("layernorm", "mlp")),
    (MIXTRAL, ("core_attn", "layernorm", "moe_act")),
    (MIXTRAL, ("moe_act",)),
    (MIXTRAL, ("core_attn", "moe_act", "mlp")),
    (MIXTRAL, ("core_attn", "moe")),
    (LLAMA, ("layernorm", "mlp")),
    (LLAMA, ("core_attn", "layernorm")),
], ids=lambda v: "+".join(v) if isinstance(v, tuple) else v[1])
def test_module_set_round_trips(inputs, given):
    text = f"tp=2,pp=2,sp=true,mbs=1,recompute=selective,recompute_modules={'+'.join(given)}"
    if inputs is MIXTRAL:
        text += ",ep=8"
    chosen, args, imported = round_trip(inputs, text)
    assert chosen.recompute_modules == given
    assert f"--recompute-modules {' '.join(given)}\n" in args
    assert tuple(imported["recompute_modules"]) == given


def test_mla_up_proj_round_trips_with_fp8_that_runs_it():
    # Blockwise FP8 runs norm and expert-activation recompute; the set stays as given.
    given = ("core_attn", "layernorm", "moe_act", "mla_up_proj")
    layout = "tp=1,pp=16,first_stage_layers=2,last_stage_layers=3,ep=64,mbs=1,fp8=hybrid,fp8_recipe=blockwise"
    chosen, _, imported = round_trip(DEEPSEEK, f"{layout},recompute=selective,recompute_modules={'+'.join(given)}")
    assert chosen.recompute_modules == given and chosen.fp8_recipe == "blockwise"
    assert tuple(imported["recompute_modules"]) == given


def test_a_set_fp8_cannot_run_is_refused_with_the_rule():
    rc, _, err = estimate_json(MIXTRAL, "tp=2,pp=2,ep=8,sp=true,mbs=1,fp8=hybrid,recompute=selective,"
                                        "recompute_modules=layernorm+mlp")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "layernorm" in err and "fp8_recipe=delayed" in err and "Traceback" not in err


def test_completion_never_strips_the_given_set():
    # fp8 left out: the completion may choose FP8 only where FP8 runs the set (delayed scaling on H100 does not).
    rc, out, err = estimate_json(MIXTRAL, "tp=2,pp=2,ep=8,sp=true,mbs=1,recompute=selective,"
                                          "recompute_modules=core_attn+layernorm+moe_act")
    assert rc == 0, err
    s = json.loads(out)["strategy"]
    assert tuple(s["recompute_modules"]) == ("core_attn", "layernorm", "moe_act")
    assert s["fp8"] == "none" or s.get("fp8_recipe") not in (None, "delayed")


def plan_json(*args):
    out = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "plan", *args], capture_output=True, text=True,
                         timeout=deadline_s(100))
    return out.returncode, out.stdout, out.stderr


def test_search_keeps_a_fixed_module_set_on_every_plan():
    rc, out, err = plan_json(*MIXTRAL, "--fix", "recompute_modules=layernorm+mlp", "--top", "5", "--json")
    assert rc == 0, err
    plans = json.loads(out)["plans"]
    assert len(plans) == 5
    for p in plans:
        s = p["strategy"]
        assert s["recompute"] == "selective" and tuple(s["recompute_modules"]) == ("layernorm", "mlp")
        assert s["fp8"] == "none" or s.get("fp8_recipe") not in (None, "delayed")


@pytest.mark.parametrize("extra, message", [
    (["--fix", "recompute=full"], "--fix recompute_modules=layernorm+mlp: the modules apply only to "
                                  "recompute=selective (got --fix recompute=full)"),
    # recompute_method is full recompute's setting, so it fixes recompute=full.
    (["--fix", "recompute_method=uniform"], "--fix recompute_modules=layernorm+mlp: the modules apply only to "
                                            "recompute=selective (got --fix recompute=full)"),
    (["--engine", "deepspeed"], "--fix recompute_modules=layernorm+mlp: DeepSpeed has no per-module selective "
                                "recompute"),
])
def test_a_fixed_module_set_the_search_cannot_keep_is_refused_with_the_rule(extra, message):
    rc, _, err = plan_json(*LLAMA, "--fix", "recompute_modules=layernorm+mlp", *extra)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
