"""Measure the PyTorch caching allocator's overhead on a Llama-style training step, to put a measured figure under
`Calibration.fragmentation` (today an allowance without a measurement behind it).

A decoder stack with the shapes of a real recipe (default: Llama-3-8B as NVIDIA's
examples/llama/train_llama3_8b_h100_fp8.sh runs it: hidden 4096, FFN 14336, 32 heads / 8 KV groups, seq 8192,
micro batch 1), bf16 weights, flash attention through `scaled_dot_product_attention`, an untied output layer with
fp32 cross entropy, trained for a few steps of several micro batches each. Fewer layers than the model has, so one
GPU holds it; the allocator pattern per layer is the same.

Printed per setting, from `torch.cuda.memory_stats()` after the steps (PyTorch c10/cuda/CUDACachingAllocator.cpp):
- peak allocated and peak reserved, GiB;
- the allocated peak minus what is allocated before the first forward (weights, grads, optimizer state): the
  activation-and-transient peak the cost model sizes;
- fragmentation = (peak reserved - peak allocated) / that activation peak: the quantity
  `Calibration.fragmentation` stands for (costmodel/rank.py applies it to activations + logits + transients).
Peak reserved includes cached blocks the allocator would free and retry before an out-of-memory error, so this
ratio is an upper bound on the overhead that can cause one.

    python -m benchmarks.allocator_fragmentation                  # defaults: 4 layers, 3 steps x 4 micro batches
    python -m benchmarks.allocator_fragmentation --layers 8 --expandable   # PYTORCH_CUDA_ALLOC_CONF set first

Needs a CUDA device; exits 2 with one line when none is visible.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Optional, Sequence

from autoplan.costmodel.hardware import GIB


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--mbs", type=int, default=1)
    ap.add_argument("--micro-batches", type=int, default=4, help="micro batches per step (default 4)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--expandable", action="store_true",
                    help="set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts")
    return ap.parse_args(argv)


def build(args, torch):
    """A Llama-style decoder: RMSNorm, GQA attention with SDPA, SwiGLU MLP, untied head."""
    nn, F = torch.nn, torch.nn.functional
    head_dim = args.hidden // args.heads

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.RMSNorm(args.hidden)
            self.qkv = nn.Linear(args.hidden, (args.heads + 2 * args.kv_heads) * head_dim, bias=False)
            self.proj = nn.Linear(args.heads * head_dim, args.hidden, bias=False)
            self.norm2 = nn.RMSNorm(args.hidden)
            self.fc1 = nn.Linear(args.hidden, 2 * args.ffn, bias=False)
            self.fc2 = nn.Linear(args.ffn, args.hidden, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(
                [args.heads * head_dim, args.kv_heads * head_dim, args.kv_heads * head_dim], dim=-1)
            q = q.view(b, s, args.heads, head_dim).transpose(1, 2)
            k = k.view(b, s, args.kv_heads, head_dim).transpose(1, 2)
            v = v.view(b, s, args.kv_heads, head_dim).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.proj(o.transpose(1, 2).reshape(b, s, -1))
            gate, up = self.fc1(self.norm2(x)).chunk(2, dim=-1)
            return x + self.fc2(F.silu(gate) * up)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.hidden)
            self.layers = nn.ModuleList(Layer() for _ in range(args.layers))
            self.norm = nn.RMSNorm(args.hidden)
            self.head = nn.Linear(args.hidden, args.vocab, bias=False)

        def forward(self, ids, labels):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().reshape(-1, args.vocab), labels.reshape(-1))

    return Model().to(device="cuda", dtype=torch.bfloat16)


def measure(args) -> Dict[str, float]:
    import torch

    model = build(args, torch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def batch():
        ids = torch.randint(0, args.vocab, (args.mbs, args.seq + 1), device="cuda", generator=gen)
        return ids[:, :-1], ids[:, 1:]

    # One step first so the optimizer state and gradients exist, then measure from a clean peak.
    for _ in range(args.micro_batches):
        model(*batch()).backward()
    optimizer.step()
    torch.cuda.synchronize()
    static = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(args.steps):
        for _ in range(args.micro_batches):
            model(*batch()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    peak_alloc = stats["allocated_bytes.all.peak"]
    peak_reserved = stats["reserved_bytes.all.peak"]
    activation_peak = max(peak_alloc - static, 1)
    return {"static_gib": static / GIB, "peak_allocated_gib": peak_alloc / GIB,
            "peak_reserved_gib": peak_reserved / GIB, "activation_peak_gib": activation_peak / GIB,
            "fragmentation": (peak_reserved - peak_alloc) / activation_peak,
            "alloc_retries": float(stats.get("num_alloc_retries", 0))}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.expandable:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    if not torch.cuda.is_available():
        print("allocator_fragmentation: needs a CUDA device (torch.cuda.is_available() is False); "
              "run it on a GPU machine", file=sys.stderr)
        return 2
    print(f"device {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r}")
    print(f"layers {args.layers}, hidden {args.hidden}, ffn {args.ffn}, heads {args.heads}/{args.kv_heads}, "
          f"seq {args.seq}, mbs {args.mbs}, {args.micro_batches} micro batches x {args.steps} steps")
    for key, value in measure(args).items():
        print(f"  {key:22s} {value:10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
