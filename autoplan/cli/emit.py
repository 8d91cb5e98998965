"""`autoplan emit PLAN.json --format megatron|deepspeed --out DIR [--probe]`: write launch files for a plan.

PLAN.json is a serialized `Plan` or the output of `autoplan plan --json` (then plans[--index] is used)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import typer

from autoplan.errors import InputError
from autoplan.integrations.megatron_releases import DEFAULT_RELEASE, RELEASES, release_tag
from autoplan.results import Plan

FORMATS = ("megatron", "deepspeed")
MEGATRON_VERSION_HELP = (f"Megatron-LM release the Megatron files are written and checked for: {', '.join(RELEASES)} "
                         f"(default {DEFAULT_RELEASE}; the number alone, e.g. 0.16, also works).")


def register(app: typer.Typer) -> None:
    app.command("emit")(emit_cmd)


def emit_files(plan: Plan, fmt: str, probe: bool = False, train_script: Optional[str] = None,
               megatron_version: Optional[str] = None) -> Dict[str, str]:
    """{filename: text} for one engine format; `megatron_version` (a release tag or number) picks the Megatron-LM
    release the files are checked against (default: integrations/megatron_releases.py DEFAULT_RELEASE)."""
    if fmt == "megatron":
        from autoplan.integrations.megatron import emit_megatron

        return emit_megatron(plan, probe=probe, release=release_tag(megatron_version or DEFAULT_RELEASE))
    if fmt == "deepspeed":
        from autoplan.integrations.deepspeed import emit_deepspeed

        return emit_deepspeed(plan, probe=probe, train_script=train_script)
    raise InputError(f"unknown format {fmt!r}; valid formats: {', '.join(FORMATS)}")


def parse_formats(text: str, option: str = "--format") -> List[str]:
    """'megatron,deepspeed' -> ['megatron', 'deepspeed']; an unknown or missing format is a one-line InputError."""
    formats = list(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    _check_formats(formats, option)
    return formats


def _check_formats(formats: List[str], option: str = "--format") -> None:
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise InputError(f"{option}: unknown format {unknown[0] if unknown else ''!r}; valid formats: "
                         f"{', '.join(FORMATS)} (comma-separated for several)")


def launch_options(engine: str, launcher: str, megatron_version: Optional[str]) -> Optional[str]:
    """`probe`'s and `tune`'s launch options checked: a known --launcher, and --megatron-version (a known release,
    only with --engine megatron). Returns the release tag, or None when none is given."""
    from autoplan.integrations.launchers import LAUNCHERS

    if launcher not in LAUNCHERS:
        raise InputError(f"--launcher {launcher!r} is unknown; valid launchers: {', '.join(LAUNCHERS)}")
    release = release_tag(megatron_version) if megatron_version is not None else None
    if release and engine != "megatron":
        raise InputError(f"--megatron-version {megatron_version} picks the release of Megatron-LM files; "
                         f"--engine {engine} writes none, drop it")
    return release


def emit_request(emit: Optional[str], out: Optional[str], megatron_version: Optional[str] = None) -> List[str]:
    """`plan --emit/--out/--megatron-version`, checked before the search: the formats (none without --emit).
    --emit writes files, so it needs --out; --out must be a folder; --megatron-version a known release, given only
    with Megatron files to write."""
    if out is not None:
        check_out_folder(out)
    if megatron_version is not None:
        release_tag(megatron_version)
        if "megatron" not in (parse_formats(emit, "--emit") if emit else []):
            raise InputError(f"--megatron-version {megatron_version} picks the release of emitted Megatron-LM files, "
                             f"but --emit has no megatron; add --emit megatron --out DIR or drop --megatron-version")
    if not emit:
        return []
    formats = parse_formats(emit, "--emit")
    if out is None:
        raise InputError(f"--emit {','.join(formats)} writes launch files but no --out folder is given; add --out DIR "
                         f"(e.g. --out plan-out)")
    return formats


def check_out_folder(out: str) -> None:
    """--out names a folder (it may not exist yet); an existing file there is a one-line InputError."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"--out {out} is a file, not a folder; pass a folder to write into")


def emitted_files(plan: Plan, formats: List[str], out_dir, probe: bool = False,
                  train_script: Optional[str] = None, megatron_version: Optional[str] = None) -> Dict[Path, str]:
    """{path: text} of each format's files; with several formats each goes to its own subfolder (out_dir/megatron,
    ...). Every emitter runs before anything is written, so a refusal writes nothing."""
    _check_formats(formats)
    files: Dict[Path, str] = {}
    for fmt in formats:
        folder = Path(out_dir) / fmt if len(formats) > 1 else Path(out_dir)
        files.update({folder / name: text
                      for name, text in emit_files(plan, fmt, probe, train_script, megatron_version).items()})
    return files


def write_all(files: Dict[Path, str]) -> List[Path]:
    """Write the files all or none (autoplan/fileio.py); shell scripts are made executable."""
    from autoplan.fileio import write_files

    return write_files(files, executable=[p for p in files if p.name.endswith(".sh")])


def write_emitted(plan: Plan, formats: List[str], out_dir, probe: bool = False,
                  train_script: Optional[str] = None, megatron_version: Optional[str] = None) -> List[Path]:
    """Write each format's files (see `emitted_files`), all or none."""
    return write_all(emitted_files(plan, formats, out_dir, probe, train_script, megatron_version))


def emit_error(plan: Plan, fmt: str, megatron_version: Optional[str] = None) -> Optional[str]:
    """Why `fmt`'s emitter refuses the plan (its one-line InputError), or None when it writes it."""
    try:
        emit_files(plan, fmt, megatron_version=megatron_version)
    except InputError as e:
        return str(e)
    return None


def emit_fixed(fmt: str) -> Dict[str, object]:
    """Strategy keys `fmt`'s emitted training files need fixed ({} when it writes every plan its engine runs)."""
    if fmt == "deepspeed":
        from autoplan.integrations.deepspeed import TRAINING_RUN_FIXED

        return dict(TRAINING_RUN_FIXED)
    return {}


def search_emit_files(winner: Plan, formats: List[str], out_dir, engine_best: Callable[[str], Optional[Plan]],
                      probe: bool = False, megatron_version: Optional[str] = None
                      ) -> Tuple[Dict[Path, str], List[str], List[str]]:
    """`plan --emit`: each format gets the search's winner when its engine runs it, else that engine's own best
    plan (`engine_best(fmt)`: the same search with --engine fmt and what its files need fixed). Returns ({path: text}
    to write, one line per format saying which plan it got, one line per format that got nothing). With several
    formats, or a plan other than the winner, each goes to its own subfolder with the plan.json it was emitted
    from. `megatron_version` is the Megatron-LM release the Megatron files are written and checked for."""
    _check_formats(formats, "--emit")
    files: Dict[Path, str] = {}
    said: List[str] = []
    missing: List[str] = []
    for fmt in formats:
        plan, why_not = winner, emit_error(winner, fmt, megatron_version)
        if why_not:
            plan = engine_best(fmt)
            if plan is None or emit_error(plan, fmt, megatron_version):
                missing.append(f"{fmt}: nothing written; the winner {winner.strategy.label()} is refused ({why_not}) "
                               f"and no plan {fmt} runs fits; try `autoplan plan --engine {fmt}`")
                continue
            said.append(f"{fmt}: its own best plan {plan.strategy.label()} ({plan.estimate.step_time_s:.3f} s/step), "
                        f"not the winner {winner.strategy.label()}: {why_not}")
        else:
            said.append(f"{fmt}: the winner {plan.strategy.label()}")
        # A format that got another plan than the winner goes to its own subfolder too, with that plan's plan.json:
        # --out's plan.json is the winner's.
        own = len(formats) > 1 or plan is not winner
        folder = Path(out_dir) / fmt if own else Path(out_dir)
        files.update(emitted_files(plan, [fmt], folder, probe=probe, megatron_version=megatron_version))
        if own:
            files[folder / "plan.json"] = plan.model_dump_json(indent=2)
    return files, said, missing


def load_plan(path: str, index: int = 0) -> Plan:
    """A Plan from a serialized Plan or from `autoplan plan --json` output (plans[index])."""
    from autoplan.fileio import read_text

    text = read_text(path, "plan file", "pass plan.json from `autoplan plan --out` or `autoplan plan --json` output")
    try:
        data = json.loads(text)
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
    if not isinstance(plans, list):
        raise InputError(f"plan file {path}: plans is a {type(plans).__name__}, not a list; write it with "
                         f"`autoplan plan --json`")
    if not plans:
        raise InputError(f"plan file {path} holds no plans (the search found none feasible)")
    if not 0 <= index < len(plans):
        raise InputError(f"--index {index} is out of range; {path} holds plans 0..{len(plans) - 1}")
    missing = [k for k in ("model", "cluster", "workload") if k not in data]
    if missing:
        raise InputError(f"plan file {path} lacks {', '.join(missing)}; write it with `autoplan plan --json`")
    entry = plans[index]
    if not isinstance(entry, dict) or not {"strategy", "estimate"} <= set(entry):
        raise InputError(f"plan file {path}: plans[{index}] lacks strategy or estimate; write it with "
                         f"`autoplan plan --json`")
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
    megatron_version: Optional[str] = typer.Option(None, "--megatron-version", help=MEGATRON_VERSION_HELP),
) -> None:
    """Write ready-to-run Megatron-LM or DeepSpeed launch files for a plan."""
    formats = parse_formats(fmt)
    check_out_folder(out)
    if megatron_version is not None:
        release_tag(megatron_version)  # a bad value is refused before the plan file is read
    plan = load_plan(plan_file, index)
    for path in write_emitted(plan, formats, out, probe=probe, train_script=train_script,
                              megatron_version=megatron_version):
        print(path)
