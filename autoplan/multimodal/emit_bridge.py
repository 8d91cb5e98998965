"""Megatron-Bridge VLM recipe overrides: an OmegaConf YAML file for the example launcher
(examples/models/vlm/qwen_vl/finetune_qwen_vl.py --config-file, Megatron-Bridge v0.3.1, the release whose
pyproject pins megatron-core >= 0.15, < 0.17, i.e. autoplan's pinned megatron-core 0.16.1).

The keys are fields of the model provider (Qwen25VLModelProvider / Qwen3VLModelProvider / Gemma3VLModelProvider,
all GPTModelProvider -> TransformerConfig) and of TrainingConfig. The megatron-core parser could not be run here
(its import needs the engine extra), so its checks on these fields are replicated (benchmarks/vlm_parser_check.py runs
the written files through Bridge's own override and validation code and compares verdicts), citing megatron-core 0.16.1
megatron/core/transformer/transformer_config.py: heads divisible by TP (line 926), query groups (line 941), first /
last stage layers > 0 (lines 1369, 1388), middle layers divisible by the middle stages (lines 1409, 1416)."""
from __future__ import annotations

from typing import Dict, List

from autoplan.errors import InputError
from autoplan.multimodal.placement import Placement
from autoplan.multimodal.spec import Freeze, MultimodalSpec

BRIDGE_RELEASE = "Megatron-Bridge v0.3.1"
# VLM model providers of that release (src/megatron/bridge/models/{qwen_vl,gemma_vl}).
# Model keys that are the provider's own rather than TransformerConfig's: GPTModelProvider.seq_length and the freeze
# switches of the VLM providers (models/qwen_vl/qwen25_vl_provider.py lines 50-52). The VLM recipes' dataset is a
# VLM conversation provider whose length field is seq_length (data/vlm_datasets/mock_provider.py line 46, hf_provider.py,
# preloaded_provider.py), not GPTDatasetConfig's sequence_length. An unknown key is skipped with a
# warning by the override code (training/utils/omegaconf_utils.py `_apply_overrides`, line 453), so every key
# written is one of these or a TransformerConfig field.
PROVIDER_FIELDS = ("seq_length", "freeze_language_model", "freeze_vision_model", "freeze_vision_projection")
BRIDGE_VLMS = {"qwen2_5_vl": "Qwen25VLModelProvider", "qwen3_vl": "Qwen3VLModelProvider",
               "gemma3": "Gemma3VLModelProvider"}


def check_transformer_config(num_layers: int, heads: int, groups: int, tp: int, pp: int, first, last) -> None:
    """megatron-core 0.16.1 TransformerConfig.__post_init__ checks on these fields (lines cited above)."""
    if heads % tp:
        raise InputError(f"num_attention_heads ({heads}) must be a multiple of tensor_model_parallel_size ({tp})")
    if groups % tp and tp % groups:
        raise InputError(f"num_query_groups ({groups}) and tensor_model_parallel_size ({tp}) must divide one another")
    if first is None and last is None:
        if num_layers % pp:
            raise InputError(f"num_layers ({num_layers}) must be divisible by pipeline_model_parallel_size ({pp}) "
                             f"without first/last stage layer counts")
        return
    rest, stages = num_layers, pp
    for name, value in (("first", first), ("last", last)):
        if value is not None:
            if value <= 0:
                raise InputError(f"num_layers_in_{name}_pipeline_stage must be larger than 0 (got {value})")
            rest, stages = rest - value, stages - 1
    if bool(rest) != bool(stages):
        raise InputError(f"Mismatch: {rest} middle layers remaining but {stages} middle PP stages available")
    if stages and rest % stages:
        raise InputError(f"number of layers at middle stage: {rest} must be divisible by the middle pipeline model "
                         f"parallel size {stages}")


# The one placement kind Bridge expresses: the vision tower on the language model's pipeline stage 0.
PLACEMENT = "inherit"


def bridge_overrides(spec: MultimodalSpec, p: Placement, freeze: Freeze, seq: int, gbs: int) -> Dict[str, Dict]:
    if spec.model_type not in BRIDGE_VLMS:
        raise InputError(f"{BRIDGE_RELEASE} has no VLM model provider for model_type {spec.model_type!r} (it has "
                         f"{', '.join(BRIDGE_VLMS)}); emit mimo or train it another way")
    if p.kind != PLACEMENT:
        raise InputError(f"{BRIDGE_RELEASE} builds the vision tower on pipeline stage 0 of the language model's grid "
                         f"only; a disjoint encoder grid cannot be expressed there (--emit mimo)")
    s = p.llm
    if p.encoder_recompute:
        raise InputError(f"{BRIDGE_RELEASE} has no setting for recomputing the Hugging Face vision tower; plan with "
                         f"--no-encoder-recompute")
    check_transformer_config(spec.llm.num_layers, spec.llm.num_attention_heads, spec.llm.num_query_groups, s.tp,
                             s.pp, s.first_stage_layers, s.last_stage_layers)
    if p.llm_gpus % (s.tp * s.pp * s.cp):
        # ConfigContainer.get_data_parallel_size (training/config.py): the world must divide by TP x PP x CP.
        raise InputError(f"world size ({p.llm_gpus}) is not divisible by tensor x pipeline x context parallel "
                         f"({s.tp} x {s.pp} x {s.cp})")
    model = {"tensor_model_parallel_size": s.tp, "pipeline_model_parallel_size": s.pp,
             "context_parallel_size": s.cp, "expert_model_parallel_size": s.ep, "sequence_parallel": s.sp,
             "seq_length": seq, "freeze_vision_model": freeze.vision_model,
             "freeze_vision_projection": freeze.vision_projection, "freeze_language_model": freeze.language_model}
    if s.pp > 1:
        model["pipeline_dtype"] = "bfloat16"  # omegaconf_utils.py line 484: getattr(torch, value)
    if s.first_stage_layers is not None:
        model["num_layers_in_first_pipeline_stage"] = s.first_stage_layers
    if s.last_stage_layers is not None:
        model["num_layers_in_last_pipeline_stage"] = s.last_stage_layers
    return {"model": model, "train": {"micro_batch_size": s.mbs, "global_batch_size": gbs},
            "dataset": {"seq_length": seq}}


def bridge_yaml(overrides: Dict[str, Dict], header: List[str]) -> str:
    lines = [f"# {h}" for h in header]
    if "pipeline_dtype" in overrides["model"]:
        # omegaconf_utils.py line 482 turns the string back into torch.bfloat16 only over a recipe value that is
        # already a dtype; the 3B/7B recipes leave it None.
        lines.append("# pipeline_dtype: pass pipeline_dtype=torch.bfloat16 to the recipe function when its default "
                     "is None")
    for section, values in overrides.items():
        lines.append(f"{section}:")
        for k, v in values.items():
            lines.append(f"  {k}: {str(v).lower() if isinstance(v, bool) else v}")
    return "\n".join(lines) + "\n"
