"""The files `autoplan vlm --emit` writes, run through the releases' own configuration code where it is installed
(benchmarks/vlm_parser_check.py: Megatron-Bridge 0.3.1's override and validation code; Megatron-LM's MIMO
example at the pinned commit), and the fixes those parsers asked for, which hold everywhere."""
import os
from pathlib import Path

import pytest

from autoplan.errors import InputError
from autoplan.multimodal.emit_bridge import bridge_overrides
from autoplan.multimodal.emit_mimo import mimo_args
from autoplan.multimodal.placement import Placement
from autoplan.multimodal.reader import load_multimodal
from autoplan.multimodal.spec import Freeze
from autoplan.strategy import Strategy
from benchmarks import vlm_parser_check as check

DATA = Path(__file__).parents[1] / "data" / "vlm"
QWEN72 = DATA / "qwen2_5_vl_72b_instruct.json"


def _s(tp, pp, first=None, last=None):
    return Strategy(tp=tp, pp=pp, mbs=1, sp=True, zero=1, recompute="selective", first_stage_layers=first,
                    last_stage_layers=last)


@pytest.fixture(scope="module")
def qwen72():
    return load_multimodal(str(QWEN72))


def test_bridge_dataset_length_is_the_vlm_providers_field(qwen72):
    # The VLM recipes' dataset is a VLM conversation provider (seq_length); GPTDatasetConfig's sequence_length is
    # skipped there by apply_overrides with a warning.
    over = bridge_overrides(qwen72, Placement("inherit", _s(8, 4, 14, 20), 64), Freeze(), 8192, 128)
    assert over["dataset"] == {"seq_length": 8192}


def test_bridge_refuses_a_world_that_tp_pp_cp_do_not_divide(qwen72):
    with pytest.raises(InputError, match=r"world size \(64\) is not divisible"):
        bridge_overrides(qwen72, Placement("inherit", _s(8, 3, 20, 20), 64), Freeze(), 8192, 128)


def test_mimo_args_carry_what_pretrain_mimo_requires(qwen72):
    args = mimo_args(qwen72, Placement("disjoint", _s(8, 7, 10, 10), 56, 8, 1), 64, 8192, 128)
    assert "--use-distributed-optimizer" in args
    for flag, value in (("--num-layers", "80"), ("--hidden-size", "8192"), ("--num-attention-heads", "64"),
                        ("--num-query-groups", "8"), ("--seq-length", "8192")):
        assert args[args.index(flag) + 1] == value
    assert args.count("--seq-length") == 1


def test_mimo_refuses_uneven_middle_stages(qwen72):
    with pytest.raises(InputError, match="middle stage: 61"):
        mimo_args(qwen72, Placement("disjoint", _s(8, 7, 9, 10), 56, 8, 1), 64, 8192, 128)


def test_mimo_file_names_the_entry_point_and_launch_environment(tmp_path, capsys):
    from conftest import run_cli

    code, out, err = run_cli(["vlm", "--model", str(QWEN72), "--gpus", "64", "--seq", "8192", "--gbs", "128",
                              "--images-per-sample", "mean=6,p95=8", "--tokens-per-image", "mean=1024,p95=1024",
                              "--placement", "disjoint", "--emit", "mimo", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    head = (tmp_path / "mimo_args.txt").read_text().splitlines()[:3]
    assert "examples/mimo/pretrain_mimo.py" in head[0] and "CUDA_DEVICE_MAX_CONNECTIONS=1" in head[1]


def _bridge():
    try:
        return check.load_bridge()
    except check.Unavailable as e:
        pytest.skip(f"Megatron-Bridge's parser is not importable here: {e}")


@pytest.mark.parametrize("case", check.BRIDGE_CASES, ids=lambda c: c.name)
def test_bridge_accepts_exactly_what_autoplan_emits(case):
    ours, accepted, detail = check.run_bridge(_bridge(), case, QWEN72)
    assert ours.startswith("emitted") == accepted, (ours, detail)


@pytest.mark.parametrize("case", check.MIMO_CASES, ids=lambda c: c.name)
def test_mimo_example_accepts_exactly_what_autoplan_emits(case):
    root = os.environ.get("AUTOPLAN_MEGATRON_LM")
    if not root:
        pytest.skip("AUTOPLAN_MEGATRON_LM (a Megatron-LM checkout at the MIMO commit) is not set: the MIMO "
                    "example's parser lives in that repository, not in any installed package")
    try:
        ours, accepted, detail = check.run_mimo(Path(root), case, QWEN72)
    except check.Unavailable as e:
        pytest.skip(f"the MIMO example's parser is not importable here: {e}")
    assert ours.startswith("emitted") == accepted, (ours, detail)
