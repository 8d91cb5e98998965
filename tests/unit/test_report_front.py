"""The trade-off front of the report: priced candidates of the search space, sampled without losing the front."""
from __future__ import annotations

from autoplan.cluster import ClusterSpec
from autoplan.clusterio import load_gpu
from autoplan.modelio import load_model
from autoplan.report.build import front_points
from autoplan.report.charts import pareto
from autoplan.solvers.api import solve
from autoplan.solvers.space import Problem
from autoplan.workload import Workload


def _problem() -> Problem:
    return Problem(load_model("llama3-8b"), ClusterSpec(gpu=load_gpu("h100"), num_gpus=16),
                   Workload(seq_len=4096, global_batch_size=32))


def _flat(points):
    return [p for pts in points.values() for p in pts]


def test_sampling_keeps_every_point_of_the_front():
    everything = _flat(front_points(_problem(), limit=10**9))
    sampled = _flat(front_points(_problem(), limit=50))
    full_front = {(p["label"], p["peak_gib"]) for p in pareto(everything)}
    assert full_front <= {(p["label"], p["peak_gib"]) for p in sampled}
    assert len(sampled) <= 50 + len(full_front) < len(everything)


def test_the_winner_is_on_the_front_of_what_fits():
    problem = _problem()
    best = solve(problem, "enumerate", top_k=1).plans[0].estimate
    cap = best.capacity_gib
    fits = [p for p in _flat(front_points(problem, limit=10**9)) if p["peak_gib"] <= cap]
    assert max(p["tokens_per_s_per_gpu"] for p in fits) == max(best.tokens_per_s_per_gpu,
                                                               *(p["tokens_per_s_per_gpu"] for p in fits))
    assert any(abs(p["tokens_per_s_per_gpu"] - best.tokens_per_s_per_gpu) < 1e-6 * best.tokens_per_s_per_gpu
               for p in pareto(fits))


def test_pareto_keeps_only_undominated_points():
    pts = [{"peak_gib": m, "tokens_per_s_per_gpu": t, "label": f"{m}/{t}"}
           for m, t in [(10, 100), (20, 90), (20, 150), (30, 150), (40, 200), (5, 50)]]
    assert [p["label"] for p in pareto(pts)] == ["5/50", "10/100", "20/150", "40/200"]
