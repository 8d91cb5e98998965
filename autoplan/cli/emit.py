"""`autoplan emit PLAN.json --format megatron|deepspeed --out DIR [--probe]`: write launch files for a plan.

PLAN.json is a serialized `Plan` or the output of `autoplan plan --json` (then plans[--index] is used)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import typer

from autoplan.errors import InputError
from autoplan.results import Plan

FORMATS = ("megatron", "deepspeed")


def register(app: typer.Typer) -> None:
    app.command("emit")(emit_cmd)


def emit_files(plan: Plan, fmt: str, probe: bool = False, train_script: Optional[str] = None) -> Dict[str, str]:
    """{filename: text} for one engine format."""
    if fmt == "megatron":
        from autoplan.integrations.megatron import emit_megatron

        return emit_megatron(plan, probe=probe)
    if fmt == "deepspeed":
        from autoplan.integrations.deepspeed import emit_deepspeed

        return emit_deepspeed(plan, probe=probe, train_script=train_script)
    raise InputError(f"unknown format {fmt!r}; valid formats: {', '.join(FORMATS)}")


def write_emitted(plan: Plan, formats: List[str], out_dir, probe: bool = False,
                  train_script: Optional[str] = None) -> List[Path]:
    """Write each format's files; with several formats each goes to its own subfolder (out_dir/megatron, ...)."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise InputError(f"unknown format {unknown[0] if unknown else ''!r}; valid formats: {', '.join(FORMATS)}")
    all_files = {fmt: emit_files(plan, fmt, probe, train_script) for fmt in formats}  # fail before writing
    written: List[Path] = []
    for fmt, files in all_files.items():
        folder = Path(out_dir) / fmt if len(formats) > 1 else Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = folder / name
            path.write_text(text)
            if name.endswith(".sh"):
                os.chmod(path, 0o755)
            written.append(path)
    return written


def emit_error(plan: Plan, fmt: str) -> Optional[str]:
    """Why `fmt`'s emitter refuses the plan (its one-line InputError), or None when it writes it."""
    try:
        emit_files(plan, fmt)
    except InputError as e:
        return str(e)
    return None


def write_search_emits(winner: Plan, formats: List[str], out_dir, engine_best: Callable[[str], Optional[Plan]],
                       probe: bool = False) -> Tuple[List[Path], List[str], List[str]]:
    """`plan --emit`: each format gets the search's winner when its engine runs it, else that engine's own best
    plan (`engine_best(fmt)`: the same search with --engine fmt). Returns (written paths, one line per format
    saying which plan it got, one line per format that got nothing). With several formats each goes to its own
    subfolder with the plan.json it was emitted from."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise InputError(f"unknown format {unknown[0] if unknown else ''!r}; valid formats: {', '.join(FORMATS)}")
    written: List[Path] = []
    said: List[str] = []
    missing: List[str] = []
    for fmt in formats:
        plan, why_not = winner, emit_error(winner, fmt)
        if why_not:
            plan = engine_best(fmt)
            if plan is None or emit_error(plan, fmt):
                missing.append(f"{fmt}: nothing written; the winner {winner.strategy.label()} is refused ({why_not}) "
                               f"and no plan {fmt} runs fits; try `autoplan plan --engine {fmt}`")
                continue
            said.append(f"{fmt}: its own best plan {plan.strategy.label()} ({plan.estimate.step_time_s:.3f} s/step), "
                        f"not the winner {winner.strategy.label()}: {why_not}")
        else:
            said.append(f"{fmt}: the winner {plan.strategy.label()}")
        folder = Path(out_dir) / fmt if len(formats) > 1 else Path(out_dir)
        written += write_emitted(plan, [fmt], folder, probe=probe)
        if len(formats) > 1:
            (folder / "plan.json").write_text(plan.model_dump_json(indent=2))
            written.append(folder / "plan.json")
    return written, said, missing


def load_plan(path: str, index: int = 0) -> Plan:
    """A Plan from a serialized Plan or from `autoplan plan --json` output (plans[index])."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"plan file {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise InputError(f"plan file {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    if isinstance(data, dict) and "plans" in data:
        data = _plan_from_search_output(data, index, path)
    from pydantic import ValidationError

    try:
        return Plan.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "plan"
        raise InputError(f"plan file {path}: {loc}: {err['msg']}") from None


def _plan_from_search_output(data: Dict[str, Any], index: int, path: str) -> Dict[str, Any]:
    plans = data["plans"]
    if not plans:
        raise InputError(f"plan file {path} holds no plans (the search found none feasible)")
    if not 0 <= index < len(plans):
        raise InputError(f"--index {index} is out of range; {path} holds plans 0..{len(plans) - 1}")
    missing = [k for k in ("model", "cluster", "workload") if k not in data]
    if missing:
        raise InputError(f"plan file {path} lacks {', '.join(missing)}; write it with `autoplan plan --json`")
    entry = plans[index]
    return {"model": data["model"], "cluster": data["cluster"], "workload": data["workload"],
            "strategy": entry["strategy"], "estimate": entry["estimate"]}


def emit_cmd(
    plan_file: str = typer.Argument(..., help="Plan JSON: a saved plan or `autoplan plan --json` output."),
    fmt: str = typer.Option(..., "--format", help="Engine: megatron or deepspeed (comma-separated for both)."),
    out: str = typer.Option(..., "--out", help="Folder to write the files into."),
    probe: bool = typer.Option(False, "--probe", help="A short measuring run: mock data, a few iterations."),
    index: int = typer.Option(0, "--index", help="Which plan of `autoplan plan --json` output (0 = best)."),
    train_script: Optional[str] = typer.Option(None, "--train-script",
                                               help="DeepSpeed: your training script instead of ds_train.py."),
) -> None:
    """Write ready-to-run Megatron-LM or DeepSpeed launch files for a plan."""
    plan = load_plan(plan_file, index)
    formats = [f.strip().lower() for f in fmt.split(",") if f.strip()]
    for path in write_emitted(plan, formats, out, probe=probe, train_script=train_script):
        print(path)
