"""Collective benchmarks under torchrun (NCCL on GPU, gloo on CPU), reported as nccl-tests does, with an
alpha-beta fit per collective and GpuSpec overrides for the cost model.

Bandwidths follow nccl-tests `doc/PERFORMANCE.md`: algbw = size / time with `size` the per-rank buffer (for
all-gather the gathered output, for reduce-scatter the input); busbw = algbw x factor, factor 2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for send/recv. The fit is the Hockney model the
cost model uses (`autoplan.costmodel.collectives`): t = alpha + bus_bytes / beta, with alpha spread over the ring's
steps (2(n-1) for all-reduce, n-1 otherwise) to give the per-step latency of `GpuSpec.*_latency_us`."""
from __future__ import annotations

import datetime
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Literal, Optional, Tuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autoplan.errors import InputError

COMM_SCHEMA_VERSION = 1
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def ring_steps(op: str, n: int) -> float:
    """Latency steps of the ring/pairwise algorithm (as in autoplan.costmodel.collectives)."""
    if op == "all_reduce":
        return 2.0 * (n - 1)
    if op == "send_recv":
        return 1.0
    return float(n - 1)


class CommPoint(BaseModel):
    """One collective at one message size (times are the slowest rank's, per repeat)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: str = Field(description="Collective name.")
    size_bytes: int = Field(gt=0, description="Per-rank buffer, bytes (nccl-tests 'size').")
    median_s: float = Field(gt=0, description="Median over repeats of the slowest rank's time, s.")
    min_s: float = Field(gt=0, description="Fastest repeat, s.")
    max_s: float = Field(gt=0, description="Slowest repeat, s.")
    raw_s: Tuple[float, ...] = Field(description="Every repeat (max over ranks), s.")
    algbw_gbytes_per_s: float = Field(description="size / median, GB/s (10^9 B/s).")
    busbw_gbytes_per_s: float = Field(description="algbw x bus factor, GB/s.")


class CommFit(BaseModel):
    """Least-squares alpha-beta fit of one collective: t = alpha + bus_bytes / beta (relative residuals)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: str = Field(description="Collective name.")
    alpha_us: float = Field(ge=0, description="Fixed latency of one collective call, us.")
    step_latency_us: float = Field(ge=0, description="alpha / ring steps, us (GpuSpec *_latency_us).")
    busbw_gbytes_per_s: float = Field(gt=0, description="beta: asymptotic bus bandwidth, GB/s.")
    bandwidth_resolved: bool = Field(description="False when every size stayed latency-bound: busbw is then only "
                                                 "a lower bound (raise --max-size).")
    max_rel_error: float = Field(ge=0, description="Largest |fit - measured| / measured over the sizes.")


class CommProfile(BaseModel):
    """What `autoplan profile-comm` writes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = Field(COMM_SCHEMA_VERSION, description="Format version.")
    created: str = Field(description="ISO-8601 UTC time of the run.")
    backend: str = Field(description="torch.distributed backend: nccl or gloo.")
    device_name: str = Field(description="GPU name, or 'cpu'.")
    torch_version: str = Field(description="torch.__version__.")
    world_size: int = Field(gt=0, description="Ranks in the job.")
    local_world_size: int = Field(gt=0, description="Ranks per node.")
    level: Literal["nvlink", "network"] = Field(description="Which links the group spans.")
    points: Tuple[CommPoint, ...] = Field(description="Every op and size.")
    fits: Tuple[CommFit, ...] = Field(description="Alpha-beta fit per op.")
    gpu_overrides: Dict[str, float] = Field(description="GpuSpec fields to override (latency, bandwidth, "
                                                        "efficiency), from the all-reduce fit.")
    notes: Tuple[str, ...] = Field((), description="Skipped ops and caveats.")


def fit_alpha_beta(bus_bytes: np.ndarray, seconds: np.ndarray) -> Tuple[float, float, float, bool]:
    """(alpha s, beta B/s, max relative error, bandwidth resolved) of t = alpha + x / beta, minimising relative
    residuals with alpha >= 0 and 1/beta >= 0. When the sizes never leave the latency regime (the free fit's slope
    is not positive) the bandwidth is not resolved: beta is then the best measured x / t, a lower bound."""
    x, t = np.asarray(bus_bytes, float), np.asarray(seconds, float)
    a = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
    (alpha, slope), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    resolved = True
    if slope <= 0:  # latency only
        alpha, slope, resolved = float(np.sum(1 / t) / np.sum(1 / t**2)), 0.0, False
    elif alpha < 0:  # bandwidth only, through the origin
        alpha, slope = 0.0, float(np.sum(x / t) / np.sum((x / t) ** 2))
    fitted = alpha + x * slope
    beta = 1.0 / slope if resolved else float(np.max(x / t))
    return float(alpha), beta, float(np.max(np.abs(fitted - t) / t)), resolved


def fit_points(points: List[CommPoint], n: int) -> List[CommFit]:
    """One fit per op with 2+ sizes; none on a single rank (nothing crosses a link)."""
    if n < 2:
        return []
    fits = []
    for op in dict.fromkeys(p.op for p in points):
        rows = [p for p in points if p.op == op]
        if len(rows) < 2:
            continue
        x = np.array([p.size_bytes * bus_factor(op, n) for p in rows])
        alpha, beta, err, resolved = fit_alpha_beta(x, np.array([p.median_s for p in rows]))
        fits.append(CommFit(op=op, alpha_us=alpha * 1e6, step_latency_us=alpha * 1e6 / ring_steps(op, n),
                            busbw_gbytes_per_s=beta / 1e9, bandwidth_resolved=resolved, max_rel_error=err))
    return fits


def gpu_overrides(fits: List[CommFit], level: str, link_gbytes_per_s: Optional[float],
                  notes: List[str]) -> Dict[str, float]:
    """GpuSpec fields from the all-reduce fit (the ring collective the cost model's efficiencies describe)."""
    fit = next((f for f in fits if f.op == "all_reduce"), None)
    if fit is None:
        notes.append("no all_reduce fit: no GpuSpec overrides written")
        return {}
    out = {f"{level}_latency_us": fit.step_latency_us}
    if not fit.bandwidth_resolved:
        notes.append("all_reduce stayed latency-bound at every size: bandwidth not written; raise --max-size")
        return out
    if link_gbytes_per_s:
        out[f"{level}_bus_efficiency"] = fit.busbw_gbytes_per_s / link_gbytes_per_s
    elif level == "nvlink":
        # bandwidth x efficiency must equal the measured bus bandwidth: put it all in the bandwidth.
        out["nvlink_bandwidth_gbytes_per_s"] = fit.busbw_gbytes_per_s
        out["nvlink_bus_efficiency"] = 1.0
    else:
        notes.append("network level: pass --link-gbytes-per-s (per-GPU NIC rate) to derive network_bus_efficiency")
    return out


def message_sizes(min_bytes: int, max_bytes: int) -> List[int]:
    """Powers of two from min to max (nccl-tests -f 2)."""
    if min_bytes > max_bytes:
        raise InputError(f"--min-size={min_bytes} bytes must not exceed --max-size={max_bytes} bytes")
    sizes, s = [], 1 << max(0, (min_bytes - 1).bit_length())
    while s <= max_bytes:
        sizes.append(s)
        s *= 2
    return sizes or [max_bytes]


@dataclass(frozen=True)
class CommRequest:
    ops: Tuple[str, ...] = COLLECTIVES
    min_bytes: int = 1 << 10
    max_bytes: int = 1 << 30
    repeats: int = 10
    warmup: int = 3
    level: Optional[str] = None
    link_gbytes_per_s: Optional[float] = None
    backend: Optional[str] = None

    def check(self) -> None:
        unknown = [o for o in self.ops if o not in COLLECTIVES]
        if unknown:
            raise InputError(f"unknown collective {unknown[0]!r}; valid: {', '.join(COLLECTIVES)}")
        if self.level not in (None, "nvlink", "network"):
            raise InputError(f"--level {self.level!r} is not valid; use nvlink or network")
        if self.repeats < 1 or self.warmup < 0:
            raise InputError(f"repeats={self.repeats} must be >= 1 and warmup={self.warmup} >= 0")


def _all_gather(out, part):
    import torch.distributed as dist

    # all_gather_single replaces all_gather_into_tensor in newer torch; same semantics.
    return getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, part)


def _reduce_scatter(part, inp):
    import torch.distributed as dist

    return getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(part, inp)


def _collective(op: str, size: int, n: int, rank: int, device):
    """A zero-argument function that runs one `op` on a `size`-byte per-rank buffer (float32 elements)."""
    import torch
    import torch.distributed as dist

    elems = max(n, size // 4 // n * n)  # divisible by n for the sharded collectives
    if op == "all_reduce":
        buf = torch.ones(elems, device=device)
        return lambda: dist.all_reduce(buf)
    if op == "all_gather":
        out, part = torch.empty(elems, device=device), torch.ones(elems // n, device=device)
        return lambda: _all_gather(out, part)
    if op == "reduce_scatter":
        inp, part = torch.ones(elems, device=device), torch.empty(elems // n, device=device)
        return lambda: _reduce_scatter(part, inp)
    if op == "all_to_all":
        inp, out = torch.ones(elems, device=device), torch.empty(elems, device=device)
        return lambda: dist.all_to_all_single(out, inp)
    send, recv = torch.ones(elems, device=device), torch.empty(elems, device=device)

    def send_recv():
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    return send_recv


def time_collective(op: str, size: int, req: CommRequest, device) -> List[float]:
    """Each repeat's time on the slowest rank, s."""
    import torch
    import torch.distributed as dist

    from autoplan.profiler.timing import synchronize, time_call

    n, rank = dist.get_world_size(), dist.get_rank()
    fn = _collective(op, size, n, rank, device)
    for _ in range(req.warmup):
        fn()
    synchronize(device)
    raw = []
    for _ in range(req.repeats):
        dist.barrier()
        raw.append(time_call(fn, device)[0])
    times = torch.tensor(raw, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.cpu().tolist()


def _point(op: str, size: int, raw: List[float], n: int) -> CommPoint:
    median = statistics.median(raw)
    algbw = size / median / 1e9
    return CommPoint(op=op, size_bytes=size, median_s=median, min_s=min(raw), max_s=max(raw), raw_s=tuple(raw),
                     algbw_gbytes_per_s=algbw, busbw_gbytes_per_s=algbw * bus_factor(op, n))


def measure(req: CommRequest, device, backend: str) -> Tuple[List[CommPoint], List[str]]:
    """Run every op over every size; ops the backend lacks are skipped with a note."""
    import torch.distributed as dist

    n, notes, points = dist.get_world_size(), [], []
    for op in req.ops:
        if op == "send_recv" and n < 2:
            notes.append("send_recv needs 2 or more ranks; skipped")
            continue
        for size in message_sizes(req.min_bytes, req.max_bytes):
            try:
                raw = time_collective(op, size, req, device)
            except (RuntimeError, ValueError) as e:  # e.g. a collective gloo does not implement
                notes.append(f"{op} on {backend}: {str(e).splitlines()[0]}; skipped")
                break
            points.append(_point(op, size, raw, n))
    return points, notes


def write_comm_profile(profile: CommProfile, out: Path) -> None:
    """Write the profile as YAML (.yaml/.yml) or JSON, atomically (autoplan/fileio.py)."""
    from autoplan.fileio import write_text

    if out.suffix in (".yaml", ".yml"):
        import yaml

        write_text(out, yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False))
    else:
        write_text(out, profile.model_dump_json(indent=1) + "\n")


def run_comm_profile(req: CommRequest, out: Path) -> Optional[CommProfile]:
    """Initialise the process group from torchrun's environment, measure, fit; rank 0 writes `out` and returns
    the profile (other ranks return None)."""
    import torch
    import torch.distributed as dist

    req.check()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise InputError("profile-comm must run under torchrun (RANK/WORLD_SIZE unset); e.g. torchrun "
                         "--nproc-per-node 8 -m autoplan.cli.main profile-comm --out comm.json")
    backend = req.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    try:
        points, notes = measure(req, device, backend)
        n = dist.get_world_size()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(n)))
        level = req.level or ("nvlink" if local >= n else "network")
        fits = fit_points(points, n)
        overrides = gpu_overrides(fits, level, req.link_gbytes_per_s, notes)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        profile = CommProfile(created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              backend=backend, device_name=name, torch_version=torch.__version__, world_size=n,
                              local_world_size=local, level=level, points=tuple(points), fits=tuple(fits),
                              gpu_overrides=overrides, notes=tuple(notes))
        if dist.get_rank() == 0:
            write_comm_profile(profile, out)
            return profile
        return None
    finally:
        dist.barrier()
        dist.destroy_process_group()
