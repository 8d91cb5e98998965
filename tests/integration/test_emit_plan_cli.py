"""`autoplan plan --emit megatron,deepspeed --out DIR`: each engine gets the winner when it runs it, else its own best
plan of the same search, and the output says which."""
import json
import subprocess
import sys

from autoplan.integrations.engines import deepspeed_unsupported
from autoplan.results import Plan
from conftest import deadline_s

LLAMA_70B = ["--model", "llama3-70b", "--cluster", "h100", "--gpus", "64", "--seq", "8192", "--gbs", "128"]


def plan_cli(*args):
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", "plan", *args], capture_output=True, text=True,
                          timeout=deadline_s(100))


def read_plan(path):
    return Plan.model_validate_json(path.read_text())


def test_fp8_vpp_winner_gets_megatron_and_deepspeed_its_own_best(tmp_path):
    out = plan_cli(*LLAMA_70B, "--precision", "any", "--emit", "megatron,deepspeed", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    winner = read_plan(tmp_path / "plan.json")
    # The case reported: the winner runs what DeepSpeed does not (FP8 here, and VPP when the winner has it).
    assert winner.strategy.uses_fp8 and deepspeed_unsupported(winner.strategy, winner.model) is not None
    assert read_plan(tmp_path / "megatron" / "plan.json").strategy == winner.strategy
    assert (tmp_path / "megatron" / "megatron_args.txt").exists()
    ds = read_plan(tmp_path / "deepspeed" / "plan.json")
    assert deepspeed_unsupported(ds.strategy, ds.model) is None and ds.strategy != winner.strategy
    config = json.loads((tmp_path / "deepspeed" / "ds_config.json").read_text())
    assert config["train_micro_batch_size_per_gpu"] == ds.strategy.mbs
    assert f"# strategy: {ds.strategy.label()}" in (tmp_path / "deepspeed" / "launch.sh").read_text()
    assert f"deepspeed: its own best plan {ds.strategy.label()}" in out.stderr
    assert f"megatron: the winner {winner.strategy.label()}" in out.stderr


def test_winner_an_engine_runs_is_emitted_as_is(tmp_path):
    out = plan_cli(*LLAMA_70B, "--engine", "deepspeed", "--emit", "deepspeed", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    winner = read_plan(tmp_path / "plan.json")
    assert f"# strategy: {winner.strategy.label()}" in (tmp_path / "launch.sh").read_text()
    assert "deepspeed: the winner" in out.stderr


def test_engine_with_no_plan_is_named_and_the_others_are_written(tmp_path):
    # Context parallelism fixed: DeepSpeed runs none of these plans; Megatron's files are still written.
    out = plan_cli(*LLAMA_70B, "--fix", "cp=2", "--emit", "megatron,deepspeed", "--out", str(tmp_path))
    assert out.returncode == 1
    assert (tmp_path / "megatron" / "megatron_args.txt").exists() and not (tmp_path / "deepspeed").exists()
    line = [x for x in out.stderr.splitlines() if x.startswith("emitted deepspeed")]
    assert line and "context parallelism (cp=2)" in line[0] and "nothing written" in line[0]


def test_fp8_only_search_names_deepspeed_as_unable(tmp_path):
    # --precision fp8: DeepSpeed runs no FP8 GEMMs, so it has no plan of this search; Megatron's files are written.
    out = plan_cli(*LLAMA_70B, "--precision", "fp8", "--emit", "megatron,deepspeed", "--out", str(tmp_path))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert read_plan(tmp_path / "plan.json").strategy.uses_fp8
    assert (tmp_path / "megatron" / "megatron_args.txt").exists() and not (tmp_path / "deepspeed").exists()
    line = [x for x in out.stderr.splitlines() if x.startswith("emitted deepspeed")]
    assert line and "nothing written" in line[0]


def test_deepspeed_pipeline_winner_gets_the_best_plan_its_training_run_can_carry(tmp_path):
    # ZeRO-1 for a 13B model on 8 x 80 GB: the DeepSpeed search's winner has pipeline stages, which the emitted
    # training run (one Hugging Face module) cannot carry; --emit writes DeepSpeed's best plan with pp=1 instead,
    # in its own folder with its own plan.json, and says so. --out's plan.json stays the winner.
    args = ["--model", "llama2-13b", "--cluster", "a100-80g", "--gpus", "8", "--seq", "4096", "--engine", "deepspeed",
            "--fix", "zero=1"]
    out = plan_cli(*args, "--emit", "deepspeed", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    winner, emitted = read_plan(tmp_path / "plan.json"), read_plan(tmp_path / "deepspeed" / "plan.json")
    assert winner.strategy.pp > 1 and emitted.strategy.pp == 1 and emitted.strategy.zero == 1
    assert emitted.estimate.step_time_s >= winner.estimate.step_time_s
    assert f"# strategy: {emitted.strategy.label()}" in (tmp_path / "deepspeed" / "launch.sh").read_text()
    line = [x for x in out.stderr.splitlines() if x.startswith("emitted deepspeed")]
    assert line and f"its own best plan {emitted.strategy.label()}" in line[0] and "pipeline stages" in line[0]


def test_a_fixed_pipeline_the_training_run_cannot_carry_is_named(tmp_path):
    out = plan_cli("--model", "llama3-8b", "--gpus", "8", "--engine", "deepspeed", "--fix", "pp=2", "--emit", "deepspeed",
                   "--out", str(tmp_path))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    line = [x for x in out.stderr.splitlines() if x.startswith("emitted deepspeed")]
    assert line and "nothing written" in line[0] and "pp=2" in line[0]


def test_megatron_version_picks_the_release_of_the_emitted_files(tmp_path):
    out = plan_cli(*LLAMA_70B, "--emit", "megatron", "--out", str(tmp_path), "--megatron-version", "0.16")
    assert out.returncode == 0, out.stderr
    header = "# for Megatron-LM core_v0.16.1 (NVIDIA/Megatron-LM commit 55ac7082517c3878ae653c07c09c534b8aed49f6)"
    for name in ("megatron_args.txt", "train.sh", "sbatch.sh"):
        assert header in (tmp_path / name).read_text(), name


def test_megatron_version_is_checked_before_the_search(tmp_path):
    for args, message in ((["--emit", "megatron", "--megatron-version", "0.12"], "--megatron-version '0.12' is not"),
                          (["--emit", "deepspeed", "--megatron-version", "0.16"], "--emit has no megatron")):
        out = plan_cli(*LLAMA_70B, "--out", str(tmp_path / "o"), *args)
        assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert not (tmp_path / "o").exists()
