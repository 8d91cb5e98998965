"""`autoplan profile` end to end on CPU with a tiny model."""
from __future__ import annotations

import json

import pytest

from autoplan.costmodel.measured import load_profile

pytest.importorskip("torch")

from autoplan.cli.main import main  # noqa: E402

TINY = ["--model", "llama3-8b", "--set", "hidden_size=128", "--set", "ffn_hidden_size=256",
        "--set", "num_attention_heads=4", "--set", "num_query_groups=2", "--set", "kv_channels=32",
        "--set", "vocab_size=512", "--set", "name=tiny-llama"]


def run(args, capsys):
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_profile_writes_a_loadable_profile(tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, _ = run(["profile", *TINY, "--tp", "1,2", "--mbs", "1", "--seq", "32,64", "--device", "cpu",
                           "--repeats", "2", "--warmup", "1", "--dtype", "bf16,fp8", "--out", str(out)], capsys)
    assert code == 0
    assert "wrote" in stdout and "fp8" in stdout  # the fp8 skip is reported
    profile = load_profile(out)
    assert profile.model.name == "tiny-llama" and profile.device.gpu_id == "cpu"
    assert {(e.tp, e.seq) for e in profile.layers} == {(1, 32), (1, 64), (2, 32), (2, 64)}
    assert json.loads(out.read_text())["schema_version"] == 1


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "tp=3 must divide num_attention_heads=4"),
    (["--tp", "1,x"], "--tp takes comma-separated positive integers"),
    (["--device", "tpu"], "device 'tpu' is not supported"),
])
def test_bad_input_exits_2_with_one_line(args, message, capsys, tmp_path):
    code, _, err = run(["profile", *TINY, "--device", "cpu", *args, "--out", str(tmp_path / "x.json")], capsys)
    assert code == 2
    assert message in err and err.count("\n") == 1
