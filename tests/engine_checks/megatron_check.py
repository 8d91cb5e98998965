"""Feed emitted Megatron-LM arguments to megatron-core's own checks on a fake process group of the plan's world
size: `parallel_state.initialize_model_parallel`, `TransformerConfig` (MLATransformerConfig for MLA), the
micro-batch calculator and the interleaved schedule's entry test.

Run as a script (the fake process group is global state, so the tests keep it out of the pytest process):
    python megatron_check.py WORLD_SIZE ARGS_FILE [WORLD_SIZE ARGS_FILE ...]
prints 'OK ARGS_FILE' per accepted pair, or 'REJECTED ARGS_FILE: <megatron-core's error>'."""
from __future__ import annotations

import re
import shlex
import sys
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F


def read_flags(args_text: str) -> Dict[str, Optional[str]]:
    """{flag name without '--': its value (words joined by spaces) or None} of an argument file read as shell words
    (shlex raises on a quote left open, as the shell would)."""
    flags: Dict[str, Optional[str]] = {}
    name = None
    for word in shlex.split(args_text, comments=True):
        if word.startswith("--"):
            name = word[2:]
            flags[name] = None
        elif name is not None:
            flags[name] = word if flags[name] is None else f"{flags[name]} {word}"
    return flags


def _eval_pattern(pattern: str):
    """A list expression such as '[0]*3+[1]*58', checked the way Megatron-LM's arguments.py _eval_pattern checks it."""
    if re.search(r"[^,\d\[\]\(\)\+\*]", pattern):
        raise ValueError(f"Invalid pattern: {pattern}")
    return eval(pattern)  # noqa: S307 - only digits, brackets, commas, + and * are left


def _bias_activation_fusion(flags: Dict[str, Optional[str]]) -> bool:
    """training/argument_utils.py: bias_swiglu_fusion with --swiglu, else bias_gelu_fusion, which arguments.py
    validate_args turns off without linear biases; both default on."""
    if "swiglu" in flags:
        return "no-bias-swiglu-fusion" not in flags
    return "no-bias-gelu-fusion" not in flags and "disable-bias-linear" not in flags


def transformer_kwargs(flags: Dict[str, Optional[str]]) -> Dict[str, Any]:
    """TransformerConfig fields from Megatron-LM argument names (megatron/training/arguments.py ->
    core_transformer_config_from_args)."""
    def num(name, kind=int, default=None):
        return kind(flags[name]) if name in flags else default

    tp = num("tensor-model-parallel-size", default=1)
    kw: Dict[str, Any] = dict(
        num_layers=num("num-layers"), hidden_size=num("hidden-size"), ffn_hidden_size=num("ffn-hidden-size"),
        num_attention_heads=num("num-attention-heads"), kv_channels=num("kv-channels"),
        num_query_groups=num("num-query-groups") if "group-query-attention" in flags else None,
        normalization=flags.get("normalization", "LayerNorm"), add_bias_linear="disable-bias-linear" not in flags,
        add_qkv_bias="add-qkv-bias" in flags, qk_layernorm="qk-layernorm" in flags,
        hidden_dropout=num("hidden-dropout", float, 0.1), attention_dropout=num("attention-dropout", float, 0.1),
        init_method_std=num("init-method-std", float, 0.02),
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=num("pipeline-model-parallel-size", default=1),
        virtual_pipeline_model_parallel_size=num("num-virtual-stages-per-pipeline-rank"),
        context_parallel_size=num("context-parallel-size", default=1),
        expert_model_parallel_size=num("expert-model-parallel-size", default=1),
        expert_tensor_parallel_size=num("expert-tensor-parallel-size", default=tp),
        sequence_parallel="sequence-parallel" in flags,
        num_layers_in_first_pipeline_stage=num("decoder-first-pipeline-num-layers"),
        num_layers_in_last_pipeline_stage=num("decoder-last-pipeline-num-layers"),
        account_for_embedding_in_pipeline_split="account-for-embedding-in-pipeline-split" in flags,
        account_for_loss_in_pipeline_split="account-for-loss-in-pipeline-split" in flags,
        pipeline_model_parallel_layout=flags.get("pipeline-model-parallel-layout"),
        mtp_num_layers=num("mtp-num-layers"),
        bf16="bf16" in flags, params_dtype=torch.bfloat16 if "bf16" in flags else torch.float32,
        pipeline_dtype=torch.bfloat16 if "bf16" in flags else torch.float32,
        fp8=flags.get("fp8-format"), fp8_recipe=flags.get("fp8-recipe", "delayed"),
        recompute_granularity=flags.get("recompute-granularity"), recompute_method=flags.get("recompute-method"),
        recompute_num_layers=num("recompute-num-layers"), tp_comm_overlap="tp-comm-overlap" in flags,
    )
    if flags.get("recompute-modules"):
        kw["recompute_modules"] = flags["recompute-modules"].split()
    if kw["pipeline_model_parallel_layout"]:
        # arguments.py validate_args: a layout sets vpp to its stage count / pp (None for one stage per rank).
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

        assert kw["virtual_pipeline_model_parallel_size"] is None, "a layout and a vpp flag cannot both be set"
        stages = PipelineParallelLayerLayout.get_num_stages_from_str(kw["pipeline_model_parallel_layout"])
        pp = kw["pipeline_model_parallel_size"]
        assert stages % pp == 0, f"layout stages {stages} must be divisible by pp {pp}"
        kw["virtual_pipeline_model_parallel_size"] = stages // pp if stages // pp > 1 else None
    if "swiglu" in flags:
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    if "quick-geglu" in flags:  # arguments.py: quick_gelu inside a gated linear unit
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kw.update(gated_linear_unit=True, activation_func=quick_gelu)
    kw.update(glu_linear_offset=num("glu-linear-offset", float, 0.0),
              activation_func_clamp_value=num("activation-func-clamp-value", float),
              softmax_type=flags.get("softmax-type", "vanilla"),
              bias_activation_fusion=_bias_activation_fusion(flags))
    if "window-size" in flags:
        kw["window_size"] = tuple(int(x) for x in flags["window-size"].split(","))
        skip = flags.get("window-attn-skip-freq")
        kw["window_attn_skip_freq"] = None if skip is None else (_eval_pattern(skip) if "[" in skip else int(skip))
    if "num-experts" in flags:
        freq = flags.get("moe-layer-freq", "1")
        kw.update(num_moe_experts=num("num-experts"), moe_router_topk=num("moe-router-topk"),
                  moe_ffn_hidden_size=num("moe-ffn-hidden-size"),
                  moe_shared_expert_intermediate_size=num("moe-shared-expert-intermediate-size"),
                  moe_layer_freq=_eval_pattern(freq) if "[" in freq else int(freq),
                  moe_token_dispatcher_type=flags.get("moe-token-dispatcher-type", "allgather"),
                  moe_router_load_balancing_type=flags.get("moe-router-load-balancing-type", "aux_loss"),
                  moe_aux_loss_coeff=num("moe-aux-loss-coeff", float, 0.0),
                  moe_router_dtype=flags.get("moe-router-dtype"),
                  moe_router_score_function=flags.get("moe-router-score-function", "softmax"),
                  moe_router_pre_softmax="moe-router-pre-softmax" in flags,
                  moe_router_enable_expert_bias="moe-router-enable-expert-bias" in flags,
                  moe_router_topk_scaling_factor=num("moe-router-topk-scaling-factor", float),
                  moe_router_num_groups=num("moe-router-num-groups"),
                  moe_router_group_topk=num("moe-router-group-topk"),
                  overlap_moe_expert_parallel_comm="overlap-moe-expert-parallel-comm" in flags,
                  moe_grouped_gemm="moe-grouped-gemm" in flags)
    impl = flags.get("cuda-graph-impl", "none")
    if impl != "none":
        # The verified Megatron-LM commit's --cuda-graph-impl full_iteration / --cuda-graph-modules are megatron-core
        # 0.16.1's cuda_graph_impl "local" with cuda_graph_scope ["full_iteration"] / cuda_graph_scope (arguments.py
        # at core_v0.16.1: --cuda-graph-scope, nargs="+").
        modules = (flags.get("cuda-graph-modules") or "").split()
        kw.update(cuda_graph_impl="local" if impl == "full_iteration" else impl,
                  cuda_graph_scope=["full_iteration"] if impl == "full_iteration" else modules,
                  use_te_rng_tracker="te-rng-tracker" in flags)
    # The recent families' attention variants (TransformerConfig fields of the same names; arguments.py generates
    # their flags from them).
    variant = flags.get("experimental-attention-variant")
    kw.update(attention_output_gate="attention-output-gate" in flags, experimental_attention_variant=variant,
              layernorm_zero_centered_gamma="apply-layernorm-1p" in flags,
              moe_shared_expert_gate="moe-shared-expert-gate" in flags)
    if variant == "gated_delta_net":
        freq = flags["linear-attention-freq"]
        kw.update(linear_attention_freq=_eval_pattern(freq) if "[" in freq else int(freq),
                  linear_conv_kernel_dim=num("linear-conv-kernel-dim"), linear_key_head_dim=num("linear-key-head-dim"),
                  linear_value_head_dim=num("linear-value-head-dim"),
                  linear_num_key_heads=num("linear-num-key-heads"),
                  linear_num_value_heads=num("linear-num-value-heads"))
    if variant == "dsa":
        kw.update(dsa_indexer_n_heads=num("dsa-indexer-n-heads"), dsa_indexer_head_dim=num("dsa-indexer-head-dim"),
                  dsa_indexer_topk=num("dsa-indexer-topk"),
                  dsa_indexer_loss_coeff=num("dsa-indexer-loss-coeff", float),
                  apply_rope_fusion="no-rope-fusion" not in flags)  # arguments.py --no-rope-fusion, default on
    if "multi-latent-attention" in flags:
        kw.update(multi_latent_attention=True, q_lora_rank=num("q-lora-rank"), kv_lora_rank=num("kv-lora-rank"),
                  qk_head_dim=num("qk-head-dim"), qk_pos_emb_head_dim=num("qk-pos-emb-head-dim"),
                  v_head_dim=num("v-head-dim"), rope_type=flags.get("rope-type", "yarn"),
                  rotary_scaling_factor=num("rotary-scaling-factor", float, 40.0),
                  mscale=num("mscale", float, 1.0), mscale_all_dim=num("mscale-all-dim", float, 0.0))
    return kw


# TransformerEngine is not installed on a CPU machine, while the emitted runs need it; TransformerConfig's version
# checks then see the oldest version the pinned megatron-core 0.16.1 is built for (its `dev` extra:
# transformer-engine>=2.9.0a0,<2.12.0) instead of failing on a missing version.
ASSUMED_TE_VERSION = "2.9.0"


def assume_transformer_engine() -> None:
    """Make megatron-core's TE version checks answer for ASSUMED_TE_VERSION when TE is absent."""
    from packaging.version import Version

    import megatron.core.transformer.transformer_config as tc
    import megatron.core.utils as mcu

    try:
        import transformer_engine  # noqa: F401
        return
    except ImportError:
        pass
    te = Version(ASSUMED_TE_VERSION)
    for module in (tc, mcu):
        module.get_te_version = lambda: te
        module.is_te_min_version = lambda version, check_equality=True: (te >= Version(version) if check_equality
                                                                          else te > Version(version))


def check_schedule(flags: Dict[str, Optional[str]], kw: Dict[str, Any], world_size: int) -> None:
    """The batch and schedule rules met when training starts: megatron-core's own micro-batch calculator
    (num_microbatches_calculator.py ConstantNumMicroBatchesCalculator asserts gbs % (mbs * dp) == 0), and the entry
    test of the interleaved schedule (pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving,
    with microbatch_group_size_per_vp_stage defaulting to pp in model_parallel_config.py), which has no entry point
    of its own and is repeated here."""
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    pp = kw["pipeline_model_parallel_size"]
    dp = world_size // (kw["tensor_model_parallel_size"] * pp * kw["context_parallel_size"])
    micro = ConstantNumMicroBatchesCalculator(int(flags["global-batch-size"]), int(flags["micro-batch-size"]), dp,
                                              decrease_batch_size_if_needed=False, rank=0).get()
    if not kw["virtual_pipeline_model_parallel_size"]:
        return
    group = pp
    if group > micro:
        raise ValueError(f"The number of contiguous micro-batches in a virtual pipeline stage should range in "
                         f"[PP={pp} , M={micro}]")
    if 0 < micro % group < pp:
        raise RuntimeError(f"The remainder of M (the total micro-batches) divided by N (number of contiguous "
                           f"micro-batches in a virtual pipeline stage) should be 0, or larger than or equal to the "
                           f"pipeline-parallel size, but it is {micro % group}.")


def dist_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def check(world_size: int, args_text: str) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from megatron.core import parallel_state
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    assume_transformer_engine()
    flags = read_flags(args_text)
    kw = transformer_kwargs(flags)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=kw["tensor_model_parallel_size"],
        pipeline_model_parallel_size=kw["pipeline_model_parallel_size"],
        virtual_pipeline_model_parallel_size=kw["virtual_pipeline_model_parallel_size"],
        context_parallel_size=kw["context_parallel_size"], expert_model_parallel_size=kw["expert_model_parallel_size"],
        expert_tensor_parallel_size=kw["expert_tensor_parallel_size"], create_gloo_process_groups=False)
    config_cls = MLATransformerConfig if kw.get("multi_latent_attention") else TransformerConfig
    config_cls(**kw)
    check_schedule(flags, kw, world_size)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    pairs = sys.argv[1:]
    for world, path in zip(pairs[::2], pairs[1::2]):
        try:
            check(int(world), open(path).read())
            print(f"OK {path}", flush=True)
        except Exception as e:  # every failure is a verdict on this file; the next file is still checked
            print(f"REJECTED {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            if dist_initialized():
                from megatron.core import parallel_state

                parallel_state.destroy_model_parallel()
                torch.distributed.destroy_process_group()
