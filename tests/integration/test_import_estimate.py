"""`autoplan estimate` on an imported config prices it as written: the precision, EP and recompute it states are
kept, only the keys it truly lacks are chosen (and listed), and what cannot be honoured is a one-line error."""
import json

import pytest
from typer.testing import CliRunner

from autoplan.cli.main import build_app, main

APP = build_app()
MIXTRAL_SCRIPT = "tests/data/real_configs/megatron/train_mixtral_8x7b_distributed.sh"
ZERO3_EP8_FULL = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
                  "zero_optimization": {"stage": 3}, "expert_parallel": {"enabled": True, "autoep_size": 8},
                  "activation_checkpointing": {"partition_activations": False}}
MIXTRAL = ["--model", "mixtral-8x7b", "--gpus", "64", "--seq", "4096"]


def estimate(*args):
    result = CliRunner().invoke(APP, ["estimate", *args, "--json"])
    return result.exit_code, (json.loads(result.output) if result.exit_code == 0 else None), result.exception


def write(tmp_path, config):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_bf16_mixtral_script_stays_bf16():
    code, est, err = estimate("--from-megatron", MIXTRAL_SCRIPT, "--gpus", "32")
    assert code == 0, err
    assert est["strategy"]["fp8"] == "none" and est["strategy"]["ep"] == 8 and est["strategy"]["pp"] == 4
    assert any("priced as written" in n for n in est["notes"])


def test_zero3_autoep_full_recompute_config_keeps_them(tmp_path):
    code, est, err = estimate("--from-deepspeed", write(tmp_path, ZERO3_EP8_FULL), *MIXTRAL)
    assert code == 0, err
    s = est["strategy"]
    assert (s["zero"], s["ep"], s["recompute"], s["recompute_layers"], s["fp8"]) == (3, 8, "full", 1, "none")
    assert not any(n.startswith("chosen for you") for n in est["notes"])


def test_only_lacking_keys_are_chosen_and_listed(tmp_path):
    config = {k: v for k, v in ZERO3_EP8_FULL.items() if k not in ("expert_parallel", "activation_checkpointing")}
    code, est, err = estimate("--from-deepspeed", write(tmp_path, config), *MIXTRAL)
    assert code == 0, err
    chosen = [n for n in est["notes"] if n.startswith("chosen for you")]
    assert len(chosen) == 1 and chosen[0].split(": ", 1)[1].startswith("recompute=")
    assert (est["strategy"]["zero"], est["strategy"]["mbs"]) == (3, 1)


def test_autoep_config_lacking_keys_names_them(tmp_path):
    config = {k: v for k, v in ZERO3_EP8_FULL.items() if k != "activation_checkpointing"}
    code, _, err = estimate("--from-deepspeed", write(tmp_path, config), *MIXTRAL)
    assert code != 0 and "give recompute with --strategy" in str(err) and "\n" not in str(err)
    code, est, err = estimate("--from-deepspeed", write(tmp_path, config), *MIXTRAL, "--strategy", "recompute=none")
    assert code == 0 and est["strategy"]["ep"] == 8 and est["strategy"]["recompute"] == "none"


def test_strategy_key_deepspeed_cannot_run_is_an_error(tmp_path):
    config = {k: v for k, v in ZERO3_EP8_FULL.items() if k != "expert_parallel"}
    code, _, err = estimate("--from-deepspeed", write(tmp_path, config), *MIXTRAL, "--strategy", "ep=8")
    assert code != 0 and "expert parallelism" in str(err) and "expert_parallel" in str(err)


def test_strategy_overrides_are_listed():
    code, est, err = estimate("--from-megatron", MIXTRAL_SCRIPT, "--gpus", "32", "--strategy", "fp8=hybrid")
    assert code == 0, err
    assert est["strategy"]["fp8"] == "hybrid"
    assert any("overrides the imported config: fp8=hybrid (config: none)" in n for n in est["notes"])


@pytest.mark.parametrize("option", ["--from-megatron", "--from-deepspeed"])
def test_missing_file_exits_2(option, tmp_path, capsys):
    extra = MIXTRAL if option == "--from-deepspeed" else []
    with pytest.raises(SystemExit) as exit_:
        main(["estimate", option, str(tmp_path / "nope.sh"), *extra])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "file not found" in err and err.count("\n") == 1
