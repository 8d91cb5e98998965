"""Probe a plan: write its `--probe` launch files, train a few iterations for real, and measure.

`run_probe(plan, engine=...)` emits the engine files into a folder, launches the training program with the chosen
launcher (local ranks, torchrun or Slurm), parses the log and returns a `ProbeResult`: ok, oom, failed (with the
line that says why) or hung (killed on timeout, the whole process group). The step time is the median over the
iterations after the warm-up ones; tokens/s follow from the workload.

Before the timed launch, a program may name a preparation step (`ProbeProgram.prepare_args`): for DeepSpeed,
`integrations/ds_ops.py` builds or loads the JIT ops the ranks will load, under its own deadline (`build_timeout_s`),
so that a first-use op build never counts as a hang and is never killed by the probe timeout. A stale build lock
raises `ProbeFailure` with the one-line fix (every later probe would wait on it); a build that does not finish
in time, or fails, makes the probe "failed" with the reason. After any launch that was killed, the build locks it
left (created during the launch, no builder alive) are removed. Unless $TORCH_EXTENSIONS_DIR is set, the preparation
and the ranks build in a folder of this Python environment's own (`extlocks.environment_root`), so that another
environment on the host cannot rebuild the ops under the probe. probe_result.json is written atomically.

Testing hook: `AUTOPLAN_FAULT=fail|oom|hang` in the environment of a DeepSpeed probe makes `ds_train.py` fail, run
out of memory or hang on purpose (`autoplan tune` sets it per trial from `AUTOPLAN_TUNE_FAULTS`); it exists to test failure handling.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from autoplan import fileio
from autoplan.errors import InputError, ProbeFailure
from autoplan.keys import ENGINES, Engine
from autoplan.integrations import extlocks
from autoplan.integrations.launchers import LaunchOutcome, LaunchRequest, LauncherName, launch, run_group
from autoplan.integrations.logparse import LogFormat, ParsedLog, parse_log
from autoplan.results import Plan

ProbeStatus = Literal["ok", "oom", "failed", "hung"]
DEFAULT_ITERS = 10
DEFAULT_WARMUP = 2
DEFAULT_TIMEOUT_S = 600.0
# Op builds before the timed launch: one DeepSpeed op (deepspeed_shm_comm) took 181-300 s on a 2-core host at load
# average 7.7-11 (README "Probes: op builds, stale locks, interrupts"); 1800 s bounds a few such builds on a busy
# machine and still ends a stuck one.
DEFAULT_BUILD_TIMEOUT_S = 1800.0
FAULT_ENV = "AUTOPLAN_FAULT"


class ProbeResult(BaseModel):
    """What one short real training run of a plan measured, next to what the cost model predicted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: ProbeStatus = Field(description="ok, oom (out of device memory), failed (error) or hung (timed out).")
    error: Optional[str] = Field(None, description="The log line (or exit status) that explains a non-ok status.")
    engine: Engine = Field(description="Training engine that ran the probe.")
    launcher: LauncherName = Field(description="How the ranks were started.")
    strategy_label: str = Field(description="Short label of the probed strategy.")
    world_size: int = Field(description="Ranks (devices) the probe ran on.")
    iterations_logged: int = Field(description="Iteration lines found in the log (all ranks).")
    warmup_iters: int = Field(description="Leading iterations left out of the median.")
    step_times_s: List[float] = Field(default_factory=list, description="Measured step times after warm-up, s.")
    step_time_s: Optional[float] = Field(None, description="Median measured step time after warm-up, s.")
    tokens_per_s: Optional[float] = Field(None, description="Measured training tokens per second, whole job.")
    tokens_per_s_per_gpu: Optional[float] = Field(None, description="Measured tokens per second per device.")
    peak_mem_gib_by_rank: Dict[int, float] = Field(
        default_factory=dict, description="Peak allocated device memory per rank where the engine reports it, GiB.")
    host_rss_peak_gib_by_rank: Dict[int, float] = Field(
        default_factory=dict, description="Peak resident host memory per rank where the program reports it, GiB.")
    predicted_step_time_s: float = Field(description="Cost-model step time, s.")
    predicted_tokens_per_s_per_gpu: float = Field(description="Cost-model tokens per second per device.")
    predicted_peak_mem_gib: float = Field(description="Cost-model peak memory over ranks, GiB.")
    step_time_ratio: Optional[float] = Field(None, description="measured / predicted step time; None unless ok.")
    log_path: str = Field(description="Log of all ranks.")
    out_dir: str = Field(description="Folder holding the emitted probe files.")
    wall_time_s: float = Field(description="Launch to exit (or kill), s.")
    command: List[str] = Field(description="Command line that was started.")
    build_time_s: Optional[float] = Field(
        None, description="Building or loading the engine's JIT ops before the timed launch, s (not in the "
                          "probe timeout); None when the program needs none.")

    @property
    def measured_peak_mem_gib(self) -> Optional[float]:
        return max(self.peak_mem_gib_by_rank.values()) if self.peak_mem_gib_by_rank else None


class ProbeProgram(BaseModel):
    """The training program a probe runs: script, arguments, environment and how to read its log."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    script: str = Field(description="Python script every rank runs.")
    args: List[str] = Field(default_factory=list, description="Its arguments.")
    env: Dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    log_format: LogFormat = Field(description="Parser for its log.")
    prepare_args: List[str] = Field(
        default_factory=list, description="Interpreter arguments of a step run once before the timed launch "
                                          "(builds the ops the ranks load); empty for none.")


def write_files(files: Dict[str, str], out_dir: Path) -> None:
    fileio.write_files({out_dir / name: text for name, text in files.items()},
                       executable=[out_dir / name for name in files if name.endswith(".sh")])


def megatron_program(plan: Plan, out_dir: Path, iters: int, megatron_lm: Optional[str] = None,
                     release: Optional[str] = None) -> ProbeProgram:
    """pretrain_gpt.py of a Megatron-LM checkout ($MEGATRON_LM) with the emitted megatron_args.txt, written for
    `release` (a megatron_releases.py tag; default DEFAULT_RELEASE)."""
    from autoplan.integrations.megatron_releases import DEFAULT_RELEASE
    from autoplan.integrations.megatron import emit_megatron, needs_max_connections_1

    root = megatron_lm or os.environ.get("MEGATRON_LM")
    if not root:
        raise InputError("a Megatron probe needs a Megatron-LM checkout: set MEGATRON_LM to the folder holding "
                         "pretrain_gpt.py")
    script = Path(root) / "pretrain_gpt.py"
    if not script.is_file():
        raise InputError(f"MEGATRON_LM={root!r} has no pretrain_gpt.py; point it at a Megatron-LM checkout")
    files = emit_megatron(plan, probe=True, probe_iters=iters, release=release or DEFAULT_RELEASE)
    write_files(files, out_dir)
    args: List[str] = []
    for line in files["megatron_args.txt"].splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            args += shlex.split(line)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if needs_max_connections_1(plan) else {}
    return ProbeProgram(script=str(script), args=args, env=env, log_format="megatron")


def deepspeed_program(plan: Plan, out_dir: Path, iters: int) -> ProbeProgram:
    """The emitted ds_train.py with the emitted ds_config.json and model.json (autoplan.integrations.deepspeed);
    the same arguments launch.sh passes, with --iters set to the probe's count."""
    from autoplan.integrations.deepspeed import emit_deepspeed
    from autoplan.integrations.ds_ops import prepare_args

    write_files(emit_deepspeed(plan, probe=True), out_dir)
    s = plan.strategy
    args = ["--deepspeed_config", str(out_dir / "ds_config.json"), "--model-json", str(out_dir / "model.json"),
            "--seq-len", str(plan.workload.seq_len), "--iters", str(iters)]
    if s.recompute != "none":
        args += ["--recompute", s.recompute]
    if s.recompute == "full":
        args += ["--recompute-method", s.recompute_method or "uniform", "--recompute-layers",
                 str(s.recompute_layers or 1)]
    return ProbeProgram(script=str(out_dir / "ds_train.py"), args=args, log_format="ds_train",
                        prepare_args=prepare_args(out_dir / "ds_config.json"))


def build_program(plan: Plan, engine: Engine, out_dir: Path, iters: int,
                  megatron_release: Optional[str] = None) -> ProbeProgram:
    if engine == "megatron":
        return megatron_program(plan, out_dir, iters, release=megatron_release)
    if engine == "deepspeed":
        return deepspeed_program(plan, out_dir, iters)
    raise InputError(f"unknown engine {engine!r}; valid engines: {', '.join(ENGINES)}")


def step_times_after_warmup(parsed: ParsedLog, warmup: int, global_batch: int,
                            tokens_per_gpu_step: Optional[float] = None) -> List[float]:
    """Per-iteration step time (slowest rank) for iterations > warmup, in iteration order, s. A rate per GPU
    (torchtitan's tps) needs the tokens one GPU's share of a step holds, seq x gbs / GPUs."""
    by_iter: Dict[int, float] = {}
    for rec in parsed.iterations:
        step = rec.step_time_s
        if step is None and rec.samples_per_s:
            step = global_batch / rec.samples_per_s  # DeepSpeed logs a rate over the whole batch
        if step is None and rec.tokens_per_s_per_gpu and tokens_per_gpu_step:
            step = tokens_per_gpu_step / rec.tokens_per_s_per_gpu
        if step is None or rec.iteration <= warmup:
            continue
        by_iter[rec.iteration] = max(by_iter.get(rec.iteration, 0.0), step)
    return [by_iter[k] for k in sorted(by_iter)]


def classify(outcome: LaunchOutcome, parsed: ParsedLog, step_times: List[float]) -> tuple[ProbeStatus, Optional[str]]:
    """Status and the line that explains it. OOM wins over a generic failure; a timeout is a hang."""
    if outcome.timed_out:
        return "hung", (f"timed out: no exit within the probe timeout; every rank's process group killed after "
                        f"{outcome.wall_time_s:.0f} s")
    if parsed.oom_line:
        return "oom", parsed.oom_line
    if outcome.returncode != 0:
        state = f" (Slurm state {outcome.job_state})" if outcome.job_state else ""
        return "failed", parsed.error_line or exit_reason(outcome.returncode) + state
    if not step_times:
        return "failed", "the run exited cleanly but logged no iteration after the warm-up ones"
    return "ok", None


def exit_reason(returncode: Optional[int]) -> str:
    """'exit status N', or the signal that ended a rank (SIGKILL is also how the kernel's OOM killer ends one)."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (the kernel's out-of-memory killer sends it; check host memory)" if name == "SIGKILL" else ""
        return f"a rank was killed by {name}{hint}"
    return f"exit status {returncode}"


def result_from_log(plan: Plan, engine: Engine, outcome: LaunchOutcome, log_format: LogFormat, warmup: int,
                    out_dir: Path) -> ProbeResult:
    """Build the ProbeResult of a finished launch from its log."""
    text = Path(outcome.log_path).read_text(errors="replace") if Path(outcome.log_path).exists() else ""
    parsed = parse_log(text, log_format)
    w = plan.workload
    steps = step_times_after_warmup(parsed, warmup, w.global_batch_size)
    status, error = classify(outcome, parsed, steps)
    median = statistics.median(steps) if status == "ok" else None
    tokens = w.tokens_per_step / median if median else None
    est = plan.estimate
    return ProbeResult(
        status=status, error=error, engine=engine, launcher=outcome.launcher, strategy_label=plan.strategy.label(),
        world_size=plan.cluster.num_gpus, iterations_logged=len(parsed.iterations), warmup_iters=warmup,
        step_times_s=steps if status == "ok" else [], step_time_s=median, tokens_per_s=tokens,
        tokens_per_s_per_gpu=tokens / plan.cluster.num_gpus if tokens else None,
        peak_mem_gib_by_rank=parsed.peak_mem_gib_by_rank(),
        host_rss_peak_gib_by_rank=parsed.peak_mem_gib_by_rank(host=True), predicted_step_time_s=est.step_time_s,
        predicted_tokens_per_s_per_gpu=est.tokens_per_s_per_gpu, predicted_peak_mem_gib=est.peak_mem_gib,
        step_time_ratio=median / est.step_time_s if median and est.step_time_s > 0 else None,
        log_path=outcome.log_path, out_dir=str(out_dir), wall_time_s=outcome.wall_time_s, command=outcome.command)


def check_iters(iters: int, warmup: int, timeout_s: float) -> None:
    if warmup < 0:
        raise InputError(f"--warmup={warmup} must be >= 0")
    if iters <= warmup:
        raise InputError(f"--iters={iters} must exceed --warmup={warmup} so that some iterations are measured; "
                         f"use --iters {warmup + 3} or more")
    if timeout_s <= 0:
        raise InputError(f"--timeout={timeout_s} must be > 0 seconds")


def run_probe(plan: Plan, *, engine: Engine, out_dir: Path, iters: int = DEFAULT_ITERS,
              warmup: int = DEFAULT_WARMUP, launcher: LauncherName = "torchrun",
              timeout_s: float = DEFAULT_TIMEOUT_S, fault: Optional[str] = None,
              program: Optional[ProbeProgram] = None, build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S,
              log: Callable[[str], None] = lambda s: None, megatron_release: Optional[str] = None) -> ProbeResult:
    """Emit, prepare the ops, launch, wait (or kill on timeout) and measure one plan. `fault` sets AUTOPLAN_FAULT
    (testing hook); `log` receives progress lines ("building op X"); `megatron_release` is the Megatron-LM release
    tag the Megatron files are written for."""
    check_iters(iters, warmup, timeout_s)
    if build_timeout_s <= 0:
        raise InputError(f"--build-timeout={build_timeout_s} must be > 0 seconds")
    out_dir = Path(out_dir).resolve()  # the ranks run inside it
    program = program or build_program(plan, engine, out_dir, iters, megatron_release)
    env = dict(program.env)
    if fault:
        env[FAULT_ENV] = fault
    prepare = program.prepare_args if launcher != "slurm" else []  # Slurm ranks build on their own nodes
    if prepare:  # the build folder the caller's environment names, else this Python environment's own
        env.update(extlocks.own_build_folder(os.environ, sys.executable))
    nodes = plan.cluster.num_nodes
    req = LaunchRequest(script=program.script, args=program.args, nproc_per_node=plan.cluster.num_gpus // nodes,
                        nnodes=nodes, env=env, cwd=str(out_dir),
                        gpus_per_node=0 if plan.cluster.gpu.id == "cpu" else plan.cluster.num_gpus // nodes)
    for stale in ("probe.log", "probe_result.json", "prepare.log"):
        (out_dir / stale).unlink(missing_ok=True)
    build_time_s = None
    if prepare:
        prepared = prepare_ops(req, prepare, out_dir / "prepare.log", build_timeout_s, log)
        if prepared.timed_out or prepared.returncode != 0:
            return _save(result_from_log(plan, engine, prepared, program.log_format, warmup, out_dir).model_copy(
                update={"status": "failed", "error": prepare_failure(prepared, build_timeout_s)}), out_dir)
        build_time_s = prepared.wall_time_s
    started = time.time()
    outcome = launch(launcher, req, out_dir / "probe.log", timeout_s)
    result = result_from_log(plan, engine, outcome, program.log_format, warmup, out_dir)
    if outcome.returncode != 0:
        removed = extlocks.clear_orphans(extlocks.extension_roots(_merged_env(req)), since=started)
        if removed:
            result = result.model_copy(update={"error": f"{result.error}; removed the op-build lock(s) it left: "
                                                        + ", ".join(map(str, removed))})
    fileio.write_text(out_dir / "plan.json", plan.model_dump_json(indent=2) + "\n")  # what `autoplan calibrate` reads
    return _save(result.model_copy(update={"build_time_s": build_time_s}), out_dir)


def _save(result: ProbeResult, out_dir: Path) -> ProbeResult:
    fileio.write_text(out_dir / "probe_result.json", json.dumps(result.model_dump(), indent=2) + "\n")
    return result


def _merged_env(req: LaunchRequest) -> Dict[str, str]:
    return {**os.environ, **req.env}


def prepare_ops(req: LaunchRequest, prepare_args: List[str], log_path: Path, build_timeout_s: float,
                log: Callable[[str], None]) -> LaunchOutcome:
    """Run the preparation step (one process, its own group, killed on `build_timeout_s`), relaying its progress.
    A stale build lock raises ProbeFailure with the fix; a killed build's lock is removed."""
    from autoplan.integrations.ds_ops import OP_PREFIX, STALE_LOCK_EXIT

    seen = [0]

    def relay() -> None:
        complete = log_path.read_text(errors="replace").split("\n")[:-1] if log_path.exists() else []
        for line in complete[seen[0]:]:
            if line.startswith(OP_PREFIX):
                log(_op_progress(json.loads(line[len(OP_PREFIX):])))
        seen[0] = len(complete)

    started = time.time()
    env = _merged_env(req)
    env.setdefault("PYTHONUNBUFFERED", "1")
    outcome = run_group([[req.python, *prepare_args]], [env], req.cwd, log_path, build_timeout_s, "local", relay)
    relay()
    if outcome.returncode == STALE_LOCK_EXIT:
        raise ProbeFailure(_last_op_record(log_path).get("message", "stale op-build lock"))
    if outcome.returncode != 0:
        extlocks.clear_orphans(extlocks.extension_roots(env), since=started)
    return outcome


def _op_progress(rec: Dict[str, object]) -> str:
    op, state = rec.get("op"), rec.get("state")
    if state == "loading":
        return f"op {op}: loading (built on first use; not counted in the probe timeout)"
    if state == "waiting":
        return f"op {op}: waiting for another process's build ({rec.get('lock')})"
    if state == "ready":
        return f"op {op}: ready after {rec.get('seconds')} s"
    return f"op {op}: {state}"


def _last_op_record(log_path: Path) -> Dict[str, object]:
    from autoplan.integrations.ds_ops import OP_PREFIX

    records = [json.loads(line[len(OP_PREFIX):]) for line in log_path.read_text(errors="replace").splitlines()
               if line.startswith(OP_PREFIX)] if log_path.exists() else []
    return records[-1] if records else {}


def prepare_failure(outcome: LaunchOutcome, build_timeout_s: float) -> str:
    """Why the op preparation did not finish: the op and the deadline, or its error line."""
    op = _last_op_record(Path(outcome.log_path)).get("op", "the engine's ops")
    if outcome.timed_out:
        return (f"building op {op} did not finish within --build-timeout={build_timeout_s:.0f} s (not a hang of "
                f"the probe); raise --build-timeout or pre-build the ops (DS_BUILD_OPS=1 pip install deepspeed); "
                f"log: {outcome.log_path}")
    text = Path(outcome.log_path).read_text(errors="replace") if Path(outcome.log_path).exists() else ""
    error = parse_log(text, "ds_train").error_line or exit_reason(outcome.returncode)
    return f"building op {op} failed: {error}; log: {outcome.log_path}"


def load_plan_file(path: Path) -> Plan:
    """A serialized Plan, or `autoplan plan --json` output (its first plan)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"plan file {str(path)!r} does not exist; write one with `autoplan plan ... --json`") from None
    except json.JSONDecodeError as e:
        raise InputError(f"plan file {str(path)!r} is not valid JSON ({e.msg} at line {e.lineno}); "
                         f"pass the output of `autoplan plan --json`") from None
    return plan_from_json(data, str(path))


def plan_from_json(data: object, where: str) -> Plan:
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object (a plan or `autoplan plan --json` output)")
    if "plans" in data:
        if not data["plans"]:
            raise InputError(f"{where}: 'plans' is empty; there is no plan to probe")
        first = data["plans"][0]
        data = {"model": data.get("model"), "cluster": data.get("cluster"), "workload": data.get("workload"),
                "strategy": first.get("strategy"), "estimate": first.get("estimate")}
    try:
        return Plan.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise InputError(f"{where}: {loc}: {err['msg']}; pass a plan written by `autoplan plan --json`") from None


