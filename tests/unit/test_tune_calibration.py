"""Correction factors: least squares on log ratios of measured vs predicted."""
import math

import pytest

from autoplan.results import Estimate
from autoplan.tuning.calibration import corrected_step_time, fit_corrections, split_time


def est(compute: float, comm: float, peak: float = 1.0) -> Estimate:
    step = compute + comm
    return Estimate(step_time_s=step, tokens_per_s=1.0 / step, tokens_per_s_per_gpu=1.0 / step,
                    model_tflops_per_gpu=1.0, mfu=0.1, peak_mem_gib=peak, fits=True,
                    time_breakdown={"compute": compute * 0.8, "optimizer": compute * 0.2, "dp_comm": comm * 0.5,
                                    "tp_comm": comm * 0.5, "bubble": 0.0},
                    memory_breakdown={}, capacity_gib=10.0)


def test_split_time_groups_terms():
    assert split_time(est(0.3, 0.1)) == pytest.approx((0.3, 0.1))


def test_recovers_separate_compute_and_comm_scales():
    points = [(0.10, 0.01), (0.05, 0.05), (0.20, 0.02), (0.02, 0.10)]
    data = [(est(c, m), 2.0 * c + 5.0 * m) for c, m in points]
    corr = fit_corrections(data, [])
    assert corr.compute_scale == pytest.approx(2.0, rel=0.05)
    assert corr.comm_scale == pytest.approx(5.0, rel=0.05)
    assert corr.rms_log_error < 0.03
    assert corrected_step_time(est(0.1, 0.1), corr) == pytest.approx(0.7, rel=0.05)


def test_single_probe_gives_its_ratio_to_both_scales():
    corr = fit_corrections([(est(0.1, 0.1), 0.6)], [])
    assert corr.compute_scale == pytest.approx(3.0, rel=1e-3)
    assert corr.comm_scale == pytest.approx(3.0, rel=1e-3)
    assert corr.time_probes == 1


def test_no_communication_measured_keeps_comm_equal_to_compute():
    corr = fit_corrections([(est(0.1, 0.0), 0.4), (est(0.2, 0.0), 0.8)], [])
    assert corr.compute_scale == pytest.approx(4.0, rel=1e-3)
    assert corr.comm_scale == corr.compute_scale


def test_memory_scale_is_geometric_mean_of_ratios():
    corr = fit_corrections([], [(est(0.1, 0.0, peak=2.0), 4.0), (est(0.1, 0.0, peak=4.0), 2.0)])
    assert corr.memory_scale == pytest.approx(math.sqrt(2.0 * 0.5))
    assert corr.memory_probes == 2 and corr.time_probes == 0


def test_no_points_is_identity():
    corr = fit_corrections([], [])
    assert (corr.compute_scale, corr.comm_scale, corr.memory_scale) == (1.0, 1.0, 1.0)
    assert corr.rms_log_error is None
