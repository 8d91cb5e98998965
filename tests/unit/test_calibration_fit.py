"""The calibration fit's choice between a reference stack and a cluster unlike it (autoplan/calibration/fit.py
`prior_spreads`), and the prior probability of the latter estimated over groups (benchmarks/fewshot.py
`mixing_probability`)."""
import math

import numpy as np

from autoplan.calibration import fit
from benchmarks.fewshot import mixing_probability

SD = np.array([0.3, 0.7])  # two constants' prior spreads, the datasheet's
JD = np.array([[0.8, 0.1]])  # one run's d log step / d z: mostly the first constant
COV = np.array([[0.02 ** 2 + 0.078 ** 2]])  # run noise and a dense model's own error (fit.RUN_SIGMA, MODEL_SIGMA)


def test_the_datasheet_spreads_win_only_when_the_bayes_factor_beats_the_prior_odds():
    threshold = math.log((1 - fit.UNLIKE_REFERENCE) / fit.UNLIKE_REFERENCE)
    stack = fit.stack_scale(JD, SD)
    assert 0 < stack < 1
    seen_between = False
    for error in np.linspace(0.0, 0.6, 61):
        residual = np.array([error])
        log_bf = fit.unlike_log_odds(JD, residual, COV, SD)
        chosen = fit.prior_spreads(JD, residual, COV, SD, catalogue=True)
        assert chosen == (1.0 if log_bf > threshold else stack), (error, log_bf)
        seen_between |= 0 < log_bf < threshold
        # A GPU given by its datasheet has no reference stack to be near.
        assert fit.prior_spreads(JD, residual, COV, SD, catalogue=False) == 1.0
    assert seen_between  # runs the equal odds of before read as unlike the reference, now read as a reference stack


def test_mixing_probability_is_the_rule_of_succession_at_its_fixed_point():
    expected, p = mixing_probability([-50.0] * 40)  # no group unlike the reference: 1 / (40 + 2), never 0
    assert math.isclose(expected, 0.0, abs_tol=1e-12) and math.isclose(p, 1 / 42)
    expected, p = mixing_probability([50.0] * 40)
    assert math.isclose(expected, 40.0) and math.isclose(p, 41 / 42)
    log_bf = [-3.0, -1.0, 0.5, 4.0, -2.0, 2.0]
    expected, p = mixing_probability(log_bf)
    posterior = 1 / (1 + np.exp(-(np.array(log_bf) + math.log(p / (1 - p)))))
    assert math.isclose(expected, posterior.sum(), rel_tol=1e-6)
    assert math.isclose(p, (expected + 1) / (len(log_bf) + 2), rel_tol=1e-6)
