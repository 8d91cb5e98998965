"""`ModelSpec`: the architecture of a transformer language model, dense or MoE, as the cost model needs it."""
from __future__ import annotations

import math
from functools import lru_cache
from typing import List, Literal, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


HYBRID_SYMBOLS = "M*-E"

# The deepest model read: 2^14 = 16,384 layers, 128x the deepest in the catalogue (gpt-1t, 128 layers; Narayanan et
# al. 2021 Table 1). The cost model and the stage splits walk the layers one by one, so the bound keeps a typo'd
# depth (80,000,000) a one-line error instead of minutes of work.
MAX_LAYERS = 2**14

# Every other size at most 2^31 - 1 (the int32 range Megatron's argparse sizes and TransformerConfig dims are used
# in; the largest catalogue dim, vocab 256,000, is 8,000x below), and every number finite: the cost model multiplies
# sizes in float64 (layers x hidden^2 x ...), which a 400-digit field overflows into a crash or an inf.
MAX_SIZE = 2**31 - 1

# GEMM modules a per-module quantization recipe can take out of the run's FP8/FP4 recipe (Megatron-Core
# `quant_recipe`, megatron/core/quantization/quant_config.py: glob matchers over module names, each mapped to a
# TransformerEngine recipe; megatron/core/extensions/transformer_engine.py `_get_fp8_autocast_for_quant_recipe`:
# an empty training recipe runs the module in bf16, `fp8_quantization_recipe: mxfp8` in MXFP8): attention's
# linear_qkv and linear_proj, a latent MoE's fc1/fc2_latent_proj, every module of the MTP depths, the Mamba
# mixer's out_proj.
QUANT_OVERRIDE_MODULES = ("attention_linear", "latent_proj", "mtp", "mamba_out_proj")


def computes_topk(index: int, freq: int, offset: int) -> bool:
    """Whether layer `index` (from 0) runs its own DSA lightning indexer under top-k sharing every `freq` layers
    after `offset`: Megatron's dsa.py `is_dsa_skip_topk_layer` on the 1-indexed layer number, the offset taken as
    at least 1 (core_v0.19.0)."""
    return freq == 1 or max(index + 1 - max(offset, 1), 0) % freq == 0


@lru_cache(maxsize=256)
def _indexer_layer_count(num_layers: int, freq: int, offset: int) -> int:
    return sum(computes_topk(i, freq, offset) for i in range(num_layers))


# The dtypes SGLang takes from a config's mamba_ssm_dtype (sglang/srt/configs/mamba_utils.py mamba2_state_dtype:
# dtype_map, 0.5.15.post1 and 0.5.23 alike).
SSM_STATE_DTYPES = ("float32", "bfloat16", "float16")


class ModelSpec(BaseModel):
    """A decoder-only transformer. Sizes are counts (not bytes); all are per model, not per rank."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Display name, e.g. 'llama3-70b'.")
    num_layers: int = Field(gt=0, le=MAX_LAYERS, description="Transformer decoder layers (Megatron --num-layers).")
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
    sliding_window: int = Field(0, ge=0, description=(
        "Sliding-window size: keys each query attends to, itself included, tokens (HF sliding_window; flash-attention "
        "and Megatron --window-size left = this - 1); 0 = none."))
    num_sliding_window_layers: int = Field(0, ge=0, description="How many layers use the sliding window.")

    # What training needs to match the released model (written by the emitters). Most have no effect on time or
    # memory; attention_sinks adds parameters, sandwich_norm and logit_softcapping are priced (costmodel/).
    rope_scaling: Literal["none", "llama3", "yarn"] = Field("none", description=(
        "RoPE scaling of the HF config's rope_scaling: llama3 (Megatron --use-rope-scaling) or yarn "
        "(--position-embedding-type yarn)."))
    rope_scaling_factor: float = Field(1.0, ge=1.0, description="RoPE scaling factor (context extension ratio).")
    rope_original_max_position_embeddings: int = Field(0, ge=0, description=(
        "YaRN: context length before scaling, tokens (HF rope_scaling.original_max_position_embeddings); 0 = unset."))
    rope_mscale: float = Field(1.0, ge=0.0, description="YaRN attention-scale factor (HF rope_scaling.mscale).")
    rope_mscale_all_dim: float = Field(0.0, ge=0.0, description=(
        "YaRN mscale_all_dim (HF rope_scaling.mscale_all_dim; DeepSeek-V3 1.0, Megatron's MLA default 0.0)."))
    rope_truncate: bool = Field(True, description=(
        "YaRN rounds its correction range to whole dimensions (HF rope_scaling.truncate, default true; gpt-oss "
        "false; Megatron --no-yarn-correction-range-round-to-int)."))
    rope_beta_fast: float = Field(32.0, gt=0.0, description=(
        "YaRN beta_fast, rotations per context length where interpolation stops (HF rope_scaling.beta_fast, default "
        "32; Kimi-K2 1; Megatron --yarn-beta-fast, MLA fixed at 32)."))
    rope_beta_slow: float = Field(1.0, gt=0.0, description=(
        "YaRN beta_slow, rotations per context length where interpolation starts (HF rope_scaling.beta_slow, "
        "default 1; Megatron --yarn-beta-slow, MLA fixed at 1)."))
    moe_aux_loss_coeff: float = Field(0.001, ge=0.0, description=(
        "Load-balancing loss weight (HF router_aux_loss_coef / aux_loss_alpha, default 0.001 as in transformers' "
        "MixtralConfig; Megatron --moe-aux-loss-coeff)."))
    # How tokens are routed and balanced (Megatron moe_utils.py topk_routing_with_score_function, router.py; HF
    # DeepSeek-V3 scoring_func / topk_method / routed_scaling_factor / n_group / topk_group / norm_topk_prob /
    # seq_aux). No effect on time or memory; the emitters write them so the run trains the released model.
    moe_router_score_function: Literal["softmax", "sigmoid"] = Field("softmax", description=(
        "Router score function (HF scoring_func; Megatron --moe-router-score-function)."))
    moe_router_norm_topk_prob: bool = Field(True, description=(
        "The k chosen scores are renormalised to sum to 1 (HF norm_topk_prob; Megatron: softmax over the top-k "
        "logits, false = --moe-router-pre-softmax; a sigmoid router always renormalises when k > 1)."))
    moe_router_expert_bias: bool = Field(False, description=(
        "Aux-loss-free balancing: a per-expert bias added to the scores for selection only, updated from the load "
        "(HF topk_method noaux_tc, e_score_correction_bias; Megatron --moe-router-enable-expert-bias)."))
    moe_router_topk_scaling_factor: float = Field(1.0, gt=0.0, description=(
        "Factor on the routing weights of the chosen experts (HF routed_scaling_factor; Megatron "
        "--moe-router-topk-scaling-factor)."))
    moe_router_num_groups: int = Field(0, ge=0, description=(
        "Expert groups of group-limited routing (HF n_group; Megatron --moe-router-num-groups); 0 = no groups."))
    moe_router_group_topk: int = Field(0, ge=0, description=(
        "Groups each token may route into (HF topk_group; Megatron --moe-router-group-topk); 0 = no groups."))
    moe_router_group_by_max: bool = Field(False, description=(
        "Groups ranked by their best expert score (HF topk_method group_limited_greedy, DeepSeek-V2) instead of "
        "the sum of their top k/group_topk scores (Megatron group_limited_topk, HF noaux_tc)."))
    moe_load_balancing: Literal["aux_loss", "seq_aux_loss", "none"] = Field("aux_loss", description=(
        "Balancing loss: over the micro-batch (aux_loss), per sequence (seq_aux_loss; HF seq_aux, DeepSeek-V3) or "
        "none (Megatron --moe-router-load-balancing-type)."))
    attention_sinks: bool = Field(False, description=(
        "A learned softmax sink per head (gpt-oss `sinks`; Megatron --softmax-type learnable)."))
    swiglu_limit: float = Field(0.0, ge=0.0, description=(
        "gpt-oss clamped GLU: gate and linear clamped to this value, linear offset by 1 (HF swiglu_limit; Megatron "
        "--quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value); 0 = plain SwiGLU/GELU."))
    rotary_percent: float = Field(1.0, gt=0.0, le=1.0, description=(
        "Fraction of each head's dimensions rotated by RoPE (HF partial_rotary_factor / NeoX rotary_pct; Megatron "
        "--rotary-percent); no weight shapes change."))
    gate_activation: Literal["silu", "gelu", "gelu_tanh"] = Field("silu", description=(
        "Function on the gate of a gated MLP (activation=swiglu): silu is SwiGLU, gelu / gelu_tanh are GeGLU "
        "(Gemma, HF hidden_activation gelu_pytorch_tanh); same shapes and cost."))
    sandwich_norm: bool = Field(False, description=(
        "An extra RMSNorm on the attention output and on the MLP output of every layer (Gemma-2/3 "
        "post_attention/post_feedforward_layernorm, GLM-4-0414 post_self_attn/post_mlp_layernorm): h weights and "
        "one saved norm input each (priced in autoplan/costmodel/params.py, memory.py, compute.py)."))
    # Priced as one more saved bf16 copy of the logits and three elementwise passes (costmodel/memory.py, compute.py).
    logit_softcapping: float = Field(0.0, ge=0.0, description=(
        "Final-logit soft-capping cap*tanh(logits/cap) (Gemma-2 final_logit_softcapping); 0 = none."))
    # Attention variants of recent Hugging Face families (read in autoplan/hf_recent.py; priced in
    # costmodel/params.py, flops.py and layers/mixers.py).
    qk_norm_scope: Literal["head", "all_heads"] = Field("head", description=(
        "What a qk_layernorm normalises: each head's d values (Qwen3, per-head scale of d) or the whole q and k "
        "projections (OLMo-2 q_norm over heads x d, k_norm over groups x d; MiniMax-M2 qk_norm_type per_layer)."))
    attention_output_gate: bool = Field(False, description=(
        "Gated attention (Qwen3-Next, modeling_qwen3_next.py Qwen3NextAttention): q_proj also emits a per-head "
        "gate of heads x d, and the attention output is multiplied by its sigmoid before o_proj."))
    attention_chunk_size: int = Field(0, ge=0, description=(
        "Chunked attention (Llama-4 attention_chunk_size): a query attends only to keys of its own chunk of this "
        "many tokens; 0 = none."))
    num_chunked_attention_layers: int = Field(0, ge=0, description=(
        "Layers with chunked attention (Llama-4: the RoPE layers; every no_rope_layer_interval-th layer is NoPE "
        "with full attention)."))
    dsa_index_heads: int = Field(0, ge=0, description=(
        "DeepSeek Sparse Attention lightning-indexer heads (DeepSeek-V3.2 index_n_heads); 0 = dense attention."))
    dsa_index_head_dim: int = Field(0, ge=0, description="Lightning-indexer head dim (index_head_dim).")
    dsa_index_topk: int = Field(0, ge=0, description="Keys each query attends to under DSA (index_topk).")
    dsa_indexer_topk_freq: int = Field(1, ge=1, description=(
        "DSA top-k sharing across layers (GLM-5.2; Megatron --dsa-indexer-topk-freq): after the first "
        "dsa_indexer_skip_topk_offset layers, only every this-many-th layer runs its own lightning indexer and the "
        "others reuse the last such layer's top-k, holding no indexer (megatron/core/transformer/"
        "experimental_attention_variant/dsa.py is_dsa_skip_topk_layer); 1 = an indexer in every layer."))
    dsa_indexer_skip_topk_offset: int = Field(0, ge=0, description=(
        "Layers (from the first, at least 1) that all run their own indexer before the every-n-th pattern of "
        "dsa_indexer_topk_freq starts (Megatron --dsa-indexer-skip-topk-offset)."))
    dsa_indexer_loss_coeff: Optional[float] = Field(None, ge=0.0, description=(
        "Weight of the lightning indexer's KL loss against the attention scores, a training setting no Hugging Face "
        "config holds (Megatron --dsa-indexer-loss-coeff; experimental_attention_variant/dsa.py multiplies the loss "
        "by it, so a Megatron launch needs it given: --set dsa_indexer_loss_coeff=...); no effect on the price."))
    linear_attention_layers: int = Field(0, ge=0, description=(
        "Layers whose mixer is Gated DeltaNet linear attention instead of softmax attention (Qwen3-Next "
        "layer_types 'linear_attention'); the others use the attention fields."))
    linear_attention_freq: int = Field(0, ge=0, description=(
        "Where the softmax-attention layers sit among the Gated DeltaNet ones: layer i (from 0) is attention when "
        "(i + 1) % N == 0 (Qwen3-Next full_attention_interval; Megatron --linear-attention-freq N, "
        "experimental_attention_variant_module_specs.py get_linear_attention_pattern); 0 = not that pattern."))
    gdn_num_key_heads: int = Field(0, ge=0, description="Gated DeltaNet q/k heads (linear_num_key_heads).")
    gdn_num_value_heads: int = Field(0, ge=0, description="Gated DeltaNet v heads (linear_num_value_heads).")
    gdn_key_head_dim: int = Field(0, ge=0, description="Gated DeltaNet q/k head dim (linear_key_head_dim).")
    gdn_value_head_dim: int = Field(0, ge=0, description="Gated DeltaNet v head dim (linear_value_head_dim).")
    gdn_conv_kernel: int = Field(4, gt=0, description="Gated DeltaNet depthwise conv width (linear_conv_kernel_dim).")
    shared_expert_gate: bool = Field(False, description=(
        "A sigmoid gate of width 1 on the shared expert's output (Qwen2-MoE / Qwen3-Next shared_expert_gate, h "
        "weights per MoE layer)."))
    layernorm_zero_centered: bool = Field(False, description=(
        "Norm scales stored as offsets from 1, applied as (1 + w) (Qwen3-Next Qwen3NextRMSNorm; Megatron "
        "--apply-layernorm-1p, transformer_config.py layernorm_zero_centered_gamma); same shapes and cost."))
    parallel_mamba: bool = Field(False, description=(
        "Every layer runs a Mamba-2 mixer beside its attention on the same normed input and adds the two "
        "(Falcon-H1, modeling_falcon_h1.py FalconH1DecoderLayer); the mamba_* fields give its shapes."))
    mamba_gated_norm: bool = Field(True, description=(
        "The Mamba-2 mixer has its gated RMSNorm over d_inner (Megatron always; Falcon-H1 mamba_rms_norm)."))
    unexpressed: Tuple[str, ...] = Field((), description=(
        "Settings of the source config that change the numerics but not the cost, and that no emitted launch file "
        "carries (e.g. Granite's muP multipliers); emitting refuses the model, naming the first."))
    notes: Tuple[str, ...] = Field((), description=(
        "What reading the source config assumed or could not express, one sentence each."))

    # Hybrid Mamba / attention models (Megatron MambaModel, Nemotron-H / Nemotron-3): one symbol per layer as in
    # Megatron's --hybrid-override-pattern (megatron/core/ssm/mamba_hybrid_layer_allocation.py Symbols): 'M' a
    # Mamba-2 mixer, '*' self-attention, '-' a dense MLP, 'E' an MoE block. Each symbol is one residual layer
    # with its own pre-norm, so num_layers = len(pattern).
    hybrid_layer_pattern: str = Field("", description=(
        "Megatron --hybrid-override-pattern, one of M * - E per layer; empty = a standard decoder where every "
        "layer is attention + MLP/MoE."))
    mamba_num_heads: int = Field(0, ge=0, description="Mamba-2 heads per mixer (Megatron --mamba-num-heads).")
    mamba_head_dim: int = Field(64, gt=0, description="Mamba-2 head dim P (--mamba-head-dim); d_inner = heads x P.")
    mamba_state_dim: int = Field(128, gt=0, description="Mamba-2 SSM state size N (--mamba-state-dim).")
    mamba_num_groups: int = Field(8, gt=0, description="Mamba-2 B/C groups G (--mamba-num-groups).")
    mamba_conv_kernel: int = Field(4, gt=0, description="Depthwise causal conv width (Megatron MambaMixer d_conv).")
    mamba_ssm_dtype: Optional[Literal[SSM_STATE_DTYPES]] = Field(None, description=(
        "The checkpoint config's mamba_ssm_dtype (Qwen3.5's text_config sets float32): the dtype SGLang keeps each "
        "Mamba-2 / Gated DeltaNet layer's temporal state in while it generates (sglang/srt/configs/mamba_utils.py "
        "mamba2_state_dtype; unset: SGLang's float32). vLLM 0.11 keeps it in the model dtype whatever this says, "
        "and training keeps no such state."))
    moe_latent_size: int = Field(0, ge=0, description=(
        "Latent MoE (Megatron --moe-latent-size): routed experts run on this width, with one h->latent and one "
        "latent->h projection per token; 0 = experts run on hidden_size."))

    # Multi-token prediction (Megatron --mtp-num-layers; DeepSeek-V3 report sec. 2.2): each depth embeds the
    # next tokens, projects [h; emb] (2h -> h), runs its own layers and the shared LM head and loss.
    mtp_num_layers: int = Field(0, ge=0, description="Multi-token-prediction depths (Megatron --mtp-num-layers).")
    mtp_layer_pattern: str = Field("", description=(
        "Layers of one MTP depth in hybrid symbols (Megatron --mtp-hybrid-override-pattern, e.g. '*E'); "
        "hybrid models only."))
    mtp_shared_weights: bool = Field(False, description=(
        "All MTP depths reuse one set of layer weights (Megatron mtp_use_repeated_layer)."))

    # Layers kept in bf16 under an FP8/FP4 recipe (Megatron --first-last-layers-bf16 with
    # --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16, megatron/core/fp8_utils.py): their GEMMs run in
    # bf16 and save bf16 inputs.
    bf16_first_layers: int = Field(0, ge=0, description="Leading layers whose GEMMs stay bf16 under FP8/FP4.")
    bf16_last_layers: int = Field(0, ge=0, description="Trailing layers whose GEMMs stay bf16 under FP8/FP4.")
    # Modules (QUANT_OVERRIDE_MODULES) a per-module quantization recipe runs in bf16 / in MXFP8 whatever the run's
    # FP8/FP4 recipe (Megatron-Core quant_recipe; Megatron-Bridge's Nemotron-3 Super NVFP4 presets load
    # scripts/performance/configs/nemotronh/te_quant.cfg).
    bf16_modules: Tuple[str, ...] = Field((), description=(
        f"GEMM modules kept in bf16 under FP8/FP4: any of {', '.join(QUANT_OVERRIDE_MODULES)}."))
    mxfp8_modules: Tuple[str, ...] = Field((), description=(
        f"GEMM modules run in MXFP8 under FP8/FP4 (an NVFP4 run's exceptions): any of "
        f"{', '.join(QUANT_OVERRIDE_MODULES)}."))

    @field_validator("*", mode="after")
    @classmethod
    def _representable(cls, value, info):
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value > MAX_SIZE:
            raise ValueError(f"must be at most 2^31 - 1 = {MAX_SIZE:,}; pass the real size")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.hybrid_layer_pattern:
            self._check_hybrid()
        if self.mtp_num_layers and self.is_hybrid and not self.mtp_layer_pattern:
            raise ValueError("mtp_num_layers > 0 on a hybrid model needs an mtp_layer_pattern (e.g. '*E')")
        if self.mtp_layer_pattern and not self.is_hybrid:
            raise ValueError(f"mtp_layer_pattern={self.mtp_layer_pattern!r} is for hybrid models; a GPT model's "
                             f"MTP depth is one layer of its own kind, leave it empty")
        for field in ("bf16_modules", "mxfp8_modules"):
            unknown = [x for x in getattr(self, field) if x not in QUANT_OVERRIDE_MODULES]
            if unknown:
                raise ValueError(f"{field} names {unknown}; each must be one of {', '.join(QUANT_OVERRIDE_MODULES)}")
        both = set(self.bf16_modules) & set(self.mxfp8_modules)
        if both:
            raise ValueError(f"{sorted(both)} in both bf16_modules and mxfp8_modules; name each module once")
        if self.bf16_first_layers + self.bf16_last_layers > self.num_layers:
            raise ValueError(f"bf16_first_layers + bf16_last_layers = {self.bf16_first_layers + self.bf16_last_layers}"
                             f" cannot exceed num_layers={self.num_layers}")
        if set(self.mtp_layer_pattern) - set(HYBRID_SYMBOLS):
            raise ValueError(f"mtp_layer_pattern={self.mtp_layer_pattern!r} may use only M, *, -, E")
        if self.num_experts:
            if not (0 < self.moe_router_topk <= self.num_experts):
                raise ValueError(f"moe_router_topk={self.moe_router_topk} must be in 1..num_experts={self.num_experts}")
            if self.moe_ffn_hidden_size <= 0:
                raise ValueError("moe_ffn_hidden_size must be > 0 for an MoE model")
        self._check_router_groups()
        if self.multi_latent_attention and (self.kv_lora_rank <= 0 or self.v_head_dim <= 0 or self.qk_head_dim <= 0):
            raise ValueError("MLA needs kv_lora_rank, qk_head_dim and v_head_dim > 0")
        self._check_mixers()
        if self.num_sliding_window_layers > self.num_layers:
            raise ValueError("num_sliding_window_layers cannot exceed num_layers")
        return self

    def _check_router_groups(self) -> None:
        groups, chosen = self.moe_router_num_groups, self.moe_router_group_topk
        if bool(groups) != bool(chosen):
            raise ValueError(f"moe_router_num_groups={groups} and moe_router_group_topk={chosen} are set together "
                             f"(both 0 for no group-limited routing)")
        if groups and (not self.is_moe or self.num_experts % groups or chosen > groups):
            raise ValueError(f"moe_router_num_groups={groups} must divide num_experts={self.num_experts} and be at "
                             f"least moe_router_group_topk={chosen}")

    def _check_mixers(self) -> None:
        if self.num_chunked_attention_layers + self.linear_attention_layers > self.num_layers:
            raise ValueError("num_chunked_attention_layers + linear_attention_layers cannot exceed num_layers")
        if bool(self.attention_chunk_size) != bool(self.num_chunked_attention_layers):
            raise ValueError("attention_chunk_size and num_chunked_attention_layers are set together")
        if self.dsa_index_heads and not (self.multi_latent_attention and self.q_lora_rank and self.dsa_index_topk
                                         and self.dsa_index_head_dim):
            raise ValueError("DSA (dsa_index_heads > 0) needs MLA with q_lora_rank, dsa_index_head_dim and "
                             "dsa_index_topk > 0")
        if (self.dsa_indexer_topk_freq > 1 or self.dsa_indexer_skip_topk_offset) and not self.dsa_index_heads:
            raise ValueError("dsa_indexer_topk_freq / dsa_indexer_skip_topk_offset share DSA top-k between layers; "
                             "they need dsa_index_heads > 0")
        if self.linear_attention_freq and self.linear_attention_layers != sum(
                (i + 1) % self.linear_attention_freq != 0 for i in range(self.num_layers)):
            raise ValueError(f"linear_attention_freq={self.linear_attention_freq} makes "
                             f"{sum((i + 1) % self.linear_attention_freq != 0 for i in range(self.num_layers))} of "
                             f"{self.num_layers} layers Gated DeltaNet, not linear_attention_layers="
                             f"{self.linear_attention_layers}")
        if self.linear_attention_layers and not (self.gdn_num_key_heads and self.gdn_num_value_heads
                                                 and self.gdn_key_head_dim and self.gdn_value_head_dim):
            raise ValueError("linear_attention_layers > 0 needs gdn_num_key_heads, gdn_num_value_heads, "
                             "gdn_key_head_dim and gdn_value_head_dim > 0")
        if self.parallel_mamba and (self.mamba_num_heads <= 0 or self.is_hybrid):
            raise ValueError("parallel_mamba needs mamba_num_heads > 0 and no hybrid_layer_pattern")
        if (self.linear_attention_layers or self.parallel_mamba or self.num_chunked_attention_layers) and \
                (self.multi_latent_attention or self.num_sliding_window_layers):
            raise ValueError("linear attention, parallel Mamba and chunked attention are not supported together "
                             "with MLA or sliding windows")

    def _check_hybrid(self) -> None:
        pattern = self.hybrid_layer_pattern
        bad = sorted(set(pattern) - set(HYBRID_SYMBOLS))
        if bad:
            raise ValueError(f"hybrid_layer_pattern has symbols {bad}; use only M (Mamba), * (attention), "
                             "- (MLP), E (MoE)")
        if len(pattern) != self.num_layers:
            raise ValueError(f"num_layers={self.num_layers} must equal len(hybrid_layer_pattern)={len(pattern)}")
        if "M" in pattern and self.mamba_num_heads <= 0:
            raise ValueError("a hybrid_layer_pattern with Mamba layers (M) needs mamba_num_heads > 0")
        if ("E" in pattern) != self.is_moe:
            raise ValueError("hybrid_layer_pattern has MoE layers (E) exactly when num_experts > 0; "
                             f"got num_experts={self.num_experts}")
        if self.num_sliding_window_layers or self.multi_latent_attention:
            raise ValueError("hybrid models with sliding-window or MLA attention are not supported")
        if self.mamba_num_heads % self.mamba_num_groups:
            raise ValueError(f"mamba_num_groups={self.mamba_num_groups} must divide "
                             f"mamba_num_heads={self.mamba_num_heads}")

    @property
    def context_parallel_blocker(self) -> Optional[str]:
        """The mixer megatron-core 0.16.1 has no context-parallel path for, or None: Gated DeltaNet
        (TransformerConfig.__post_init__ asserts context_parallel_size == 1 for gated_delta_net: "does not support
        context parallel for now") and DSA (experimental_attention_variant/dsa.py scores and attends over the
        rank's local keys with a local causal mask, no exchange between CP ranks)."""
        if self.linear_attention_layers:
            return "Gated DeltaNet linear attention (megatron/core/transformer/transformer_config.py has no CP path " \
                   "for gated_delta_net)"
        if self.dsa_index_heads:
            return "DeepSeek Sparse Attention (megatron/core/transformer/experimental_attention_variant/dsa.py " \
                   "has no CP path)"
        return None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def bf16_layer_fraction(self) -> float:
        """Share of the layers whose GEMMs stay bf16 under an FP8/FP4 recipe."""
        return (self.bf16_first_layers + self.bf16_last_layers) / self.num_layers

    def window_binds(self, seq_len: int) -> bool:
        """Whether the sliding window limits attention at this sequence length: a window of w tokens (the query
        included) changes nothing when no sequence is longer than w."""
        return bool(self.sliding_window and self.num_sliding_window_layers) and self.sliding_window < seq_len

    def window_note(self, seq_len: int) -> List[str]:
        """The plan's note when the window cannot bind (Phi-4-mini: 262,144 tokens)."""
        if not self.sliding_window or not self.num_sliding_window_layers or self.window_binds(seq_len):
            return []
        return [f"sliding_window={self.sliding_window} is not shorter than seq_len={seq_len}: the window never limits "
                f"attention, so it is priced as full attention and left out of the launch files"]

    @property
    def is_hybrid(self) -> bool:
        """A Mamba / attention hybrid described by `hybrid_layer_pattern`."""
        return bool(self.hybrid_layer_pattern)

    @property
    def mtp_depth_pattern(self) -> str:
        """Layers of one MTP depth in hybrid symbols: the hybrid's `mtp_layer_pattern`, else one decoder layer of
        the model's own kind, attention then MoE or MLP (Megatron gpt_layer_specs.py get_gpt_mtp_block_spec builds
        the depth from the decoder's last layer spec; DeepSeek-V3: MLA + MoE)."""
        if self.is_hybrid:
            return self.mtp_layer_pattern
        return "*E" if self.is_moe else "*-"

    def layer_count(self, symbol: str) -> int:
        """Layers of one hybrid symbol (M, *, -, E); 0 for a standard decoder."""
        return self.hybrid_layer_pattern.count(symbol)

    @property
    def mamba_d_inner(self) -> int:
        """Mamba-2 inner width, heads x head dim (megatron/core/ssm/mamba_mixer.py d_inner)."""
        return self.mamba_num_heads * self.mamba_head_dim

    def dsa_computes_topk(self, index: int) -> bool:
        """Whether layer `index` (from 0) runs its own DSA lightning indexer rather than reusing an earlier layer's
        top-k; every layer without sharing (`computes_topk`)."""
        return computes_topk(index, self.dsa_indexer_topk_freq, self.dsa_indexer_skip_topk_offset)

    @property
    def num_dsa_indexer_layers(self) -> int:
        """Layers with a lightning indexer of their own (0 without DSA)."""
        if not self.dsa_index_heads:
            return 0
        return _indexer_layer_count(self.num_layers, self.dsa_indexer_topk_freq, self.dsa_indexer_skip_topk_offset)

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (0-based) is an MoE layer (DeepSeek's first_k_dense_replace rule; the
        pattern's 'E' for a hybrid)."""
        if self.is_hybrid:
            return self.hybrid_layer_pattern[index] == "E"
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
