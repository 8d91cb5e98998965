"""Readable tables for estimates and plans (rich)."""
from __future__ import annotations

from typing import List

from rich.table import Table

from autoplan.cli.console import console as make_console
from autoplan.numerics import precision_label
from autoplan.results import Estimate, Plan

# Pipes and CI logs get a wide, fixed width so tables do not wrap; terminals use their own width.
console = make_console(180)
SHORT = {"weights": "weights", "grads": "grads", "optimizer": "optim", "activations": "activ", "logits": "logits",
         "transient": "transient", "cuda_context": "ctx", "nccl": "nccl", "fragmentation": "frag",
         "cuda_graphs": "graphs"}


def estimate_tables(est: Estimate, title: str = "Estimate") -> List[Table]:
    head = Table(title=title, show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("step time", f"{est.step_time_s:.3f} s  ({est.num_microbatches} micro batches, dp={est.dp})")
    head.add_row("throughput", f"{est.tokens_per_s:,.0f} tokens/s  ({est.tokens_per_s_per_gpu:,.0f} per GPU)")
    head.add_row("model TFLOP/s/GPU", f"{est.model_tflops_per_gpu:.0f}  (MFU {est.mfu:.1%} of bf16 peak)")
    fit = "[green]fits[/green]" if est.fits else "[red]DOES NOT FIT[/red]"
    head.add_row("peak memory", f"{est.peak_mem_gib:.1f} GiB of {est.capacity_gib:.1f} GiB  {fit}")
    head.add_row("bottleneck", est.bottleneck)

    times = Table(title="Time per step (exposed)")
    times.add_column("term")
    times.add_column("seconds", justify="right")
    times.add_column("share", justify="right")
    for k, v in est.time_breakdown.items():
        if v > 0:
            times.add_row(k, f"{v:.3f}", f"{v / est.step_time_s:.1%}")

    tables = [head, times]
    if est.stage_memory:
        keys = list(est.stage_memory[0].breakdown_gib)
        mem = Table(title="Memory per pipeline rank (GiB)")
        mem.add_column("rank", justify="right")
        mem.add_column("layers", justify="right")
        for k in keys:
            mem.add_column(SHORT.get(k, k), justify="right")
        mem.add_column("total", justify="right", style="bold")
        rows = est.stage_memory
        if len(rows) > 8:  # first, last and the heaviest in between
            heavy = max(rows[1:-1], key=lambda s: s.total_gib)
            rows = [rows[0], heavy, rows[-1]]
        for s in rows:
            mem.add_row(str(s.stage), str(s.num_layers), *(f"{s.breakdown_gib[k]:.1f}" for k in keys),
                        f"{s.total_gib:.1f}")
        tables.append(mem)
    return tables


def print_estimate(est: Estimate, title: str = "Estimate") -> None:
    for t in estimate_tables(est, title):
        console.print(t)
    if est.useful_fraction is not None:
        console.print(goodput_table(est))
    for note in est.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


def plans_table(plans: List[Plan], title: str, show_gpus: bool = False) -> Table:
    t = Table(title=title)
    t.add_column("#", justify="right")
    if show_gpus:
        t.add_column("GPUs", justify="right")
    t.add_column("strategy", no_wrap=True)
    t.add_column("GEMMs")  # the training's precision: FP8 / NVFP4 rows change the numerics (autoplan/numerics.py)
    for col, just in ( ("step s", "right"), ("tok/s/GPU", "right"),
                      ("MFU", "right"), ("peak GiB", "right"), ("headroom", "right"), ("bottleneck", "left"),
                      ("goodput/GPU", "right"), ("ckpt every", "right"), ("stall s", "right")):
        t.add_column(col, justify=just)
    for i, p in enumerate(plans, 1):
        e = p.estimate
        gemms = precision_label(p.strategy.fp8, p.strategy.fp8_recipe, p.cluster.gpu.id)
        t.add_row(str(i), *([str(p.cluster.num_gpus)] if show_gpus else []), p.strategy.label(moe=p.model.is_moe),
                  gemms if gemms == "bf16" else f"[bold magenta]{gemms}[/bold magenta]", f"{e.step_time_s:.3f}", f"{e.tokens_per_s_per_gpu:,.0f}",
                  f"{e.mfu:.1%}", f"{e.peak_mem_gib:.1f}", f"{1 - e.peak_mem_gib / e.capacity_gib:.0%}",
                  e.bottleneck, *_goodput_cells(e, p.cluster.num_gpus))
    return t


def _goodput_cells(e: Estimate, gpus: int) -> List[str]:
    """A plan row's goodput (tokens/s per GPU and the useful-time fraction), checkpoint interval and save stall
    (the interval in steps is in the estimate and plan.json)."""
    if e.useful_fraction is None:
        return ["-"] * 3
    return [f"{e.goodput_tokens_per_s / gpus:,.0f} {e.useful_fraction:.1%}", f"{e.checkpoint_interval_s:,.0f} s",
            f"{e.checkpoint_stall_s:.2f}"]


def goodput_table(e: Estimate) -> Table:
    """The goodput block of `estimate`: failures, checkpoints and restarts (autoplan/costmodel/goodput.py)."""
    t = Table(title=f"Goodput under failures ({e.checkpoint_method} checkpoints)", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    rows = [("job MTBF", f"{e.expected_job_mtbf_s / 3600:,.2f} h"),
            ("checkpoint per rank", f"{e.checkpoint_gib_per_rank:,.2f} GiB"),
            ("checkpoint interval", f"{e.checkpoint_interval_steps} steps = {e.checkpoint_interval_s:,.0f} s"),
            ("save stall", f"{e.checkpoint_stall_s:.3f} s"),
            ("of which overlapped steps", f"{e.checkpoint_overlap_s:.3f} s"),
            ("durable after", f"{e.checkpoint_persist_s:.2f} s"),
            ("restart (incl. load)", f"{e.restart_s:,.0f} s"),
            ("lost work per failure", f"{e.lost_work_s:,.0f} s"),
            ("useful time", f"{e.useful_fraction:.2%}"),
            ("goodput", f"{e.goodput_tokens_per_s:,.0f} tokens/s ({e.goodput_tokens_per_s / e.tokens_per_s:.1%} "
                        f"of {e.tokens_per_s:,.0f})")]
    for row in rows:
        t.add_row(*row)
    return t
