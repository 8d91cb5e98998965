"""The profiling run: build each layer shard over the (dtype, kind, tp, ep) grid, time it over (mbs, seq), time the
GEMM table, and assemble a `MeasuredProfile`."""
from __future__ import annotations

import datetime
import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch

from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.profiler.fp8 import SUPPORTED_DTYPES, Precision, fp8_unavailable_reason, precision_for
from autoplan.profiler.gemm import gemm_table, strategy_gemm_shapes
from autoplan.profiler.layers import build_layer, layer_kinds
from autoplan.profiler.schema import DeviceInfo, GemmTiming, LayerTiming, MeasuredProfile
from autoplan.profiler.shards import check_ep, check_tp
from autoplan.profiler.timing import LayerMeasurement, measure_points, warm_up

Advance = Callable[[str], None]


@dataclass(frozen=True)
class ProfileRequest:
    """What to measure. Degrees and shapes are the grid's axes; repeats are timed after `warmup` untimed runs."""

    model: ModelSpec
    tps: Tuple[int, ...] = (1,)
    eps: Tuple[int, ...] = (1,)
    mbss: Tuple[int, ...] = (1,)
    seqs: Tuple[int, ...] = (4096,)
    dtypes: Tuple[str, ...] = ("bf16",)
    device: str = "cpu"
    warmup: int = 2
    repeats: int = 5
    kinds: Optional[Tuple[str, ...]] = None  # None = every kind the model has
    gemms: bool = True
    gpu_id: Optional[str] = None
    threads: Optional[int] = None  # torch intra-op threads during the run; None = torch's default
    min_repeat_s: Optional[float] = None  # each repeat averages iterations lasting >= this; None: 10 ms on CPU, 0 GPU

    def repeat_floor_s(self) -> float:
        """Seconds one repeat lasts at least: CPU timings of sub-ms layers need several iterations per repeat;
        GPU events time one kernel sequence exactly."""
        if self.min_repeat_s is not None:
            return self.min_repeat_s
        return 0.01 if self.device == "cpu" else 0.0

    def check(self) -> None:
        """One-line InputError for a bad request (before anything is built)."""
        for tp in self.tps:
            check_tp(self.model, tp)
        for ep in self.eps:
            check_ep(self.model, ep)
        for name in self.dtypes:
            if name not in SUPPORTED_DTYPES:
                raise InputError(f"dtype {name!r} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}")
        if self.threads is not None and self.threads < 1:
            raise InputError(f"threads={self.threads} must be >= 1 (or left unset for torch's default)")
        if self.repeats < 1 or self.warmup < 0:
            raise InputError(f"repeats={self.repeats} must be >= 1 and warmup={self.warmup} >= 0")
        if self.min_repeat_s is not None and not 0 <= self.min_repeat_s <= 10:
            raise InputError(f"min_repeat_s={self.min_repeat_s} must be between 0 and 10 seconds")
        if self.device not in ("cpu", "cuda"):
            raise InputError(f"device {self.device!r} is not supported; use cpu or cuda")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise InputError("device=cuda but torch sees no CUDA device; use --device cpu")
        too_long = [s for s in self.seqs if s > self.model.max_position_embeddings]
        if too_long:
            raise InputError(f"seq={too_long[0]} exceeds max_position_embeddings="
                             f"{self.model.max_position_embeddings} of {self.model.name}; use a shorter --seq")
        unknown = set(self.kinds or ()) - set(layer_kinds(self.model))
        if unknown:
            raise InputError(f"layer kind {sorted(unknown)[0]!r} is not in {self.model.name}; "
                             f"valid kinds: {', '.join(layer_kinds(self.model))}")

    def grid(self) -> List[Tuple[str, int, int]]:
        """(kind, tp, ep) of every layer shard to build; ep varies only for MoE."""
        kinds = self.kinds or layer_kinds(self.model)
        return [(kind, tp, ep) for kind in kinds for tp in self.tps for ep in (self.eps if kind == "moe" else (1,))]


def default_gpu_id(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA A100-SXM4-80GB' -> 'a100': the first token after the vendor."""
    words = name.lower().replace("nvidia", "").replace("-", " ").split()
    return words[0] if words else "unknown"


def _driver_version() -> Optional[str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _cpu_model() -> Optional[str]:
    """The 'model name' line of /proc/cpuinfo (Linux), else None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def device_info(device: torch.device, gpu_id: Optional[str]) -> DeviceInfo:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return DeviceInfo(kind="cuda", name=name, gpu_id=gpu_id or default_gpu_id(name),
                          torch_version=torch.__version__, cuda_version=torch.version.cuda,
                          driver_version=_driver_version(), cpu_threads=torch.get_num_threads())
    name = _cpu_model() or platform.processor() or platform.machine() or "cpu"
    return DeviceInfo(kind="cpu", name=name, gpu_id=gpu_id or "cpu", torch_version=torch.__version__,
                      cuda_version=torch.version.cuda, driver_version=None, cpu_threads=torch.get_num_threads())


def _entries(kind: str, tp: int, ep: int, mbs: int, seq: int, dtype: str, m: LayerMeasurement) -> List[LayerTiming]:
    out = []
    for pass_, samples in (("fwd", m.fwd), ("bwd", m.bwd)):
        out.append(LayerTiming(kind=kind, pass_=pass_, tp=tp, ep=ep, mbs=mbs, seq=seq, dtype=dtype,
                               median_s=samples.median, min_s=min(samples.raw), max_s=max(samples.raw),
                               repeats=len(samples.raw), raw_s=samples.raw, activation_bytes=m.activation_bytes,
                               weight_bytes=m.weight_bytes, peak_bytes=m.peak_bytes))
    return out


def profile_shard(req: ProfileRequest, prec: Precision, device: torch.device, kind: str, tp: int, ep: int,
                  advance: Advance, notes: List[str]) -> List[LayerTiming]:
    """All (mbs, seq) points of one layer shard, timed in interleaved rounds. A point whose warm-up runs out of
    GPU memory is skipped with a note."""
    torch.manual_seed(0)
    layer = build_layer(req.model, kind, tp, ep, prec.linear).to(device=device, dtype=prec.param_dtype)
    inputs_by_point = {}
    for mbs in req.mbss:
        for seq in req.seqs:
            try:
                inputs = layer.make_inputs(mbs, seq, device, prec.param_dtype)
                warm_up(layer, inputs, max(req.warmup, 1), prec.autocast)
            except torch.cuda.OutOfMemoryError:
                notes.append(f"{prec.name} {kind} tp={tp} ep={ep} mbs={mbs} seq={seq}: out of GPU memory; skipped")
                inputs = None
                torch.cuda.empty_cache()
            if inputs is not None:
                inputs_by_point[(mbs, seq)] = inputs
            else:
                advance(f"{prec.name} {kind} tp={tp} ep={ep} mbs={mbs} seq={seq}")
    measured = measure_points(layer, inputs_by_point, device, 0, req.repeats, prec.autocast,
                              min_repeat_s=req.repeat_floor_s())
    rows: List[LayerTiming] = []
    for (mbs, seq), m in measured.items():
        rows.extend(_entries(kind, tp, ep, mbs, seq, prec.name, m))
        advance(f"{prec.name} {kind} tp={tp} ep={ep} mbs={mbs} seq={seq}")
    return rows


def count_steps(req: ProfileRequest) -> int:
    """Progress steps: one per layer point and one per GEMM shape and dtype."""
    points = len(req.grid()) * len(req.mbss) * len(req.seqs) * len(req.dtypes)
    gemms = len(gemm_shapes(req)) * sum(d != "fp8" for d in req.dtypes) if req.gemms else 0
    return points + gemms


def gemm_shapes(req: ProfileRequest):
    eps = req.eps if req.model.is_moe else (1,)
    return strategy_gemm_shapes(req.model, req.tps, eps, req.mbss, req.seqs)


def run_profile(req: ProfileRequest, advance: Advance = lambda label: None) -> MeasuredProfile:
    """Measure the grid and return the profile. FP8 without Transformer Engine or an FP8 GPU is skipped with a
    note (see `MeasuredProfile.notes`)."""
    req.check()
    previous_threads = torch.get_num_threads()
    if req.threads:
        torch.set_num_threads(req.threads)
    try:
        return _run(req, advance)
    finally:
        torch.set_num_threads(previous_threads)


def _run(req: ProfileRequest, advance: Advance) -> MeasuredProfile:
    device = torch.device(req.device)
    notes: List[str] = []
    layers: List[LayerTiming] = []
    gemms: List[GemmTiming] = []
    for name in req.dtypes:
        reason = fp8_unavailable_reason(device) if name == "fp8" else None
        if reason:
            notes.append(reason)
            continue
        prec = precision_for(name, device)
        if name == "fp8":
            notes.append("fp8: projections use Transformer Engine Linear; SDPA and grouped expert GEMMs stay bf16; "
                         "the GEMM table is bf16 only (torch.matmul has no fp8 path)")
        for kind, tp, ep in req.grid():
            layers.extend(profile_shard(req, prec, device, kind, tp, ep, advance, notes))
        if req.gemms and name != "fp8":
            gemms.extend(gemm_table(gemm_shapes(req), name, prec.param_dtype, device, req.warmup, req.repeats,
                                    lambda: advance(f"{name} gemm")))
    return MeasuredProfile(created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           device=device_info(device, req.gpu_id), model=req.model, warmup=max(req.warmup, 1),
                           layers=tuple(layers), gemms=tuple(gemms), notes=tuple(notes))
