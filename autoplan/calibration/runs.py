"""Measured runs: what a calibration is fitted on, and the readers that build them.

A run is one training setup (model, cluster, sequence, batch, strategy, engine) with its measured step time and,
when known, its peak device memory. Sources:
- a runs table, `.csv` or `.json` (a list of objects, or `{"runs": [...]}`), one run per row with the columns
  `model` (catalogue name or config path), `cluster` (GPU id or cluster YAML), `gpus`, `seq`, `gbs`, `strategy`
  (the `estimate --strategy` string; keys it leaves out take the defaults, as the run's launch did), `step_time_s`, and optionally `peak_mem_gib` and `engine` (megatron or
  deepspeed; default megatron);
- a training log with its launch config: Megatron-LM (`training_log` / `report_memory` lines) with the Megatron
  arguments or launch script, DeepSpeed or `ds_train.py` with the ds_config (integrations/logparse.py parses the
  lines, integrations/importers.py reads the configs);
- a probe's `probe_result.json` (or its folder), with the `plan.json` that `run_probe` writes beside it.

Every bad run is one InputError naming it: the file, the row, and what to fix."""
from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from autoplan.cluster import ClusterSpec
from autoplan.errors import InputError
from autoplan.keys import ENGINES
from autoplan.model import ModelSpec
from autoplan.strategy import Strategy
from autoplan.workload import Workload

REQUIRED_COLUMNS = ("model", "cluster", "gpus", "seq", "gbs", "strategy", "step_time_s")
OPTIONAL_COLUMNS = ("peak_mem_gib", "engine")
# Two measurements of one setup further apart than this cannot both be right: run-to-run variation of a training
# step on a healthy cluster is a few percent (the probes' own step times after warm-up spread by less than 10%,
# tests/fixtures/logs/megatron_ling_v2_pretrain.log), so a 25% gap means one of the rows describes another setup.
REPEAT_TOLERANCE = 0.25
DEFAULT_WARMUP = 2  # leading logged iterations left out (integrations/probe.py DEFAULT_WARMUP)


@dataclass(frozen=True)
class MeasuredRun:
    """One measured training setup."""

    label: str  # names the run in messages and in the calibration file, e.g. 'runs.csv row 3'
    source: str  # the file it was read from
    model: ModelSpec
    cluster: ClusterSpec
    workload: Workload
    strategy: Strategy
    engine: str
    step_time_s: float
    peak_mem_gib: Optional[float] = None
    notes: tuple = ()

    def setup_key(self) -> tuple:
        return (self.model.name, self.cluster.gpu.id, self.cluster.num_gpus, self.workload.seq_len,
                self.workload.global_batch_size, self.engine, self.strategy.label(self.model.is_moe))


# ------------------------------------------------------------------------------------------ runs tables
def read_table(path: Path) -> List[MeasuredRun]:
    """The runs of a `.csv` or `.json` runs table."""
    rows = _table_rows(path)
    if not rows:
        raise InputError(f"runs table {path}: no rows; add one line per measured run with the columns "
                         f"{', '.join(REQUIRED_COLUMNS)}")
    return [_row_run(path, i, row) for i, row in enumerate(rows, start=1)]


def _table_rows(path: Path) -> List[Dict[str, Any]]:
    from autoplan.fileio import read_text

    text = read_text(path, "runs table", f"pass a .csv or .json table with the columns {', '.join(REQUIRED_COLUMNS)}")
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(f"runs table {path}: missing column(s) {', '.join(missing)}; the header must name "
                             f"{', '.join(REQUIRED_COLUMNS)} (optional: {', '.join(OPTIONAL_COLUMNS)})")
        return [dict(r) for r in reader]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"runs table {path}: not valid JSON ({e.msg} at line {e.lineno}); write a list of runs "
                         f"or {{\"runs\": [...]}}") from None
    if isinstance(data, dict) and "runs" in data:
        data = data["runs"]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise InputError(f"runs table {path}: expected a list of run objects or {{\"runs\": [...]}}")
    return data


def _row_run(path: Path, index: int, row: Dict[str, Any]) -> MeasuredRun:
    return run_of_row(f"{path.name} row {index}", str(path), row)


def run_of_row(label: str, source: str, row: Dict[str, Any]) -> MeasuredRun:
    """One runs-table row (the REQUIRED_COLUMNS, optionally OPTIONAL_COLUMNS) as a run; errors name `label`."""
    try:
        return _build_row(label, source, row)
    except InputError as e:
        raise InputError(f"{label}: {e}") from None


def _build_row(label: str, source: str, row: Dict[str, Any]) -> MeasuredRun:
    from autoplan.clusterio import load_cluster
    from autoplan.modelio import load_model
    from autoplan.strategy import parse_strategy_text

    unknown = sorted(set(row) - set(REQUIRED_COLUMNS) - set(OPTIONAL_COLUMNS) - {None})
    if unknown:
        raise InputError(f"unknown column {unknown[0]!r}; the columns are {', '.join(REQUIRED_COLUMNS)} "
                         f"(optional: {', '.join(OPTIONAL_COLUMNS)})")
    missing = [c for c in REQUIRED_COLUMNS if _blank(row.get(c))]
    if missing:
        raise InputError(f"column {missing[0]} is empty; every run needs {', '.join(REQUIRED_COLUMNS)}")
    engine = str(row.get("engine") or "megatron").strip().lower()
    if engine not in ENGINES:
        raise InputError(f"engine={engine!r} is unknown; use one of {', '.join(ENGINES)}")
    gpus, seq, gbs = (_whole(row, c) for c in ("gpus", "seq", "gbs"))
    step = _positive(row, "step_time_s")
    peak = None if _blank(row.get("peak_mem_gib")) else _positive(row, "peak_mem_gib")
    model = load_model(str(row["model"]).strip())
    cluster = load_cluster(str(row["cluster"]).strip(), gpus)
    workload = Workload(seq_len=seq, global_batch_size=gbs)
    strategy, notes = as_run(model, cluster, workload, parse_strategy_text(str(row["strategy"])), engine)
    return checked(MeasuredRun(label=label, source=source, model=model, cluster=cluster, workload=workload,
                               strategy=strategy, engine=engine, step_time_s=step, peak_mem_gib=peak,
                               notes=tuple(notes)))


def as_run(model: ModelSpec, cluster: ClusterSpec, workload: Workload, given: Dict[str, Any], engine: str):
    """(strategy, notes) of a measured run: the keys it states, the engine's defaults for the rest (never a searched
    choice: the run ran with whatever its launch left at the default), validated."""
    from autoplan.complete import default_completion
    from autoplan.strategy import CONTRACT_KEYS
    from autoplan.validate import validate

    strategy = validate(model, cluster, workload, default_completion(given), engine=engine)
    defaulted = [k for k in CONTRACT_KEYS if k not in given]
    notes = [f"defaults for the keys the run does not state: "
             f"{', '.join(f'{k}={getattr(strategy, k)}' for k in defaulted)}"] if defaulted else []
    return strategy, notes


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _number(row: Dict[str, Any], column: str) -> float:
    try:
        value = float(str(row[column]).strip())
    except ValueError:
        raise InputError(f"column {column}={row[column]!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(f"column {column}={row[column]!r} is not a finite number")
    return value


def _whole(row: Dict[str, Any], column: str) -> int:
    value = _number(row, column)
    if value <= 0 or value != int(value):
        raise InputError(f"column {column}={row[column]!r} must be a positive whole number")
    return int(value)


def _positive(row: Dict[str, Any], column: str) -> float:
    value = _number(row, column)
    if value <= 0:
        raise InputError(f"column {column}={row[column]!r} must be > 0")
    return value


def checked(run: MeasuredRun) -> MeasuredRun:
    """The run, or an InputError when its own numbers contradict each other."""
    capacity = run.cluster.gpu.hbm_gib
    if run.peak_mem_gib is not None and run.peak_mem_gib > capacity * 1.0001:
        raise InputError(f"peak_mem_gib={run.peak_mem_gib:g} exceeds the {capacity:g} GiB of one "
                         f"{run.cluster.gpu.id}; a run cannot peak above its device's memory (is the value in MiB, "
                         f"or the cluster wrong?)")
    return run


def check_repeats(runs: Sequence[MeasuredRun]) -> None:
    """Two runs of the same setup whose step times differ by more than REPEAT_TOLERANCE contradict each other."""
    first: Dict[tuple, MeasuredRun] = {}
    for run in runs:
        seen = first.setdefault(run.setup_key(), run)
        if seen is run:
            continue
        gap = abs(math.log(run.step_time_s / seen.step_time_s))
        if gap > math.log(1.0 + REPEAT_TOLERANCE):
            raise InputError(f"{run.label}: step_time_s={run.step_time_s:g} contradicts {seen.label} "
                             f"(step_time_s={seen.step_time_s:g}) for the same setup "
                             f"({run.strategy.label(run.model.is_moe)}); the two differ by more than "
                             f"{REPEAT_TOLERANCE:.0%}: fix or drop one of them")


# ------------------------------------------------------------------------------------------ logs
def detect_log_format(text: str) -> str:
    """ds_train, megatron or deepspeed, from the lines the log holds."""
    from autoplan.integrations.logparse import DS_TRAIN_TAG

    from autoplan.integrations.logparse import parse_torchtitan_log

    if DS_TRAIN_TAG in text:
        return "ds_train"
    if "elapsed time per iteration (ms)" in text:
        return "megatron"
    if "tps:" in text and parse_torchtitan_log(text).iterations:
        return "torchtitan"
    return "deepspeed"


@dataclass(frozen=True)
class LogConfig:
    """How to read a log's setup: its launch config plus what the config cannot say."""

    from_megatron: Optional[str] = None
    from_deepspeed: Optional[str] = None
    # A torchtitan run's layout as an `estimate --strategy` string or file: torchtitan's job configs are Python /
    # TOML this project does not import.
    from_torchtitan: Optional[str] = None
    model: Optional[str] = None  # DeepSpeed configs and torchtitan strategies hold no architecture
    cluster: str = "h100"
    gpus: Optional[int] = None
    seq: Optional[int] = None
    gbs: Optional[int] = None
    warmup: int = DEFAULT_WARMUP


def read_log(path: Path, cfg: LogConfig) -> MeasuredRun:
    """The run a training log measured, its setup read from the launch config in `cfg`."""
    from autoplan.integrations.logparse import parse_log

    # Not fileio.read_text: a long run's log may pass its size bound, and stray bytes (progress bars, other
    # processes' output) are replaced, not refused.
    text = path.read_text(encoding="utf-8", errors="replace")
    fmt = detect_log_format(text)
    label = path.name
    try:
        model, cluster, workload, given, engine, notes = _log_setup(fmt, cfg)
        parsed = parse_log(text, fmt)  # type: ignore[arg-type]
        if parsed.oom_line:
            raise InputError(f"the log records an out-of-memory error ({parsed.oom_line[:80]}); a run that "
                             f"failed cannot calibrate a step time: drop it")
        step = _median_step(parsed, cfg.warmup, workload, cluster.num_gpus, fmt)
        _check_ds_train(text, fmt, cluster, workload)
        strategy, chosen = as_run(model, cluster, workload, given, engine)
        peaks = parsed.peak_mem_gib_by_rank()
        run = MeasuredRun(label=label, source=str(path), model=model, cluster=cluster, workload=workload,
                          strategy=strategy, engine=engine, step_time_s=step,
                          peak_mem_gib=max(peaks.values()) if peaks else None, notes=tuple(notes + chosen))
        return checked(run)
    except InputError as e:
        raise InputError(f"{label}: {e}") from None


def _median_step(parsed, warmup: int, workload: Workload, gpus: int, fmt: str) -> float:
    from autoplan.integrations.probe import step_times_after_warmup

    if not parsed.iterations:
        engine = {"megatron": "Megatron-LM training_log", "ds_train": "ds_train.py AUTOPLAN_ITER",
                  "deepspeed": "DeepSpeed throughput-timer or pipeline-engine", "torchtitan": "torchtitan step"}[fmt]
        raise InputError(f"no {engine} iteration lines found; pass the training log of the run")
    steps = step_times_after_warmup(parsed, warmup, workload.global_batch_size, workload.tokens_per_step / gpus)
    if not steps:
        last = max(r.iteration for r in parsed.iterations)
        raise InputError(f"no iteration after the {warmup} warm-up ones (the log ends at iteration {last}); "
                         f"pass --warmup {max(last - 1, 0)} or a longer log")
    return float(statistics.median(steps))


def _check_ds_train(text: str, fmt: str, cluster: ClusterSpec, workload: Workload) -> None:
    """ds_train.py logs its world size and tokens per second: both must agree with the config the log is read with."""
    if fmt != "ds_train":
        return
    from autoplan.integrations.logparse import parse_ds_train_line

    for line in text.splitlines():
        obj = parse_ds_train_line(line)
        if obj is None:
            continue
        world = obj.get("world_size")
        if world is not None and int(world) != cluster.num_gpus:
            raise InputError(f"the log ran {world} ranks but the run is read as {cluster.num_gpus} GPUs; pass "
                             f"--gpus {world}")
        rate, elapsed = obj.get("tokens_per_s"), obj.get("elapsed_ms")
        if rate and elapsed:
            tokens = float(rate) * float(elapsed) / 1000.0
            if abs(tokens / workload.tokens_per_step - 1.0) > 0.01:  # the log rounds to 3 decimals
                raise InputError(f"the log trained {tokens:.0f} tokens per step but seq*gbs = "
                                 f"{workload.seq_len}*{workload.global_batch_size} = {workload.tokens_per_step}; "
                                 f"pass the --seq and --gbs the run used")
        return


def _log_setup(fmt: str, cfg: LogConfig):
    """(model, cluster, workload, strategy keys, engine, notes) of a log's run, from its launch config."""
    from autoplan.clusterio import load_cluster
    from autoplan.integrations import importers

    if fmt == "torchtitan":
        return _torchtitan_setup(cfg)
    if fmt == "megatron":
        if not cfg.from_megatron:
            raise InputError("a Megatron-LM log needs its launch config: pass --from-megatron ARGS|script")
        imp = importers.from_megatron_args(cfg.from_megatron)
        model, engine = imp.model, "megatron"
    else:
        if not cfg.from_deepspeed:
            raise InputError("a DeepSpeed log needs its config: pass --from-deepspeed ds_config.json with --model, "
                             "--gpus and --seq")
        if not cfg.model or not cfg.gpus or not cfg.seq:
            raise InputError("--from-deepspeed needs --model, --gpus and --seq (a DeepSpeed config holds no "
                             "architecture, world size or sequence length)")
        from autoplan.modelio import load_model

        model = load_model(cfg.model)
        imp = importers.from_deepspeed_config(cfg.from_deepspeed, model, cfg.gpus, seq_len=cfg.seq, gbs=cfg.gbs)
        engine = "deepspeed"
    world = cfg.gpus or imp.world_size
    if not world:
        raise InputError("the world size is not in the launch config; pass --gpus N")
    cluster = load_cluster(cfg.cluster, world)
    workload = imp.workload
    if cfg.seq or cfg.gbs:
        workload = Workload(seq_len=cfg.seq or workload.seq_len, global_batch_size=cfg.gbs or workload.global_batch_size)
    return model, cluster, workload, dict(imp.strategy), engine, list(imp.notes)


def _torchtitan_setup(cfg: LogConfig):
    """A torchtitan log's run: the layout from --from-torchtitan (an `estimate --strategy` string or file), the
    model, world size, sequence and batch from the flags. Priced under Megatron's rules with the layout as written
    (torchtitan's FSDP2 is zero=3); the engine's own kernels are what the calibration absorbs."""
    from autoplan.cli.common import read_strategy
    from autoplan.clusterio import load_cluster
    from autoplan.modelio import load_model

    if not cfg.from_torchtitan:
        raise InputError("a torchtitan log needs its layout: pass --from-torchtitan 'tp=..,pp=..,zero=3,...' (the "
                         "estimate --strategy keys the run used) with --model, --gpus, --seq and --gbs")
    lacking = [flag for flag, v in (("--model", cfg.model), ("--gpus", cfg.gpus), ("--seq", cfg.seq),
                                    ("--gbs", cfg.gbs)) if not v]
    if lacking:
        raise InputError(f"a torchtitan log needs {', '.join(lacking)} (its log line holds only tokens/s per GPU)")
    model = load_model(cfg.model)
    cluster = load_cluster(cfg.cluster, cfg.gpus)
    workload = Workload(seq_len=cfg.seq, global_batch_size=cfg.gbs)
    return model, cluster, workload, read_strategy(cfg.from_torchtitan), "megatron", \
        ["torchtitan run priced under Megatron's rules with its layout as written"]


# ------------------------------------------------------------------------------------------ probe results
def read_probe(path: Path) -> MeasuredRun:
    """A probe's result (`probe_result.json`, or the folder holding it) with the plan it probed (`plan.json`)."""
    from autoplan.integrations.probe import ProbeResult, load_plan_file

    result_path = path / "probe_result.json" if path.is_dir() else path
    label = str(result_path)
    plan_path = result_path.parent / "plan.json"
    if not plan_path.is_file():
        raise InputError(f"{label}: no plan.json beside it; a probe folder holds the plan it ran (re-run the probe, "
                         f"or list the run in a runs table)")
    try:
        from autoplan.fileio import read_text

        result = ProbeResult.model_validate_json(read_text(result_path, "probe result", "pass a probe's folder"))
    except ValueError as e:
        raise InputError(f"{label}: not a probe result ({str(e).splitlines()[0]})") from None
    if result.status != "ok" or not result.step_time_s:
        raise InputError(f"{label}: the probe's status is {result.status} ({result.error}); only an ok probe "
                         f"calibrates step time: drop it")
    plan = load_plan_file(plan_path)
    peak = result.measured_peak_mem_gib
    try:
        return checked(MeasuredRun(label=label, source=str(result_path), model=plan.model, cluster=plan.cluster,
                                   workload=plan.workload, strategy=plan.strategy, engine=result.engine,
                                   step_time_s=float(result.step_time_s), peak_mem_gib=peak))
    except InputError as e:
        raise InputError(f"{label}: {e}") from None


def is_probe_result(path: Path) -> bool:
    return (path.is_dir() and (path / "probe_result.json").is_file()) or path.name == "probe_result.json"
