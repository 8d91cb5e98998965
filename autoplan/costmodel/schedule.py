"""Pipeline bubble of Megatron's 1F1B schedules, derived from the schedules themselves.

With p ranks, v model chunks per rank and m micro-batches of t seconds per rank (forward + backward):
- 1F1B (schedules.py `forward_backward_pipelining_without_interleaving`, warm-up p - s - 1 forwards on rank s):
  micro-batch 1 crosses all p ranks before the last backward can finish, so a step takes (m + p - 1) t for every
  m >= 1 (m < p included: the warm-up is then cut to m and the schedule degenerates to all-forward, all-backward):
  bubble (p - 1) t, i.e. (p - 1)/m of the ideal m t (Narayanan et al. SC'21 sec. 2.2).
- interleaved (`forward_backward_pipelining_with_interleaving`, micro-batches in groups of p): a pass through one
  chunk takes t/v; when m is a multiple of p the pipeline stays full between warm-up and cool-down and a step takes
  m t + (p - 1) t / v: bubble (p - 1)/(v m). With m < p (which Megatron refuses, validate.py `_interleaved_schedule`)
  the pipeline never fills: the last micro-batch starts (m - 1) t / v after the first, which needs p t to cross all
  p v chunks, so a step takes p t + (m - 1) t / v: bubble (p - m) t + (m - 1) t / v.
Unequal ranks: t_max (the slowest rank) runs every micro-batch; the others' times enter the warm-up and cool-down,
so (p - 1) t becomes sum_s t_s - t_max. tests/unit/test_pipeline_schedule.py checks both forms against a simulation of
Megatron's per-rank operation order."""
from __future__ import annotations

import numpy as np


def pipeline_bubble(t_sum, t_max, pp, vpp, num_microbatches) -> np.ndarray:
    """Seconds a step spends beyond m * t_max: `t_sum` = sum over ranks of one micro-batch's time, `t_max` the
    slowest rank's (s), `pp` ranks, `vpp` chunks per rank, `num_microbatches` per pipeline (arrays broadcast)."""
    fill = np.maximum(np.asarray(t_sum, dtype=float) - t_max, 0.0)  # (p - 1) t on a balanced pipeline
    pp = np.asarray(pp, dtype=float)
    vpp = np.asarray(vpp, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    # Interleaved with fewer micro-batches than ranks: (p - m) t more than the full-pipeline (p - 1) t / v form
    # loses to chunking, i.e. (p - m)/(p - 1) of the fill time at (1 - 1/v).
    short = np.where((vpp > 1) & (m < pp), np.maximum(pp - m, 0.0) / np.maximum(pp - 1.0, 1.0), 0.0)
    return fill / vpp + short * fill * (1.0 - 1.0 / vpp)
