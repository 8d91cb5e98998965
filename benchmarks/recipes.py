"""What each published Megatron-Bridge run ran with, beyond the layout the tables print.

Source: NVIDIA-NeMo/Megatron-Bridge, the performance configs of the release that produced the row
(`RELEASE_TAG`): `scripts/performance/configs/<family>/*workload_base_configs.py` and `*_llm_pretrain.py` for
tags v0.3.0 to v0.5.1, `src/megatron/bridge/perf_recipes/<family>/<gpu>/*.py` and `perf_recipes/_common.py` for
v0.6.0 (commit 067f987df, the 26.08 container). The container a tag shipped in is inferred from the dates (tag
v0.4.0 2026-04-16 -> container 26.04, ...); rows of 25.09 / 25.11 use the earliest tag with that layout (v0.3.0)
and say so in `RecipeFacts.source`.

Facts read there, per family (config names are those files' constants / functions):
- All families: `grad_reduce_in_fp32 = False` (`_benchmark_common` in perf_recipes/_common.py; the per-family
  `*_llm_pretrain.py` helpers in v0.3-v0.5) -> bf16 gradient buffer and bf16 DP reduction.
- FP8 recipes: `bf16_with_mxfp8_mixed` and `bf16_with_fp8_current_scaling_mixed` set `fp8_param_gather = True`
  (src/megatron/bridge/training/mixed_precision.py): primary weights are kept in FP8 (MXFP8: row- and
  column-wise copies, with `reuse_grad_buf_for_mxfp8_param_ag` staging the gather in the grad buffer), so no bf16
  weight copy is kept.
- Llama3 8B / 70B, Llama3.1 405B: no recompute (`recompute_granularity = None`) except Llama3-8B H100 FP8-CS
  (`recompute_num_layers = 5`, full, block). Megatron-FSDP presets offload activations of N layers to CPU
  (`cpu_offloading_num_layers`: 70B GB200 40, GB300 20; 405B GB200 128 GPUs 92).
- DeepSeek-V3: `recompute_granularity = "selective"` with the modules of each GPU's preset
  (`deepseek_v3_modules`: mla_up_proj on most, mla_up_proj + mlp on H100, none on GB300 from v0.5.0);
  `moe_a2a_overlap` on H100, on B200 MXFP8 pp8 vpp2 ep32 (v0.5.0), and on GB200 / GB300 MXFP8 from v0.5.0
  (full-iteration CUDA graphs, HybridEP).
- MoE token dispatcher: DeepSeek-V3 runs the flex dispatcher in every tag: the recipe sets
  `moe_flex_dispatcher_backend = "hybridep"` and calls `apply_flex_dispatcher_backend`
  (src/megatron/bridge/recipes/deepseek/deepseek_v3.py, v0.3.0-v0.5.1; `moe_token_dispatcher_type = "flex"` in
  perf_recipes/deepseek/common.py, v0.6.0, "deepep" on B200), the perf base configs keep "hybridep"
  (configs/deepseek/deepseek_workload_base_configs.py) and the CLI default (-1, argument_parser.py) leaves it.
  Qwen3-235B H100 / B200 / B300 and GPT-OSS v0.3.0 set no backend (alltoall); their GB200 / GB300 (and GPT-OSS
  v0.4.0+ V2) configs use HybridEP inside one NVL72 domain, where it moves the same bytes as alltoall in the cost
  model, so those rows are left on the default.
- DeepSeek-V3 optimizer: `use_precision_aware_optimizer = True` with `exp_avg_dtype = exp_avg_sq_dtype =
  torch.bfloat16` and fp32 main params (src/megatron/bridge/recipes/deepseek/deepseek_v3.py, v0.3.0-v0.5.1;
  perf_recipes/deepseek/common.py, v0.6.0): Adam's moments are bf16 (Strategy `adam_bf16_states`). The perf
  scripts turn it off only under Megatron-FSDP (scripts/performance/utils/overrides.py
  `_set_megatron_fsdp_overrides`).
- Nemotron-3 (Nano, Super, 3.5): `use_fused_weighted_squared_relu = True` (src/megatron/bridge/recipes/nemotronh/
  nemotron_3_nano.py and nemotron_3_super.py, v0.4.0; perf_recipes/nemotronh/common.py, v0.6.0): the MoE
  squared ReLU is weighted by the routing probabilities in Megatron's fused kernel (Strategy
  `fused_weighted_squared_relu`). Nemotron-3 Super NVFP4 runs `nemotron_3_super_bf16_with_nvfp4_mixed`
  (src/megatron/bridge/training/mixed_precision.py): its last 14 layers in bf16 (`bf16_last_layers`), and its
  presets load the per-module quantization recipe scripts/performance/configs/nemotronh/te_quant.cfg (v0.4.0-v0.5.1;
  src/megatron/bridge/perf_recipes/nemotronh/te_quant.cfg in v0.6.0, byte-identical, sha256 35ce5b22e5922b4faf3d14788a9a71bf920fffaf8881b0ca5b0818f7ea0d7976):
  glob matchers `*.linear_qkv`, `*.linear_proj`, `*mlp.fc[12]_latent_proj` and `mtp.*` to an empty (bf16) recipe,
  `*mixer.out_proj` to MXFP8 (`bf16_modules`, `mxfp8_modules`).
- Qwen3-235B-A22B: no recompute; `moe_a2a_overlap` on H100 (all tags), on B300 in v0.3.0, on GB200 / GB300
  MXFP8 from v0.5.0.
- Pipeline split: the Qwen3-235B-A22B and Llama3.1-405B pre-training recipes the perf configs start from set
  `account_for_embedding_in_pipeline_split = account_for_loss_in_pipeline_split = True` in every tag
  (src/megatron/bridge/recipes/qwen/qwen3_moe.py `qwen3_235b_a22b_pretrain_config` and recipes/llama/llama3.py
  `llama31_405b_pretrain_config`, v0.3.0-v0.5.1; recipes/qwen/h100/qwen3_moe.py and recipes/llama/h100/llama3.py,
  v0.6.0, which perf_recipes/<family>/common.py builds on): the embedding and the loss count as one layer each, so
  94 + 2 and 126 + 2 layers split evenly over every pp x vpp the tables print (Strategy `account_for_embedding`,
  `account_for_loss`, used where pp > 1).
- Dropout: the Bridge model providers set `hidden_dropout = 0.0` for Llama (models/llama/llama_bridge.py),
  DeepSeek-V3 (models/deepseek/deepseek_v3_bridge.py) and Qwen (models/qwen/qwen2_bridge.py); torch's dropout
  with p = 0 returns its input, so no mask is saved.
- Allocator: scripts/performance/perf_plugins.py (v0.4.0) sets `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
  for Llama3.1-405B FP8 on GB200 / GB300 and for DeepSeek-V3 on H100 / GB200.
- Loss: `cross_entropy_loss_fusion = True` (src/megatron/bridge/models/gpt_provider.py) with
  `cross_entropy_fusion_impl = "te"` (scripts/performance/utils/overrides.py, all tags): TransformerEngine's
  parallel cross entropy (transformer_engine/pytorch/cross_entropy.py) writes the logits gradient in place into
  the bf16 logits, so no fp32 softmax copy is held.
- GPT-OSS-120B: selective `layernorm` + `moe_act` on B200 / GB200 / H100; `moe_a2a_overlap` on GB200 from
  v0.4.0 and on GB200 / GB300 MXFP8 from v0.5.0; TransformerEngine's op fuser (CuteDSL fused grouped MLP) on GB200 /
  GB300 MXFP8 from v0.5.0 (`te_op_fuser`), elsewhere Megatron's unfused expert path (per-expert bias loop, eager
  clamps; compute.unfused_expert_extras).

- CUDA graphs: each preset's `cuda_graph_impl` / `cuda_graph_scope` (`cuda_graph_modules` below; the table there).

CPU activation offload, FP8 primary weights, per-module selective recompute, the TE fused cross entropy and
expandable segments are Strategy switches (`cpu_offload_layers`, `fp8_param`, `recompute_modules`,
`te_cross_entropy`, `expandable_segments`, `cuda_graph_modules`) priced by the cost model; dropout 0 is the model's `hidden_dropout` (set
to 0 for the rows whose providers do so). Where the summary table prints a layout no config has, `config_layout`
gives the config's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from autoplan import cuda_graphs as G
from autoplan.modelio import load_model
from autoplan.pipeline_split import balanced_layout

# Container release -> Megatron-Bridge tag (tag dates 2026-02-26, 04-16, 06-16, 08-19).
RELEASE_TAG = {"26.02": "v0.3.0", "26.02.01": "v0.3.0", "26.04": "v0.4.0", "26.04.01": "v0.4.0",
               "26.06": "v0.5.0", "26.06.01": "v0.5.0", "26.08": "v0.6.0"}
EARLY_TAG = "v0.3.0"  # 25.09 / 25.11 rows: configs of that era not readable here; the nearest tag is used


@dataclass(frozen=True)
class RecipeFacts:
    """Settings of one published run that the table does not print."""

    recompute: str = "none"  # autoplan recompute kind
    recompute_layers: Optional[int] = None  # full recompute, block method: layers per chunk
    recompute_modules: str = ""  # Megatron selective modules, '/'-separated (recompute becomes "selective")
    cpu_offload_layers: int = 0  # layers whose activations live in host memory
    moe_a2a_overlap: bool = False
    moe_flex_dispatcher: bool = False  # flex token dispatcher (DeepEP / HybridEP)
    fp8_param: bool = False  # FP8 primary weights (fp8_param_gather)
    grad_reduce_bf16: bool = False
    no_dropout: bool = False  # hidden/attention dropout 0: no dropout masks are stored
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    te_cross_entropy: bool = False  # TransformerEngine fused cross entropy (gradient written into the logits)
    adam_bf16_states: bool = False  # precision-aware optimizer with bf16 Adam moments
    fused_weighted_squared_relu: bool = False  # MoE squared ReLU weighted in Megatron's fused kernel
    pipeline_layout: Optional[str] = None  # --pipeline-model-parallel-layout the recipe sets
    account_for_split: bool = False  # account_for_embedding/loss_in_pipeline_split both set by the recipe
    bf16_last_layers: int = 0  # trailing layers the mixed-precision config keeps in bf16 under FP8/FP4
    bf16_modules: Tuple[str, ...] = ()  # modules a per-module quantization recipe keeps in bf16 (ModelSpec field)
    mxfp8_modules: Tuple[str, ...] = ()  # modules it runs in MXFP8 under NVFP4 (ModelSpec field)
    cuda_graph_modules: Tuple[str, ...] = ()  # CUDA-graph capture (`cuda_graph_modules`); () = none
    te_op_fuser: bool = False  # TransformerEngine op fuser's fused grouped MLP for the experts
    # (key, value) of the layout the release's config runs where the table prints another (see `config_layout`).
    layout: Tuple[Tuple[str, int], ...] = ()
    source: str = ""


def release_of(row_id: str) -> Optional[str]:
    """'26.04.01' for 'mb_26.04.01_pre-training_...'; None for the NeMo rows."""
    if not row_id.startswith("mb_"):
        return None
    return row_id.split("_")[1]


def _tag(release: str) -> str:
    return RELEASE_TAG.get(release, EARLY_TAG)


def _at_least(release: str, tag: str) -> bool:
    return _tag(release) >= tag


def config_layout(row: Dict[str, str], gpu: str) -> Tuple[Tuple[str, int], ...]:
    """The layout a release's config runs where the table prints one no config of any tag has (a transcription
    slip of the summary page); () elsewhere.
    - Llama3-70B on GB300 in MXFP8 / NVFP4 without Megatron-FSDP: pp 4, vpp 5, micro batch 1
      (scripts/performance/configs/llama/llama3_workload_base_configs.py LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_MX_*
      and _NVFP4_*, micro_batch_size left at its default 1); rows printing no vpp.
    - GPT-OSS-120B on H100: micro batch 1 (gpt_oss_workload_base_configs.py BASE_GPT_OSS_120B_CONFIG
      micro_batch_size=1, kept by GPT_OSS_120B_PRETRAIN_CONFIG_H100_*); rows printing another."""
    model, fsdp = row["model"], row["zero_or_distopt"].startswith("fsdp")
    mx_or_fp4 = row["precision"] == "nvfp4" or (row["precision"] == "fp8" and "FP8-CS" not in row["notes"])
    if model.startswith("LLAMA3_70B") and gpu == "gb300" and mx_or_fp4 and not fsdp and not row["vpp"]:
        return (("pp", 4), ("vpp", 5), ("mbs", 1))
    if model.startswith("GPT OSS") and gpu == "h100" and (row["mbs"] or "1") != "1":
        return (("mbs", 1),)
    return ()


def recipe_facts(row: Dict[str, str], gpu: str, fp8: bool) -> Optional[RecipeFacts]:
    """The recipe facts of a Megatron-Bridge row, or None for rows from other sources."""
    release = release_of(row["id"])
    if release is None:
        return None
    model, pp, vpp, ep = row["model"], row["pp"], row["vpp"] or "1", row["ep"]
    fsdp = row["zero_or_distopt"].startswith("fsdp")
    tag = _tag(release)
    expandable = (model.startswith("LLAMA3.1_405B") and gpu in ("gb200", "gb300") and fp8) or \
        (model.startswith("DeepSeekV3") and gpu in ("h100", "gb200"))
    common = dict(fp8_param=fp8, grad_reduce_bf16=True, expandable_segments=expandable, te_cross_entropy=True,
                  cuda_graph_modules=cuda_graph_modules(row, gpu, release),
                  no_dropout=model.startswith(("LLAMA", "DeepSeek", "Qwen")),
                  layout=config_layout(row, gpu),
                  source=f"Megatron-Bridge {tag}" + ("" if release in RELEASE_TAG else f" (nearest to {release})"))
    if model.startswith("LLAMA"):
        offload = 0
        if fsdp and model.startswith("LLAMA3_70B"):
            offload = {"gb200": 40, "gb300": 20, "b200": 5}.get(gpu, 0)
        if fsdp and model.startswith("LLAMA3.1_405B") and gpu == "gb200":
            offload = 92
        if model.startswith("LLAMA3_8B") and gpu == "h100" and not fsdp:
            return RecipeFacts(recompute="full", recompute_layers=5, **common)
        return RecipeFacts(cpu_offload_layers=offload, account_for_split=model.startswith("LLAMA3.1_405B"),
                           **common)
    if model.startswith("DeepSeekV3"):
        a2a = gpu == "h100" or (gpu == "b200" and pp == "8" and vpp == "2" and ep == "32") or \
            (gpu in ("gb200", "gb300") and fp8 and _at_least(release, "v0.5.0"))
        modules = deepseek_v3_modules(gpu, release, pp, vpp, ep)
        return RecipeFacts(recompute="selective" if modules else "none", recompute_modules=modules,
                           moe_a2a_overlap=a2a, moe_flex_dispatcher=True, adam_bf16_states=True,
                           pipeline_layout=deepseek_v3_layout(gpu, pp, vpp), **common)
    if model.startswith("Qwen3"):
        a2a = gpu == "h100" or (gpu == "b300" and tag == "v0.3.0") or \
            (gpu in ("gb200", "gb300") and fp8 and _at_least(release, "v0.5.0"))
        return RecipeFacts(moe_a2a_overlap=a2a, account_for_split=model.startswith("Qwen3_235B"), **common)
    if model.startswith("GPT OSS"):
        a2a = (gpu == "gb200" and _at_least(release, "v0.4.0")) or \
            (gpu in ("gb200", "gb300") and fp8 and _at_least(release, "v0.5.0"))
        modules = "layernorm/moe_act" if gpu in ("b200", "gb200", "h100") else ""
        # The GB200 / GB300 MXFP8 V2 presets (v0.5.0+) run the experts through TransformerEngine's op fuser with
        # the CuteDSL fused grouped MLP (scripts/performance/utils/overrides.py `cutedsl_fused_grouped_mlp`:
        # use_transformer_engine_op_fuser; v0.6.0 `_apply_gpt_oss_120b_full_iter_fp8mx_configs`).
        op_fuser = gpu in ("gb200", "gb300") and fp8 and "MXFP8" in row["notes"] and _at_least(release, "v0.5.0")
        return RecipeFacts(recompute="selective" if modules else "none", recompute_modules=modules,
                           moe_a2a_overlap=a2a, te_op_fuser=op_fuser, **common)
    if model.startswith("Nemotron_3"):
        modules = nemotron3_modules(model, gpu, row["precision"])
        # nemotron_3_super_bf16_with_nvfp4_mixed (training/mixed_precision.py): first_last_layers_bf16 with
        # num_layers_at_end_in_bf16 = 14 (start: the MixedPrecisionConfig default 0).
        super_fp4 = model == "Nemotron_3_Super" and row["precision"] == "nvfp4"
        bf16_tail = 14 if super_fp4 else 0
        # The Super NVFP4 presets also load a per-module quantization recipe (nemotron_3_llm_pretrain.py
        # `set_nemotron_3_super_common_configs`: cfg.model.quant_recipe = load_quantization_recipe("te_quant.cfg"),
        # v0.4.0-v0.5.1; perf_recipes/nemotronh/common.py `_TE_QUANT_CFG_PATH`, v0.6.0; the same file in every tag,
        # sha256 35ce5b22...): attention linear_qkv / linear_proj, fc1/fc2_latent_proj and every mtp.* module in
        # bf16, the Mamba mixer's out_proj in MXFP8.
        return RecipeFacts(recompute="selective" if modules else "none", recompute_modules=modules,
                           moe_flex_dispatcher=True, fused_weighted_squared_relu=True, bf16_last_layers=bf16_tail,
                           bf16_modules=("attention_linear", "latent_proj", "mtp") if super_fp4 else (),
                           mxfp8_modules=("mamba_out_proj",) if super_fp4 else (), **common)
    return RecipeFacts(**common)


TE_MOE = ("attn", "moe_router", "moe_preprocess")  # TransformerEngine graphs of attention, router, preprocess
ROUTER = ("moe_router", "moe_preprocess")
FULL = G.FULL_ITERATION
NEMOTRON_TE = ("attn", "mamba", "moe_router", "moe_preprocess")


def cuda_graph_modules(row: Dict[str, str], gpu: str, release: str) -> Tuple[str, ...]:
    """The CUDA-graph capture of a Megatron-Bridge row's preset, () for none. Read per tag in
    scripts/performance/configs/<family>/*_workload_base_configs.py (`cuda_graph_impl`, `cuda_graph_scope`, applied
    by utils/overrides.py `_set_cuda_graph_overrides`; v0.3.0-v0.5.x) and perf_recipes/<family>/<gpu>/*.py (v0.6.0);
    impl "none" captures nothing whatever the scope (Llama NVFP4 presets); impl "local" + scope full_iteration and
    impl "full_iteration" are the full-iteration graph. The preset is the one whose layout the row prints (V1 / V2):
    - Llama3-8B: full iteration on B200 / B300 / GB200 / GB300 (GB300 NVFP4 too; GB200 NVFP4 none); H100 none.
    - Llama3-70B: GB200 NVFP4 V2 TE attn + mlp from v0.5.0; Llama3.1-405B: GB300 NVFP4 V1 (gbs 64) full iteration
      before v0.6.0; every other Llama preset none.
    - DeepSeek-V3: GB200 TE attn/moe_router/moe_preprocess, MXFP8 full iteration from v0.5.0; GB300 bf16 TE, MXFP8
      full iteration from v0.5.0 (none before: `cuda_graph_scope = []` only), FP8-CS / NVFP4 none; B200 MXFP8 pp 8
      vpp 2 ep 32 TE; B300 pp 8 ep 8 mbs 2 (v0.5.0 V2) TE; H100 none.
    - Qwen3-235B: GB200 TE, MXFP8 pp 8 vpp 3 (V2) full iteration from v0.5.0; GB300 pp 1 ep 64 (V1) and the bf16
      pp 4 vpp 12 ep 16 (v0.3.0 V2) moe_router/moe_preprocess, MXFP8 pp 4 vpp 12 full iteration from v0.5.0, else TE;
      B200 / B300 / H100 none (their full-iteration presets start at v0.5.1 with another layout).
    - GPT-OSS-120B: B300 TE; GB300 TE, MXFP8 ep 16 (V2) full iteration from v0.5.0; GB200 MXFP8 full iteration
      from v0.5.0; H100, B200 and GB200 bf16 none.
    - Nemotron-3 Nano and 3.5 Lightning (Lightning's recipe is Nano's, perf_recipes/nemotronh/gb200/nemotronh.py):
      TE attn/mamba/moe_router/moe_preprocess on Blackwell, attn + mamba on H100 bf16, mamba on H100 FP8-CS;
      Super: TE attn/mamba/moe_router/moe_preprocess except B200 bf16 / MXFP8 (none). Presets from v0.4.0; the
      26.02.01 Nemotron rows use them."""
    model, prec, notes = row["model"], row["precision"], row["notes"]
    pp, vpp, ep, mbs = row["pp"] or "1", row["vpp"] or "1", row["ep"] or "1", row["mbs"] or "1"
    mx = prec == "fp8" and "MXFP8" in notes
    fp4 = prec == "nvfp4"
    v05 = _at_least(release, "v0.5.0")
    if model.startswith("LLAMA3_8B"):
        if gpu == "h100" or (fp4 and gpu != "gb300"):
            return ()
        return FULL
    if model.startswith("LLAMA3_70B"):
        return ("attn", "mlp") if gpu == "gb200" and fp4 and v05 else ()
    if model.startswith("LLAMA3.1_405B"):
        return FULL if gpu == "gb300" and fp4 and row["gbs"] == "64" and _tag(release) < "v0.6.0" else ()
    if model.startswith("DeepSeekV3"):
        if gpu == "gb200":
            return FULL if mx and v05 else TE_MOE
        if gpu == "gb300":
            return (FULL if v05 else ()) if mx else (TE_MOE if prec == "bf16" else ())
        if gpu == "b200":
            return TE_MOE if mx and (pp, vpp, ep) == ("8", "2", "32") else ()
        if gpu == "b300":
            return TE_MOE if (pp, ep, mbs) == ("8", "8", "2") else ()
        return ()
    if model.startswith("Qwen3"):
        if gpu == "gb200":
            return FULL if mx and vpp == "3" and v05 else TE_MOE
        if gpu == "gb300":
            if pp == "1" or (prec == "bf16" and vpp == "12" and ep == "16"):
                return ROUTER
            return FULL if mx and vpp == "12" and v05 else TE_MOE
        return ()
    if model.startswith("GPT OSS"):
        if gpu == "b300":
            return TE_MOE
        if gpu == "gb300":
            return FULL if mx and ep == "16" and v05 else TE_MOE
        if gpu == "gb200":
            return FULL if mx and v05 else ()
        return ()
    if model.startswith(("Nemotron_3_Nano", "Nemotron_3_5")):
        if gpu == "h100":
            return ("attn", "mamba") if prec == "bf16" else ("mamba",)
        return NEMOTRON_TE
    if model.startswith("Nemotron_3_Super"):
        return () if gpu in ("h100",) or (gpu == "b200" and not fp4) else NEMOTRON_TE
    return ()


def deepseek_v3_layout(gpu: str, pp: str, vpp: str) -> Optional[str]:
    """The pipeline layout the DeepSeek-V3 recipes set (src/megatron/bridge/recipes/deepseek/deepseek_v3.py
    `set_deepseek_v3_pipeline_model_parallel_layout` layout_map, and the perf presets' `pp_layout`), as
    `pipeline_split.balanced_layout` builds it for the catalogue model (61 layers, one MTP depth): 16 virtual stages
    (pp x vpp = 16) hold the embedding with 4 layers, 14 x 4 layers, then 1 layer, the MTP block and the loss
    (Et*4|(t*4|)*14tmL: the last stage gives 3 layers to MTP and loss); pp 8 vpp 4 (H100 preset) 1, 30 x 2, then
    MTP and loss (Et|(t*2|)*30mL, the preset's Et|(tt|)*30mL: the embedding takes 1 and MTP with the loss 2); pp 8
    alone 8, 6 x 8, then 5. None where no config sets one (Megatron's even split)."""
    p, v = int(pp or 1), int(vpp or 1)
    if (p * v == 16 and p in (2, 4, 8, 16)) or (p, v) == (8, 1):
        emb_units, loss_units = 0, 3
    elif gpu == "h100" and (p, v) == (8, 4):
        emb_units, loss_units = 1, 2
    else:
        return None
    model = load_model("deepseek-v3")
    return balanced_layout(model.num_layers, p, v, emb_units, loss_units, model.mtp_num_layers)


def deepseek_v3_modules(gpu: str, release: str, pp: str, vpp: str, ep: str) -> str:
    """Selective recompute modules of the DeepSeek-V3 FP8 / MXFP8 perf presets
    (scripts/performance/configs/deepseek/deepseek_workload_base_configs.py `recompute_modules`, V1 and V2 alike;
    v0.6.0: src/megatron/bridge/perf_recipes/deepseek/<gpu>/deepseek_v3.py): H100 mla_up_proj and mlp (every tag);
    B200 at pp 8, vpp 2, ep 32 mla_up_proj and mlp (B200_FP8_MX_V2 of v0.5.0, the only preset with that layout);
    GB300 none from v0.5.0 (`recompute_modules=[]`, mbs 1, full-iteration CUDA graphs); GB200 mlp in v0.4.0;
    mla_up_proj elsewhere (GB300 v0.3.0-v0.4.0, GB200 v0.3.0 and v0.5.0+, B200 / B300)."""
    tag = _tag(release)
    if gpu == "h100" or (gpu == "b200" and (pp, vpp, ep) == ("8", "2", "32")):
        return "mla_up_proj/mlp"
    if gpu == "gb300" and tag >= "v0.5.0":
        return ""
    if gpu == "gb200" and tag == "v0.4.0":
        return "mlp"
    return "mla_up_proj"


def nemotron3_modules(model: str, gpu: str, precision: str) -> str:
    """Selective recompute modules of the Nemotron-3 perf presets
    (scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py, tags v0.4.0 to v0.5.1 alike for
    Super): Super on B200 moe_act, moe, layernorm and core_attn in bf16 (B200_BF16_V1), moe_act and layernorm in
    MXFP8 (BASE_NEMOTRON_3_SUPER_CONFIG_B200), none in NVFP4 (`recompute_modules=None`, which
    utils/overrides.py `_set_recompute_overrides` leaves at the recipe's none); on B300 moe_act and layernorm in bf16
    and NVFP4 (B300_NVFP4_V1 = B300_BF16_V1), none in MXFP8; none on GB200 and GB300 (BASE_NEMOTRON_3_SUPER_CONFIG
    and its tp-2 GB200 copy set no modules; the GB200 "moe_act, layernorm, core_attn, moe" of the April 2026 main
    branch was removed by commit 142fdafe2 'nt super cleanup' before any of those tags); Nano on H100 moe and
    layernorm in bf16, moe, layernorm, core_attn and moe_act in FP8, none elsewhere. Every preset sets a flex
    dispatcher backend (hybridep, deepep on B300)."""
    if model.startswith("Nemotron_3_Super"):
        if gpu == "b200":
            return {"bf16": "moe_act/moe/layernorm/core_attn", "nvfp4": ""}.get(precision, "moe_act/layernorm")
        if gpu == "b300" and precision in ("bf16", "nvfp4"):
            return "moe_act/layernorm"
        return ""
    if model.startswith("Nemotron_3_Nano") and gpu == "h100":
        return "moe/layernorm" if precision == "bf16" else "moe/layernorm/core_attn/moe_act"
    return ""
    if model.startswith("Nemotron_3_Nano") and gpu == "h100":
        return "moe/layernorm" if precision == "bf16" else "moe/layernorm/core_attn/moe_act"
    return ""
