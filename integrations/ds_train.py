"""Train a GPT-style model with DeepSpeed on random tokens and report every iteration (a probe/benchmark run).

Self-contained (torch + deepspeed only) so that `autoplan emit --format deepspeed` can copy it next to the config.

Usage:
    deepspeed --num_gpus 8 ds_train.py --deepspeed_config ds_config.json --model-json model.json --seq-len 4096
    torchrun --nproc_per_node 2 ds_train.py --deepspeed_config ds_config.json --model-json model.json --seq-len 64
Options: --iters K (default 10), --recompute none|selective|full, --recompute-method uniform|block,
--recompute-layers N (the Strategy fields of the same names), --seed S, --save-dir DIR with --save-interval N
(engine.save_checkpoint every N steps, with the ds_config's "checkpoint" settings).

The model is built from a ModelSpec JSON (`autoplan.model.ModelSpec.model_dump_json()`): token embedding
(+ learned positions or RoPE on `rotary_percent` of each head), `num_layers` pre-norm decoder layers (GQA attention
with `kv_channels` per head and optional q/k norms; SwiGLU, GeGLU or GELU MLP; an MoE layer with top-k routing and
optional shared expert where the spec says so; the post-attention / post-MLP norms of `sandwich_norm`), final norm
and LM head (with final-logit soft-capping). MLA is approximated by GQA attention; sliding windows, attention sinks,
gpt-oss's clamped GLU and RoPE scaling are not applied (the emitter names them in launch.sh): the script measures
a parallel layout, it is not a faithful copy of every architecture. With `pipeline.stages` > 1 in the config the
layers go into a `deepspeed.pipe.PipelineModule` (uniform partition). The optimizer is `torch.optim.AdamW` so
DeepSpeed compiles no fused optimizer. CPU runs use gloo.

Output format (parsed by the probe log parser). Every rank prints, for each iteration, one line:
    AUTOPLAN_ITER {"rank": 0, "world_size": 2, "iteration": 1, "elapsed_ms": 812.3, "tokens_per_s": 1260.5,
                   "loss": 6.24, "device_mem_peak_gib": null, "host_rss_peak_gib": 1.13}
on a single line: the prefix `AUTOPLAN_ITER `, then a JSON object. `iteration` counts from 1; `elapsed_ms` is the
wall time of that optimizer step (all microbatches); `tokens_per_s` is global_batch * seq_len / elapsed for the
whole job; `loss` is this rank's last loss (null on pipeline ranks that do not hold it); `device_mem_peak_gib` is
the accelerator's peak allocated memory so far (null on CPU); `host_rss_peak_gib` the process's peak RSS.
Find the prefix anywhere in a line: DeepSpeed's pipeline engine ends its own step report without a newline, so
that text can precede it. After the last iteration rank 0 prints `AUTOPLAN_DONE {"iterations": K, "world_size": N}`.
Before the first iteration every rank prints the layout DeepSpeed built:
    AUTOPLAN_LAYOUT {"rank": 0, "tensor_parallel": 2, "data_parallel": 1, "local_params": 139840}
(`data_parallel` is the engine's data-parallel world size; `local_params` the parameters this rank holds before
ZeRO partitioning, i.e. after AutoTP sharding).

Tensor parallelism (`tensor_parallel.autotp_size` > 1 in the config) is DeepSpeed AutoTP driven by the config:
`deepspeed.initialize` shards the model by `Gpt._tp_plan`, and an `AutoTpGroups` mpu makes DeepSpeed count
world / tp data-parallel ranks. (`deepspeed.tp_model_init` only records arguments in 0.19.8 and is not needed.)

Fault hooks for tests of failure handling: AUTOPLAN_FAULT=fail raises at the first iteration, AUTOPLAN_FAULT=oom
raises torch's out-of-memory error there (the error a GPU rank prints when an allocation fails),
AUTOPLAN_FAULT=hang sleeps forever there; AUTOPLAN_FAULT_RANK=R limits the fault to rank R (default: every rank)."""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

if __name__ == "__main__":
    # Run as a script from autoplan's integrations/ folder, whose deepspeed.py would shadow the deepspeed package.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

ITER_PREFIX = "AUTOPLAN_ITER "
LAYOUT_PREFIX = "AUTOPLAN_LAYOUT "
DONE_PREFIX = "AUTOPLAN_DONE "


# ----------------------------------------------------------------------------------------------- model
def _norm(spec: Dict[str, Any], width: Optional[int] = None) -> nn.Module:
    """The model's norm over `width` features (default hidden_size)."""
    h = width or spec["hidden_size"]
    return nn.RMSNorm(h) if spec.get("normalization", "rmsnorm") == "rmsnorm" else nn.LayerNorm(h)


def _rope(x: torch.Tensor, base: float, percent: float = 1.0) -> torch.Tensor:
    """Rotary embedding on [b, heads, s, d] (RoFormer, arXiv:2104.09864 eq. 34), rotate-half form, on the first
    `percent` of each head's dimensions (Megatron --rotary-percent; HF partial_rotary_factor); the rest pass."""
    rot = int(x.shape[-1] * percent) // 2 * 2
    if rot < x.shape[-1]:
        return torch.cat([_rope(x[..., :rot], base), x[..., rot:]], -1)
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    full = torch.cat([ang, ang], -1)
    cos, sin = full.cos().to(x.dtype), full.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, spec: Dict[str, Any], selective: bool):
        super().__init__()
        h, d = spec["hidden_size"], spec["kv_channels"]
        heads, groups = spec["num_attention_heads"], spec["num_query_groups"]
        self.d = d
        self.rope_base = spec.get("rotary_base", 10000.0) if spec.get("position_embedding", "rope") == "rope" else 0
        self.rotary_percent = spec.get("rotary_percent", 1.0)
        # Per-head norms on q and k over d (HF Qwen3 / Gemma-3 q_norm, k_norm; Megatron --qk-layernorm).
        qk_norm = spec.get("qk_layernorm", False)
        self.q_norm, self.k_norm = (_norm(spec, d), _norm(spec, d)) if qk_norm else (nn.Identity(), nn.Identity())
        qkv_bias = spec.get("add_bias_linear", False) or spec.get("add_qkv_bias", False)
        self.q_proj = nn.Linear(h, heads * d, bias=qkv_bias)
        self.k_proj = nn.Linear(h, groups * d, bias=qkv_bias)
        self.v_proj = nn.Linear(h, groups * d, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * d, h, bias=spec.get("add_bias_linear", False))
        self.selective = selective

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Head counts come from the projections' outputs: under AutoTP each rank holds heads/tp and groups/tp.
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.d).transpose(1, 2)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rope_base:
            q, k = _rope(q, self.rope_base, self.rotary_percent), _rope(k, self.rope_base, self.rotary_percent)
        if self.selective and self.training:  # Megatron's selective recompute: the core attention only
            out = torch.utils.checkpoint.checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


# ModelSpec.gate_activation: SwiGLU (silu) or GeGLU (Gemma's gelu_pytorch_tanh is the tanh approximation).
GATE_FUNCTIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class Mlp(nn.Module):
    def __init__(self, spec: Dict[str, Any], ffn: int):
        super().__init__()
        h, bias = spec["hidden_size"], spec.get("add_bias_linear", False)
        self.gated = spec.get("activation", "swiglu") == "swiglu"
        self.gate_act = GATE_FUNCTIONS[spec.get("gate_activation", "silu")]
        self.up_proj = nn.Linear(h, ffn, bias=bias)
        self.gate_proj = nn.Linear(h, ffn, bias=bias) if self.gated else None
        self.down_proj = nn.Linear(ffn, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down_proj(self.gate_act(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x)))


class MoE(nn.Module):
    """Top-k softmax router over local experts (Shazeer et al., arXiv:1701.06538), plus an optional shared expert.
    Every expert runs, possibly on zero tokens, so all parameters take part in every step (ZeRO-3 safe)."""

    def __init__(self, spec: Dict[str, Any]):
        super().__init__()
        self.topk = spec["moe_router_topk"]
        self.router = nn.Linear(spec["hidden_size"], spec["num_experts"], bias=False)
        self.experts = nn.ModuleList(Mlp(spec, spec["moe_ffn_hidden_size"]) for _ in range(spec["num_experts"]))
        shared = spec.get("shared_expert_ffn_hidden_size", 0)
        self.shared = Mlp(spec, shared) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(F.softmax(self.router(flat).float(), dim=-1), self.topk, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(flat.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero(chosen == e, as_tuple=True)
            out.index_add_(0, token, expert(flat[token]) * weights[token, slot].unsqueeze(-1))
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view_as(x)


def _is_moe_layer(spec: Dict[str, Any], index: int) -> bool:
    """Same rule as autoplan.model.ModelSpec.is_moe_layer (DeepSeek's first_k_dense_replace)."""
    first_dense = spec.get("first_k_dense_layers", 0)
    if not spec.get("num_experts", 0) or index < first_dense:
        return False
    return (index - first_dense) % spec.get("moe_layer_freq", 1) == 0


class Block(nn.Module):
    def __init__(self, spec: Dict[str, Any], index: int, selective: bool):
        super().__init__()
        self.norm1, self.norm2 = _norm(spec), _norm(spec)
        self.attn = Attention(spec, selective)
        self.mlp = MoE(spec) if _is_moe_layer(spec, index) else Mlp(spec, spec["ffn_hidden_size"])
        self.dropout = nn.Dropout(spec.get("hidden_dropout", 0.0))  # after attention and MLP, as Megatron
        # sandwich_norm: a norm on the attention output and on the MLP output before the residual add (HF
        # modeling_gemma2.py post_attention_layernorm / post_feedforward_layernorm).
        sandwich = spec.get("sandwich_norm", False)
        self.post_attn_norm = _norm(spec) if sandwich else nn.Identity()
        self.post_mlp_norm = _norm(spec) if sandwich else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.post_attn_norm(self.attn(self.norm1(x))))
        return x + self.dropout(self.post_mlp_norm(self.mlp(self.norm2(x))))


class Embed(nn.Module):
    def __init__(self, spec: Dict[str, Any]):
        super().__init__()
        self.tokens = nn.Embedding(spec["vocab_size"], spec["hidden_size"])
        learned = spec.get("position_embedding", "rope") == "learned"
        self.positions = nn.Embedding(spec["max_position_embeddings"], spec["hidden_size"]) if learned else None
        self.dropout = nn.Dropout(spec.get("hidden_dropout", 0.0))  # embedding dropout, as Megatron

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)
        if self.positions is not None:
            x = x + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return self.dropout(x)


class Head(nn.Module):
    def __init__(self, spec: Dict[str, Any]):
        super().__init__()
        self.norm = _norm(spec)
        self.lm_head = nn.Linear(spec["hidden_size"], spec["vocab_size"], bias=False)
        self.softcap = spec.get("logit_softcapping", 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(x))
        if self.softcap:  # cap * tanh(logits / cap) (HF modeling_gemma2.py final_logit_softcapping)
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


class Gpt(nn.Module):
    """The whole model in one module (no pipeline); full recompute per Megatron's uniform/block methods.

    `_tp_plan` is the AutoTP sharding plan, in the Hugging Face form that `deepspeed.initialize` reads from the model
    class (deepspeed 0.19.8 runtime/tensor_parallel/config.py `_get_hf_tp_plan`, converted by
    module_inject/tp_plan_converter.py). It is Megatron's layout (Shoeybi et al., arXiv:1909.08053 sec. 3): Q/K/V and
    the MLP's up/gate projections split by output columns, the attention output and MLP down projections by input
    rows (one all-reduce each). Routed experts stay whole (DeepSpeed has no expert tensor parallelism, etp=1); the
    shared expert is split like a dense MLP. Embedding, norms, router and LM head are not listed, so they are
    replicated: DeepSpeed leaves modules the plan does not name untouched (module_inject/auto_tp.py
    `_replace_module`)."""

    _tp_plan = {
        "blocks.*.attn.q_proj": "colwise", "blocks.*.attn.k_proj": "colwise", "blocks.*.attn.v_proj": "colwise",
        "blocks.*.attn.o_proj": "rowwise",
        "blocks.*.mlp.up_proj": "colwise", "blocks.*.mlp.gate_proj": "colwise", "blocks.*.mlp.down_proj": "rowwise",
        "blocks.*.mlp.shared.up_proj": "colwise", "blocks.*.mlp.shared.gate_proj": "colwise",
        "blocks.*.mlp.shared.down_proj": "rowwise",
    }

    def __init__(self, spec: Dict[str, Any], recompute: str, method: str, group: int):
        super().__init__()
        self.embed, self.head = Embed(spec), Head(spec)
        self.blocks = nn.ModuleList(Block(spec, i, recompute == "selective") for i in range(spec["num_layers"]))
        if spec.get("tie_embeddings", False):
            self.head.lm_head.weight = self.embed.tokens.weight
        self.recompute, self.method, self.group = recompute, method, group

    def _run(self, start: int, stop: int, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks[start:stop]:
            x = block(x)
        return x

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x, n = self.embed(ids), len(self.blocks)
        if self.recompute != "full" or not self.training:
            return lm_loss(self.head(self._run(0, n, x)), labels)
        if self.method == "uniform":  # checkpoint groups of `group` layers
            for start in range(0, n, self.group):
                x = torch.utils.checkpoint.checkpoint(self._run, start, min(n, start + self.group), x,
                                                      use_reentrant=False)
        else:  # block: checkpoint each of the first `group` layers, run the rest normally
            for i in range(n):
                x = torch.utils.checkpoint.checkpoint(self._run, i, i + 1, x, use_reentrant=False) \
                    if i < self.group else self.blocks[i](x)
        return lm_loss(self.head(x), labels)


def build_pipeline(spec: Dict[str, Any], stages: int, recompute: str, interval: int):
    from deepspeed.pipe import LayerSpec, PipelineModule

    layers = [LayerSpec(Embed, spec)]
    layers += [LayerSpec(Block, spec, i, recompute == "selective") for i in range(spec["num_layers"])]
    layers += [LayerSpec(Head, spec)]
    return PipelineModule(layers=layers, num_stages=stages, loss_fn=lm_loss, partition_method="uniform",
                          checkpointable_layers=["Block"],  # never the embedding: its input ids carry no grad
                          activation_checkpoint_interval=interval if recompute == "full" else 0)


class AutoTpGroups:
    """Tensor- and data-parallel process groups of an AutoTP run, handed to `deepspeed.initialize` as its `mpu`.

    DeepSpeedConfig checks train_batch_size == micro * gas * (data-parallel size) with the size taken from
    `mpu.get_data_parallel_world_size()`, and without an mpu from the whole world (deepspeed 0.19.8
    runtime/config.py `DeepSpeedConfig.__init__`, `_batch_assertion`): AutoTP's own groups are built later, in the
    engine (runtime/engine.py `_configure_tensor_parallel_states`), so without this object the tensor-parallel
    ranks count as data parallel. The layout is DeepSpeed's (utils/groups.py `_init_tp_mesh_device`, a (dp, tp)
    mesh): a tensor-parallel group is `tp` consecutive ranks, a data-parallel group every tp-th rank."""

    def __init__(self, tp: int):
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        if tp < 1 or world % tp:
            raise ValueError(f"tensor_parallel.autotp_size={tp} must divide the world size {world}")
        self.tp, self.dp = tp, world // tp
        self.tp_rank, self.dp_rank = rank % tp, rank // tp
        # Every rank creates every group, in the same order (torch.distributed.new_group's contract).
        for first in range(0, world, tp):
            group = dist.new_group(list(range(first, first + tp)))
            if first == rank - self.tp_rank:
                self.tp_group = group
        for offset in range(tp):
            group = dist.new_group(list(range(offset, world, tp)))
            if offset == self.tp_rank:
                self.dp_group = group

    def get_model_parallel_world_size(self) -> int:
        return self.tp

    def get_model_parallel_rank(self) -> int:
        return self.tp_rank

    def get_model_parallel_group(self):
        return self.tp_group

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tp

    def get_tensor_model_parallel_rank(self) -> int:
        return self.tp_rank

    def get_tensor_model_parallel_group(self):
        return self.tp_group

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return self.dp_rank

    def get_data_parallel_group(self):
        return self.dp_group


def check_autotp(spec: Dict[str, Any], tp: int) -> None:
    """AutoTP splits Q by whole heads and K/V by whole key-value groups; it cannot replicate K/V heads as
    Megatron does when tp exceeds the group count (runtime/engine.py: ranks past the kv-head count get no shard)."""
    heads, groups = spec["num_attention_heads"], spec["num_query_groups"]
    if heads % tp or groups % tp:
        raise ValueError(f"tensor_parallel.autotp_size={tp} must divide num_attention_heads={heads} and "
                         f"num_query_groups={groups}")


# ----------------------------------------------------------------------------------------------- run
def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deepspeed_config", "--deepspeed-config", required=True, help="ds_config.json")
    p.add_argument("--model-json", required=True, help="ModelSpec JSON")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--iters", type=int, default=10, help="optimizer steps to run")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    p.add_argument("--recompute-method", choices=("uniform", "block"), default="uniform")
    p.add_argument("--recompute-layers", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--save-dir", default=None, help="checkpoint folder (engine.save_checkpoint)")
    p.add_argument("--save-interval", type=int, default=0, help="steps between checkpoints; 0 = none")
    p.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    return p.parse_args(argv)


def _maybe_fault(rank: int) -> None:
    fault = os.environ.get("AUTOPLAN_FAULT", "")
    only = os.environ.get("AUTOPLAN_FAULT_RANK")
    if not fault or (only is not None and int(only) != rank):
        return
    if fault == "fail":
        raise RuntimeError(f"AUTOPLAN_FAULT=fail: injected failure on rank {rank}")
    if fault == "oom":
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (AUTOPLAN_FAULT=oom: injected "
                                     f"on rank {rank})")
    if fault == "hang":
        print(f"AUTOPLAN_FAULT=hang: rank {rank} sleeping", flush=True)
        while True:
            time.sleep(3600)
    raise ValueError(f"AUTOPLAN_FAULT must be 'fail', 'oom' or 'hang', got {fault!r}")


def emit_line(text: str) -> None:
    """One os.write of the whole line: ranks share the output pipe, and writes up to PIPE_BUF (4 KiB) are not
    interleaved, while a buffered print of a long buffer may be."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (text + "\n").encode())


def _memory() -> Dict[str, Optional[float]]:
    device_peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return {"device_mem_peak_gib": device_peak, "host_rss_peak_gib": rss_kib / 2**20}


def _batches(vocab: int, mbs: int, seq: int, device: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    while True:
        tokens = torch.randint(0, vocab, (mbs, seq + 1), generator=gen)
        yield tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def build_engine(spec: Dict[str, Any], config: Dict[str, Any], args: argparse.Namespace, stages: int, tp: int):
    """(engine, model, mpu): the model, sharded by AutoTP when tp > 1, wrapped by `deepspeed.initialize`."""
    import deepspeed

    if stages > 1:
        model = build_pipeline(spec, stages, args.recompute, args.recompute_layers)
    else:
        model = Gpt(spec, args.recompute, args.recompute_method, args.recompute_layers)
    mpu = None
    if tp > 1:
        # AutoTP from the config: deepspeed.initialize shards `model` by Gpt._tp_plan; the mpu sizes the batch.
        check_autotp(spec, tp)
        mpu = AutoTpGroups(tp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, mpu=mpu)
    return engine, model, mpu


def main(argv: Optional[List[str]] = None) -> int:
    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    args = parse_args(argv)
    spec = json.loads(open(args.model_json).read())
    config = json.loads(open(args.deepspeed_config).read())
    torch.manual_seed(args.seed)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        torch.cuda.set_device(args.local_rank)
    device = get_accelerator().current_device_name()

    stages = int(config.get("pipeline", {}).get("stages", 1))
    tp = int(config.get("tensor_parallel", {}).get("autotp_size", 1) or 1)
    engine, model, mpu = build_engine(spec, config, args, stages, tp)
    emit_line(LAYOUT_PREFIX + json.dumps({"rank": rank, "tensor_parallel": tp, "data_parallel": engine.dp_world_size,
                                          "local_params": _local_params(model)}))
    mbs, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    tokens_per_step = engine.train_batch_size() * args.seq_len
    data = _batches(spec["vocab_size"], mbs, args.seq_len, device, args.seed + _data_parallel_rank(engine, mpu))
    for iteration in range(1, args.iters + 1):
        if iteration == 1:
            _maybe_fault(rank)
        get_accelerator().synchronize()
        start = time.perf_counter()
        loss = _step(engine, data, gas, stages)
        get_accelerator().synchronize()
        elapsed = time.perf_counter() - start
        record = {"rank": rank, "world_size": world, "iteration": iteration, "elapsed_ms": round(elapsed * 1e3, 3),
                  "tokens_per_s": round(tokens_per_step / elapsed, 3),
                  "loss": None if loss is None or not math.isfinite(loss) else round(loss, 5), **_memory()}
        emit_line(ITER_PREFIX + json.dumps(record))
        if args.save_dir and args.save_interval > 0 and iteration % args.save_interval == 0:
            engine.save_checkpoint(args.save_dir, tag=f"step{iteration}")
    _shutdown(engine, rank, args.iters, world)
    return 0


def _shutdown(engine, rank: int, iters: int, world: int) -> None:
    """Orderly teardown: the engine releases its hooks and ZeRO-3 gather handles (runtime/engine.py `destroy`)
    and every rank has done so (the barrier) before any rank tears down the process group."""
    import torch.distributed as dist

    engine.destroy()
    dist.barrier()
    if rank == 0:
        emit_line(DONE_PREFIX + json.dumps({"iterations": iters, "world_size": world}))
    dist.destroy_process_group()


def _local_params(model: nn.Module) -> int:
    """Parameters this rank's model holds; ZeRO-3 keeps the unpartitioned count in `ds_numel`."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def _data_parallel_rank(engine, mpu: Optional[AutoTpGroups]) -> int:
    """Ranks of one model replica (pipeline stages, AutoTP shards) must read the same tokens; DeepSpeed checks
    this for AutoTP on the first forward (runtime/engine.py `check_dataloader_inputs_same_across_ranks`)."""
    import torch.distributed as dist

    if hasattr(engine, "grid"):  # PipelineEngine's process topology
        return engine.grid.get_data_parallel_rank()
    return mpu.get_data_parallel_rank() if mpu is not None else dist.get_rank()


def _step(engine, data, gas: int, stages: int) -> Optional[float]:
    """One optimizer step of `gas` microbatches; this rank's last loss (None where the rank holds none)."""
    if stages > 1:
        loss = engine.train_batch(data_iter=data)
        return float(loss) if loss is not None and engine.is_last_stage() else None
    loss = None
    for _ in range(gas):
        ids, labels = next(data)
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()
    return float(loss.detach()) if loss is not None else None


if __name__ == "__main__":
    sys.exit(main())
