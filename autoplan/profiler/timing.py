"""Timers and memory probes. The benchmark discipline follows nanoGPT's bench.py and nccl-tests: warm up, then
time each repeat on the device clock (CUDA events + synchronize on GPU, `time.perf_counter` on CPU) and keep every
repeat; callers report the median."""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from autoplan.profiler.layers import ProfiledLayer


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device) -> Tuple[float, object]:
    """(seconds, result) of one call, measured on the device's own clock."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, result  # elapsed_time is in ms
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


@dataclass(frozen=True)
class Samples:
    """Every timed repeat, s."""

    raw: Tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.raw)


class SavedTensorBytes:
    """Counts the bytes autograd saves for backward (deduplicated by storage), excluding the layer's parameters:
    the activation memory a forward pass leaves behind on any device."""

    def __init__(self, params: Sequence[torch.Tensor]):
        self.param_storages = {p.untyped_storage().data_ptr() for p in params}
        self.storages = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.param_storages:
            self.storages[ptr] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def hooks(self) -> ContextManager:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


@dataclass(frozen=True)
class LayerMeasurement:
    """Forward and backward samples of one layer at one shape, with its memory."""

    fwd: Samples
    bwd: Samples
    activation_bytes: int  # saved-for-backward bytes (CPU) or allocated delta held after forward (GPU)
    peak_bytes: Optional[int]  # max_memory_allocated delta over forward+backward (GPU only)
    weight_bytes: int


def weight_bytes(layer: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in layer.parameters())


def _backward(out: torch.Tensor) -> None:
    grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)
    out.backward(grad)


def _clear_grads(layer: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> None:
    layer.zero_grad(set_to_none=True)
    for x in inputs:
        if x.requires_grad:
            x.grad = None


def measure_activation(layer: ProfiledLayer, inputs, device: torch.device,
                       autocast: Callable[[], ContextManager]) -> Tuple[int, Optional[int]]:
    """(activation bytes, peak bytes) of one forward (+ backward for the peak)."""
    if device.type != "cuda":
        counter = SavedTensorBytes(list(layer.parameters()))
        with counter.hooks(), autocast():
            out = layer(*inputs)
        _backward(out)
        _clear_grads(layer, inputs)
        return counter.total, None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with autocast():
        out = layer(*inputs)
    synchronize(device)
    held = torch.cuda.memory_allocated(device) - before
    _backward(out)
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    _clear_grads(layer, inputs)
    return held, peak


def warm_up(layer: ProfiledLayer, inputs: Sequence[torch.Tensor], iterations: int,
            autocast: Callable[[], ContextManager]) -> None:
    for _ in range(iterations):
        with autocast():
            out = layer(*inputs)
        _backward(out)
        _clear_grads(layer, inputs)


def time_once(layer: ProfiledLayer, inputs: Sequence[torch.Tensor], device: torch.device,
              autocast: Callable[[], ContextManager]) -> Tuple[float, float]:
    """(forward s, backward s) of one iteration; backward is autograd from the output."""
    with autocast():
        t_fwd, out = time_call(lambda: layer(*inputs), device)
    grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)
    synchronize(device)
    t_bwd, _ = time_call(lambda: out.backward(grad), device)
    del out
    _clear_grads(layer, inputs)
    return t_fwd, t_bwd


def iterations_for(layer: ProfiledLayer, inputs: Sequence[torch.Tensor], device: torch.device,
                   autocast: Callable[[], ContextManager], min_repeat_s: float) -> int:
    """Iterations one repeat averages so that it lasts at least `min_repeat_s` (timeit's autorange): a repeat of a
    sub-millisecond CPU layer is otherwise dominated by scheduler jitter. 1 when `min_repeat_s` is 0."""
    if min_repeat_s <= 0:
        return 1
    t_fwd, t_bwd = time_once(layer, inputs, device, autocast)
    return max(1, min(1000, math.ceil(min_repeat_s / max(t_fwd + t_bwd, 1e-9))))


def measure_points(layer: ProfiledLayer, inputs_by_point: Dict[Hashable, Sequence[torch.Tensor]],
                   device: torch.device, warmup: int, repeats: int,
                   autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                   min_repeat_s: float = 0.0) -> Dict[Hashable, LayerMeasurement]:
    """Time several input shapes of one layer in interleaved rounds (each round times every shape once), so a
    burst of load from other processes spreads over all shapes instead of skewing one shape's median. Each
    repeat is the mean of enough iterations to last `min_repeat_s` (`iterations_for`)."""
    for inputs in inputs_by_point.values():
        warm_up(layer, inputs, warmup, autocast)
    synchronize(device)
    iterations = {k: iterations_for(layer, inputs, device, autocast, min_repeat_s)
                  for k, inputs in inputs_by_point.items()}
    fwd: Dict[Hashable, List[float]] = {k: [] for k in inputs_by_point}
    bwd: Dict[Hashable, List[float]] = {k: [] for k in inputs_by_point}
    for _ in range(repeats):
        for key, inputs in inputs_by_point.items():
            times = [time_once(layer, inputs, device, autocast) for _ in range(iterations[key])]
            fwd[key].append(sum(t for t, _ in times) / len(times))
            bwd[key].append(sum(t for _, t in times) / len(times))
    out = {}
    for key, inputs in inputs_by_point.items():
        activation, peak = measure_activation(layer, inputs, device, autocast)
        out[key] = LayerMeasurement(Samples(tuple(fwd[key])), Samples(tuple(bwd[key])), activation, peak,
                                    weight_bytes(layer))
    return out


def measure_layer(layer: ProfiledLayer, inputs: Sequence[torch.Tensor], device: torch.device, warmup: int,
                  repeats: int, autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> LayerMeasurement:
    """Warm up, then time `repeats` forward passes and the backward pass of each (autograd from the output)."""
    return measure_points(layer, {0: inputs}, device, warmup, repeats, autocast)[0]
