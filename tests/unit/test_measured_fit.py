"""The alpha-beta fit of measured layer times and its cross-validated choice (numpy only)."""
from __future__ import annotations

import numpy as np
import pytest

from autoplan.profiler import fit
from test_measured import synthetic_profile


def affine(tp, mbs, seq, ep=1):
    """Fixed cost + per-token work, sharded by tp."""
    return 2e-4 + 3e-7 * mbs * seq / tp


def quadratic(tp, mbs, seq, ep=1):
    """Fixed cost + per-token work + attention's seq^2-per-sequence core."""
    return 1e-4 + 2e-7 * mbs * seq / tp + 5e-11 * mbs * seq * seq / tp


def test_nnls_matches_unconstrained_solution_when_it_is_feasible_and_clips_otherwise():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(fit.nnls(a, a @ np.array([2.0, 3.0])), [2.0, 3.0], atol=1e-12)
    # Unconstrained optimum is (-1, 2); with x >= 0 the best is x0 = 0, x1 = mean of its targets.
    got = fit.nnls(a, a @ np.array([-1.0, 2.0]))
    assert got[0] == 0.0 and got[1] == pytest.approx((2.0 + 1.0) / 2)


@pytest.mark.parametrize("law, terms", [(affine, (2e-4, 3e-7, 0.0)), (quadratic, (1e-4, 2e-7, 5e-11))])
def test_fit_recovers_affine_and_quadratic_coefficients_exactly(law, terms):
    points = {(seq, mbs): law(1, mbs, seq) for seq in (256, 512, 1024) for mbs in (1, 2, 4)}
    np.testing.assert_allclose(fit.fit_coefficients(points), terms, rtol=1e-7, atol=1e-15)


@pytest.mark.parametrize("law", [affine, quadratic])
def test_profile_chooses_the_fit_and_predicts_unmeasured_shapes_exactly(law):
    p = synthetic_profile(mbss=(1, 2, 4), seqs=(256, 512, 1024), law=law)
    assert p.layer_method("mlp", "fwd", "bf16") in ("fit", "fit+loglog")
    # Off-grid mbs and seq inside the range, and up to 2x past it; tp only on measured shards.
    tp, mbs, seq = np.array([1, 2, 4, 8, 2]), np.array([3, 1, 6, 2, 8]), np.array([700, 1500, 384, 2000, 128])
    got = p.layer_time("mlp", "fwd", tp, mbs, seq, "bf16")
    np.testing.assert_allclose(got, law(tp, mbs, seq), rtol=1e-7)


def test_power_laws_keep_log_log_interpolation():
    p = synthetic_profile()
    assert p.layer_method("attention", "fwd", "bf16") == "loglog"


def test_fit_smooths_noise_better_than_neighbours():
    rng = np.random.default_rng(0)
    noisy = lambda tp, mbs, seq, ep=1: quadratic(tp, mbs, seq) * (1 + 0.03 * rng.standard_normal())  # noqa: E731
    p = synthetic_profile(tps=(1, 2), mbss=(1, 2, 3, 4, 6), seqs=(128, 192, 256, 384, 512, 768), law=noisy)
    assert p.layer_method("mlp", "fwd", "bf16").startswith("fit")
    tp, mbs, seq = np.array([1, 2, 1]), np.array([5, 5, 2]), np.array([320, 640, 600])
    got = p.layer_time("mlp", "fwd", tp, mbs, seq, "bf16")
    np.testing.assert_allclose(got, quadratic(tp, mbs, seq), rtol=0.03)


def test_fit_is_nan_outside_twice_the_measured_range_and_off_a_single_value_axis():
    p = synthetic_profile(mbss=(1, 2, 4), seqs=(256, 512, 1024), law=quadratic)
    seq = np.array([2048, 2049, 128, 127, 512, 512])
    mbs = np.array([1, 1, 1, 1, 8, 9])
    got = p.layer_time("mlp", "fwd", np.ones(6), mbs, seq, "bf16")
    assert np.isfinite(got[[0, 2, 4]]).all() and np.isnan(got[[1, 3, 5]]).all()
    single = {(512, mbs): quadratic(1, mbs, 512) for mbs in (1, 2, 4, 8)}
    predict = fit.predictor(single, "fit")
    assert np.isfinite(predict(512, 3)) and np.isnan(predict(600, 3))


def test_fit_and_ratio_blend_return_measured_points():
    points = {(seq, mbs): quadratic(1, mbs, seq) * (1.1 if mbs == 2 else 1.0)
              for seq in (256, 512, 1024) for mbs in (1, 2, 4)}
    blend = fit.predictor(points, "fit+loglog")
    assert blend(512, 2) == pytest.approx(points[(512, 2)], rel=1e-12)
    assert fit.predictor(points, "fit")(512, 2) != pytest.approx(points[(512, 2)], rel=1e-3)


def test_small_slices_fall_back_to_log_log():
    points = {(256, 1): 1.0, (512, 1): 2.0, (256, 2): 2.0}
    assert fit.predictor(points, "fit")(256, 2) == 2.0
    assert fit.choose_method({(1, 1): points}) == "loglog"


def test_unknown_method_is_rejected():
    points = {(seq, mbs): affine(1, mbs, seq) for seq in (256, 512) for mbs in (1, 2, 4)}
    with pytest.raises(ValueError, match="method must be one of"):
        fit.predictor(points, "spline")
