"""The GEMM shapes a strategy's layers issue on one rank, and their measured throughput.

Shapes are (m, n, k) of the forward GEMM output[m, n] = input[m, k] @ weight[k, n] with m = mbs * seq tokens;
backward issues the same FLOPs as two GEMMs of the transposed shapes (Narayanan et al., SC'21, sec. 5.1: the
backward pass costs twice the forward GEMM FLOPs), so the forward table covers the family."""
from __future__ import annotations

import statistics
from typing import Callable, Dict, Iterable, List, Tuple

import torch

from autoplan.model import ModelSpec
from autoplan.profiler.schema import GemmTiming
from autoplan.profiler.shards import shard_dims, tokens_per_local_expert
from autoplan.profiler.timing import time_call

Shape = Tuple[int, int, int]


def layer_gemm_shapes(model: ModelSpec, tp: int, ep: int, mbs: int, seq: int) -> Dict[str, Shape]:
    """{name: (m, n, k)} of the projection GEMMs of one rank's layers at this shape."""
    dims = shard_dims(model, tp, ep)
    t, h = mbs * seq, model.hidden_size
    mult = 2 if model.gated_mlp else 1
    shapes: Dict[str, Shape] = {}
    if model.multi_latent_attention:
        qk = model.qk_head_dim + model.qk_pos_emb_head_dim
        if model.q_lora_rank:
            shapes["attention.q_down"] = (t, model.q_lora_rank, h)
            shapes["attention.q_up"] = (t, dims.heads * qk, model.q_lora_rank)
        else:
            shapes["attention.q"] = (t, dims.heads * qk, h)
        shapes["attention.kv_down"] = (t, model.kv_lora_rank + model.qk_pos_emb_head_dim, h)
        shapes["attention.kv_up"] = (t, dims.heads * (model.qk_head_dim + model.v_head_dim), model.kv_lora_rank)
        shapes["attention.proj"] = (t, h, dims.heads * model.v_head_dim)
    else:
        d = model.kv_channels
        shapes["attention.qkv"] = (t, (dims.heads + 2 * dims.groups) * d, h)
        shapes["attention.proj"] = (t, h, dims.heads * d)
    if model.num_dense_layers:
        shapes["mlp.fc1"] = (t, mult * dims.ffn, h)
        shapes["mlp.fc2"] = (t, h, dims.ffn)
    if model.is_moe:
        rows = tokens_per_local_expert(model, ep, t)
        shapes["moe.expert_fc1"] = (rows, mult * dims.expert_ffn, h)
        shapes["moe.expert_fc2"] = (rows, h, dims.expert_ffn)
        shapes["moe.router"] = (t, model.num_experts, h)
    shapes["head"] = (t, dims.vocab, h)
    return shapes


def strategy_gemm_shapes(model: ModelSpec, tps: Iterable[int], eps: Iterable[int], mbss: Iterable[int],
                         seqs: Iterable[int]) -> Dict[Shape, str]:
    """Distinct shapes over the grid, each with the first layer/point that produced it."""
    out: Dict[Shape, str] = {}
    for tp in tps:
        for ep in eps:
            for mbs in mbss:
                for seq in seqs:
                    for name, shape in layer_gemm_shapes(model, tp, ep, mbs, seq).items():
                        out.setdefault(shape, f"{name} tp={tp} ep={ep} mbs={mbs} seq={seq}")
    return out


def time_gemm(shape: Shape, dtype: torch.dtype, device: torch.device, warmup: int, repeats: int) -> List[float]:
    """Seconds of each timed torch.matmul (m, k) @ (k, n)."""
    m, n, k = shape
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    for _ in range(warmup):
        torch.matmul(a, b)
    return [time_call(lambda: torch.matmul(a, b), device)[0] for _ in range(repeats)]


def gemm_table(shapes: Dict[Shape, str], dtype_name: str, dtype: torch.dtype, device: torch.device, warmup: int,
               repeats: int, advance: Callable[[], None] = lambda: None) -> List[GemmTiming]:
    """Time every shape and record achieved TFLOP/s = 2mnk / median."""
    rows = []
    for shape, source in shapes.items():
        raw = time_gemm(shape, dtype, device, warmup, repeats)
        median = statistics.median(raw)
        m, n, k = shape
        rows.append(GemmTiming(m=m, n=n, k=k, dtype=dtype_name, median_s=median, tflops=2 * m * n * k / median / 1e12,
                               repeats=repeats, raw_s=tuple(raw), source=source))
        advance()
    return rows
