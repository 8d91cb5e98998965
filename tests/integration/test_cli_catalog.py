"""`autoplan models` and `autoplan clusters`, in process (only this command module registered) and once through
the installed console script."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import typer

import autoplan.cli.main as cli_main
from autoplan.clusterio import gpu_ids
from autoplan.modelio import catalogue_names
from conftest import deadline_s


@pytest.fixture
def run(monkeypatch, capsys):
    """Call `main(argv)` with a fresh app holding only the catalogue commands; (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ("autoplan.cli.catalog",))
    monkeypatch.setattr(cli_main, "app", typer.Typer(add_completion=False, pretty_exceptions_enable=False))

    def _run(*argv):
        try:
            cli_main.main(list(argv))
            code = 0
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return _run


def test_models_json_is_a_stable_list(run):
    code, out, _ = run("models", "--json")
    rows = json.loads(out)
    assert code == 0
    assert [r["name"] for r in rows] == catalogue_names()
    assert set(rows[0]) == {"name", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                            "num_experts", "moe_router_topk", "total_params", "active_params"}
    dsv3 = next(r for r in rows if r["name"] == "deepseek-v3")
    assert (dsv3["num_experts"], dsv3["moe_router_topk"]) == (256, 8)
    assert 682e9 < dsv3["total_params"] < 683e9  # 671B and one MTP depth (embedding and head shared)


def test_models_table(run):
    code, out, _ = run("models")
    assert code == 0
    assert "llama3.1-405b" in out and "256/8" in out and "405.85" in out


def test_clusters_json_and_table(run):
    code, out, _ = run("clusters", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["id"] for r in rows] == gpu_ids()
    h100 = next(r for r in rows if r["id"] == "h100")
    assert h100["peak_tflops"] == {"bf16": 989.0, "fp8": 1979.0, "fp4": None}
    code, out, _ = run("clusters")
    assert code == 0 and "gb200" in out and "8x400G" in out


def test_bad_option_exits_2_without_traceback(run):
    code, out, err = run("models", "--jsn")
    assert code == 2
    assert "Traceback" not in err and "--jsn" in err


@pytest.mark.skipif(shutil.which("autoplan") is None, reason="console script not installed")
def test_console_script_end_to_end():
    ok = subprocess.run(["autoplan", "clusters", "--json"], capture_output=True, text=True, timeout=deadline_s(40))
    assert ok.returncode == 0, ok.stderr
    assert "mi300x" in {r["id"] for r in json.loads(ok.stdout)}
    bad = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "models", "--bogus"], capture_output=True,
                         text=True, timeout=deadline_s(40))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
