"""The tuning space: every legal strategy of the Problem that the engine can run and that is predicted to fit,
and, apart, the ones pruned before any launch with the reason."""
from __future__ import annotations

from typing import List, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field

from autoplan.costmodel.estimate import estimate
from autoplan.errors import InputError
from autoplan.results import Estimate, Plan
from autoplan.solvers.space import Problem, legal_strategies
from autoplan.strategy import Strategy


class Candidate(BaseModel):
    """One strategy the tuner may probe, with the cost model's prediction."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(description="Stable id: the strategy's JSON (sorted keys); the Optuna parameter value.")
    strategy: Strategy = Field(description="The strategy.")
    estimate: Estimate = Field(description="Uncorrected cost-model prediction.")


class Pruned(BaseModel):
    """A legal strategy that is never launched, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str = Field(description="Strategy label.")
    reason: str = Field(description="Why it is not probed (engine cannot run it, predicted not to fit).")


def engine_reason(problem: Problem, plan: Plan) -> Optional[str]:
    """Why the engine's emitter refuses the plan (its own checks), or None."""
    try:
        if problem.engine == "deepspeed":
            from autoplan.integrations.deepspeed import check_deepspeed_plan

            check_deepspeed_plan(plan)
        else:
            from autoplan.integrations.megatron import check_megatron_plan

            check_megatron_plan(plan)
    except InputError as e:
        return str(e)
    return None


def fit_reason(est: Estimate, capacity_gib: float, memory_scale: float = 1.0) -> Optional[str]:
    """Why a plan is predicted not to fit (after the memory correction), or None."""
    peak = est.peak_mem_gib * memory_scale
    if not est.fits or peak > capacity_gib:
        scale = f" x memory correction {memory_scale:.2f}" if memory_scale != 1.0 else ""
        return f"predicted peak {peak:.2f} GiB{scale} exceeds the {capacity_gib:.2f} GiB usable per device"
    return None


def build_candidates(problem: Problem) -> Tuple[List[Candidate], List[Pruned]]:
    """Runnable candidates in the cost model's order (fastest predicted first) and the pruned ones."""
    runnable: List[Candidate] = []
    pruned: List[Pruned] = []
    for strategy in legal_strategies(problem):
        est = estimate(problem.model, problem.cluster, strategy, problem.workload, headroom=problem.mem_headroom,
                       engine=problem.engine, cal=problem.calibration)
        plan = Plan(model=problem.model, cluster=problem.cluster, workload=problem.workload, strategy=strategy,
                    estimate=est)
        reason = engine_reason(problem, plan) or fit_reason(est, capacity_gib(est))
        if reason:
            pruned.append(Pruned(label=strategy.label(), reason=reason))
        else:
            runnable.append(Candidate(key=strategy.key(), strategy=strategy, estimate=est))
    runnable.sort(key=lambda c: (c.estimate.step_time_s, c.key))
    return runnable, pruned


def capacity_gib(est: Estimate) -> float:
    """Usable device memory the estimate was judged against, GiB (falls back to the peak when unset)."""
    return est.capacity_gib if est.capacity_gib > 0 else est.peak_mem_gib


def plan_of(problem: Problem, cand: Candidate) -> Plan:
    return Plan(model=problem.model, cluster=problem.cluster, workload=problem.workload, strategy=cand.strategy,
                estimate=cand.estimate)
