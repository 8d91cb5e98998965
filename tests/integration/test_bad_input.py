"""Bad input through the command line: one line naming the rule, the value and the fix, exit 2, no traceback and
nothing written; legal but absurd input priced with a warning."""
import errno
import json
import os
import time
from pathlib import Path

import pytest

from autoplan.errors import InputError
from conftest import call_within, run_cli as run

BINARY = bytes(range(256)) * 4  # NUL bytes and invalid UTF-8
NOT_UTF8 = "tp: 8\n# caf\xe9\n".encode("latin-1")  # text, but Latin-1


def assert_one_line(code, err, *needles):
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


# ---------------------------------------------------------------- --gpus

def test_gpu_count_past_the_bound_is_refused_at_once(capsys):
    start = time.perf_counter()
    run(["estimate", "--model", "llama3-8b", "--gpus", "8", "--strategy", "tp=1"], capsys)  # a baseline call
    baseline = time.perf_counter() - start
    code, out, err = call_within(max(10 * baseline, 5.0), lambda: run(
        ["plan", "--model", "llama3-8b", "--gpus", "99999999999"], capsys))
    assert_one_line(code, err, "gpus=99999999999", "1,048,576", "real GPU count")
    assert out == ""


def test_bounded_divisors_match_the_full_list():
    from autoplan.valid_values import divisors

    for n in range(1, 400):
        full = [d for d in range(1, n + 1) if n % d == 0]
        assert divisors(n) == full
        for upto in (1, 3, 16, 64):
            assert divisors(n, upto=upto) == [d for d in full if d <= upto]
    huge = 2**20 * 3**10 * 7 * 11 * 13 * 10**12  # a loop to n would not end
    assert divisors(huge, upto=80) == [d for d in range(1, 81) if huge % d == 0]


# ---------------------------------------------------------------- binary and non-UTF-8 files

BASE = ["--model", "llama3-8b", "--gpus", "8", "--seq", "4096"]


@pytest.mark.parametrize("argv, what", [
    (["estimate", *BASE, "--strategy", "{f}"], "strategy file"),
    (["estimate", *BASE, "--from-deepspeed", "{f}"], "DeepSpeed config"),
    (["estimate", "--from-megatron", "{f}"], "Megatron launch file"),
    (["emit", "{f}", "--format", "megatron", "--out", "{d}"], "plan file"),
    (["estimate", *BASE, "--strategy", "tp=1", "--profile", "{f}"], "measured profile"),
    (["estimate", "--model", "{f}", "--gpus", "8", "--strategy", "tp=1"], "model file"),
    (["estimate", *BASE, "--strategy", "tp=1", "--cluster", "{f}"], "cluster file"),
])
@pytest.mark.parametrize("content, rule", [(BINARY, "binary (a NUL byte at offset 0)"),
                                           (NOT_UTF8, "not UTF-8 text (byte 0xe9 at offset 11)")])
def test_binary_and_non_utf8_files_are_one_line(tmp_path, capsys, argv, what, content, rule):
    f = tmp_path / "input.json"
    f.write_bytes(content)
    argv = [a.format(f=f, d=tmp_path / "out") for a in argv]
    code, _, err = run(argv, capsys)
    assert_one_line(code, err, f"{what} {f}", rule)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, rule", [("", "is empty"), ("   \n\n", "is empty"),
                                        ("#!/bin/bash\necho hello\n", "holds no Megatron-LM argument")])
def test_empty_or_foreign_megatron_file_is_not_a_megatron_script(tmp_path, capsys, text, rule):
    f = tmp_path / "train.sh"
    f.write_text(text)
    code, _, err = run(["estimate", "--from-megatron", str(f)], capsys)
    assert_one_line(code, err, rule, "not a Megatron script", "--seq-length" if "no Megatron" in rule else "")
    assert "lack --seq-length" not in err


# ---------------------------------------------------------------- --seq / --gbs defaults

def test_estimate_and_plan_default_the_workload_alike(capsys):
    from autoplan.cli.common import DEFAULT_GBS, DEFAULT_SEQ
    from autoplan.cli.plan import plan_cmd
    import inspect

    params = inspect.signature(plan_cmd).parameters
    assert (params["seq"].default.default, params["gbs"].default.default) == (DEFAULT_SEQ, DEFAULT_GBS)
    code, out, err = run(["estimate", "--model", "llama3-8b", "--gpus", "8", "--strategy", "tp=1,pp=1"], capsys)
    assert code == 0, err
    assert f"seq {DEFAULT_SEQ}, gbs {DEFAULT_GBS}" in out


# ---------------------------------------------------------------- --fix / --exclude

def test_a_key_fixed_twice_is_refused(capsys):
    code, out, err = run(["plan", "--model", "llama3-8b", "--gpus", "8", "--fix", "tp=8", "--fix", "tp=4"], capsys)
    assert_one_line(code, err, "--fix tp is given twice", "--fix tp=8", "--fix tp=4", "tp=8|4")
    assert out == ""
    from autoplan.solvers.space import parse_constraints

    assert parse_constraints(["tp=8|4"], "--fix") == {"tp": [8, 4]}  # either, as written
    assert parse_constraints(["tp=8", "tp=4"], "--exclude") == {"tp": [8, 4]}  # excluding twice excludes both


def test_fix_and_exclude_of_the_same_value_names_both(capsys):
    code, _, err = run(["plan", "--model", "llama3-8b", "--gpus", "8", "--fix", "tp=8", "--exclude", "tp=8"], capsys)
    assert_one_line(code, err, "--fix tp=8 contradicts --exclude tp=8")
    from autoplan.solvers.policy import search_constraints

    fixed, excluded = search_constraints({"tp": [8, 4]}, {"tp": [8]})  # tp=4 is left: legal
    assert fixed == {"tp": [8, 4]} and excluded == {"tp": [8]}


# ---------------------------------------------------------------- --emit / --out

def test_emit_without_out_is_refused_before_the_search(capsys):
    code, out, err = run(["plan", "--model", "llama3-8b", "--gpus", "8", "--emit", "megatron"], capsys)
    assert_one_line(code, err, "--emit megatron", "--out DIR")
    assert out == ""


def test_unknown_emit_format_writes_nothing(tmp_path, capsys):
    out_dir = tmp_path / "D"
    code, _, err = run(["plan", "--model", "llama3-8b", "--gpus", "8", "--emit", "megatron,fsdp", "--out",
                        str(out_dir)], capsys)
    assert_one_line(code, err, "unknown format 'fsdp'")
    assert not out_dir.exists()


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("mine")
    code, _, err = run(["plan", "--model", "llama3-8b", "--gpus", "8", "--out", str(f)], capsys)
    assert_one_line(code, err, f"--out {f} is a file")
    assert f.read_text() == "mine"


# ---------------------------------------------------------------- absurd batches

def test_huge_batch_is_priced_with_a_warning(capsys):
    code, out, err = run(["estimate", "--model", "llama3-8b", "--gpus", "8", "--gbs", "10000000000", "--strategy",
                          "tp=1,pp=1", "--json"], capsys)
    assert code == 0, err
    assert "warning: --gbs=10000000000" in err and "tokens per step" in err
    assert json.loads(out)["step_time_s"] > 1e6


def test_ordinary_batch_has_no_warning(capsys):
    code, _, err = run(["estimate", "--model", "llama3-8b", "--gpus", "8", "--gbs", "1024", "--strategy",
                        "tp=1,pp=1", "--json"], capsys)
    assert code == 0 and "warning" not in err


def test_batch_past_what_the_cost_model_counts_is_refused(capsys):
    code, _, err = run(["plan", "--model", "llama3-8b", "--gpus", "8", "--gbs", "10" * 12], capsys)
    assert_one_line(code, err, "--gbs=" + "10" * 12, "2^53")


# ---------------------------------------------------------------- writing: all or none

def _plan(tmp_path):
    from engine_checks.plans import GPT2_SMALL, make_plan

    plan = make_plan(GPT2_SMALL, 8, 1024, 32, zero=1, mbs=4)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    return path


def _failing(real, on_call, err):
    calls = {"n": 0}

    def fake(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == on_call:
            raise OSError(err, os.strerror(err))
        return real(*args, **kwargs)
    return fake


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_emit_on_a_full_or_read_only_disk_writes_nothing(tmp_path, capsys, monkeypatch, err):
    import autoplan.fileio as fileio

    plan = _plan(tmp_path)
    monkeypatch.setattr(fileio.os, "fsync", _failing(os.fsync, 3, err))  # the third file's flush fails
    out_dir = tmp_path / "deep" / "out"
    code, out, stderr = run(["emit", str(plan), "--format", "megatron,deepspeed", "--out", str(out_dir)], capsys)
    assert_one_line(code, stderr, "cannot write", os.strerror(err), "nothing was written")
    assert not (tmp_path / "deep").exists()  # the folders it made are gone too
    assert out == ""


def test_a_failed_rename_puts_the_replaced_files_back(tmp_path, monkeypatch):
    import autoplan.fileio as fileio

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a")
    monkeypatch.setattr(fileio.os, "replace", _failing(os.replace, 2, errno.EIO))
    with pytest.raises(InputError, match="nothing was written"):
        fileio.write_files({a: "new a", b: "new b"})
    assert a.read_text() == "old a" and not b.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_written_files_are_complete_with_their_modes(tmp_path):
    from autoplan.fileio import write_files

    sh, js = tmp_path / "x" / "train.sh", tmp_path / "x" / "plan.json"
    write_files({sh: "#!/bin/bash\n", js: "{}"}, executable=[sh])
    assert sh.read_text() == "#!/bin/bash\n" and js.read_text() == "{}"
    assert sh.stat().st_mode & 0o111 and not js.stat().st_mode & 0o111
    assert sorted(p.name for p in sh.parent.iterdir()) == ["plan.json", "train.sh"]


# ---------------------------------------------------------------- corrupted plan and profile files

def test_truncated_or_corrupted_plan_json_is_one_line(tmp_path, capsys):
    text = _plan(tmp_path).read_text()
    cases = [text[:n] for n in (0, 1, len(text) // 3, len(text) // 2, len(text) - 1)]
    cases += ['{"plans": 5}', '{"plans": [5], "model": {}, "cluster": {}, "workload": {}}', "[]", "null"]
    for i, body in enumerate(cases):
        f = tmp_path / f"cut{i}.json"
        f.write_text(body)
        code, _, err = run(["emit", str(f), "--format", "megatron", "--out", str(tmp_path / "o")], capsys)
        assert_one_line(code, err, f"plan file {f}")
        assert not (tmp_path / "o").exists()


def test_truncated_or_corrupted_profile_json_is_one_line(tmp_path, capsys):
    shipped = Path(__file__).resolve().parents[2] / "profiles" / "measured" / "h200-llama3-8b.json"
    data = shipped.read_bytes()
    cut = [data[:n] for n in (0, 10, len(data) // 2, len(data) - 2)]
    flipped = [data[:n] + b"\xff" + data[n + 1:] for n in (5, len(data) // 2)]  # a corrupted byte
    for n, body in enumerate(cut + flipped):
        f = tmp_path / f"p{n}.json"
        f.write_bytes(body)
        code, _, err = run(["estimate", "--model", "llama3-8b", "--cluster", "h200", "--gpus", "8", "--seq", "4096",
                            "--gbs", "64", "--strategy", "tp=1", "--profile", str(f)], capsys)
        assert_one_line(code, err, f"measured profile {f}")


# ---------------------------------------------------------------- Hugging Face config fields

LLAMA = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
         "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}


@pytest.mark.parametrize("field, value, rule", [
    ("head_dim", "x", "'head_dim'='x' must be an integer"),
    ("num_key_value_heads", [], "'num_key_value_heads'=[] must be an integer"),
    ("num_attention_heads", 0, "'num_attention_heads'=0 must be a positive integer"),
    ("rope_theta", "big", "'rope_theta'='big' must be a finite number"),
    ("num_hidden_layers", 80_000_000, "num_layers"),
])
def test_hf_config_field_of_the_wrong_kind_is_one_line(tmp_path, capsys, field, value, rule):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA, field: value}))
    code, _, err = call_within(60, lambda: run(["plan", "--model", str(f), "--gpus", "8"], capsys))
    assert_one_line(code, err, rule)
