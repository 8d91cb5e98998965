"""Megatron-LM launch files for a plan: the `pretrain_gpt.py` argument list, a torchrun script and a Slurm script.

The files target one Megatron-LM release (integrations/megatron_releases.py, --megatron-version): every argument
name and value written is one that release's `megatron/training/arguments.py` parser accepts, spelled as it spells
it, or the emit is refused naming the flag. The engine rules checked here are
the ones that would otherwise fail only after the job starts; each cites `validate_args` [V],
`TransformerConfig.__post_init__` [TC] or the runtime [RT] (see docs/sources.md)."""
from __future__ import annotations

import shlex
from typing import Dict, List, Optional, Tuple

from autoplan import cuda_graphs as G
from autoplan import keys as K
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.results import Plan
from autoplan.strategy import Strategy
from autoplan.validate import effective_fp8_recipe, first_broken_rule, interleaved_schedule_problem
from autoplan.integrations.engines import is_blackwell_or_newer
from autoplan.integrations.megatron_releases import DEFAULT_RELEASE, describe, for_release, release_problem

PROBE_ITERS = 10  # iterations a probe run trains before it exits
DEFAULT_TRAIN_ITERS = 1000  # a placeholder: pass `--train-iters N` to train.sh to override
DEFAULT_MASTER_PORT = 6000


def world_layout(plan: Plan) -> Dict[str, int]:
    """nodes, gpus per node and dp of the plan; InputError when the GPUs cannot be laid out."""
    s, world = plan.strategy, plan.cluster.num_gpus
    model_parallel = s.tp * s.pp * s.cp
    # [V] WORLD_SIZE must be divisible by TP x PP x CP; DP is the quotient.
    if world % model_parallel:
        raise InputError(f"world size {world} must be divisible by tp*pp*cp = {s.tp}*{s.pp}*{s.cp} = {model_parallel};"
                         f" change the GPU count or the parallel sizes")
    # A GPU count that does not fill whole nodes runs the rest on the last node (ClusterSpec.node_gpu_counts).
    counts = plan.cluster.node_gpu_counts
    return {"nodes": len(counts), "gpus_per_node": counts[0], "last_node_gpus": counts[-1],
            "dp": world // model_parallel}


def _gpus_per_node_lines(layout: Dict[str, int]) -> str:
    """train.sh's GPUS_PER_NODE: the same on every node, or the rest on the last one. torchrun ranks nodes of
    different sizes in node-rank order (torch/distributed/elastic/agent/server/api.py _assign_worker_ranks)."""
    full, last = layout["gpus_per_node"], layout["last_node_gpus"]
    if last == full:
        return f"GPUS_PER_NODE=${{GPUS_PER_NODE:-{full}}}"
    return (f"# {layout['nodes'] - 1} nodes of {full} GPUs and a last node of {last}\n"
            f"GPUS_PER_NODE=${{GPUS_PER_NODE:-$(( NODE_RANK == NNODES - 1 ? {last} : {full} ))}}")


def check_megatron_plan(plan: Plan) -> None:
    """Raise InputError for the first Megatron-LM rule the plan breaks (rules that fail only at launch)."""
    m, s, w = plan.model, plan.strategy, plan.workload
    dp = world_layout(plan)["dp"]
    problems = (
        # [MB] global batch = micro batch x DP x number of microbatches.
        w.global_batch_size % (s.mbs * dp) and
        f"global_batch_size={w.global_batch_size} must be divisible by mbs*dp = {s.mbs}*{dp}; "
        f"use a multiple of {s.mbs * dp}",
        # [TC] heads split across TP ranks.
        m.num_attention_heads % s.tp and
        f"tp={s.tp} must divide num_attention_heads={m.num_attention_heads}",
        # [TC] GQA groups are a multiple or a divisor of TP.
        not m.multi_latent_attention and m.num_query_groups % s.tp and s.tp % m.num_query_groups and
        f"num_query_groups={m.num_query_groups} must be a multiple or a divisor of tp={s.tp}",
        # [V] experts split across EP ranks.
        m.is_moe and m.num_experts % s.ep and f"ep={s.ep} must divide num_experts={m.num_experts}",
        not m.is_moe and s.ep > 1 and f"ep={s.ep} needs an MoE model; {m.name} is dense, use ep=1",
        # [RT] MoE with TP needs sequence parallel during training.
        m.is_moe and s.tp > 1 and not s.sp and f"Megatron MoE with tp={s.tp} requires sp=true",
        # [TC] MoE layers with biases need ETP 1.
        m.is_moe and m.add_bias_linear and s.etp > 1 and f"MoE layers with bias need etp=1 (got etp={s.etp})",
        # [V] CP splits each sequence into 2*CP chunks.
        s.cp > 1 and w.seq_len % (2 * s.cp) and f"seq_len={w.seq_len} must be divisible by 2*cp = {2 * s.cp}",
        # [V] VPP needs a pipeline.
        s.vpp > 1 and s.pp == 1 and f"vpp={s.vpp} needs pp > 1",
        # [V] arguments.py has no flag for TransformerConfig.use_fused_weighted_squared_relu.
        s.fused_weighted_squared_relu and
        "fused_weighted_squared_relu=true has no Megatron-LM command-line flag (TransformerConfig."
        "use_fused_weighted_squared_relu is set by Megatron-Bridge recipes); set fused_weighted_squared_relu=false "
        "to emit a Megatron-LM launch",
        # [V] TP communication overlap needs sequence parallel.
        s.tp_comm_overlap and not (s.sp and s.tp > 1) and "tp_comm_overlap=true needs tp > 1 and sp=true",
        # [TC] EP all-to-all overlap: EP > 1, no full recompute, VPP when PP > 1.
        s.moe_a2a_overlap and m.is_moe and (s.ep == 1 or s.recompute == "full" or (s.pp > 1 and s.vpp == 1)) and
        f"moe_a2a_overlap needs ep > 1, no full recompute and vpp > 1 when pp > 1 "
        f"(ep={s.ep}, recompute={s.recompute}, pp={s.pp}, vpp={s.vpp})",
        # [V] learned absolute positions end at max_position_embeddings.
        m.position_embedding == "learned" and w.seq_len > m.max_position_embeddings and
        f"seq_len={w.seq_len} exceeds max_position_embeddings={m.max_position_embeddings} of learned positions",
        # [RT] dsa.py DSAttention.forward multiplies the indexer's KL loss by config.dsa_indexer_loss_coeff (None
        # fails there); a training setting no Hugging Face config holds, so it is asked for, not filled in.
        m.dsa_index_heads and m.dsa_indexer_loss_coeff is None and
        f"{m.name}'s DeepSeek sparse attention trains its indexer with a KL loss whose weight Megatron-LM needs "
        f"(--dsa-indexer-loss-coeff) and the model's config does not give; pass --set dsa_indexer_loss_coeff=VALUE "
        f"(0 leaves the indexer untrained)",
        _pipeline_split_problem(m, s),
        _window_problem(m, w.seq_len),
        # Megatron-LM reads a per-module quantization recipe only from a YAML file (arguments.py
        # --te-precision-config-file, megatron/core/quantization/quant_config.py), which these files do not write.
        (f"{m.name} keeps modules out of the FP8/FP4 recipe (bf16_modules={list(m.bf16_modules)}, "
         f"mxfp8_modules={list(m.mxfp8_modules)}), which Megatron-LM takes only as a --te-precision-config-file "
         f"YAML that autoplan does not write; write that file and pass it, or clear both fields")
        if s.uses_fp8 and (m.bf16_modules or m.mxfp8_modules) else None,
        inexpressible_problem(m),
        # [RT] the interleaved schedule's micro-batch groups (autoplan/validate.py, shared with the search).
        interleaved_schedule_problem(s.pp, s.vpp, w.global_batch_size // (s.mbs * dp)),
        # Every other Megatron-LM rule the search and `estimate` apply (pipeline splits and layouts included).
        first_broken_rule(m, plan.cluster, w, s, engine="megatron"),
    )
    first = next((p for p in problems if p), None)
    if first:
        raise InputError(first)


def _pipeline_split_problem(m: ModelSpec, s: Strategy) -> Optional[str]:
    """[V][TC] layers per pipeline rank and per virtual stage must be whole numbers."""
    chunks = s.pp * s.vpp
    if s.pipeline_layout or s.account_for_embedding or s.account_for_loss:
        return None  # those splits' rules: autoplan/validate.py, checked last in check_megatron_plan
    if s.first_stage_layers is None and s.last_stage_layers is None:
        if m.num_layers % chunks:
            return f"num_layers={m.num_layers} must be divisible by pp*vpp = {s.pp}*{s.vpp}; change pp or vpp"
        return None
    if s.pp == 1:
        return "first_stage_layers/last_stage_layers need pp > 1"
    given = [x for x in (s.first_stage_layers, s.last_stage_layers) if x is not None]
    middle_layers = m.num_layers - sum(given)
    middle_stages = s.pp - len(given)
    if middle_layers < 0 or (middle_stages == 0 and middle_layers) or \
            (middle_stages and middle_layers % (middle_stages * s.vpp)):
        return (f"uneven pipeline: {m.num_layers} layers minus first/last ({sum(given)}) must split evenly over "
                f"{middle_stages} middle stages x vpp={s.vpp}")
    if any(x % s.vpp for x in given):
        return f"first/last stage layers {given} must be divisible by vpp={s.vpp}"
    return None


def inexpressible_problem(m: ModelSpec) -> Optional[str]:
    """Model features Megatron-LM's pretrain_gpt.py has no argument for (arguments.py of every release in megatron_releases.py): the
    files would train a different model, so they are refused, never written without them."""
    missing = [what for what, present in (
        (f"a {m.gate_activation}-gated MLP (GeGLU; gate_activation={m.gate_activation})",
         m.activation == "swiglu" and m.gate_activation != "silu" and not m.swiglu_limit),
        ("post-attention/post-MLP norms (sandwich_norm=true)", m.sandwich_norm),
        (f"final-logit soft-capping (logit_softcapping={_num(m.logit_softcapping)})", m.logit_softcapping),
        (f"a Mamba / attention hybrid layer pattern (hybrid_layer_pattern={m.hybrid_layer_pattern!r}; Megatron-LM "
         "trains it with pretrain_mamba.py --hybrid-override-pattern)", m.is_hybrid),
        *_mla_yarn_inexpressible(m),
        *_router_inexpressible(m),
        *_mixers_inexpressible(m),
    ) if present]
    if missing:
        return (f"Megatron-LM's pretrain_gpt.py has no argument for {missing[0]} of {m.name}; use "
                f"Megatron-Bridge's recipe for the family with this plan's parallel settings")
    return None


def _mixers_inexpressible(m: ModelSpec) -> List[Tuple[str, bool]]:
    """Attention and mixer variants of recent families (autoplan/hf_recent.py, hf_config.py) that no release's
    pretrain_gpt.py arguments build (megatron_releases/*.txt): written without them the files would train plain
    attention. Gated attention, Gated DeltaNet, DSA and the shared-expert gate are written (`_mixer_args`) when
    their settings are complete."""
    return [
        ("q/k norms over the whole projection (qk_norm_scope=all_heads)", m.qk_norm_scope == "all_heads"),
        # MLATransformerConfig.__post_init__: "Output gate is not supported for MLA yet."
        ("a sigmoid gate on MLA's attention output (attention_output_gate with multi_latent_attention)",
         m.attention_output_gate and m.multi_latent_attention),
        (f"chunked attention (attention_chunk_size={m.attention_chunk_size})", m.attention_chunk_size),
        (f"Gated DeltaNet layers placed other than before every N-th attention layer (linear_attention_layers="
         f"{m.linear_attention_layers}, linear_attention_freq=0)", m.linear_attention_layers and
         not m.linear_attention_freq),
        ("a Mamba mixer beside attention (parallel_mamba=true)", m.parallel_mamba),
        (m.unexpressed[0] if m.unexpressed else "", bool(m.unexpressed)),
    ]


def _mixer_args(m: ModelSpec) -> List[str]:
    """The recent families' attention variants, as each release's parser names them (TransformerConfig fields,
    megatron/core/transformer/transformer_config.py; gpt_builders.py builds the block with
    get_transformer_block_with_experimental_attention_variant_spec when experimental_attention_variant is set):
    - Gated DeltaNet (Qwen3-Next): experimental_attention_variant gated_delta_net on the layers
      get_linear_attention_pattern marks 1, i.e. layer i unless (i + 1) % linear_attention_freq == 0 (the same rule
      as Qwen3-Next's full_attention_interval), with the linear_* sizes (megatron/core/ssm/gated_delta_net.py);
    - gated attention: attention_output_gate (attention.py _apply_output_gate: output * sigmoid(gate), the gate a
      second per-head projection of the query's width, as Qwen3NextAttention's);
    - DSA (DeepSeek-V3.2): experimental_attention_variant dsa with the indexer's heads, head dim and top-k
      (experimental_attention_variant/dsa.py DSAIndexer: wq_b from the q latent, wk from the hidden state, a
      LayerNorm on k, per-head weights, as DeepSeek-V3.2's Indexer) and its loss weight; RoPE fusion off, which
      TransformerConfig.__post_init__ asserts for DSA;
    - zero-centred norm scales (layernorm_zero_centered_gamma, --apply-layernorm-1p)."""
    a: List[str] = []
    if m.linear_attention_layers:
        a += ["--experimental-attention-variant", "gated_delta_net",
              "--linear-attention-freq", str(m.linear_attention_freq),
              "--linear-conv-kernel-dim", str(m.gdn_conv_kernel),
              "--linear-key-head-dim", str(m.gdn_key_head_dim), "--linear-value-head-dim", str(m.gdn_value_head_dim),
              "--linear-num-key-heads", str(m.gdn_num_key_heads),
              "--linear-num-value-heads", str(m.gdn_num_value_heads)]
    if m.dsa_index_heads:
        a += ["--experimental-attention-variant", "dsa", "--dsa-indexer-n-heads", str(m.dsa_index_heads),
              "--dsa-indexer-head-dim", str(m.dsa_index_head_dim), "--dsa-indexer-topk", str(m.dsa_index_topk),
              "--dsa-indexer-loss-coeff", _num(m.dsa_indexer_loss_coeff or 0.0), "--no-rope-fusion"]
        if m.dsa_indexer_topk_freq > 1:  # top-k shared between layers (core_v0.19.0 and later)
            a += ["--dsa-indexer-topk-freq", str(m.dsa_indexer_topk_freq),
                  "--dsa-indexer-skip-topk-offset", str(m.dsa_indexer_skip_topk_offset)]
    if m.attention_output_gate:
        a += ["--attention-output-gate"]
    if m.layernorm_zero_centered:
        a += ["--apply-layernorm-1p"]
    return a


def _mla_yarn_inexpressible(m: ModelSpec) -> List[Tuple[str, bool]]:
    """MLA's YaRN settings without an argument: MLATransformerConfig's beta_fast 32, beta_slow 1 and
    original_max_position_embeddings 4096 stay as declared, and multi_latent_attention.py builds its
    YarnRotaryEmbedding with correction_range_round_to_int's default (true); the --yarn-* flags reach only
    non-MLA models (argument_utils.py _apply_yarn_config_from_args)."""
    if not (m.multi_latent_attention and m.rope_scaling == "yarn"):
        return []
    original = m.rope_original_max_position_embeddings
    betas = (m.rope_beta_fast, m.rope_beta_slow)
    return [
        ("MLA YaRN without rounding of the correction range (rope_truncate=false)", not m.rope_truncate),
        (f"MLA YaRN original_max_position_embeddings={original} (Megatron fixes 4096)", original not in (0, 4096)),
        (f"MLA YaRN rope_beta_fast={_num(betas[0])}, rope_beta_slow={_num(betas[1])} (Megatron fixes 32 and 1)",
         betas != (32.0, 1.0)),
    ]


def _router_inexpressible(m: ModelSpec) -> List[Tuple[str, bool]]:
    """Routing Megatron's TopKRouter cannot train (moe_utils.py topk_routing_with_score_function, group_limited_topk):
    it renormalises sigmoid top-k scores whenever k > 1 and ranks groups by the sum of their top k/group_topk scores."""
    if not m.is_moe:
        return []
    return [
        ("a sigmoid router without renormalised top-k weights (moe_router_norm_topk_prob=false)",
         m.moe_router_score_function == "sigmoid" and not m.moe_router_norm_topk_prob and m.moe_router_topk > 1),
        ("an expert-bias (aux-loss-free) router on softmax scores (Megatron's bias needs the sigmoid router)",
         m.moe_router_expert_bias and m.moe_router_score_function != "sigmoid"),
        ("groups ranked by their best expert (moe_router_group_by_max=true, HF topk_method group_limited_greedy)",
         m.moe_router_group_by_max and m.moe_router_num_groups > 0),
    ]


def _window_problem(m: ModelSpec, seq_len: int) -> Optional[str]:
    n, layers = m.num_sliding_window_layers, m.num_layers
    if m.window_binds(seq_len) and n not in (0, layers, (layers + 1) // 2):
        return (f"num_sliding_window_layers={n} of {layers}: Megatron patterns here are all layers or every other "
                f"layer; use {layers} or {(layers + 1) // 2}")
    return None


def moe_layer_pattern(m: ModelSpec) -> str:
    """Megatron `--moe-layer-freq` list expression, run-length encoded: '[0]*3+[1]*58' (1 = MoE layer)."""
    flags = [int(m.is_moe_layer(i)) for i in range(m.num_layers)]
    runs: List[List[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "+".join(f"[{f}]*{n}" for f, n in runs)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def architecture_args(m: ModelSpec, seq_len: int) -> List[str]:
    a = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
         "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads)]
    if m.multi_latent_attention:
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_head_dim),
              "--qk-pos-emb-head-dim", str(m.qk_pos_emb_head_dim), "--v-head-dim", str(m.v_head_dim)]
        if m.q_lora_rank:
            a += ["--q-lora-rank", str(m.q_lora_rank)]
    a += ["--kv-channels", str(m.kv_channels)]
    if not m.multi_latent_attention and m.num_query_groups != m.num_attention_heads:
        a += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    a += _position_args(m)
    a += ["--normalization", "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm"]
    a += _activation_args(m)
    a += ["--softmax-type", "learnable"] if m.attention_sinks else []  # gpt-oss sinks [TC softmax_type]
    a += [] if m.tie_embeddings else ["--untie-embeddings-and-output-weights"]
    a += [] if m.add_bias_linear else ["--disable-bias-linear"]
    a += ["--add-qkv-bias"] if m.add_qkv_bias and not m.add_bias_linear else []
    a += ["--qk-layernorm"] if m.qk_layernorm else []
    a += _mixer_args(m)
    if m.window_binds(seq_len):  # a window as long as the sequence is full attention (ModelSpec.window_note)
        # flash-attention's (left, right) window: `left` keys before the query plus itself, so HF sliding_window
        # 128 is 127,0 (Megatron-LM examples/gptoss/02_train.sh --window-size 127,0).
        a += ["--window-size", f"{m.sliding_window - 1},0"]
        if m.num_sliding_window_layers != m.num_layers:
            a += ["--window-attn-skip-freq", "2"]  # layer_number % 2 != 0 -> window (core/transformer/utils.py)
    a += ["--seq-length", str(seq_len), "--max-position-embeddings", str(max(m.max_position_embeddings, seq_len)),
          "--vocab-size", str(m.vocab_size), "--tokenizer-type", "NullTokenizer", "--mock-data",
          "--attention-dropout", "0.0", "--hidden-dropout", repr(float(m.hidden_dropout)), "--init-method-std", "0.02"]
    return a


def _position_args(m: ModelSpec) -> List[str]:
    """Positions, with the HF config's RoPE scaling: Llama-3.x frequency scaling (arguments.py --use-rope-scaling,
    --rope-scaling-factor; low/high frequency factors 1/4 and 8192 original positions are Megatron's constants) or
    YaRN (--position-embedding-type yarn; training/argument_utils.py _apply_yarn_config_from_args maps
    --rotary-scaling-factor and --yarn-original-max-position-embeddings onto the config)."""
    if m.position_embedding != "rope":
        return ["--position-embedding-type", "learned_absolute"]
    if m.multi_latent_attention:
        # MLA reads its own RoPE settings (MLATransformerConfig rope_type, rotary_scaling_factor, mscale,
        # mscale_all_dim; arguments.py --rope-type, --rotary-scaling-factor, --mscale, --mscale-all-dim).
        a = ["--position-embedding-type", "rope", "--rotary-base", _num(m.rotary_base)]
        if m.rope_scaling == "yarn":
            a += ["--rope-type", "yarn", "--rotary-scaling-factor", _num(m.rope_scaling_factor),
                  "--mscale", _num(m.rope_mscale), "--mscale-all-dim", _num(m.rope_mscale_all_dim)]
        else:
            a += ["--rope-type", "rope"]
        return a
    if m.rope_scaling == "yarn":
        a = ["--position-embedding-type", "yarn", "--rotary-base", _num(m.rotary_base),
             "--rotary-scaling-factor", _num(m.rope_scaling_factor)]
        a += ["--rotary-percent", _num(m.rotary_percent)] if m.rotary_percent != 1.0 else []
        if m.rope_original_max_position_embeddings:
            a += ["--yarn-original-max-position-embeddings", str(m.rope_original_max_position_embeddings)]
        # The same mapping sets yarn_mscale / yarn_mscale_all_dim from --mscale / --mscale-all-dim (defaults 1, 0).
        a += ["--mscale", _num(m.rope_mscale)] if m.rope_mscale != 1.0 else []
        a += ["--mscale-all-dim", _num(m.rope_mscale_all_dim)] if m.rope_mscale_all_dim else []
        a += [] if m.rope_truncate else ["--no-yarn-correction-range-round-to-int"]  # gpt-oss truncate=false
        # --yarn-beta-fast / --yarn-beta-slow (arguments.py; the same mapping, defaults 32 and 1).
        a += ["--yarn-beta-fast", _num(m.rope_beta_fast)] if m.rope_beta_fast != 32.0 else []
        a += ["--yarn-beta-slow", _num(m.rope_beta_slow)] if m.rope_beta_slow != 1.0 else []
        return a
    a = ["--position-embedding-type", "rope", "--rotary-base", _num(m.rotary_base)]
    if m.rotary_percent != 1.0:  # partial rotary (NeoX rotary_pct, HF partial_rotary_factor)
        a += ["--rotary-percent", _num(m.rotary_percent)]
    if m.rope_scaling == "llama3":
        a += ["--use-rope-scaling", "--rope-scaling-factor", _num(m.rope_scaling_factor)]
    return a


def _activation_args(m: ModelSpec) -> List[str]:
    """MLP activation. gpt-oss's clamped GLU is Megatron's quick-GEGLU with a linear offset of 1 and a clamp, with
    the bias-activation and RoPE fusions off, as Megatron-LM's examples/gptoss/02_train.sh runs it."""
    if m.swiglu_limit:
        return ["--quick-geglu", "--glu-linear-offset", "1.0", "--activation-func-clamp-value",
                _num(m.swiglu_limit), "--no-bias-gelu-fusion", "--no-rope-fusion"]
    return ["--swiglu"] if m.activation == "swiglu" else []


def _moe_args(m: ModelSpec, s: Strategy) -> List[str]:
    if not m.is_moe:
        return []
    a = ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.moe_router_topk),
         "--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)]
    if m.shared_expert_ffn_hidden_size:
        a += ["--moe-shared-expert-intermediate-size", str(m.shared_expert_ffn_hidden_size)]
        # shared_experts.py SharedExpertMLP: output * sigmoid(Linear(h, 1)(input)), Qwen's shared_expert_gate.
        a += ["--moe-shared-expert-gate"] if m.shared_expert_gate else []
    if m.first_k_dense_layers or m.moe_layer_freq > 1:
        a += ["--moe-layer-freq", moe_layer_pattern(m)]
    # Flex dispatcher with HybridEP, the backend that also runs across a multi-node NVLink domain [TC]
    # (transformer_config.py moe_flex_dispatcher_backend; DeepEP's normal kernels need single-node NVLink).
    dispatcher = K.written("moe_flex_dispatcher") if s.moe_flex_dispatcher else K.valued("moe_flex_dispatcher",
                                                                                          "alltoall")
    # Fused permute/unpermute (TransformerEngine >= 2.1, transformer_config.py moe_permute_fusion): the cost model
    # prices the MoE permutation with these kernels.
    a += ["--moe-grouped-gemm", "--moe-permute-fusion", *dispatcher]
    a += _router_args(m)
    if m.swiglu_limit:  # gpt-oss routes in fp32 (examples/gptoss/02_train.sh)
        a += ["--moe-router-dtype", "fp32"]
    return a


def _router_args(m: ModelSpec) -> List[str]:
    """The model's routing and balancing (moe_utils.py topk_routing_with_score_function, router.py TopKRouter):
    score function, softmax before or after the top-k, aux-loss-free expert bias, weight scaling, group-limited
    routing, and the balancing loss with its weight. Absent flags are Megatron's defaults (softmax after the
    top-k, no bias, no scaling, no groups)."""
    a = ["--moe-router-score-function", "sigmoid"] if m.moe_router_score_function == "sigmoid" else []
    if m.moe_router_score_function == "softmax" and not m.moe_router_norm_topk_prob:
        a += ["--moe-router-pre-softmax"]  # softmax over all experts, top-k probabilities not renormalised
    if m.moe_router_expert_bias:  # bias update rate: Megatron's default 1e-3 (DeepSeek-V3 report sec. 4.2 gamma)
        a += ["--moe-router-enable-expert-bias"]
    if m.moe_router_topk_scaling_factor != 1.0:
        a += ["--moe-router-topk-scaling-factor", _num(m.moe_router_topk_scaling_factor)]
    if m.moe_router_num_groups:
        a += ["--moe-router-num-groups", str(m.moe_router_num_groups),
              "--moe-router-group-topk", str(m.moe_router_group_topk)]
    a += ["--moe-router-load-balancing-type", m.moe_load_balancing]
    if m.moe_load_balancing != "none":
        a += ["--moe-aux-loss-coeff", _num(m.moe_aux_loss_coeff)]
    return a


def _parallel_args(m: ModelSpec, s: Strategy) -> List[str]:
    """The layout's arguments, each key's flag as autoplan/keys.py declares it."""
    a = K.valued("tp", s.tp) + K.valued("pp", s.pp) + K.valued("cp", s.cp)
    if s.vpp > 1 and not s.pipeline_layout:  # [V] a layout sets vpp itself: at most one of the two flags
        a += K.valued("vpp", s.vpp)
    if s.pipeline_layout:
        a += K.valued("pipeline_layout", s.pipeline_layout)
    a += K.megatron_passthrough(s, K.names("split"))  # the account-for flags (autoplan/keys.py)
    for key in ("first_stage_layers", "last_stage_layers"):
        if getattr(s, key) is not None:
            a += K.valued(key, getattr(s, key))
    if m.is_moe:
        a += K.valued("ep", s.ep) + K.valued("etp", s.etp)
    if s.sp and s.tp > 1:  # [V] silently dropped at tp=1, so not written
        a += K.written("sp")
    return a


def _optimizer_args(m: ModelSpec, s: Strategy) -> List[str]:
    a: List[str] = []
    if s.zero == 1:
        a += [K.flag("zero", 0)]
    elif s.zero >= 2:
        # Megatron-FSDP v1 (default) shards grads (optim_grads) or grads and params (optim_grads_params); it
        # turns the distributed optimizer on itself and checkpoints in fsdp_dtensor format [V].
        a += [K.flag("zero", 1), K.flag("zero", 0)] + K.valued("zero", K.FSDP_SHARDING[s.zero], 2)
        a += ["--ckpt-format", "fsdp_dtensor"]
    if s.overlap_grad_reduce:
        a += K.written("overlap_grad_reduce")
        if s.overlap_param_gather and s.zero >= 1:  # [V] needs the distributed optimizer and overlap-grad-reduce
            a += K.written("overlap_param_gather")
    if s.tp_overlap_on:
        a += K.written("tp_comm_overlap")
    if s.grad_reduce_bf16:
        a += K.written("grad_reduce_bf16")
    if s.adam_bf16_states:  # [V] arguments.py --use-precision-aware-optimizer, --exp-avg-dtype / --exp-avg-sq-dtype
        a += K.written("adam_bf16_states")
    if s.moe_a2a_overlap and m.is_moe:
        a += K.written("moe_a2a_overlap")
    if s.cpu_offload_layers:  # [V] arguments.py turns --cpu-offloading on when the layer count is > 0
        a += K.valued("cpu_offload_layers", s.cpu_offload_layers)
    if s.te_cross_entropy:  # [TC] model_parallel_config.py cross_entropy_fusion_impl 'te': TransformerEngine's kernel
        a += K.written("te_cross_entropy")
    return a


def _precision_args(plan: Plan) -> List[str]:
    s = plan.strategy
    a = ["--bf16"] + (K.written("grad_reduce_bf16") if s.grad_reduce_bf16 else [])
    if s.uses_fp8 and s.fp8_recipe == "nvfp4":  # [V] arguments.py: --fp4-format e2m1, --fp4-recipe nvfp4
        a += K.written("fp8_recipe", entry=1)
    elif s.uses_fp8:
        a += K.valued("fp8", s.fp8) + K.valued("fp8_recipe", effective_fp8_recipe(s.fp8_recipe, plan.cluster.gpu.id))
        if s.fp8_param:  # [V] needs the distributed optimizer or FSDP (autoplan/validate.py checks zero >= 1)
            a += K.written("fp8_param")
    m = plan.model
    if s.uses_fp8 and (m.bf16_first_layers or m.bf16_last_layers):  # arguments.py: layers kept in bf16 under FP8/FP4
        a += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(m.bf16_first_layers),
              "--num-layers-at-end-in-bf16", str(m.bf16_last_layers)]
    return a


def _recompute_args(s: Strategy) -> List[str]:
    if s.recompute == "none":
        return []
    a = K.valued("recompute", s.recompute)
    if s.recompute == "full":  # [TC] full needs a method and a layer count; selective takes neither
        a += K.valued("recompute_method", s.recompute_method or "uniform") + \
            K.valued("recompute_layers", s.recompute_layers or 1)
    if s.recompute == "selective" and s.recompute_modules:  # [TC] recompute_modules, nargs="+"; default core_attn
        a += [K.flag("recompute_modules"), *s.recompute_modules]
    return a


def _cuda_graph_args(s: Strategy) -> List[str]:
    """[TC] cuda_graph_impl / cuda_graph_modules: the full-iteration graph is its own impl and takes no modules
    (arguments.py: "--cuda-graph-modules must be empty when --cuda-graph-impl=full_iteration") and needs the NaN
    check off ("--no-check-for-nan-in-loss-and-grad should be set with --cuda-graph-impl=full_iteration");
    per-layer graphs are TransformerEngine's (`transformer_engine`, whose capture needs the TE RNG tracker:
    validate_args turns it on with a warning, so it is written out)."""
    mods = s.cuda_graph_modules or ()
    if not mods:
        return []
    if G.is_full_iteration(mods):
        return K.valued("cuda_graph_modules", "full_iteration") + ["--no-check-for-nan-in-loss-and-grad",
                                                                    "--te-rng-tracker"]
    return K.valued("cuda_graph_modules", "transformer_engine") + [K.flag("cuda_graph_modules", 1), *mods,
                                                                   "--te-rng-tracker"]


def _passthrough_args(s: Strategy) -> List[str]:
    """The switches written as their own flags and nothing else (autoplan/keys.py `passthrough`), e.g. [TC]
    use_transformer_engine_op_fuser (a TransformerConfig field, so a generated flag of arguments.py)."""
    return K.megatron_passthrough(s)


def _training_args(plan: Plan, probe: bool, probe_iters: int) -> List[str]:
    iters = probe_iters if probe else DEFAULT_TRAIN_ITERS
    a = K.valued("mbs", plan.strategy.mbs) + ["--global-batch-size", str(plan.workload.global_batch_size),
         "--train-iters", str(iters), "--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "cosine",
         "--lr-warmup-iters", str(max(1, iters // 10)), "--weight-decay", "0.1", "--clip-grad", "1.0",
         "--adam-beta1", "0.9", "--adam-beta2", "0.95"]
    if probe:
        # One log line per iteration with throughput, and a memory report each iteration [training.py
        # training_log: report_memory at log_memory_interval]; no evaluation, no checkpoint, exit after train-iters.
        a += ["--log-interval", "1", "--log-throughput", "--log-memory-interval", "1", "--eval-iters", "0"]
    else:
        a += ["--log-interval", "10", "--log-throughput"]
    return a


def megatron_args(plan: Plan, *, probe: bool = False, probe_iters: int = PROBE_ITERS,
                  release: str = DEFAULT_RELEASE) -> List[str]:
    """The `pretrain_gpt.py` argv (flags and values as separate items) for the plan, in the names of `release`
    (a tag of megatron_releases.RELEASES); InputError for a flag or value that release lacks."""
    check_megatron_plan(plan)
    m, s = plan.model, plan.strategy
    mtp = ["--mtp-num-layers", str(m.mtp_num_layers)] if m.mtp_num_layers else []  # [V] arguments.py
    return for_release(architecture_args(m, plan.workload.seq_len) + _moe_args(m, s) + mtp + _parallel_args(m, s)
                       + _precision_args(plan) + _recompute_args(s) + _cuda_graph_args(s) + _passthrough_args(s)
                       + _optimizer_args(m, s)
                       + _training_args(plan, probe, probe_iters), release)


def args_to_lines(argv: List[str]) -> List[str]:
    """Group an argv into one line per flag, values quoted for the shell (shlex.split reads each line back):
    ['--tp', '8', '--moe-layer-freq', '[0]*3+[1]*58'] -> ['--tp 8', "--moe-layer-freq '[0]*3+[1]*58'"]."""
    lines: List[str] = []
    for item in argv:
        if item.startswith("--") or not lines:
            lines.append(item)
        else:
            lines[-1] += " " + shlex.quote(item)
    return lines


# Checkpoint lines of a training run: shell words expanded by train.sh (which sets the defaults), so the same file
# serves every node; CHECKPOINT_DIR is where Megatron saves and resumes (--load of an empty folder starts fresh).
CHECKPOINT_LINES = ('--save "${CHECKPOINT_DIR}"', '--load "${CHECKPOINT_DIR}"', '--save-interval "${SAVE_INTERVAL}"')
DEFAULT_SAVE_INTERVAL = 500  # iterations between checkpoints unless SAVE_INTERVAL is set


def checkpoint_args(plan: Plan) -> List[str]:
    """The checkpoint interval and method a plan ranked by goodput was priced with (autoplan/costmodel/goodput.py);
    nothing for other plans, whose saves are train.sh's SAVE_INTERVAL. Names as megatron/training/training_config.py
    CheckpointConfig declares them (the parser's flags are its field names): async_save and
    use_persistent_ckpt_worker (validate_args turns --async-save off without it) [V]; ckpt_format torch_dist, the
    format async saving supports (Megatron-FSDP writes fsdp_dtensor, set in _optimizer_args); local checkpoints:
    non_persistent_ckpt_type local, non_persistent_local_ckpt_dir, non_persistent_save_interval, replication,
    replication_jump (required with replication [V]: one node's GPU count puts each replica on another node) and
    replication_factor."""
    e = plan.estimate
    if plan.objective != "goodput" or e.checkpoint_method is None:
        return []
    asynchronous = ["--async-save", "--use-persistent-ckpt-worker"] + (
        ["--ckpt-format", "torch_dist"] if plan.strategy.zero < 2 else [])
    if e.checkpoint_method == "async":
        return asynchronous
    if e.checkpoint_method == "local":
        # Saved asynchronously, as priced: checkpointing.py hands the local checkpoint manager's save
        # is_async=args.async_save.
        per_node = world_layout(plan)["gpus_per_node"]
        return asynchronous + ["--non-persistent-ckpt-type", "local", "--non-persistent-local-ckpt-dir", "${LOCAL_CKPT_DIR}",
                "--non-persistent-save-interval", str(e.checkpoint_interval_steps), "--replication",
                "--replication-jump", str(per_node), "--replication-factor",
                str(plan.cluster.resilience.replication)]
    return []


def _save_interval(plan: Plan) -> int:
    """train.sh's default SAVE_INTERVAL: the priced interval of a plan ranked by goodput with global (blocking or
    async) saves; otherwise DEFAULT_SAVE_INTERVAL (local checkpoints: the persistent copies every so often, not
    priced)."""
    e = plan.estimate
    if plan.objective == "goodput" and e.checkpoint_method in ("blocking", "async"):
        return int(e.checkpoint_interval_steps)
    return DEFAULT_SAVE_INTERVAL


def _shell_line(line: str) -> str:
    """An argument line whose ${VAR} train.sh expands (double quotes, as CHECKPOINT_LINES)."""
    return line.replace("'${LOCAL_CKPT_DIR}'", '"${LOCAL_CKPT_DIR}"')


def needs_max_connections_1(plan: Plan) -> bool:
    """[V] pre-Blackwell GPUs with TP or CP need CUDA_DEVICE_MAX_CONNECTIONS=1; Megatron-FSDP wants it unset."""
    s = plan.strategy
    return (s.tp > 1 or s.cp > 1) and s.zero < 2 and not is_blackwell_or_newer(plan.cluster.gpu)


def _header(plan: Plan, probe: bool, release: str) -> str:
    est = plan.estimate
    kind = "probe run" if probe else "training run"
    return (f"# autoplan {kind}: {plan.model.name} on {plan.cluster.num_gpus} x {plan.cluster.gpu.id}, "
            f"seq {plan.workload.seq_len}, global batch {plan.workload.global_batch_size}\n"
            f"# strategy: {plan.strategy.label()}\n"
            f"# predicted: {est.step_time_s:.3f} s/step, {est.tokens_per_s_per_gpu:.0f} tokens/s/GPU, "
            f"peak {est.peak_mem_gib:.1f} GiB\n"
            f"# for {describe(release)}: its arguments.py accepts every flag here\n")


def train_script(plan: Plan, probe: bool = False, release: str = DEFAULT_RELEASE) -> str:
    """torchrun launcher over nodes; reads megatron_args.txt next to it, extra arguments are appended."""
    layout = world_layout(plan)
    connections = ("export CUDA_DEVICE_MAX_CONNECTIONS=1  # TP/CP on pre-Blackwell GPUs (Megatron validate_args)\n"
                   if needs_max_connections_1(plan) else "")
    if plan.strategy.expandable_segments:  # the plan was priced with the expandable-segments allocator allowance
        connections += "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        if plan.strategy.cuda_graph_modules and not G.is_full_iteration(plan.strategy.cuda_graph_modules):
            # [V] TransformerEngine graphs with expandable segments need NCCL's graph registration off.
            connections += "export NCCL_GRAPH_REGISTER=0\n"
    return f"""#!/usr/bin/env bash
{_header(plan, probe, release)}# Usage: MEGATRON_LM=/path/to/Megatron-LM [NNODES=.. NODE_RANK=.. MASTER_ADDR=..] bash train.sh [extra args]
# Real data: set DATA_PATH (and TOKENIZER_MODEL, optionally TOKENIZER_TYPE); otherwise mock data is used.
# Checkpoints: CHECKPOINT_DIR (default ./checkpoints beside this script), every SAVE_INTERVAL iterations.
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
: "${{MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (the folder holding pretrain_gpt.py)}}"
NNODES=${{NNODES:-{layout['nodes']}}}
NODE_RANK=${{NODE_RANK:-0}}
{_gpus_per_node_lines(layout)}
MASTER_ADDR=${{MASTER_ADDR:-localhost}}
MASTER_PORT=${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}
{connections}{_version_check(release)}
CHECKPOINT_DIR="${{CHECKPOINT_DIR:-$HERE/checkpoints}}"  # --save/--load in megatron_args.txt
SAVE_INTERVAL="${{SAVE_INTERVAL:-{_save_interval(plan)}}}"  # --save-interval, iterations
{_local_ckpt_line(plan)}
# megatron_args.txt holds one flag per line in shell quoting; each line is read as shell words.
ARGS=()
while IFS= read -r line || [[ -n "$line" ]]; do
  [[ -z "$line" || "$line" == "#"* ]] && continue
  if [[ -n "${{DATA_PATH:-}}" && ( "$line" == "--mock-data" || "$line" == "--tokenizer-type "* ) ]]; then continue; fi
  eval "ARGS+=($line)"
done < "$HERE/megatron_args.txt"
if [[ -n "${{DATA_PATH:-}}" ]]; then
  ARGS+=(--data-path $DATA_PATH --tokenizer-type "${{TOKENIZER_TYPE:-HuggingFaceTokenizer}}"
         --tokenizer-model "${{TOKENIZER_MODEL:?set TOKENIZER_MODEL with DATA_PATH}}")
fi

exec torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$GPUS_PER_NODE" \\
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \\
  "$MEGATRON_LM/pretrain_gpt.py" "${{ARGS[@]}}" "$@"
"""


def _local_ckpt_line(plan: Plan) -> str:
    """train.sh's LOCAL_CKPT_DIR when the plan saves local checkpoints (--non-persistent-local-ckpt-dir)."""
    if "--non-persistent-local-ckpt-dir" not in checkpoint_args(plan):
        return ""
    return ('LOCAL_CKPT_DIR="${LOCAL_CKPT_DIR:-/tmp/autoplan-local-ckpt}"  # node-local storage: '
            '--non-persistent-local-ckpt-dir\n')


def sbatch_script(plan: Plan, probe: bool = False, release: str = DEFAULT_RELEASE) -> str:
    """Slurm batch script: one task per node, each running train.sh with its node rank."""
    layout = world_layout(plan)
    name = f"autoplan-{'probe-' if probe else ''}{plan.model.name}".replace(" ", "_")
    # With a partly used last node train.sh picks each node's count from its node rank.
    gpus_export = f"GPUS_PER_NODE={layout['gpus_per_node']} " if layout["last_node_gpus"] == layout["gpus_per_node"] \
        else ""
    return f"""#!/usr/bin/env bash
{_header(plan, probe, release)}# Submit from this folder: sbatch sbatch.sh   (needs MEGATRON_LM in the environment)
#SBATCH --job-name={name}
#SBATCH --nodes={layout['nodes']}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={layout['gpus_per_node']}
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
set -euo pipefail
RUN_DIR="${{RUN_DIR:-$SLURM_SUBMIT_DIR}}"
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"
export NNODES="$SLURM_JOB_NUM_NODES" {gpus_export}RUN_DIR

srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'NODE_RANK="$SLURM_NODEID" bash "$RUN_DIR/train.sh"'
"""


# The flags train.sh and CHECKPOINT_LINES add to megatron_args.txt, with sample values, checked against the release.
LAUNCH_FLAGS = ["--save", "dir", "--load", "dir", "--save-interval", "500", "--data-path", "prefix",
                "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "name"]


def _version_check(release: str) -> str:
    """train.sh lines that warn when the checkout is another release than the files were checked against
    (megatron/core/package_info.py MAJOR / MINOR)."""
    version = release[len("core_v"):].rsplit(".", 1)[0]
    return f"""INFO="$MEGATRON_LM/megatron/core/package_info.py"
FOUND="$(sed -n 's/^MAJOR = //p' "$INFO" 2>/dev/null || true).$(sed -n 's/^MINOR = //p' "$INFO" 2>/dev/null || true)"
if [[ "$FOUND" != "{version}" ]]; then
  echo "warning: megatron_args.txt was checked against Megatron-LM {release}; $MEGATRON_LM is version $FOUND," >&2
  echo "  whose parser may reject or rename flags; re-emit with --megatron-version" >&2
fi
"""


def emit_megatron(plan: Plan, *, probe: bool = False, probe_iters: int = PROBE_ITERS,
                  release: str = DEFAULT_RELEASE) -> Dict[str, str]:
    """{filename: text} of the Megatron-LM launch files for the plan, for Megatron-LM `release`."""
    argv = megatron_args(plan, probe=probe, probe_iters=probe_iters, release=release)
    saves = [] if probe else args_to_lines(checkpoint_args(plan))  # a probe saves nothing
    problem = release_problem(LAUNCH_FLAGS + checkpoint_args(plan), release)
    if problem:
        raise InputError(problem)
    lines = args_to_lines(argv) + ([] if probe else list(CHECKPOINT_LINES) + [_shell_line(line) for line in saves])
    args_text = _header(plan, probe, release) + "\n".join(lines) + "\n"
    return {"megatron_args.txt": args_text, "train.sh": train_script(plan, probe, release),
            "sbatch.sh": sbatch_script(plan, probe, release)}
