"""Reading saved results: a plan (`plan --out DIR`'s plan.json), the object of `plan --json` (its best plan, the
runners-up and the baseline) or of `estimate --json` (an estimate and its strategy, without the model)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from pydantic import ValidationError

from autoplan.errors import InputError
from autoplan.results import Estimate, Plan
from autoplan.strategy import Strategy


@dataclass(frozen=True)
class Saved:
    """One saved result. `plan` is None for an estimate file, which holds no model, cluster or workload."""

    name: str
    estimate: Estimate
    strategy: Strategy
    plan: Optional[Plan] = None
    runners_up: List[Plan] = field(default_factory=list)
    baseline: Optional[Plan] = None
    search: Optional[dict] = None


def load_saved(path: str) -> Saved:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path} does not exist; pass a plan.json (plan --out DIR), or the output of plan --json "
                         f"or estimate --json saved to a file")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path} is not JSON ({str(e).splitlines()[0]}); pass a plan.json or a saved --json output")
    if not isinstance(data, dict):
        raise InputError(f"{path} holds a JSON {type(data).__name__}; expected a plan or estimate object")
    try:
        return _parse(p.name, data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise InputError(f"{path}: {where}: {err['msg']} (a plan.json, plan --json or estimate --json object)"
                         ) from None


def _parse(name: str, data: dict) -> Saved:
    if "plans" in data:  # plan --json
        if not data["plans"]:
            raise InputError(f"{name} holds no plan (the search found none: {data.get('error', 'no error given')})")
        plans = [_plan(data, entry) for entry in data["plans"]]
        base = _plan(data, data["baseline"]) if data.get("baseline") else None
        return Saved(name, plans[0].estimate, plans[0].strategy, plans[0], plans[1:], base, data.get("search"))
    if {"model", "cluster", "workload", "strategy", "estimate"} <= set(data):  # plan.json
        plan = Plan.model_validate(data)
        return Saved(name, plan.estimate, plan.strategy, plan)
    if "step_time_s" in data and "strategy" in data:  # estimate --json
        est = Estimate.model_validate({k: v for k, v in data.items() if k != "strategy"})
        return Saved(name, est, Strategy.model_validate(data["strategy"]))
    raise InputError(f"{name} is neither a plan (model, cluster, workload, strategy, estimate), the output of plan "
                     f"--json (plans) nor of estimate --json (step_time_s, strategy)")


def _plan(data: dict, entry: dict) -> Plan:
    cluster = dict(data["cluster"])
    if entry.get("num_gpus"):
        cluster["num_gpus"] = entry["num_gpus"]
    return Plan.model_validate({"model": data["model"], "cluster": cluster, "workload": data["workload"],
                                "strategy": entry["strategy"], "estimate": entry["estimate"]})
