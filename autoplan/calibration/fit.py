"""Fit the cluster's constants to measured runs: regularised least squares in log step time, priors from the GPU
profile and `Calibration`.

Objective (a maximum a-posteriori fit with Gaussian priors and Gaussian log-time errors):

    r' C^-1 r + sum_constants ((z - z_prior) / prior_sd)^2,   r = log predicted - log measured

with C the runs' covariance (`run_covariance`: measurement noise RUN_SIGMA, and the model's own error MODEL_SIGMA
shared by the runs of one model)

over the transformed constants z (autoplan/calibration/params.py; on a catalogue GPU every prior_sd may be scaled
down to a reference stack's spread first, `prior_spreads`), minimised by a coarse search along each constant
(steps of its prior spread) followed by Levenberg-Marquardt (Levenberg 1944, Marquardt 1963) with finite-difference
derivatives, every step clipped into the constants' bounds. With one
run the prior terms decide how its error is shared among the constants it is sensitive to; more runs pull each
constant towards what they jointly say.

What the runs identify follows from the same quantities at the fitted point: the posterior covariance
P = (J' C^-1 J + diag(1 / prior_sd^2))^-1, J the data rows' derivatives; a constant is identified when the runs shrink its
variance below half its prior variance (1 - P_ii / prior_sd_i^2 >= IDENTIFIED_SHARE) and its posterior correlation
with every other constant stays below CONFOUNDED (one run shrinks the variance of one combination of constants,
not of each). A constant no run is sensitive
to is named with the kind of run that would exercise it; one the runs exercise but cannot separate from another is
named with the constant it is confounded with (the largest posterior correlation).

Only identified constants move: once the fit over every constant has said which the runs identify, the fit is run
again over those alone, every other constant held at its prior (and so on until the constants fitted are the ones
identified). A constant the runs do not identify is reported and kept at its prior, not nudged by a share of a
run's error that the runs cannot attribute to it; a calibration whose runs identify nothing leaves the priors as
they are."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from autoplan.calibration.params import CONSTANTS, Constant
from autoplan.calibration.runs import MeasuredRun
from autoplan.cluster import ClusterSpec
from autoplan.costmodel.calibration import DEFAULT, Calibration
from autoplan.errors import InputError

# Standard deviation of one run's measured log step time: the noise of a median over logged iterations between two
# launches of one setup (node placement, clocks, data order). Consecutive Megatron-LM iterations agree within 0.1%
# (tests/fixtures/logs/megatron_ling_v2_pretrain.log: 10.7656 and 10.7674 s); launches differ more, so 2%. It is
# measurement noise, not the model's error: the priors, not this figure, keep a fit on few runs plausible. Fixed
# here, never fitted; a smaller value trusts the runs more.
RUN_SIGMA = 0.02
# The model's own error for one model (model discrepancy, Kennedy & O'Hagan 2001, "Bayesian calibration of computer
# models", JRSS B 63(3)): runs of one GPU, software release and precision share every cluster constant, yet the
# uncalibrated model's log error still scatters among their models by this standard deviation, which no constant
# can remove. Each run's log step time carries its model's error, shared by every run of that model and independent
# between models, so the fit integrates it out (`run_covariance`): one run's residual is shared between the
# constants and its model's own error, and the constants carry to other models only the part the prior says is the
# cluster's; two runs of one model still tell the constants their difference. Pooled within-group SD over the
# published runs, test split left out (`python -m benchmarks.fewshot --part discrepancy`, benchmarks/README.md
# "Few-shot calibration"), per architecture of the run.
MODEL_SIGMA = {"dense": 0.078, "moe": 0.147}
# How far one reference software stack on a catalogue GPU sits from the priors: the standard deviation, in log step
# time, of the uncalibrated model's mean error over the runs of one (GPU, software release, precision) group, less
# the sampling noise of those means (one-way random effects, method of moments, each architecture about its own
# mean, pooled over the 44 groups of the published runs, test split left out; `python -m benchmarks.fewshot --part
# discrepancy`, benchmarks/README.md "Few-shot calibration"). The priors' own spreads (calibration/params.py,
# +-30% on efficiencies) are the datasheet's, for a cluster nothing is known about; on a catalogue GPU a reference
# stack moves the step time by this much, so the fit weighs both hypotheses (`prior_spreads`).
STACK_SIGMA = 0.043
# Prior probability that a cluster of a catalogue GPU is unlike every reference stack (the datasheet spreads'
# hypothesis of `prior_spreads`), against a reference stack (1 - this). Empirical Bayes over the published runs:
# every (GPU, software release, precision) group's marginal likelihood under both hypotheses, as `prior_spreads`
# computes it for a user's runs; the mixing probability by expectation-maximisation (Dempster, Laird & Rubin 1977,
# JRSS B 39(1)) with the rule of succession, (expected groups unlike the reference + 1) / (groups + 2) (Laplace; the
# posterior mean under a uniform prior), so that a probability estimated from 41 groups is never 0 or 1. Test
# split left out; `python -m benchmarks.fewshot --part discrepancy` prints it (5.06 of 41 groups, 0.141;
# benchmarks/README.md "Few-shot calibration"). Before this figure the two hypotheses had equal odds, an assumption
# the published groups do not support: one run a few tens of percent off was then read as an unlike cluster far more
# often than the groups are.
UNLIKE_REFERENCE = 0.141
IDENTIFIED_SHARE = 0.5
CONFOUNDED = 0.8  # |posterior correlation| with another constant at which the runs cannot tell the two apart
SENSITIVE = 1e-3  # |d log step / d z| below this for every run: no run exercises the constant
LM_STEPS = 40
# Before the local steps: each constant alone is tried at these multiples of its prior spread from where it stands,
# and moved to the best (one pass per SEARCH_PASSES). Local derivatives cannot see what a hidden fraction would do
# once exposed (log step time is flat in it while the overlap hides it), which this coarse search can.
SEARCH_STEPS = (-3.0, -2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 3.0)
SEARCH_PASSES = 2
FD_STEP = 1e-3  # finite-difference step in z


@dataclass(frozen=True)
class RunResidual:
    """One run's measured vs predicted step time before (priors) and after the fit."""

    run: MeasuredRun
    predicted_prior_s: float
    predicted_fit_s: float
    predicted_peak_mem_gib: float

    @property
    def error_prior(self) -> float:
        return self.predicted_prior_s / self.run.step_time_s - 1.0

    @property
    def error_fit(self) -> float:
        return self.predicted_fit_s / self.run.step_time_s - 1.0


@dataclass(frozen=True)
class FitResult:
    priors: Dict[str, float]
    values: Dict[str, float]
    identified: Tuple[str, ...]
    unidentified: Dict[str, str]  # name -> why
    data_share: Dict[str, float]  # 1 - posterior / prior variance
    residuals: Tuple[RunResidual, ...]
    prior_scale: float = 1.0  # factor on every constant's prior spread (`prior_spreads`): 1 = the datasheet's


def priors_of(cluster: ClusterSpec, base: Calibration = DEFAULT) -> Dict[str, float]:
    """Each constant's prior: the GPU profile's field or the Calibration default."""
    return {c.name: float(getattr(cluster.gpu if c.home == "gpu" else base, c.name)) for c in CONSTANTS}


def apply_values(values: Dict[str, float], cluster: ClusterSpec, base: Calibration = DEFAULT
                 ) -> Tuple[ClusterSpec, Calibration]:
    """(cluster with the fitted GPU fields, Calibration with the fitted constants)."""
    homes = {c.name: c.home for c in CONSTANTS}
    gpu_fields = {k: v for k, v in values.items() if homes.get(k) == "gpu"}
    cal_fields = {k: v for k, v in values.items() if homes.get(k) == "calibration"}
    gpu = cluster.gpu.model_copy(update=gpu_fields) if gpu_fields else cluster.gpu
    return cluster.model_copy(update={"gpu": gpu}), replace(base, **cal_fields)


class Predictor:
    """Predicted step times (and peak memory) of the runs under a set of constant values; layouts built once."""

    def __init__(self, runs: Sequence[MeasuredRun], base: Calibration = DEFAULT):
        from autoplan.costmodel.layout import layouts_from_strategies

        self.runs = list(runs)
        self.base = base
        self.layouts = [layouts_from_strategies([r.strategy], r.cluster.num_gpus, engine=r.engine,
                                                gpu_id=r.cluster.gpu.id) for r in self.runs]

    def evaluations(self, values: Dict[str, float]):
        from autoplan.costmodel.estimate import evaluate

        out = []
        for run, lay in zip(self.runs, self.layouts):
            cluster, cal = apply_values(values, run.cluster, self.base)
            out.append(evaluate(run.model, cluster, run.workload, lay, cal, every_rank=True))
        return out

    def step_times(self, values: Dict[str, float]) -> np.ndarray:
        return np.array([float(ev.step_time_s[0]) for ev in self.evaluations(values)])


def run_covariance(runs: Sequence[MeasuredRun]) -> np.ndarray:
    """Covariance of the runs' log step times about the model's prediction: measurement noise RUN_SIGMA^2 on the
    diagonal, plus MODEL_SIGMA^2 of the model's own error between every two runs of one model (the model's name)."""
    names = [r.model.name for r in runs]
    sd = np.array([MODEL_SIGMA["moe" if r.model.is_moe else "dense"] for r in runs])
    same = np.array([[a == b for b in names] for a in names], dtype=float)
    return RUN_SIGMA ** 2 * np.eye(len(runs)) + same * np.outer(sd, sd)


def check_one_gpu(runs: Sequence[MeasuredRun]) -> None:
    ids = sorted({r.cluster.gpu.id for r in runs})
    if len(ids) > 1:
        first = {i: next(r.label for r in runs if r.cluster.gpu.id == i) for i in ids}
        raise InputError(f"the runs are on {len(ids)} GPU types ({', '.join(f'{i}: {first[i]}' for i in ids)}); "
                         f"a calibration describes one GPU type: calibrate each GPU's runs into its own file")


def is_catalogue_gpu(cluster: ClusterSpec) -> bool:
    """The cluster's GPU is a bundled profile as shipped (profiles/gpus), not a datasheet the user wrote."""
    from autoplan.clusterio import gpu_ids, load_gpu

    return cluster.gpu.id in gpu_ids() and load_gpu(cluster.gpu.id) == cluster.gpu


def log_evidence(residual: np.ndarray, cov: np.ndarray) -> float:
    """log N(residual; 0, cov) up to the constant: the runs' marginal likelihood under a linearised model."""
    _, logdet = np.linalg.slogdet(cov)
    return float(-0.5 * residual @ np.linalg.solve(cov, residual) - 0.5 * logdet)


def stack_scale(jd: np.ndarray, sd: np.ndarray) -> float:
    """The factor on the prior spreads `sd` at which the constants move the runs' log step time by STACK_SIGMA (root
    mean square over the runs, linearised: `jd` the derivatives at the priors); 1 where they move it less already."""
    total = float(np.sqrt(np.mean(np.sum((jd * sd) ** 2, axis=1))))
    return STACK_SIGMA / total if total > STACK_SIGMA else 1.0


def unlike_log_odds(jd: np.ndarray, residual: np.ndarray, cov: np.ndarray, sd: np.ndarray) -> float:
    """log Bayes factor of a cluster unlike the reference (the datasheet spreads `sd`) against a reference stack
    (`stack_scale`) for the runs' `residual` at the priors: `log_evidence` under covariance `cov` + J diag(s^2) J' for
    each hypothesis's spreads s. Prior odds not included."""
    spread = jd @ np.diag(sd ** 2) @ jd.T
    k = stack_scale(jd, sd)
    return log_evidence(residual, cov + spread) - log_evidence(residual, cov + k * k * spread)


def prior_spreads(jd: np.ndarray, residual: np.ndarray, cov: np.ndarray, sd: np.ndarray, catalogue: bool) -> float:
    """The factor on the constants' prior spreads `sd`: 1 (the datasheet's) or `stack_scale` (a reference stack's),
    whichever hypothesis the runs' `residual` at the priors makes the more probable: Bayes factor
    (`unlike_log_odds`) times the prior odds UNLIKE_REFERENCE / (1 - UNLIKE_REFERENCE) of the published groups. Only
    a catalogue GPU has a reference stack to be near; a datasheet GPU keeps the datasheet's spreads. One run some
    percent off is then taken as a reference stack plus its model's own error; runs far off, or runs whose
    differences the priors cannot explain, as a cluster unlike the reference, and the constants follow them."""
    scale = stack_scale(jd, sd)
    if not catalogue or scale >= 1.0:
        return 1.0
    odds = unlike_log_odds(jd, residual, cov, sd) + math.log(UNLIKE_REFERENCE / (1.0 - UNLIKE_REFERENCE))
    return 1.0 if odds > 0 else scale


def log_step_derivatives(log_pred: Callable[[np.ndarray], np.ndarray], z: np.ndarray, lp: np.ndarray,
                         upper: np.ndarray) -> np.ndarray:
    """d log step / d z at `z` (runs x constants), `lp` = log_pred(z): forward differences of FD_STEP in each
    constant's coordinate, backward where the step would leave the constant's upper bound."""
    cols = []
    for i in range(len(z)):
        h = FD_STEP if z[i] + FD_STEP <= upper[i] else -FD_STEP
        dz = z.copy()
        dz[i] += h
        cols.append((log_pred(dz) - lp) / h)
    return np.array(cols).T


def linearised(runs: Sequence[MeasuredRun], base: Calibration = DEFAULT, constants: Sequence[Constant] = CONSTANTS,
               predict: Optional[Predictor] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(log predicted - log measured step time at the priors, d log step / d z there: runs x constants) of runs on
    one GPU type (`predict`: the runs' Predictor, when the caller has one)."""
    predict = predict or Predictor(runs, base)
    priors = priors_of(runs[0].cluster, base)
    z0 = np.array([c.to_z(priors[c.name]) for c in constants])

    def log_pred(z: np.ndarray) -> np.ndarray:
        return np.log(predict.step_times({**priors, **{c.name: c.from_z(float(x)) for c, x in zip(constants, z)}}))

    lp = log_pred(z0)
    upper = np.array([c.z_bounds()[1] for c in constants])
    return lp - np.log(np.array([r.step_time_s for r in runs])), log_step_derivatives(log_pred, z0, lp, upper)


def fit(runs: Sequence[MeasuredRun], base: Calibration = DEFAULT,
        constants: Sequence[Constant] = CONSTANTS) -> FitResult:
    """Fit `constants` to the runs (all on one GPU type); see the module docstring."""
    if not runs:
        raise InputError("no runs to calibrate on; pass at least one log, runs table or probe result")
    check_one_gpu(runs)
    predict = Predictor(runs, base)
    priors = priors_of(runs[0].cluster, base)
    measured = np.log(np.array([r.step_time_s for r in runs]))
    cov = run_covariance(runs)
    whiten = np.linalg.inv(np.linalg.cholesky(cov))  # residual -> independent unit-variance terms
    residual0, jd0 = linearised(runs, base, constants, predict)
    scale = prior_spreads(jd0, residual0, cov, np.array([c.prior_sd for c in constants]),
                          is_catalogue_gpu(runs[0].cluster))

    def optimise(free: Sequence[Constant]) -> Tuple[Dict[str, float], np.ndarray]:
        """MAP values with only `free` moving (the rest at their priors), and d log step / d z of `free` there."""
        z0 = np.array([c.to_z(priors[c.name]) for c in free])
        sd = np.array([c.prior_sd for c in free]) * scale
        lo, hi = (np.array(b) for b in zip(*(c.z_bounds() for c in free)))

        def values_of(z: np.ndarray) -> Dict[str, float]:
            return {**priors, **{c.name: c.from_z(float(x)) for c, x in zip(free, z)}}

        def log_pred(z: np.ndarray) -> np.ndarray:
            return np.log(predict.step_times(values_of(z)))

        def residuals(z: np.ndarray, lp: np.ndarray) -> np.ndarray:
            return np.concatenate([whiten @ (lp - measured), (z - z0) / sd])

        def jacobian(z: np.ndarray, lp: np.ndarray) -> np.ndarray:
            return log_step_derivatives(log_pred, z, lp, hi)

        z = z0.copy()
        lp = log_pred(z)
        cost = float(np.sum(residuals(z, lp) ** 2))
        for _ in range(SEARCH_PASSES):
            for i in range(len(z)):
                for k in SEARCH_STEPS:
                    trial = z.copy()
                    trial[i] = np.clip(z[i] + k * sd[i], lo[i], hi[i])
                    trial_lp = log_pred(trial)
                    trial_cost = float(np.sum(residuals(trial, trial_lp) ** 2))
                    if trial_cost < cost:
                        z, lp, cost = trial, trial_lp, trial_cost
        damping = 1e-2
        for _ in range(LM_STEPS):
            jd = jacobian(z, lp)
            full = np.vstack([whiten @ jd, np.diag(1.0 / sd)])
            r = residuals(z, lp)
            normal = full.T @ full
            step = np.linalg.solve(normal + damping * np.diag(np.diag(normal)), -full.T @ r)
            trial = np.clip(z + step, lo, hi)
            trial_lp = log_pred(trial)
            trial_cost = float(np.sum(residuals(trial, trial_lp) ** 2))
            if trial_cost < cost:
                converged = cost - trial_cost < 1e-9 * max(cost, 1.0)
                z, lp, cost, damping = trial, trial_lp, trial_cost, damping / 3.0
                if converged:
                    break
            else:
                damping *= 4.0
                if damping > 1e8:
                    break
        return values_of(z), jacobian(z, lp)

    # Every constant first: what the runs identify, and why the others are not. Then only the identified ones move
    # (module docstring), until the constants fitted are those identified.
    free: List[Constant] = list(constants)
    values, jd = optimise(free)
    identified, unidentified, share = identifiability(jd, free, whiten, scale)
    while len(identified) < len(free):
        free = [c for c in free if c.name in identified]
        if not free:
            values = dict(priors)
            break
        values, jd = optimise(free)
        identified, dropped, _ = identifiability(jd, free, whiten, scale)
        unidentified.update(dropped)
    prior_evs, fit_evs = predict.evaluations(priors), predict.evaluations(values)
    residual_rows = tuple(
        RunResidual(run=run, predicted_prior_s=float(pe.step_time_s[0]), predicted_fit_s=float(fe.step_time_s[0]),
                    predicted_peak_mem_gib=float(fe.peak_mem_bytes[0]) / 2**30)
        for run, pe, fe in zip(runs, prior_evs, fit_evs))
    return FitResult(priors={c.name: priors[c.name] for c in constants},
                     values={c.name: values[c.name] for c in constants}, identified=tuple(identified),
                     unidentified={c.name: unidentified[c.name] for c in constants if c.name in unidentified},
                     data_share=share, residuals=residual_rows, prior_scale=scale)


def identifiability(jd: np.ndarray, constants: Sequence[Constant], whiten: np.ndarray, prior_scale: float = 1.0
                    ) -> Tuple[Tuple[str, ...], Dict[str, str], Dict[str, float]]:
    """(identified names, {unidentified name: why}, {name: data share}) from the data rows' derivatives, the
    whitening of their covariance (`run_covariance`) and the factor on the prior spreads (`prior_spreads`)."""
    sd = np.array([c.prior_sd for c in constants]) * prior_scale
    scaled = whiten @ jd
    info = scaled.T @ scaled
    cov = np.linalg.inv(info + np.diag(1.0 / sd ** 2))
    share = 1.0 - np.diag(cov) / sd ** 2
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    identified: List[str] = []
    unidentified: Dict[str, str] = {}
    for i, c in enumerate(constants):
        others = np.abs(corr[i]).copy()
        others[i] = 0.0
        if share[i] >= IDENTIFIED_SHARE and np.max(others) < CONFOUNDED:
            identified.append(c.name)
        elif np.max(np.abs(jd[:, i])) < SENSITIVE:
            unidentified[c.name] = f"no run exercises it (needs {c.needs}); kept at its prior"
        else:
            j = int(np.argmax(others))
            partner = f", confounded with {constants[j].name} (correlation {corr[i, j]:+.2f})" \
                if others[j] >= 0.3 else ""
            unidentified[c.name] = (f"the runs fix {share[i]:.0%} of it{partner} (needs {c.needs}); kept at "
                                    f"its prior")
    return tuple(identified), unidentified, {c.name: float(share[i]) for i, c in enumerate(constants)}


def rms_log_error(residuals: Sequence[RunResidual], fitted: bool) -> Optional[float]:
    if not residuals:
        return None
    errs = [math.log((r.predicted_fit_s if fitted else r.predicted_prior_s) / r.run.step_time_s) for r in residuals]
    return math.sqrt(sum(e * e for e in errs) / len(errs))
