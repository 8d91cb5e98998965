"""Parse training logs of Megatron-LM, DeepSpeed and `ds_train.py` into per-iteration timings, memory peaks and
the line that explains a failure.

Formats (each regex cites the engine code that prints the line):
- Megatron-LM `training_log` (megatron/training/training.py): `iteration N/ M | ... | elapsed time per iteration
  (ms): X | throughput per GPU (TFLOP/s/GPU): Y | ...`; `report_memory` (megatron/training/utils.py): `[Rank r]
  (after N iterations) memory (MB) | allocated: a | max allocated: b | reserved: c | max reserved: d` (older releases
  print it without the `[Rank r]` prefix).
- DeepSpeed `ThroughputTimer.stop` (deepspeed/utils/timer.py): `epoch=E/micro_step=M/global_step=G,
  RunningAvgSamplesPerSec=x, CurrSamplesPerSec=y, MemAllocated=aGB, MaxMemAllocated=bGB` (older: `E/S,
  SamplesPerSec=x, ...`); `PipelineEngine.train_batch` (deepspeed/runtime/pipe/engine.py): `steps: N loss: L ...
  iter time (s): T samples/sec: S`; `see_memory_usage` (deepspeed/runtime/utils.py): `MA x GB  Max_MA y GB  CA z GB
  Max_CA w GB`.
- `ds_train.py` (autoplan.integrations.ds_train): one JSON object per iteration, see `parse_ds_train_line`.
- torchtitan `MetricsProcessor.log` (torchtitan/components/metrics.py @ b5bcd76c): `step: {step:2}  loss:
  {loss:8.5f}  [grad_norm: {g:7.4f}  ]memory: {max_reserved_gib:5.2f}GiB({pct:.2f}%)  tps: {round(tps):,}  tflops:
  {tflops:,.2f}  mfu: {mfu:.2f}%` with ANSI colour codes between the fields (torchtitan/tools/utils.py `Color`);
  tps = tokens per second per device over the logging interval (`ntokens_since_last_log / (time_delta *
  non_data_parallel_size)`). The memory figure is the peak reserved by the caching allocator, not allocated, so it
  is not read as the peak.
- PyTorch out-of-memory errors: `torch.OutOfMemoryError` (torch >= 2.5), `torch.cuda.OutOfMemoryError` and the
  older `RuntimeError: CUDA out of memory`.
"""
from __future__ import annotations

import json
import re
from typing import Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

MIB_PER_GIB = 1024.0
LogFormat = Literal["megatron", "deepspeed", "ds_train", "torchtitan"]


class IterationRecord(BaseModel):
    """One logged training iteration (optimizer step), or the average over a logging interval."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    iteration: int = Field(description="Optimizer step number as the engine counts it (1-based).")
    step_time_s: Optional[float] = Field(None, description="Wall time of one step, s; None if only a rate is logged.")
    samples_per_s: Optional[float] = Field(None, description="Sequences per second, whole job, if logged.")
    tflops_per_gpu: Optional[float] = Field(None, description="Engine-reported TFLOP/s per GPU, if logged.")
    loss: Optional[float] = Field(None, description="Training loss of the step, if logged.")
    rank: Optional[int] = Field(None, description="Global rank that printed the line, if known.")
    tokens_per_s_per_gpu: Optional[float] = Field(None, description="Tokens per second per GPU over the logging "
                                                  "interval, if that is what is logged (torchtitan's tps).")


class MemoryRecord(BaseModel):
    """A device-memory report of one rank. GiB (2^30 bytes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: Optional[int] = Field(None, description="Global rank; None when the line does not say.")
    allocated_gib: Optional[float] = Field(None, description="Currently allocated by tensors, GiB.")
    max_allocated_gib: float = Field(description="Peak allocated by tensors so far, GiB.")
    reserved_gib: Optional[float] = Field(None, description="Held by the caching allocator, GiB.")
    max_reserved_gib: Optional[float] = Field(None, description="Peak held by the caching allocator, GiB.")


class ParsedLog(BaseModel):
    """What a log says about a run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: LogFormat = Field(description="Which parser read it.")
    iterations: List[IterationRecord] = Field(default_factory=list, description="Iteration lines in log order.")
    memory: List[MemoryRecord] = Field(default_factory=list, description="Memory reports in log order.")
    host_memory: List[MemoryRecord] = Field(default_factory=list,
                                            description="Host (CPU) peak resident memory reports, GiB.")
    oom_line: Optional[str] = Field(None, description="First out-of-memory error line, stripped.")
    error_line: Optional[str] = Field(None, description="Last exception line (`XxxError: ...`), stripped.")

    def peak_mem_gib_by_rank(self, host: bool = False) -> Dict[int, float]:
        """Highest max-allocated device memory (host RSS with host=True) per rank, GiB; reports without a rank
        count as rank 0."""
        peaks: Dict[int, float] = {}
        for rec in (self.host_memory if host else self.memory):
            rank = rec.rank if rec.rank is not None else 0
            peaks[rank] = max(peaks.get(rank, 0.0), rec.max_allocated_gib)
        return peaks


_NUM = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"

# megatron/training/training.py, training_log()
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*" + _NUM)
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUM)
_MEGATRON_LOSS = re.compile(r"\|\s*lm[ _]loss:\s*" + _NUM)
# megatron/training/utils.py, report_memory()
_MEGATRON_MEM = re.compile(
    r"(?:\[Rank (\d+)\]\s*)?\(?after \d+ iterations\)? memory \(MB\)\s*\|\s*allocated:\s*" + _NUM
    + r"\s*\|\s*max allocated:\s*" + _NUM + r"(?:\s*\|\s*reserved:\s*" + _NUM + r")?"
    + r"(?:\s*\|\s*max reserved:\s*" + _NUM + r")?")

# deepspeed/utils/timer.py, ThroughputTimer.stop(); the old form is 'E/S, SamplesPerSec=x'
_DS_TIMER = re.compile(r"(?:global_step=(\d+)|\d+/(\d+)),\s*(?:RunningAvg)?SamplesPerSec=" + _NUM
                       + r"(?:,\s*CurrSamplesPerSec=" + _NUM + r")?"
                       + r"(?:,\s*MemAllocated=" + _NUM + r"GB,\s*MaxMemAllocated=" + _NUM + r"GB)?")
# deepspeed/runtime/pipe/engine.py, PipelineEngine.train_batch()
_DS_PIPE = re.compile(r"steps:\s*(\d+)\s+loss:\s*" + _NUM + r".*?iter time \(s\):\s*" + _NUM
                      + r"\s+samples/sec:\s*" + _NUM)
# deepspeed/runtime/utils.py, see_memory_usage()
_DS_SEE_MEM = re.compile(r"MA\s+" + _NUM + r"\s*GB\s+Max_MA\s+" + _NUM + r"\s*GB\s+CA\s+" + _NUM
                         + r"\s*GB\s+Max_CA\s+" + _NUM + r"\s*GB")
# deepspeed/utils/logging.py prefixes distributed logs with '[Rank r]'
_RANK_PREFIX = re.compile(r"\[Rank (\d+)\]")

_OOM = re.compile(r"(torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError|OutOfMemoryError|"
                  r"CUDA out of memory|RuntimeError: CUDA error: out of memory)")
# Optional prefixes: torchrun's '[rank1]: ', srun's '3: ', logging's '[2024-..] [INFO]'.
_ERROR = re.compile(r"^\s*(?:\d+:\s+)?(?:\[[^\]]*\]:?\s*)*(?:[A-Za-z_][\w.]*(?:Error|Exception)|AssertionError|KeyboardInterrupt)"
                    r"(?::.*)?$")

DS_TRAIN_TAG = "AUTOPLAN_ITER"


def _f(text: Optional[str]) -> Optional[float]:
    return float(text) if text is not None else None


def _failure_lines(lines: List[str]) -> Dict[str, Optional[str]]:
    oom = next((ln.strip().strip('"') for ln in lines if _OOM.search(ln)), None)
    # torchrun's own ChildFailedError only says that a rank failed; the rank's exception is the cause.
    errors = [ln.strip() for ln in lines if _ERROR.match(ln) and "ChildFailedError" not in ln]
    return {"oom_line": oom, "error_line": errors[-1] if errors else None}


def parse_megatron_log(text: str) -> ParsedLog:
    """Iteration lines and memory reports of a Megatron-LM log."""
    lines = text.splitlines()
    iterations: List[IterationRecord] = []
    memory: List[MemoryRecord] = []
    for line in lines:
        m = _MEGATRON_ITER.search(line)
        if m:
            tflops = _MEGATRON_TFLOPS.search(line)
            loss = _MEGATRON_LOSS.search(line)
            iterations.append(IterationRecord(
                iteration=int(m.group(1)), step_time_s=float(m.group(2)) / 1000.0,
                tflops_per_gpu=_f(tflops.group(1)) if tflops else None, loss=_f(loss.group(1)) if loss else None))
            continue
        m = _MEGATRON_MEM.search(line)
        if m:
            rank, alloc, max_alloc, reserved, max_reserved = m.groups()
            memory.append(MemoryRecord(
                rank=int(rank) if rank is not None else None, allocated_gib=float(alloc) / MIB_PER_GIB,
                max_allocated_gib=float(max_alloc) / MIB_PER_GIB,
                reserved_gib=_f(reserved) / MIB_PER_GIB if reserved else None,
                max_reserved_gib=_f(max_reserved) / MIB_PER_GIB if max_reserved else None))
    return ParsedLog(format="megatron", iterations=iterations, memory=memory, **_failure_lines(lines))


def parse_deepspeed_log(text: str) -> ParsedLog:
    """Throughput-timer, pipeline-engine and see_memory_usage lines of a DeepSpeed log."""
    lines = text.splitlines()
    iterations: List[IterationRecord] = []
    memory: List[MemoryRecord] = []
    for line in lines:
        rank_match = _RANK_PREFIX.search(line)
        rank = int(rank_match.group(1)) if rank_match else None
        m = _DS_TIMER.search(line)
        if m:
            step = m.group(1) or m.group(2)
            running, current, alloc, max_alloc = m.group(3), m.group(4), m.group(5), m.group(6)
            iterations.append(IterationRecord(iteration=int(step), samples_per_s=float(current or running)))
            if max_alloc is not None:
                memory.append(MemoryRecord(rank=rank, allocated_gib=_f(alloc), max_allocated_gib=float(max_alloc)))
            continue
        m = _DS_PIPE.search(line)
        if m:
            iterations.append(IterationRecord(iteration=int(m.group(1)), loss=float(m.group(2)),
                                              step_time_s=float(m.group(3)), samples_per_s=float(m.group(4))))
            continue
        m = _DS_SEE_MEM.search(line)
        if m:
            alloc, max_alloc, reserved, max_reserved = (float(g) for g in m.groups())
            memory.append(MemoryRecord(rank=rank, allocated_gib=alloc, max_allocated_gib=max_alloc,
                                       reserved_gib=reserved, max_reserved_gib=max_reserved))
    return ParsedLog(format="deepspeed", iterations=iterations, memory=memory, **_failure_lines(lines))


def parse_ds_train_line(line: str) -> Optional[Dict]:
    """`AUTOPLAN_ITER {json}` -> the JSON object, or None for any other line (format: ds_train.py docstring)."""
    at = line.find(DS_TRAIN_TAG)
    if at < 0:
        return None
    try:
        obj = json.loads(line[at + len(DS_TRAIN_TAG):].strip())
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and "iteration" in obj and "elapsed_ms" in obj else None


def parse_ds_train_log(text: str) -> ParsedLog:
    """ds_train.py's `AUTOPLAN_ITER` lines (every rank prints one per iteration), plus DeepSpeed lines around them.

    Device memory comes from `device_mem_peak_gib` (null on CPU); host RSS is kept apart in `host_memory`."""
    base = parse_deepspeed_log(text)
    iterations: List[IterationRecord] = []
    memory: List[MemoryRecord] = []
    host: List[MemoryRecord] = []
    for line in text.splitlines():
        obj = parse_ds_train_line(line)
        if obj is None:
            continue
        rank = obj.get("rank")
        iterations.append(IterationRecord(
            iteration=int(obj["iteration"]), step_time_s=float(obj["elapsed_ms"]) / 1000.0, loss=obj.get("loss"),
            rank=rank))
        if obj.get("device_mem_peak_gib") is not None:
            memory.append(MemoryRecord(rank=rank, max_allocated_gib=float(obj["device_mem_peak_gib"])))
        if obj.get("host_rss_peak_gib") is not None:
            host.append(MemoryRecord(rank=rank, max_allocated_gib=float(obj["host_rss_peak_gib"])))
    return ParsedLog(format="ds_train", iterations=iterations, memory=memory + list(base.memory), host_memory=host,
                     oom_line=base.oom_line, error_line=base.error_line)


# torchtitan/components/metrics.py MetricsProcessor.log (see the module docstring); ANSI colours stripped first.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TITAN_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*" + _NUM + r"\s.*?memory:\s*" + _NUM + r"\s*GiB.*?tps:\s*([\d,]+)"
                         r"(?:\s+tflops:\s*([\d,]+(?:\.\d+)?))?")


def parse_torchtitan_log(text: str) -> ParsedLog:
    """The training `step:` lines of a torchtitan log (validation lines start `validate step:` and are skipped)."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    iterations: List[IterationRecord] = []
    for line in lines:
        m = _TITAN_STEP.search(line)
        if not m or "validate step:" in line:
            continue
        step, loss, _, tps, tflops = m.groups()
        iterations.append(IterationRecord(iteration=int(step), loss=float(loss),
                                          tokens_per_s_per_gpu=float(tps.replace(",", "")),
                                          tflops_per_gpu=float(tflops.replace(",", "")) if tflops else None))
    return ParsedLog(format="torchtitan", iterations=iterations, **_failure_lines(lines))


def parse_log(text: str, fmt: LogFormat) -> ParsedLog:
    """Dispatch on the log format."""
    parsers = {"megatron": parse_megatron_log, "deepspeed": parse_deepspeed_log, "ds_train": parse_ds_train_log,
               "torchtitan": parse_torchtitan_log}
    return parsers[fmt](text)
