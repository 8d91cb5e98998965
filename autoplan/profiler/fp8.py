"""Precision setup: torch dtypes, and FP8 through Transformer Engine when it is installed and the GPU has FP8
tensor cores (compute capability 8.9 Ada / 9.0 Hopper and later; TE's `check_fp8_support`)."""
from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional

import torch

from autoplan.errors import InputError
from autoplan.profiler.layers import LinearFactory, torch_linear

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SUPPORTED_DTYPES = tuple(TORCH_DTYPES) + ("fp8",)


@dataclass(frozen=True)
class Precision:
    """How to build and run the layers for one dtype name."""

    name: str
    param_dtype: torch.dtype  # parameters and activations
    linear: LinearFactory  # builds the projection layers
    autocast: Callable[[], ContextManager]  # wraps each forward


def fp8_unavailable_reason(device: torch.device) -> Optional[str]:
    """Why FP8 cannot be profiled here, or None when it can."""
    if device.type != "cuda":
        return "fp8 needs a CUDA GPU with FP8 tensor cores; skipped on CPU"
    if importlib.util.find_spec("transformer_engine") is None:
        return "fp8 needs Transformer Engine (transformer_engine.pytorch), which is not installed; skipped"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"fp8 needs compute capability >= 8.9, this GPU has {major}.{minor}; skipped"
    return None


def _te_precision() -> Precision:
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format

    recipe = DelayedScaling(fp8_format=Format.HYBRID)  # e4m3 forward, e5m2 gradients (Megatron --fp8-format hybrid)

    def linear(in_features: int, out_features: int, bias: bool) -> torch.nn.Module:
        return te.Linear(in_features, out_features, bias=bias, params_dtype=torch.bfloat16)

    return Precision("fp8", torch.bfloat16, linear, lambda: te.fp8_autocast(enabled=True, fp8_recipe=recipe))


def precision_for(name: str, device: torch.device) -> Precision:
    """The Precision for a dtype name; InputError for an unknown name. Callers check fp8 availability first."""
    if name == "fp8":
        return _te_precision()
    if name not in TORCH_DTYPES:
        raise InputError(f"dtype {name!r} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}")
    return Precision(name, TORCH_DTYPES[name], torch_linear, contextlib.nullcontext)
