"""Correction factors fitted to probe measurements: compute-time scale, communication scale, memory scale.

The corrected step time is `compute_scale * T_compute + comm_scale * T_comm`, where T_compute sums the compute,
recompute, optimizer and pipeline-bubble terms of the estimate's time breakdown and T_comm the exposed
communication terms (`*_comm`). The two scales minimise the squared log ratio of measured to corrected step time
over the ok probes (Levenberg-Marquardt on (log a, log b), with a small ridge that pulls the two scales together
so that a single probe gives a = b = its ratio). The memory scale is the geometric mean of measured / predicted
peak memory (the least-squares solution in log space), over probes whose engine reports device memory."""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autoplan.results import Estimate

COMPUTE_TERMS = ("compute", "recompute", "optimizer", "bubble")
RIDGE = 0.01  # weight of (log a - log b)^2: keeps the fit determined with fewer probes than parameters
LM_STEPS = 50


class Corrections(BaseModel):
    """Fitted correction factors; 1.0 means no correction."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute_scale: float = Field(1.0, description="Multiplies the predicted compute-side time (dimensionless).")
    comm_scale: float = Field(1.0, description="Multiplies the predicted exposed communication time.")
    memory_scale: float = Field(1.0, description="Multiplies the predicted peak memory.")
    time_probes: int = Field(0, description="Ok probes the time scales were fitted on.")
    memory_probes: int = Field(0, description="Probes with device-memory reports the memory scale was fitted on.")
    rms_log_error: Optional[float] = Field(None, description="RMS of log(measured/corrected) over the time probes.")


def split_time(est: Estimate) -> Tuple[float, float]:
    """(compute-side, communication) seconds of the estimate; any remainder of step_time goes to compute."""
    comm = sum(v for k, v in est.time_breakdown.items() if k.endswith("_comm"))
    compute = max(est.step_time_s - comm, 0.0)
    return compute, comm


def corrected_step_time(est: Estimate, corr: Corrections) -> float:
    compute, comm = split_time(est)
    return corr.compute_scale * compute + corr.comm_scale * comm


def _fit_time(parts: np.ndarray, measured: np.ndarray) -> Tuple[float, float, float]:
    """(a, b, rms log error) minimising sum (log m - log(a C + b M))^2 + RIDGE (log a - log b)^2."""
    ratio = float(np.exp(np.mean(np.log(measured / parts.sum(axis=1)))))
    theta = np.array([math.log(ratio), math.log(ratio)])
    damping = 1e-3

    def residuals(th: np.ndarray) -> np.ndarray:
        pred = parts @ np.exp(th)
        return np.concatenate([np.log(measured) - np.log(pred), [math.sqrt(RIDGE) * (th[0] - th[1])]])

    for _ in range(LM_STEPS):
        scale = np.exp(theta)
        pred = parts @ scale
        jac = -(parts * scale) / pred[:, None]
        jac = np.vstack([jac, math.sqrt(RIDGE) * np.array([1.0, -1.0])])
        r = residuals(theta)
        step = np.linalg.solve(jac.T @ jac + damping * np.eye(2), -jac.T @ r)
        if float(np.sum(residuals(theta + step) ** 2)) < float(np.sum(r ** 2)):
            theta, damping = theta + step, damping / 3
        else:
            damping *= 5
        if np.max(np.abs(step)) < 1e-9:
            break
    logs = np.log(measured) - np.log(parts @ np.exp(theta))
    return float(np.exp(theta[0])), float(np.exp(theta[1])), float(np.sqrt(np.mean(logs ** 2)))


def fit_corrections(time_points: Sequence[Tuple[Estimate, float]],
                    memory_points: Sequence[Tuple[Estimate, float]]) -> Corrections:
    """Fit from (estimate, measured step time s) and (estimate, measured peak GiB) pairs."""
    a = b = 1.0
    rms = None
    usable = [(e, m) for e, m in time_points if m > 0 and e.step_time_s > 0]
    if usable:
        parts = np.array([split_time(e) for e, _ in usable])
        parts[:, 0] = np.maximum(parts[:, 0], 1e-12)
        a, b, rms = _fit_time(parts, np.array([m for _, m in usable]))
        if not parts[:, 1].any():
            b = a  # no probe exposed communication: nothing to fit it on
    mem = [(e, m) for e, m in memory_points if m > 0 and e.peak_mem_gib > 0]
    mem_scale = float(np.exp(np.mean([math.log(m / e.peak_mem_gib) for e, m in mem]))) if mem else 1.0
    return Corrections(compute_scale=a, comm_scale=b, memory_scale=mem_scale, time_probes=len(usable),
                       memory_probes=len(mem), rms_log_error=rms)
