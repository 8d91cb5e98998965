"""`ModelSpec`: the architecture of a transformer language model, dense or MoE, as the cost model needs it."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelSpec(BaseModel):
    """A decoder-only transformer. Sizes are counts (not bytes); all are per model, not per rank."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Display name, e.g. 'llama3-70b'.")
    num_layers: int = Field(gt=0, description="Transformer decoder layers (Megatron --num-layers).")
    hidden_size: int = Field(gt=0, description="Model width h.")
    ffn_hidden_size: int = Field(gt=0, description="Dense MLP inner width (per SwiGLU branch for swiglu).")
    num_attention_heads: int = Field(gt=0, description="Query heads a.")
    num_query_groups: int = Field(gt=0, description="Key/value heads (GQA groups); equals heads for MHA.")
    kv_channels: int = Field(gt=0, description="Per-head dimension d_head (Megatron --kv-channels).")
    vocab_size: int = Field(gt=0, description="Vocabulary size V (before padding).")
    max_position_embeddings: int = Field(gt=0, description="Longest sequence the positions support, tokens.")
    activation: Literal["swiglu", "gelu"] = Field("swiglu", description="MLP activation; swiglu has 3 matrices.")
    normalization: Literal["rmsnorm", "layernorm"] = Field("rmsnorm", description="Norm layer type.")
    position_embedding: Literal["rope", "learned"] = Field("rope", description="Rotary or learned absolute.")
    rotary_base: float = Field(10000.0, gt=0, description="RoPE theta.")
    tie_embeddings: bool = Field(False, description="Input embedding and LM head share one matrix.")
    add_bias_linear: bool = Field(False, description="Linear layers carry biases (GPT-2/3 style).")
    add_qkv_bias: bool = Field(False, description="QKV projection carries a bias (Qwen2).")
    qk_layernorm: bool = Field(False, description="Per-head norm on Q and K (Qwen3).")
    hidden_dropout: float = Field(0.0, ge=0.0, lt=1.0, description=(
        "Dropout probability after attention, after the MLP and on the embeddings (Megatron --hidden-dropout); "
        "0 stores no dropout masks."))

    # Multi-latent attention (DeepSeek-V2/V3); see arXiv:2405.04434 sec. 2.1.
    multi_latent_attention: bool = Field(False, description="MLA instead of MHA/GQA.")
    q_lora_rank: Optional[int] = Field(None, gt=0, description="MLA query low-rank dim; None = full-rank q.")
    kv_lora_rank: int = Field(0, ge=0, description="MLA compressed KV dim d_c.")
    qk_head_dim: int = Field(0, ge=0, description="MLA per-head no-rope QK dim.")
    qk_pos_emb_head_dim: int = Field(0, ge=0, description="MLA per-head rope QK dim.")
    v_head_dim: int = Field(0, ge=0, description="MLA per-head value dim.")

    # Mixture of experts.
    num_experts: int = Field(0, ge=0, description="Routed experts per MoE layer; 0 = dense model.")
    moe_router_topk: int = Field(0, ge=0, description="Routed experts per token, k.")
    moe_ffn_hidden_size: int = Field(0, ge=0, description="Routed expert inner width.")
    shared_expert_ffn_hidden_size: int = Field(0, ge=0, description="Total shared-expert inner width; 0 = none.")
    moe_layer_freq: int = Field(1, ge=1, description="Every n-th layer (after the dense ones) is MoE.")
    first_k_dense_layers: int = Field(0, ge=0, description="Leading layers that stay dense.")

    # Attention span.
    sliding_window: int = Field(0, ge=0, description="Sliding-window size in tokens; 0 = none.")
    num_sliding_window_layers: int = Field(0, ge=0, description="How many layers use the sliding window.")

    # What training needs to match the released model, without effect on time or memory (written by the emitters).
    rope_scaling: Literal["none", "llama3", "yarn"] = Field("none", description=(
        "RoPE scaling of the HF config's rope_scaling: llama3 (Megatron --use-rope-scaling) or yarn "
        "(--position-embedding-type yarn)."))
    rope_scaling_factor: float = Field(1.0, ge=1.0, description="RoPE scaling factor (context extension ratio).")
    rope_original_max_position_embeddings: int = Field(0, ge=0, description=(
        "YaRN: context length before scaling, tokens (HF rope_scaling.original_max_position_embeddings); 0 = unset."))
    moe_aux_loss_coeff: float = Field(0.001, ge=0.0, description=(
        "Load-balancing loss weight (HF router_aux_loss_coef / aux_loss_alpha, default 0.001 as in transformers' "
        "MixtralConfig; Megatron --moe-aux-loss-coeff)."))
    attention_sinks: bool = Field(False, description=(
        "A learned softmax sink per head (gpt-oss `sinks`; Megatron --softmax-type learnable)."))
    swiglu_limit: float = Field(0.0, ge=0.0, description=(
        "gpt-oss clamped GLU: gate and linear clamped to this value, linear offset by 1 (HF swiglu_limit; Megatron "
        "--quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value); 0 = plain SwiGLU/GELU."))

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.num_experts:
            if not (0 < self.moe_router_topk <= self.num_experts):
                raise ValueError(f"moe_router_topk={self.moe_router_topk} must be in 1..num_experts={self.num_experts}")
            if self.moe_ffn_hidden_size <= 0:
                raise ValueError("moe_ffn_hidden_size must be > 0 for an MoE model")
        if self.multi_latent_attention and (self.kv_lora_rank <= 0 or self.v_head_dim <= 0 or self.qk_head_dim <= 0):
            raise ValueError("MLA needs kv_lora_rank, qk_head_dim and v_head_dim > 0")
        if self.num_sliding_window_layers > self.num_layers:
            raise ValueError("num_sliding_window_layers cannot exceed num_layers")
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (0-based) is an MoE layer (DeepSeek's first_k_dense_replace rule)."""
        if not self.is_moe or index < self.first_k_dense_layers:
            return False
        return (index - self.first_k_dense_layers) % self.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def gated_mlp(self) -> bool:
        return self.activation == "swiglu"
