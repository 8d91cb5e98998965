"""One rank's shard of each layer kind, built in PyTorch at the sizes `shards.shard_dims` gives (simulated TP/EP:
this device runs one rank's share; the collectives between ranks are not run here, they are costed separately).

Every module takes `make_inputs(mbs, seq)` tensors and returns the tensor that backward starts from. Layouts are
[batch, seq, hidden]; shapes follow the Hugging Face modelling files (llama, mixtral, deepseek_v3) and Megatron-LM's
GPT layers. Sliding-window attention is run as full causal attention (an upper bound on its cost)."""
from __future__ import annotations

from typing import Callable, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoplan.model import ModelSpec
from autoplan.profiler.shards import ShardDims, shard_dims, tokens_per_local_expert

LinearFactory = Callable[[int, int, bool], nn.Module]


def torch_linear(in_features: int, out_features: int, bias: bool) -> nn.Module:
    return nn.Linear(in_features, out_features, bias=bias)


def make_norm(model: ModelSpec, width: int) -> nn.Module:
    if model.normalization == "layernorm":
        return nn.LayerNorm(width)
    return nn.RMSNorm(width, eps=1e-6)


def rotary_tables(seq: int, dim: int, base: float, device, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of RoPE (Su et al., arXiv:2104.09864 eq. 34) in the rotate-half layout, shape [seq, dim]."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, heads, s, d]; cos/sin: [s, d]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class ProfiledLayer(nn.Module):
    """A layer shard with its own input factory. Subclasses set `hidden_input`: whether the input is a hidden
    state whose gradient backward must produce (False for token ids)."""

    hidden_input = True

    def __init__(self, model: ModelSpec, dims: ShardDims):
        super().__init__()
        self.spec = model
        self.dims = dims

    def make_inputs(self, mbs: int, seq: int, device, dtype) -> Tuple[torch.Tensor, ...]:
        x = torch.randn(mbs, seq, self.spec.hidden_size, device=device, dtype=dtype)
        return (x.requires_grad_(True),)


class RopeCache:
    """Rotary tables per (seq, dim, device, dtype), built once."""

    def __init__(self, base: float):
        self.base = base
        self.tables = {}

    def get(self, seq: int, dim: int, ref: torch.Tensor):
        key = (seq, dim, ref.device, ref.dtype)
        if key not in self.tables:
            self.tables[key] = rotary_tables(seq, dim, self.base, ref.device, ref.dtype)
        return self.tables[key]


class Attention(ProfiledLayer):
    """Input norm, fused QKV projection, RoPE, causal SDPA with GQA, output projection."""

    def __init__(self, model: ModelSpec, dims: ShardDims, linear: LinearFactory):
        super().__init__(model, dims)
        d, h = model.kv_channels, model.hidden_size
        self.norm = make_norm(model, h)
        self.qkv = linear(h, (dims.heads + 2 * dims.groups) * d, model.add_bias_linear or model.add_qkv_bias)
        self.q_norm = nn.RMSNorm(d, eps=1e-6) if model.qk_layernorm else None
        self.k_norm = nn.RMSNorm(d, eps=1e-6) if model.qk_layernorm else None
        self.proj = linear(dims.heads * d, h, model.add_bias_linear)
        self.rope = RopeCache(model.rotary_base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d, heads, groups = self.spec.kv_channels, self.dims.heads, self.dims.groups
        q, k, v = self.qkv(self.norm(x)).split([heads * d, groups * d, groups * d], dim=-1)
        q = q.view(b, s, heads, d).transpose(1, 2)
        k = k.view(b, s, groups, d).transpose(1, 2)
        v = v.view(b, s, groups, d).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.spec.position_embedding == "rope":
            cos, sin = self.rope.get(s, d, q)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=groups != heads)
        return self.proj(out.transpose(1, 2).reshape(b, s, heads * d))


class LatentAttention(ProfiledLayer):
    """Multi-latent attention (DeepSeek-V2, arXiv:2405.04434 eq. 9-19): replicated q/kv down projections, per-rank
    up projections for heads/tp heads, decoupled RoPE keys shared by all heads, causal SDPA, output projection."""

    def __init__(self, model: ModelSpec, dims: ShardDims, linear: LinearFactory):
        super().__init__(model, dims)
        h, heads = model.hidden_size, dims.heads
        qk, rope, v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        self.norm = make_norm(model, h)
        if model.q_lora_rank:
            self.q_down = linear(h, model.q_lora_rank, False)
            self.q_down_norm = nn.RMSNorm(model.q_lora_rank, eps=1e-6)
            self.q_up = linear(model.q_lora_rank, heads * (qk + rope), False)
        else:
            self.q_down = self.q_down_norm = None
            self.q_up = linear(h, heads * (qk + rope), False)
        self.kv_down = linear(h, model.kv_lora_rank + rope, False)
        self.kv_down_norm = nn.RMSNorm(model.kv_lora_rank, eps=1e-6)
        self.kv_up = linear(model.kv_lora_rank, heads * (qk + v), False)
        self.proj = linear(heads * v, h, model.add_bias_linear)
        self.rope = RopeCache(model.rotary_base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, heads = self.spec, self.dims.heads
        qk, rope, vd = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
        b, s, _ = x.shape
        x = self.norm(x)
        q_in = self.q_down_norm(self.q_down(x)) if self.q_down is not None else x
        q = self.q_up(q_in).view(b, s, heads, qk + rope).transpose(1, 2)
        q_nope, q_pe = q.split([qk, rope], dim=-1)
        latent, k_pe = self.kv_down(x).split([m.kv_lora_rank, rope], dim=-1)
        kv = self.kv_up(self.kv_down_norm(latent)).view(b, s, heads, qk + vd).transpose(1, 2)
        k_nope, v = kv.split([qk, vd], dim=-1)
        k_pe = k_pe.view(b, 1, s, rope)
        if rope:
            cos, sin = self.rope.get(s, rope, q_pe)
            q_pe, k_pe = apply_rotary(q_pe, cos, sin), apply_rotary(k_pe, cos, sin)
        q = torch.cat((q_nope, q_pe), dim=-1)
        k = torch.cat((k_nope, k_pe.expand(b, heads, s, rope)), dim=-1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, s, heads * vd))


def mlp_forward(fc1: nn.Module, fc2: nn.Module, gated: bool, x: torch.Tensor) -> torch.Tensor:
    """SwiGLU (Shazeer, arXiv:2002.05202 eq. 6: silu(xW) * xV, then W2) or GELU MLP."""
    y = fc1(x)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    else:
        y = F.gelu(y, approximate="tanh")
    return fc2(y)


class Mlp(ProfiledLayer):
    """Pre-MLP norm and the dense MLP at ffn/tp width (gate and up fused as in Megatron's linear_fc1)."""

    def __init__(self, model: ModelSpec, dims: ShardDims, linear: LinearFactory):
        super().__init__(model, dims)
        mult = 2 if model.gated_mlp else 1
        self.norm = make_norm(model, model.hidden_size)
        self.fc1 = linear(model.hidden_size, mult * dims.ffn, model.add_bias_linear)
        self.fc2 = linear(dims.ffn, model.hidden_size, model.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mlp_forward(self.fc1, self.fc2, self.spec.gated_mlp, self.norm(x))


class Moe(ProfiledLayer):
    """Pre-MLP norm, router (softmax top-k), token permutation to this rank's E/ep experts with a balanced load,
    grouped expert GEMMs (one batched matmul over the local experts), weighted combine, and shared experts.

    The routing decision is computed and its top-k probabilities weight the outputs (so the router gets
    gradients), but rows are assigned round-robin so every local expert gets exactly the balanced share."""

    def __init__(self, model: ModelSpec, dims: ShardDims, linear: LinearFactory, ep: int):
        super().__init__(model, dims)
        h, mult = model.hidden_size, 2 if model.gated_mlp else 1
        self.ep = ep
        self.norm = make_norm(model, h)
        self.router = nn.Linear(h, model.num_experts, bias=False)
        scale = h ** -0.5
        self.w1 = nn.Parameter(torch.randn(dims.local_experts, h, mult * dims.expert_ffn) * scale)
        self.w2 = nn.Parameter(torch.randn(dims.local_experts, dims.expert_ffn, h) * dims.expert_ffn ** -0.5)
        self.shared_fc1 = linear(h, mult * dims.shared_ffn, False) if dims.shared_ffn else None
        self.shared_fc2 = linear(dims.shared_ffn, h, False) if dims.shared_ffn else None
        self._rows = {}

    def _row_index(self, tokens: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
        """(token id, top-k slot) of each permuted row: rows r = 0..E_local*per_expert-1 take token (r mod T*k)//k."""
        key = (tokens, device)
        if key not in self._rows:
            k = self.spec.moe_router_topk
            per_expert = tokens_per_local_expert(self.spec, self.ep, tokens)
            flat = torch.arange(self.dims.local_experts * per_expert, device=device) % (tokens * k)
            self._rows[key] = (flat // k, flat % k)
        return self._rows[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        tokens = b * s
        xt = self.norm(x).reshape(tokens, h)
        probs = torch.softmax(self.router(xt).float(), dim=-1)
        top_p, _ = torch.topk(probs, self.spec.moe_router_topk, dim=-1)
        token_id, slot = self._row_index(tokens, x.device)
        rows = xt.index_select(0, token_id).view(self.dims.local_experts, -1, h)
        y = torch.bmm(rows, self.w1)
        if self.spec.gated_mlp:
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y, approximate="tanh")
        y = torch.bmm(y, self.w2).reshape(-1, h)
        y = y * top_p[token_id, slot].to(y.dtype).unsqueeze(-1)
        out = torch.zeros_like(xt).index_add(0, token_id, y)
        if self.shared_fc1 is not None:
            out = out + mlp_forward(self.shared_fc1, self.shared_fc2, self.spec.gated_mlp, xt)
        return out.view(b, s, h)


class Embedding(ProfiledLayer):
    """Vocab-parallel word embedding (Megatron VocabParallelEmbedding: ids outside this rank's rows are masked
    and give zeros) plus learned positions when the model has them."""

    hidden_input = False

    def __init__(self, model: ModelSpec, dims: ShardDims):
        super().__init__(model, dims)
        self.word = nn.Embedding(dims.vocab, model.hidden_size)
        self.positions = (nn.Embedding(model.max_position_embeddings, model.hidden_size)
                          if model.position_embedding == "learned" else None)

    def make_inputs(self, mbs: int, seq: int, device, dtype) -> Tuple[torch.Tensor, ...]:
        return (torch.randint(0, self.spec.vocab_size, (mbs, seq), device=device),)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < 0) | (ids >= self.dims.vocab)  # this rank holds rows [0, vocab/tp)
        out = self.word(ids.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.positions is not None:
            out = out + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return out


class Head(ProfiledLayer):
    """Final norm, LM head over this rank's vocab rows, and cross-entropy over those logits in fp32 (the local part
    of Megatron's vocab-parallel cross-entropy; its all-reduces are costed as communication). The LM head is a
    plain torch Linear even when profiling fp8 (Megatron keeps the output layer out of FP8)."""

    def __init__(self, model: ModelSpec, dims: ShardDims, linear: LinearFactory):
        super().__init__(model, dims)
        self.norm = make_norm(model, model.hidden_size)
        self.out = linear(model.hidden_size, dims.vocab, False)

    def make_inputs(self, mbs: int, seq: int, device, dtype) -> Tuple[torch.Tensor, ...]:
        (x,) = super().make_inputs(mbs, seq, device, dtype)
        return x, torch.randint(0, self.dims.vocab, (mbs * seq,), device=device)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.out(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels)


def build_layer(model: ModelSpec, kind: str, tp: int, ep: int = 1,
                linear: LinearFactory = torch_linear) -> ProfiledLayer:
    """The shard of `kind` for (tp, ep), parameters in fp32 on CPU (the caller moves and casts it)."""
    dims = shard_dims(model, tp, ep)
    if kind == "attention":
        cls = LatentAttention if model.multi_latent_attention else Attention
        return cls(model, dims, linear)
    if kind == "mlp":
        return Mlp(model, dims, linear)
    if kind == "moe":
        if not model.is_moe:
            raise ValueError(f"layer kind 'moe' needs an MoE model; {model.name} is dense")
        return Moe(model, dims, linear, ep)
    if kind == "embedding":
        return Embedding(model, dims)
    if kind == "head":
        return Head(model, dims, torch_linear)  # the output layer stays bf16 under FP8 recipes, as in Megatron
    raise ValueError(f"unknown layer kind {kind!r}")


def layer_kinds(model: ModelSpec) -> Tuple[str, ...]:
    """Kinds a model has: attention, mlp when any layer is dense, moe when any is MoE, embedding, head."""
    kinds = ["attention"]
    if model.num_dense_layers:
        kinds.append("mlp")
    if model.is_moe:
        kinds.append("moe")
    return tuple(kinds) + ("embedding", "head")
