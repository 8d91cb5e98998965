"""`autoplan emit` end to end: saved Plan and `plan --json` output, formats, --probe, --index, errors."""
import json
import subprocess
import sys

import pytest

from autoplan.cli.emit import load_plan, write_emitted
from autoplan.errors import InputError
from engine_checks.plans import GPT2_SMALL, golden_plans, make_plan
from conftest import deadline_s


def run(*args):
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", "emit", *args], capture_output=True, text=True,
                          timeout=deadline_s(40))


def search_output(plans):
    first = plans[0]
    return {"plans": [{"strategy": p.strategy.to_dict(), "estimate": p.estimate.contract()} for p in plans],
            "model": first.model.model_dump(), "cluster": first.cluster.model_dump(),
            "workload": first.workload.model_dump(), "search": {}}


def test_emit_saved_plan_both_formats(tmp_path):
    plan = make_plan(GPT2_SMALL, 8, 1024, 32, pp=1, zero=1, mbs=4)
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    out = run(str(tmp_path / "plan.json"), "--format", "megatron,deepspeed", "--out", str(tmp_path / "o"))
    assert out.returncode == 0, out.stderr
    printed = out.stdout.split()
    assert str(tmp_path / "o" / "megatron" / "train.sh") in printed
    assert str(tmp_path / "o" / "deepspeed" / "ds_config.json") in printed
    assert (tmp_path / "o" / "megatron" / "train.sh").stat().st_mode & 0o111


def test_emit_search_output_with_index_and_probe(tmp_path):
    plans = [make_plan(GPT2_SMALL, 8, 1024, 32, tp=2, sp=True), make_plan(GPT2_SMALL, 8, 1024, 32, pp=2)]
    (tmp_path / "plans.json").write_text(json.dumps(search_output(plans)))
    out = run(str(tmp_path / "plans.json"), "--format", "megatron", "--out", str(tmp_path / "o"), "--probe",
              "--index", "1")
    assert out.returncode == 0, out.stderr
    args = (tmp_path / "o" / "megatron_args.txt").read_text()
    assert "--pipeline-model-parallel-size 2" in args and "--train-iters 10" in args
    assert load_plan(str(tmp_path / "plans.json"), 1).strategy == plans[1].strategy


@pytest.mark.parametrize("args, message", [
    (["--format", "torchtitan"], "unknown format 'torchtitan'"),
    (["--format", "deepspeed"], "DeepSpeed cannot run Megatron sequence parallelism"),
    (["--format", "megatron", "--index", "5"], "--index 5 is out of range"),
])
def test_errors_exit_2_with_one_line(tmp_path, args, message):
    plans = [make_plan(GPT2_SMALL, 8, 1024, 32, tp=2, sp=True)]
    (tmp_path / "plans.json").write_text(json.dumps(search_output(plans)))
    out = run(str(tmp_path / "plans.json"), "--out", str(tmp_path / "o"), *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_write_emitted_single_format_goes_to_out_dir(tmp_path):
    plan = golden_plans()["deepspeed_zero3"][0]
    paths = write_emitted(plan, ["deepspeed"], tmp_path)
    assert {p.name for p in paths} == {"ds_config.json", "hostfile", "launch.sh", "ds_hf_train.py", "ds_train.py"}
    assert all(p.parent == tmp_path for p in paths)
    with pytest.raises(InputError, match="unknown format"):
        write_emitted(plan, [], tmp_path)
