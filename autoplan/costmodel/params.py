"""Parameter counts per layer kind: the shapes every other part of the cost model builds on, importing nothing of
it. Shapes follow Megatron-LM's GPT layers and the Hugging Face modelling files (llama, mixtral, qwen3_moe,
deepseek_v3, gpt_oss); counts exclude vocabulary padding. Mamba-2 mixer shapes (Dao & Gu 2024, arXiv:2405.21060,
sec. 7; megatron/core/ssm/mamba_mixer.py) and the MTP depths (DeepSeek-V3 technical report, arXiv:2412.19437,
sec. 2.2; megatron/core/transformer/multi_token_prediction.py) are described in `layers/mamba.py` and
`layers/mtp.py`, which price their time and memory."""
from __future__ import annotations

from dataclasses import dataclass

from autoplan.model import ModelSpec


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer, split by how they are sharded."""

    attention: int  # QKV/MLA projections + output projection (+ biases, qk norms): sharded by tp
    norms: int  # layer norms: replicated across tp
    dense_mlp: int  # dense MLP (0 in an MoE layer): sharded by tp
    router: int  # MoE router: replicated
    experts: int  # all routed experts of the layer: sharded by ep * etp
    shared_experts: int  # shared experts: sharded by tp
    active_experts: int  # the top-k routed experts a token uses
    indexer: int = 0  # DSA lightning indexer (`dsa_indexer_params`): replicated across tp

    @property
    def total(self) -> int:
        return self.attention + self.norms + self.dense_mlp + self.router + self.experts + self.shared_experts + \
            self.indexer

    @property
    def active(self) -> int:
        return self.attention + self.norms + self.dense_mlp + self.router + self.active_experts + \
            self.shared_experts + self.indexer


def attention_params(m: ModelSpec) -> int:
    """Attention weights of one layer that tensor parallelism splits (a DSA indexer's are `dsa_indexer_params`)."""
    h = m.hidden_size
    if m.multi_latent_attention:
        # DeepSeek-V2 (arXiv:2405.04434) eq. 9-14: low-rank q (optional) and joint kv compression.
        qk_dim = m.qk_head_dim + m.qk_pos_emb_head_dim
        heads = m.num_attention_heads
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk_dim  # q_a, q_a_norm, q_b
        else:
            q = h * heads * qk_dim
        kv = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank  # kv_a (+rope k), kv_a_norm
        kv += m.kv_lora_rank * heads * (m.qk_head_dim + m.v_head_dim)  # kv_b
        out = heads * m.v_head_dim * h
        return q + kv + out + (h if m.add_bias_linear else 0)
    q_size = m.num_attention_heads * m.kv_channels
    kv_size = m.num_query_groups * m.kv_channels
    qkv = h * (q_size + 2 * kv_size)
    if m.add_bias_linear or m.add_qkv_bias:
        qkv += q_size + 2 * kv_size
    out = q_size * h + (h if m.add_bias_linear else 0)
    if m.attention_output_gate:  # Qwen3-Next: q_proj's second half is the per-head output gate
        qkv += h * q_size + (q_size if m.add_bias_linear or m.add_qkv_bias else 0)
    qk_norm = 0
    if m.qk_layernorm:  # per-head scale (Qwen3), or one over the whole q and k projections (OLMo-2, MiniMax-M2)
        qk_norm = 2 * m.kv_channels if m.qk_norm_scope == "head" else q_size + kv_size
    sinks = m.num_attention_heads if m.attention_sinks else 0  # gpt-oss `sinks`, one learned logit per head
    return qkv + out + qk_norm + sinks


def dsa_indexer_params(m: ModelSpec) -> int:
    """DeepSeek-V3.2's lightning indexer (modeling_deepseek_v32.py DeepseekV32Indexer; DeepSeek-V3.2-Exp
    inference/model.py Indexer): wq_b (q_lora_rank -> heads x d_I), wk (h -> d_I), a LayerNorm on k (scale and
    bias, d_I each) and weights_proj (h -> heads). Megatron builds its linears with parallel_mode="duplicated"
    (megatron/core/transformer/experimental_attention_variant/dsa.py DSAIndexer, core_v0.19.0): every tensor-
    parallel rank holds the whole indexer."""
    if not m.dsa_index_heads:
        return 0
    heads, d = m.dsa_index_heads, m.dsa_index_head_dim
    return m.q_lora_rank * heads * d + m.hidden_size * d + 2 * d + m.hidden_size * heads


def dsa_indexer_share(m: ModelSpec) -> float:
    """The share of the layers that run a DSA lightning indexer of their own (ModelSpec.dsa_computes_topk): the
    mean per layer, exact over the model; a pipeline rank's own count is costmodel/stages.py's."""
    return m.num_dsa_indexer_layers / m.num_layers


def gdn_key_dim(m: ModelSpec) -> int:
    return m.gdn_num_key_heads * m.gdn_key_head_dim


def gdn_value_dim(m: ModelSpec) -> int:
    return m.gdn_num_value_heads * m.gdn_value_head_dim


def gdn_conv_channels(m: ModelSpec) -> int:
    """Channels of Gated DeltaNet's depthwise conv1d: q, k and v."""
    return 2 * gdn_key_dim(m) + gdn_value_dim(m)


def gdn_params(m: ModelSpec) -> int:
    """One Gated DeltaNet mixer (Yang et al. 2024, arXiv:2412.06464; modeling_qwen3_next.py
    Qwen3NextGatedDeltaNet): in_proj_qkvz (h -> 2 key_dim + 2 value_dim: q, k, v and the output gate z),
    in_proj_ba (h -> 2 value heads: beta and the decay input a), a bias-free conv1d over q, k, v, dt_bias and A_log
    per value head, a gated RMSNorm over one value head and out_proj (value_dim -> h)."""
    h = m.hidden_size
    in_proj = h * (2 * gdn_key_dim(m) + 2 * gdn_value_dim(m)) + h * 2 * m.gdn_num_value_heads
    conv = gdn_conv_channels(m) * m.gdn_conv_kernel
    return in_proj + conv + 2 * m.gdn_num_value_heads + m.gdn_value_head_dim + gdn_value_dim(m) * h


def mixer_params(m: ModelSpec):
    """Token-mixer weights of one layer of a standard decoder, as the mean over its layers (exact in total):
    softmax attention, or Gated DeltaNet on `linear_attention_layers` of them, plus a parallel Mamba-2 mixer in
    every layer of a `parallel_mamba` model."""
    attention = attention_params(m)
    if m.linear_attention_layers:
        n_lin = m.linear_attention_layers
        attention = ((m.num_layers - n_lin) * attention + n_lin * gdn_params(m)) / m.num_layers
    if m.parallel_mamba:
        attention += mamba_mixer_params(m)
    return attention


def mlp_params(m: ModelSpec, ffn: int, bias: bool) -> int:
    """One MLP of inner width `ffn`: SwiGLU has gate, up and down matrices; GELU has up and down."""
    h = m.hidden_size
    mats = 3 if m.gated_mlp else 2
    weights = mats * h * ffn
    biases = ((mats - 1) * ffn + h) if bias else 0
    return weights + biases


def norm_params(m: ModelSpec) -> int:
    """One norm over h: RMSNorm has a scale, LayerNorm a scale and a bias."""
    return m.hidden_size * (2 if m.normalization == "layernorm" else 1)


def norms_per_layer(m: ModelSpec) -> int:
    """Norms over h in one decoder layer: the two pre-norms, plus the norms on the attention output and on the MLP
    output with `sandwich_norm` (HF modeling_gemma2.py Gemma2DecoderLayer post_attention_layernorm /
    post_feedforward_layernorm; modeling_glm4.py Glm4DecoderLayer post_self_attn_layernorm / post_mlp_layernorm)."""
    return 4 if m.sandwich_norm else 2


def mamba_in_proj_width(m: ModelSpec) -> int:
    """Output width of in_proj: z and x (d_inner each), B and C (G x N each), dt (one per head)."""
    return 2 * m.mamba_d_inner + 2 * m.mamba_num_groups * m.mamba_state_dim + m.mamba_num_heads


def mamba_conv_channels(m: ModelSpec) -> int:
    """Channels of the depthwise conv1d: x, B and C."""
    return m.mamba_d_inner + 2 * m.mamba_num_groups * m.mamba_state_dim


def mamba_mixer_params(m: ModelSpec) -> int:
    """One Mamba-2 mixer (mamba_mixer.py): in_proj, conv1d weight + bias, dt_bias, A_log, D, gated-norm scale,
    out_proj; the layer's pre-norm is counted by the caller."""
    h = m.hidden_size
    conv = mamba_conv_channels(m) * (m.mamba_conv_kernel + 1)
    norm = m.mamba_d_inner if m.mamba_gated_norm else 0  # Falcon-H1 mamba_rms_norm false: no gated norm
    return h * mamba_in_proj_width(m) + conv + 3 * m.mamba_num_heads + norm + m.mamba_d_inner * h


def latent_projection_params(m: ModelSpec) -> int:
    """fc1_latent_proj (h -> latent) and fc2_latent_proj (latent -> h) of a latent MoE layer."""
    return 2 * m.hidden_size * m.moe_latent_size if m.moe_latent_size else 0


def expert_width(m: ModelSpec) -> int:
    """Width the routed experts read and write: the latent size of a latent MoE, else h."""
    return m.moe_latent_size or m.hidden_size


def non_moe_counts(m: ModelSpec):
    """(Mamba, attention, MLP) layers of the pattern and their total (at least 1)."""
    n_m, n_a, n_f = m.layer_count("M"), m.layer_count("*"), m.layer_count("-")
    return n_m, n_a, n_f, max(n_m + n_a + n_f, 1)


def hybrid_layer_params(m: ModelSpec, moe: bool) -> LayerParams:
    """A hybrid model's 'E' layer (`moe`), or the mean of its M, * and - layers (autoplan/costmodel/layers/mamba.py).
    Every hybrid layer has one pre-norm. Mamba mixers and attention count as `attention` (tp-sharded), the MLP
    as `dense_mlp`; a latent MoE's two projections are tp-sharded like the shared experts."""
    norm = norm_params(m)
    if moe:
        width = expert_width(m)
        mats = 3 if m.gated_mlp else 2
        expert = mats * width * m.moe_ffn_hidden_size
        router = m.hidden_size * m.num_experts
        shared = mlp_params(m, m.shared_expert_ffn_hidden_size, False) if m.shared_expert_ffn_hidden_size else 0
        shared += latent_projection_params(m)
        return LayerParams(0, norm, 0, router, m.num_experts * expert, shared, m.moe_router_topk * expert)
    n_m, n_a, n_f, n = non_moe_counts(m)
    mixers = n_m * mamba_mixer_params(m) + n_a * attention_params(m)
    mlp = n_f * mlp_params(m, m.ffn_hidden_size, m.add_bias_linear)
    return LayerParams(mixers / n, norm, mlp / n, 0, 0, 0, 0)


def layer_params(m: ModelSpec, moe: bool) -> LayerParams:
    """Parameters of one dense (`moe=False`) or MoE decoder layer (a hybrid's: `hybrid_layer_params`)."""
    if m.is_hybrid:
        return hybrid_layer_params(m, moe)
    attention = mixer_params(m)
    norms = norms_per_layer(m) * norm_params(m)
    indexer = dsa_indexer_params(m) * dsa_indexer_share(m)
    if not moe:
        return LayerParams(attention, norms, mlp_params(m, m.ffn_hidden_size, m.add_bias_linear), 0, 0, 0, 0,
                           indexer)
    expert = mlp_params(m, m.moe_ffn_hidden_size, m.add_bias_linear)
    router = m.hidden_size * m.num_experts + (m.num_experts if m.add_bias_linear else 0)
    shared = mlp_params(m, m.shared_expert_ffn_hidden_size, False) if m.shared_expert_ffn_hidden_size else 0
    shared += m.hidden_size if m.shared_expert_gate else 0  # Qwen3-Next shared_expert_gate: Linear(h, 1)
    return LayerParams(attention, norms, 0, router, m.num_experts * expert, shared, m.moe_router_topk * expert,
                       indexer)


def symbol_params(m: ModelSpec, symbol: str):
    """(tp-sharded, replicated, expert) parameters of one hybrid layer of kind `symbol`, its pre-norm included."""
    if symbol == "E":
        p = hybrid_layer_params(m, True)
        return p.shared_experts, p.norms + p.router, p.experts
    body = {"M": lambda: mamba_mixer_params(m), "*": lambda: attention_params(m),
            "-": lambda: mlp_params(m, m.ffn_hidden_size, m.add_bias_linear)}[symbol]()
    return body, norm_params(m) + (dsa_indexer_params(m) if symbol == "*" else 0), 0


def mtp_params(m: ModelSpec):
    """(tp-sharded, replicated, expert) parameters of the MTP depths: eh_proj and the layers per depth (once when
    shared), three norms per depth. The LM head is the model's own."""
    if not m.mtp_num_layers:
        return 0, 0, 0
    weight_sets = 1 if m.mtp_shared_weights else m.mtp_num_layers
    sharded = replicated = expert = 0
    for symbol in m.mtp_depth_pattern:
        s, r, e = symbol_params(m, symbol)
        sharded, replicated, expert = sharded + s, replicated + r, expert + e
    h = m.hidden_size
    return (weight_sets * (sharded + 2 * h * h), weight_sets * replicated + m.mtp_num_layers * 3 * h,
            weight_sets * expert)


def embedding_params(m: ModelSpec) -> int:
    """Input word embedding (+ learned positions)."""
    pos = m.max_position_embeddings * m.hidden_size if m.position_embedding == "learned" else 0
    return m.vocab_size * m.hidden_size + pos


def head_params(m: ModelSpec) -> int:
    """Final norm and the LM head (0 extra weights when tied to the embedding)."""
    return norm_params(m) + (0 if m.tie_embeddings else m.vocab_size * m.hidden_size)


def count_parameters(m: ModelSpec) -> tuple[int, int]:
    """(total, active-per-token) parameters of the whole model."""
    dense, moe = layer_params(m, False), layer_params(m, True) if m.is_moe else None
    n_moe = m.num_moe_layers
    n_dense = m.num_layers - n_moe  # for a hybrid: its M, * and - layers, whose mean `dense` holds
    total = n_dense * dense.total + (n_moe * moe.total if moe else 0) + embedding_params(m) + head_params(m)
    active = n_dense * dense.active + (n_moe * moe.active if moe else 0) + embedding_params(m) + head_params(m)
    if m.mtp_num_layers:
        sharded, replicated, expert = mtp_params(m)
        total += sharded + replicated + expert
        active += sharded + replicated + expert * m.moe_router_topk / max(m.num_experts, 1)
    return int(round(total)), int(round(active))
