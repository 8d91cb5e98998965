"""`MeasuredProfile`: what `autoplan profile` writes and the cost model reads. Pure pydantic + numpy (no torch).

Times are seconds, memory bytes. A layer entry is one (kind, pass, tp, ep, mbs, seq, dtype) point measured on one
rank's shard of the layer (simulated tensor/expert parallelism: one device runs one rank's share)."""
from __future__ import annotations

from typing import Dict, Literal, Optional, Tuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from autoplan.model import ModelSpec
from autoplan.profiler import fit, interpolate

SCHEMA_VERSION = 1

LayerKind = Literal["attention", "mlp", "moe", "embedding", "head"]
LAYER_KINDS: Tuple[str, ...] = ("attention", "mlp", "moe", "embedding", "head")
Pass = Literal["fwd", "bwd"]
PASSES: Tuple[str, ...] = ("fwd", "bwd")


class DeviceInfo(BaseModel):
    """The machine the profile was measured on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["cpu", "cuda"] = Field(description="Torch device type the layers ran on.")
    name: str = Field(description="Device name as torch reports it, e.g. 'NVIDIA H200' (the CPU model on CPU).")
    gpu_id: str = Field(description="Lower-case id matching `profiles/gpus/<id>.yaml`, e.g. 'h200'; 'cpu' on CPU.")
    torch_version: str = Field(description="torch.__version__.")
    cuda_version: Optional[str] = Field(None, description="CUDA runtime torch was built with; None on CPU builds.")
    driver_version: Optional[str] = Field(None, description="NVIDIA driver version; None when unknown or on CPU.")
    cpu_threads: int = Field(gt=0, description="torch.get_num_threads() during the run.")


class LayerTiming(BaseModel):
    """One measured point: a layer kind's forward or backward pass on one rank's shard."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True)

    kind: LayerKind = Field(description="Layer kind (see `autoplan.profiler` for what each holds).")
    pass_: Pass = Field(alias="pass", description="fwd, or bwd (autograd on the layer output; input+weight grads).")
    tp: int = Field(gt=0, description="Tensor-parallel degree whose shard was run.")
    ep: int = Field(1, gt=0, description="Expert-parallel degree (MoE only; 1 for other kinds).")
    mbs: int = Field(gt=0, description="Micro-batch size, sequences.")
    seq: int = Field(gt=0, description="Tokens per sequence.")
    dtype: str = Field(description="Compute dtype: bf16, fp16, fp32 or fp8 (Transformer Engine GEMMs).")
    median_s: float = Field(gt=0, description="Median over repeats, s.")
    min_s: float = Field(gt=0, description="Fastest repeat, s.")
    max_s: float = Field(gt=0, description="Slowest repeat, s.")
    repeats: int = Field(gt=0, description="Timed repeats after warm-up.")
    raw_s: Tuple[float, ...] = Field(description="Every timed repeat, s, in run order.")
    activation_bytes: int = Field(ge=0, description="Bytes kept for backward by the forward pass (fwd entries; "
                                                    "the same value is copied to the bwd entry).")
    weight_bytes: int = Field(ge=0, description="Parameter bytes of the shard.")
    peak_bytes: Optional[int] = Field(None, ge=0, description="GPU only: torch.cuda.max_memory_allocated delta "
                                                              "over forward + backward, bytes; None on CPU.")


class GemmTiming(BaseModel):
    """One timed GEMM, (m, k) @ (k, n), as the layers issue it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    m: int = Field(gt=0, description="Rows of the output (tokens).")
    n: int = Field(gt=0, description="Columns of the output.")
    k: int = Field(gt=0, description="Reduction dimension.")
    dtype: str = Field(description="Operand dtype.")
    median_s: float = Field(gt=0, description="Median over repeats, s.")
    tflops: float = Field(gt=0, description="Achieved 2*m*n*k / median_s, TFLOP/s.")
    repeats: int = Field(gt=0, description="Timed repeats after warm-up.")
    raw_s: Tuple[float, ...] = Field(description="Every timed repeat, s.")
    source: str = Field(description="Which layer GEMM produced this shape, e.g. 'mlp.fc1 tp=2 mbs=1 seq=4096'.")


class MeasuredProfile(BaseModel):
    """A versioned set of layer and GEMM measurements for one model on one device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = Field(SCHEMA_VERSION, description="Format version; bumped on breaking change.")
    created: str = Field(description="ISO-8601 UTC time of the run.")
    device: DeviceInfo = Field(description="Where it ran.")
    model: ModelSpec = Field(description="The model whose layers were built (its name and dims).")
    warmup: int = Field(ge=0, description="Untimed warm-up iterations per point.")
    layers: Tuple[LayerTiming, ...] = Field(description="Per-layer measurements.")
    gemms: Tuple[GemmTiming, ...] = Field((), description="GEMM throughput table.")
    notes: Tuple[str, ...] = Field((), description="What was skipped and why (e.g. fp8 without Transformer Engine).")

    _index: Dict[tuple, "fit.LayerTable"] = PrivateAttr(default_factory=dict)
    _index_of: Optional[tuple] = PrivateAttr(None)  # the `layers` tuple `_index` was built from
    _path: Optional[str] = PrivateAttr(None)

    @property
    def path(self) -> Optional[str]:
        """The file this profile was loaded from (None when built in memory); the estimate's sources cite it."""
        return self._path

    def with_path(self, path: str) -> "MeasuredProfile":
        """This profile, remembering the file it came from."""
        self._path = path
        return self

    def _table(self, kind: str, pass_: str, dtype: str) -> fit.LayerTable:
        """The fitted predictor of one kind/pass/dtype (cached)."""
        key = (kind, pass_, dtype)
        if self._index_of is not self.layers:  # model_copy shares private state: rebuild for new layers
            self._index, self._index_of = {}, self.layers
        if key not in self._index:
            self._index[key] = fit.LayerTable({(e.ep, e.tp, e.seq, e.mbs): e.median_s for e in self.layers
                                               if (e.kind, e.pass_, e.dtype) == key})
        return self._index[key]

    def layer_time(self, kind: str, pass_: str, tp: np.ndarray, mbs: np.ndarray, seq: np.ndarray, dtype: str,
                   ep: Optional[np.ndarray] = None) -> np.ndarray:
        """Seconds of one layer kind's pass for one micro batch of `mbs` x `seq` tokens on one rank, broadcast over
        the arrays. Within each measured (ep, tp) shard the (mbs, seq) dependence is predicted by the method of
        `autoplan.profiler.fit` that cross-validates best on this kind/pass (log-log interpolation, or the
        fixed + per-token + attention-core fit); across tp and ep it is interpolated log-log. NaN where a point
        lies outside the measured range by more than `interpolate.EXTRAPOLATION_FACTOR` on any axis, or the
        kind/pass/dtype was not measured. `ep` matters only for "moe" (other kinds are measured at ep=1)."""
        if kind not in LAYER_KINDS or pass_ not in PASSES:
            raise ValueError(f"layer_time: kind must be one of {LAYER_KINDS} and pass_ one of {PASSES}, "
                             f"got kind={kind!r} pass_={pass_!r}")
        ep_arr = np.ones_like(np.asarray(tp)) if ep is None or kind != "moe" else ep
        return self._table(kind, pass_, dtype).lookup(ep_arr, tp, seq, mbs)

    def layer_method(self, kind: str, pass_: str, dtype: str) -> str:
        """Which `fit.METHODS` entry predicts this kind/pass/dtype."""
        return self._table(kind, pass_, dtype).method

    def gemm_tflops(self, m: np.ndarray, n: np.ndarray, k: np.ndarray, dtype: str) -> np.ndarray:
        """Achieved TFLOP/s for GEMM shapes, interpolated from the GEMM table (NaN far from any measured shape)."""
        rows = [g for g in self.gemms if g.dtype == dtype]
        table = np.array([[g.m, g.n, g.k, g.tflops] for g in rows], dtype=float).reshape(-1, 4)
        return interpolate.gemm_lookup(table, m, n, k)

    def measured_dtypes(self) -> Tuple[str, ...]:
        return tuple(sorted({e.dtype for e in self.layers}))
