"""`autoplan profile` (per-layer times on this device) and `autoplan profile-comm` (collective bandwidth under
torchrun). Both need the torch extra; torch is imported only when a command runs."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import typer

from autoplan.cli.console import console, progress_console
from autoplan.errors import InputError


def parse_int_list(text: str, option: str) -> Tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); one-line InputError otherwise."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InputError(f"{option} takes comma-separated positive integers, got {text!r}; e.g. {option} 1,2,4") \
            from None
    if not values or min(values) <= 0:
        raise InputError(f"{option} takes comma-separated positive integers, got {text!r}; e.g. {option} 1,2,4")
    return tuple(dict.fromkeys(values))


def parse_size(text: str, option: str) -> int:
    """'64K', '1M', '1G' (powers of 1024) or plain bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = units.get(raw[-1:], 1)
    digits = raw[:-1] if raw[-1:] in units else raw
    try:
        value = int(digits) * scale
    except ValueError:
        raise InputError(f"{option} takes a size like 1K, 64M or 1G, got {text!r}") from None
    if value <= 0:
        raise InputError(f"{option} must be positive, got {text!r}")
    return value


def _require_torch() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InputError("profiling needs PyTorch, which is not installed; pip install 'autoplan[torch]'")


def profile_command(
    model: str = typer.Option(..., "--model", "-m", help="Catalogue name, config.json or model YAML."),
    tp: str = typer.Option("1", help="Tensor-parallel degrees whose shards to time, e.g. 1,2,4,8."),
    ep: str = typer.Option("1", help="Expert-parallel degrees (MoE layers only), e.g. 1,8."),
    mbs: str = typer.Option("1", help="Micro-batch sizes, e.g. 1,2,4."),
    seq: str = typer.Option("4096", help="Sequence lengths, e.g. 4096,8192."),
    dtype: str = typer.Option("bf16", help="bf16, fp16, fp32, fp8 (fp8 needs Transformer Engine and an FP8 GPU)."),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when torch sees a GPU, else cpu)."),
    repeats: int = typer.Option(10, help="Timed repeats per point (median reported, all kept)."),
    warmup: int = typer.Option(3, help="Untimed warm-up iterations per point."),
    kinds: Optional[str] = typer.Option(None, help="Layer kinds to time (default: all the model has)."),
    gemms: bool = typer.Option(True, help="Also time the GEMM table."),
    gpu_id: Optional[str] = typer.Option(None, help="GPU id to record (default: from the device name)."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads during the run (1 steadies CPU timings)."),
    min_repeat_ms: Optional[float] = typer.Option(
        None, help="Each repeat averages iterations lasting at least this long, ms (default: 10 on CPU, 0 on GPU)."),
    set_: List[str] = typer.Option([], "--set", help="Model override key=value (repeatable)."),
    out: Optional[Path] = typer.Option(None, help="Output JSON (default: profile-<gpu>-<model>.json)."),
) -> None:
    """Time each layer's TP/EP shard forward and backward on this device and write a measured profile."""
    _require_torch()
    import torch

    from autoplan.modelio import load_model
    from autoplan.profiler.run import ProfileRequest

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")

    req = ProfileRequest(
        model=load_model(model, set_), tps=parse_int_list(tp, "--tp"), eps=parse_int_list(ep, "--ep"),
        mbss=parse_int_list(mbs, "--mbs"), seqs=parse_int_list(seq, "--seq"),
        dtypes=tuple(d.strip().lower() for d in dtype.split(",") if d.strip()), device=device.lower(),
        warmup=warmup, repeats=repeats, kinds=tuple(k.strip() for k in kinds.split(",")) if kinds else None,
        gemms=gemms, gpu_id=gpu_id, threads=threads,
        min_repeat_s=None if min_repeat_ms is None else min_repeat_ms / 1e3)
    req.check()
    profile = _run_with_progress(req)
    from autoplan.costmodel.measured import save_profile

    path = save_profile(profile, out or Path(f"profile-{profile.device.gpu_id}-{req.model.name}.json"))
    _print_summary(profile, path)


def _run_with_progress(req):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autoplan.profiler.run import count_steps, run_profile

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=progress_console(), transient=True) as progress:
        task = progress.add_task("profiling", total=count_steps(req))
        profile = run_profile(req, lambda label: progress.update(task, advance=1, description=label))
        progress.update(task, completed=count_steps(req))
    return profile


def _print_summary(profile, path: Path) -> None:
    from rich.table import Table

    table = Table(title=f"{profile.model.name} on {profile.device.name} ({profile.device.kind})")
    for col in ("kind", "dtype", "tp", "ep", "mbs", "seq", "fwd ms", "bwd ms", "act MiB"):
        table.add_column(col, justify="right")
    fwd = {(e.kind, e.dtype, e.tp, e.ep, e.mbs, e.seq): e for e in profile.layers if e.pass_ == "fwd"}
    bwd = {(e.kind, e.dtype, e.tp, e.ep, e.mbs, e.seq): e for e in profile.layers if e.pass_ == "bwd"}
    for key, f in fwd.items():
        b = bwd.get(key)
        table.add_row(*(str(v) for v in key), f"{f.median_s * 1e3:.3f}",
                      f"{b.median_s * 1e3:.3f}" if b else "-", f"{f.activation_bytes / 2**20:.1f}")
    out = console()
    out.print(table)
    for note in profile.notes:
        out.print(f"note: {note}")
    out.print(f"wrote {path} ({len(profile.layers)} layer entries, {len(profile.gemms)} GEMM shapes)")


def _print_fits(profile, out: Path) -> None:
    """The communication profile's fits, printed by the rank that wrote the file."""
    from rich.table import Table

    table = Table(title=f"{profile.backend} x{profile.world_size} ({profile.level})")
    for col in ("op", "alpha us", "step latency us", "busbw GB/s", "max fit err"):
        table.add_column(col, justify="right")
    for f in profile.fits:
        table.add_row(f.op, f"{f.alpha_us:.1f}", f"{f.step_latency_us:.2f}", f"{f.busbw_gbytes_per_s:.2f}",
                      f"{f.max_rel_error:.0%}")
    out_console = console()
    out_console.print(table)
    for note in profile.notes:
        out_console.print(f"note: {note}")
    out_console.print(f"wrote {out}; GpuSpec overrides: {profile.gpu_overrides}")


def profile_comm_command(
    max_size: str = typer.Option("1G", "--max-size", help="Largest message, e.g. 1G on GPU, 4M on CPU."),
    min_size: str = typer.Option("1K", "--min-size", help="Smallest message."),
    ops: str = typer.Option("all_reduce,all_gather,reduce_scatter,all_to_all,send_recv",
                            help="Collectives to time."),
    repeats: int = typer.Option(10, help="Timed repeats per size (median reported, all kept)."),
    warmup: int = typer.Option(3, help="Untimed warm-up iterations per size."),
    level: Optional[str] = typer.Option(None, help="nvlink or network (default: nvlink when all ranks share "
                                                   "a node)."),
    link_gbytes_per_s: Optional[float] = typer.Option(
        None, help="Datasheet per-direction link rate, GB/s; when given, overrides carry a bus efficiency."),
    backend: Optional[str] = typer.Option(None, help="nccl or gloo (default: nccl with CUDA, else gloo)."),
    out: Path = typer.Option(Path("comm-profile.json"), help="Output file (.json, .yaml or .yml)."),
) -> None:
    """Time collectives across the ranks of a torchrun job; fit latency and bandwidth per collective; write
    GpuSpec overrides. Run as: torchrun --nproc-per-node N -m autoplan.cli.main profile-comm ..."""
    _require_torch()
    from autoplan.profiler.comm import CommRequest, run_comm_profile

    req = CommRequest(ops=tuple(o.strip() for o in ops.split(",") if o.strip()),
                      min_bytes=parse_size(min_size, "--min-size"), max_bytes=parse_size(max_size, "--max-size"),
                      repeats=repeats, warmup=warmup, level=level, link_gbytes_per_s=link_gbytes_per_s,
                      backend=backend)
    profile = run_comm_profile(req, out)
    if profile is not None:  # the rank that wrote the file
        _print_fits(profile, out)


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_command)
    app.command("profile-comm")(profile_comm_command)
