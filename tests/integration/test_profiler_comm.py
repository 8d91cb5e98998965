"""Collective benchmark: nccl-tests bandwidth conventions, the alpha-beta fit, and a 2-process gloo run under
torchrun."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from autoplan.errors import InputError
from autoplan.profiler.comm import (CommFit, CommRequest, bus_factor, fit_alpha_beta, gpu_overrides,
                                    message_sizes, ring_steps)
from conftest import deadline_s


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(op, 4) == pytest.approx(3 / 4)
    assert bus_factor("send_recv", 8) == 1.0
    assert ring_steps("all_reduce", 8) == 14 and ring_steps("all_gather", 8) == 7


def test_fit_recovers_alpha_and_beta_from_exact_times():
    x = np.array([2.0**k for k in range(10, 31)])
    alpha, beta = 20e-6, 300e9
    got_alpha, got_beta, err, resolved = fit_alpha_beta(x, alpha + x / beta)
    assert got_alpha == pytest.approx(alpha, rel=1e-6) and got_beta == pytest.approx(beta, rel=1e-6)
    assert err < 1e-9 and resolved


def test_fit_marks_latency_bound_data_as_unresolved():
    x = np.array([1024.0, 2048.0, 4096.0])
    alpha, beta, _, resolved = fit_alpha_beta(x, np.array([5e-4, 4e-4, 4.5e-4]))
    assert not resolved and 4e-4 <= alpha <= 5e-4
    assert beta == pytest.approx(np.max(x / np.array([5e-4, 4e-4, 4.5e-4])))


def test_overrides_put_measured_bus_bandwidth_into_gpu_spec_fields():
    fit = CommFit(op="all_reduce", alpha_us=70.0, step_latency_us=5.0, busbw_gbytes_per_s=360.0,
                  bandwidth_resolved=True, max_rel_error=0.01)
    notes = []
    assert gpu_overrides([fit], "nvlink", 450.0, notes) == {"nvlink_latency_us": 5.0, "nvlink_bus_efficiency": 0.8}
    plain = gpu_overrides([fit], "nvlink", None, notes)
    assert plain["nvlink_bandwidth_gbytes_per_s"] * plain["nvlink_bus_efficiency"] == pytest.approx(360.0)
    net = gpu_overrides([fit], "network", None, notes)
    assert net == {"network_latency_us": 5.0} and any("--link-gbytes-per-s" in n for n in notes)


def test_message_sizes_are_powers_of_two():
    assert message_sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    with pytest.raises(InputError, match="must not exceed"):
        message_sizes(4096, 1024)
    with pytest.raises(InputError, match="unknown collective 'broadcast'"):
        CommRequest(ops=("broadcast",)).check()


def test_outside_torchrun_is_an_input_error(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from autoplan.profiler.comm import run_comm_profile

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(InputError, match="must run under torchrun"):
        run_comm_profile(CommRequest(), tmp_path / "c.json")


@pytest.mark.slow
def test_two_gloo_processes_under_torchrun(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "comm.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29517",
           "-m", "autoplan.cli.main", "profile-comm", "--max-size", "256K", "--repeats", "3", "--warmup", "1",
           "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=deadline_s(40), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["backend"] == "gloo" and data["world_size"] == 2 and data["level"] == "nvlink"
    ops = {p["op"] for p in data["points"]}
    assert ops == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    sizes = sorted({p["size_bytes"] for p in data["points"] if p["op"] == "all_reduce"})
    assert sizes == [1024 * 2**k for k in range(9)]
    for p in data["points"]:
        assert len(p["raw_s"]) == 3
        assert p["busbw_gbytes_per_s"] == pytest.approx(p["algbw_gbytes_per_s"] * bus_factor(p["op"], 2))
    assert "nvlink_latency_us" in data["gpu_overrides"]


def test_a_single_rank_has_nothing_to_fit():
    from autoplan.profiler.comm import CommPoint, fit_points

    points = [CommPoint(op="all_reduce", size_bytes=s, median_s=1e-5, min_s=1e-5, max_s=1e-5, raw_s=(1e-5,),
                        algbw_gbytes_per_s=s / 1e-5 / 1e9, busbw_gbytes_per_s=0.0) for s in (1024, 2048)]
    notes = []
    assert fit_points(points, 1) == []
    assert gpu_overrides([], "nvlink", None, notes) == {} and notes
