"""benchmarks.residuals: within-group offsets of accuracy's per-row CSV, and the test-split refusal."""
import csv
import math

import pytest

from benchmarks import residuals

FIELDS = ["id", "model", "gpu", "num_gpus", "precision", "strategy", "metric", "holdout_side",
          "predicted_tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu", "error_pct", "peak_mem_gib",
          "capacity_gib", "fits", "holdout_error_pct"]


def _write(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for row in rows:
            rid, model, err = row[:3]
            gpu = row[3] if len(row) > 3 else "gb200"
            w.writerow({k: "" for k in FIELDS} | {"id": rid, "model": model, "gpu": gpu, "precision": "fp8",
                                                   "strategy": "tp1", "holdout_side": "train", "error_pct": err})


def test_offsets_are_each_rows_log_error_less_its_groups_mean(tmp_path, capsys):
    path = tmp_path / "rows.csv"
    _write(path, [("mb_26.04_a", "LLAMA3_70B", 10.0), ("mb_26.04_b", "DeepSeekV3", -10.0),
                  ("mb_26.06_c", "LLAMA3_70B", 5.0)])
    assert residuals.main([str(path), "--top", "5"]) == 0
    out = capsys.readouterr().out
    mean = (math.log(1.1) + math.log(0.9)) / 2
    assert f"{math.log(1.1) - mean:+.3f}" in out and f"{math.log(0.9) - mean:+.3f}" in out
    assert "rows in groups of 2+: 2" in out  # the lone 26.06 row has no offset


def test_a_csv_with_test_rows_is_refused(tmp_path, capsys):
    path = tmp_path / "rows.csv"
    _write(path, [("mb_26.08_x", "LLAMA3_70B", 1.0)])
    assert residuals.main([str(path)]) == 2
    assert "test-row rule" in capsys.readouterr().err


def test_family_by_gpu_table_means_each_cell_and_each_gpu_over_its_families(tmp_path, capsys):
    path = tmp_path / "rows.csv"
    _write(path, [("mb_26.04_a", "LLAMA3_70B", 10.0, "gb200"), ("mb_26.06_b", "LLAMA3_70B", -10.0, "gb200"),
                  ("mb_26.04_c", "DeepSeekV3", -20.0, "gb200"), ("mb_26.04_d", "LLAMA3_70B", 5.0, "gb300")])
    assert residuals.main([str(path)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("mean signed error by model family and GPU"):].splitlines()
    assert table[1].split() == ["family", "gb200", "gb300", "range"]
    llama = math.expm1((math.log(1.1) + math.log(0.9)) / 2) * 100  # geometric mean of the two gb200 rows
    assert f"{llama:+8.1f}% ( 2)" in table[3] and f"{5.0:+8.1f}% ( 1)" in table[3]
    assert table[3].rstrip().endswith(f"{5.0 - llama:8.1f}")
    assert f"{-20.0:+8.1f}% ( 1)" in table[2] and table[2].rstrip().endswith("-")  # one GPU: no range
    # gb200's mean weighs each family once: LLAMA3_70B's mean log error and DeepSeekV3's
    gb200 = math.expm1(((math.log(1.1) + math.log(0.9)) / 2 + math.log(0.8)) / 2) * 100
    assert table[4].startswith("mean of families") and f"{gb200:+8.1f}% ( 2)" in table[4]
