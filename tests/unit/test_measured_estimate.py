"""Planning with a measured profile: the estimate uses the measured layer times the way the measurements say."""
from __future__ import annotations

import numpy as np
import pytest

from autoplan.clusterio import load_cluster
from autoplan.costmodel.estimate import estimate
from autoplan.costmodel.measured import find_profile
from autoplan.profiler.schema import MeasuredProfile
from autoplan.strategy import Strategy
from autoplan.workload import Workload

STRATEGY = Strategy(tp=2, mbs=2)
WORKLOAD = Workload(seq_len=256, global_batch_size=4)


@pytest.fixture(scope="module")
def shipped() -> MeasuredProfile:
    profile = find_profile("cpu", "tiny-llama")
    assert profile is not None, "profiles/measured/cpu-tiny-llama.json ships with the package"
    return profile


def scaled(profile: MeasuredProfile, kind: str, factor: float) -> MeasuredProfile:
    """The profile with every `kind` time multiplied by `factor`."""
    layers = tuple(e.model_copy(update=dict(median_s=e.median_s * factor, min_s=e.min_s * factor,
                                            max_s=e.max_s * factor)) if e.kind == kind else e
                   for e in profile.layers)
    return profile.model_copy(update=dict(layers=layers)).with_path("scaled.json")


def measured(profile: MeasuredProfile, kind: str) -> float:
    """fwd + bwd seconds of one `kind` layer at the test's (tp, mbs, seq), from the profile."""
    one = np.array([1.0])
    return sum(float(profile.layer_time(kind, p, one * STRATEGY.tp, one * STRATEGY.mbs, one * WORKLOAD.seq_len,
                                        "bf16")[0]) for p in ("fwd", "bwd"))


def test_measured_layers_replace_the_analytic_compute(shipped):
    cluster = load_cluster("cpu", num_gpus=2)
    model = shipped.model
    analytic = estimate(model, cluster, STRATEGY, WORKLOAD)
    with_profile = estimate(model, cluster, STRATEGY, WORKLOAD, profile=shipped)
    assert analytic.sources["compute"] == "analytic"
    assert with_profile.sources["compute"] == "measured:profiles/measured/cpu-tiny-llama.json"
    assert with_profile.time_breakdown["compute"] != pytest.approx(analytic.time_breakdown["compute"])


def test_doubling_the_measured_mlp_time_raises_compute_by_that_much(shipped):
    cluster = load_cluster("cpu", num_gpus=2)
    model = shipped.model
    base = estimate(model, cluster, STRATEGY, WORKLOAD, profile=shipped)
    doubled = estimate(model, cluster, STRATEGY, WORKLOAD, profile=scaled(shipped, "mlp", 2.0))
    # pp=1: every layer is on the one stage; each microbatch runs num_layers MLPs forward and backward.
    expected = base.num_microbatches * model.num_layers * measured(shipped, "mlp")
    got = doubled.time_breakdown["compute"] - base.time_breakdown["compute"]
    assert got == pytest.approx(expected, rel=1e-9)
    assert doubled.step_time_s - base.step_time_s == pytest.approx(expected, rel=1e-9)
    assert doubled.sources["compute"] == "measured:scaled.json"


def test_points_outside_the_profile_fall_back_to_analytic(shipped):
    cluster = load_cluster("cpu", num_gpus=2)
    model = shipped.model
    far = Workload(seq_len=2048, global_batch_size=2)  # 8x the longest profiled seq: NaN -> analytic
    analytic = estimate(model, cluster, Strategy(tp=2, mbs=1), far)
    with_profile = estimate(model, cluster, Strategy(tp=2, mbs=1), far, profile=shipped)
    assert with_profile.time_breakdown["compute"] == pytest.approx(analytic.time_breakdown["compute"])
