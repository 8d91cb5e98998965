"""The constants a calibration can fit, each with its bounds, its prior spread and the kind of run that exercises it.

A constant lives either in `Calibration` (autoplan/costmodel/calibration.py, whose defaults cite their sources) or in
the GPU profile (`GpuSpec` fields: the datasheet / microbenchmark values of profiles/gpus/*.yaml). Those values are
the priors: the fit pulls every constant towards its prior with weight 1 / prior_sd^2 in the constant's transformed
coordinate, and only the constants the runs identify move (autoplan/calibration/fit.py): a constant the runs do not
exercise, or one they cannot tell from another, stays at its prior and is reported as not identified.

Coordinates: "log" fits log(x) (a multiplicative correction; prior_sd 0.3 is about +-35% at one standard deviation);
"exposed" fits log(1 - x) for a hidden fraction x (the exposed share changes multiplicatively, and x stays below 1).

Prior spreads are judgement, stated here once: +-30% (0.3) for efficiencies whose datasheet / microbenchmark value
is measured on a comparable part (GEMM, attention, HBM, bus efficiencies), a factor of ~2 (0.7) for shape constants
and per-op costs that vary with software (GEMM half size, per-op overhead, overlap), a factor of ~3 (1.0) for the
grouped-GEMM token half point (one H800 FP8 table, calibration.py). They are a datasheet's spreads, for a cluster
nothing is known about; on a catalogue GPU the fit may scale them all down to a reference stack's
(autoplan/calibration/fit.py `prior_spreads`, `STACK_SIGMA`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Tuple

Home = Literal["calibration", "gpu"]
Coordinate = Literal["log", "exposed"]


@dataclass(frozen=True)
class Constant:
    """One fittable constant."""

    name: str  # field name in Calibration or GpuSpec
    home: Home
    lower: float  # physical bounds of the value itself
    upper: float
    prior_sd: float  # in the transformed coordinate
    coordinate: Coordinate
    needs: str  # the kind of run that exercises it, named when the runs identify it not

    def to_z(self, x: float) -> float:
        x = min(max(x, self.lower), self.upper)
        return math.log(x) if self.coordinate == "log" else math.log(1.0 - x)

    def from_z(self, z: float) -> float:
        x = math.exp(z) if self.coordinate == "log" else 1.0 - math.exp(z)
        return min(max(x, self.lower), self.upper)

    def z_bounds(self) -> Tuple[float, float]:
        a, b = self.to_z(self.lower), self.to_z(self.upper)
        return min(a, b), max(a, b)


CONSTANTS: Tuple[Constant, ...] = (
    # Dense GEMM efficiency curve: scale of the profile's MAMF fraction, and the size at which a GEMM runs at half it.
    Constant("gemm_scale", "calibration", 0.2, 1.25, 0.3, "log",
             "any run; runs whose per-op share differs (e.g. two micro batch sizes) to tell it from the per-op cost"),
    Constant("gemm_half_dim", "calibration", 8.0, 4000.0, 0.7, "log",
             "runs whose GEMM sizes differ (e.g. two tp degrees or hidden sizes)"),
    Constant("attention_eff_fwd", "calibration", 0.05, 1.0, 0.3, "log",
             "runs whose attention share differs (e.g. two sequence lengths)"),
    Constant("hbm_eff", "calibration", 0.2, 1.0, 0.3, "log", "runs with a large memory-bound share"),
    Constant("kernel_overhead_s", "calibration", 1e-7, 5e-4, 0.7, "log",
             "runs with many small ops (small micro batch, many experts per rank)"),
    # Grouped expert GEMMs: the large-m rate and its dependence on tokens per expert.
    Constant("grouped_gemm_eff", "calibration", 0.1, 1.0, 0.3, "log", "a MoE run"),
    Constant("grouped_gemm_half_tokens", "calibration", 1.0, 5000.0, 1.0, "log",
             "MoE runs whose tokens per expert differ (e.g. two micro batches or ep degrees)"),
    # Overlap fractions.
    Constant("tp_overlap_hidden", "calibration", 0.0, 0.995, 0.7, "exposed", "a run with tp > 1 and tp_comm_overlap"),
    Constant("a2a_overlap_hidden", "calibration", 0.0, 0.995, 0.7, "exposed", "a run with ep > 1 and moe_a2a_overlap"),
    Constant("dp_overlap_window", "calibration", 0.0, 0.995, 0.7, "exposed", "a run with dp > 1 whose overlapped "
             "gradient reduction is partly exposed"),
    # Effective collective bandwidth per level: inside the NVLink domain (TP, EP, DP inside a node) and across it.
    Constant("nvlink_bus_efficiency", "gpu", 0.05, 1.2, 0.3, "log",
             "a run whose communication inside the NVLink domain is exposed (tp, ep or dp > 1 within a node)"),
    Constant("network_bus_efficiency", "gpu", 0.05, 1.0, 0.3, "log",
             "a run whose dp, ep or pp groups span nodes and whose communication there is exposed"),
)

BY_NAME = {c.name: c for c in CONSTANTS}
