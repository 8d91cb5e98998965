"""Read existing launch configurations: a Megatron-LM launch script or argument list
(`autoplan.integrations.megatron_flags`), or a DeepSpeed config. An imported configuration is priced as written:
every strategy key the file (or the engine's defaults) fixes is set here, and only the keys it truly lacks are left
for the search to choose."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field

from autoplan import keys as K
from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.workload import Workload, make_workload
from autoplan.integrations import megatron_flags as MF
from autoplan.integrations.megatron_model_args import hybrid_pattern, megatron_model
from autoplan.integrations.engines import ignored_deepspeed_keys


class ImportedConfig(BaseModel):
    """What an existing engine configuration says about the model, the strategy and the batch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSpec = Field(description="The architecture.")
    strategy: Dict[str, Any] = Field(description="Strategy fields by their autoplan key names (tp, pp, zero, ...).")
    workload: Optional[Workload] = Field(None, description="Sequence length and global batch; None when the "
                                                           "source holds no sequence length (DeepSpeed configs).")
    global_batch_size: Optional[int] = Field(None, description="Sequences per optimizer step, when known.")
    world_size: Optional[int] = Field(None, description="GPUs in the job when the source fixes it, else None.")
    source: str = Field(description="Engine the configuration came from: 'megatron' or 'deepspeed'.")
    notes: List[str] = Field(default_factory=list, description="Assumptions made while reading.")


# ------------------------------------------------------------------------------------------ Megatron-LM
def _read_text(text_or_path: Union[str, Path]) -> str:
    """The text of a launch file, or the argument text itself ('--num-layers 32 ...' or several lines)."""
    text = str(text_or_path)
    if not isinstance(text_or_path, Path) and ("\n" in text or text.lstrip().startswith("-") or " --" in text):
        return text
    from autoplan.fileio import read_text

    return read_text(text, "Megatron launch file", _MEGATRON_FIX)


_MEGATRON_FIX = "pass a Megatron-LM launch script, an argument file or '--num-layers ...' text"


def _source_name(text_or_path: Union[str, Path]) -> str:
    text = str(text_or_path)
    return f"{text!r}" if "\n" not in text and len(text) <= 80 else "the argument text"


def parse_megatron_flags(text: str) -> Tuple[Dict[str, Optional[str]], Dict[str, str]]:
    """({flag: value or None}, {'world': N} when the launcher fixes it) of a launch script or argument list."""
    launch = MF.launch_words(text)
    world = MF.launcher_world(launch.launcher)
    return MF.parse_flags(launch.words), ({"world": str(world)} if world else {})


# Entry scripts of Megatron-LM models that are not decoder-only GPTs, by the start of their name, and the
# arguments only those models take (T5's encoder/decoder depths, BERT's WordPiece tokenizers).
_NOT_GPT_ENTRIES = {"pretrain_bert": "BERT/T5", "pretrain_t5": "BERT/T5", "pretrain_ict": "BERT/T5 (ICT retriever)",
                    "pretrain_vlm": "a vision-language model", "pretrain_vision": "a vision model",
                    "pretrain_retro": "RETRO", "pretrain_mimo": "a multimodal (MIMO) model"}
_BERT_T5_FLAGS = ("encoder-num-layers", "decoder-num-layers", "encoder-seq-length", "decoder-seq-length",
                  "bert-binary-head", "bert-no-binary-head")


def _refuse_other_models(entry: Optional[str], flags: Dict[str, Optional[str]]) -> None:
    """A launch of a model that is not a decoder-only GPT (Mamba / hybrid / MoE included) is refused by its kind."""
    kind = next((k for prefix, k in _NOT_GPT_ENTRIES.items() if entry and entry.startswith(prefix)), None)
    tokenizer = flags.get("tokenizer-type") or ""
    if kind is None and "Multimodal" in tokenizer:
        kind, entry = "a multimodal (vision-language) model", entry or f"--tokenizer-type {tokenizer}"
    if kind is None and (any(f in flags for f in _BERT_T5_FLAGS) or tokenizer.startswith("BertWordPiece")):
        kind = "BERT/T5"
    if kind == "BERT/T5":
        raise InputError(f"{entry or 'the arguments'}: BERT/T5 is not a decoder-only GPT model; autoplan plans "
                         f"GPT/Mamba/MoE decoders")
    if kind:
        raise InputError(f"{entry} trains {kind}, not a decoder-only GPT model; autoplan plans GPT/Mamba/MoE "
                         f"decoders (pretrain_gpt.py, pretrain_mamba.py, pretrain_hybrid.py)")


def _refuse_no_model(name: str, text: str, launch: "MF.Launch", flags: Dict[str, Optional[str]]) -> None:
    """Arguments with no model to price, refused with where the model would have come from."""
    unknown = sorted({m.group(1) for w in launch.words for m in re.finditer(r"\$\{?([A-Za-z_]\w*)", w)})
    sourced = [n for n in launch.notes if n.startswith("`source") or n.startswith("`.")]
    if "use-checkpoint-args" in flags:
        why = "reads the model from its checkpoint (--use-checkpoint-args)"
    elif sourced and launch.entry:
        why = f"takes its model arguments from a sourced file ({sourced[0].split('`')[1]})"
    elif unknown and launch.entry:
        why = f"runs {launch.entry} with ${', $'.join(unknown)}, which the file does not assign (the environment or " \
              f"a script that sources this one sets it)"
    elif launch.env.get("HF_MODEL_CKPT") and "$" not in launch.env["HF_MODEL_CKPT"]:
        # Megatron-LM's examples/post_training/modelopt/*.sh build the model from ${HF_MODEL_CKPT} when the fragment
        # writes no MODEL_ARGS (conf/moonshotai/kimi_k2_instruct.sh).
        raise InputError(f"{name} names its model only by its Hugging Face checkpoint (HF_MODEL_CKPT="
                         f"{launch.env['HF_MODEL_CKPT']}), which autoplan does not read: pass the checkpoint's "
                         f"config.json or a catalogue name (`autoplan models`) as --model, and the fragment's layout "
                         f"as --strategy")
    elif set(flags) & MF.READ_FLAGS:
        why = f"sets {', '.join('--' + k for k in list(flags)[:4])} but no model"
    else:
        what = "is empty" if not text.strip() else "holds no Megatron-LM argument autoplan reads (--num-layers, " \
                                                   "--seq-length, ...)"
        raise InputError(f"{name} {what}: not a Megatron script; {_MEGATRON_FIX}")
    raise InputError(f"{name} {why}: no --num-layers or --hybrid-layer-pattern to price; pass the model's fragment "
                     f"or launch script")


def _job_value(flags: Dict[str, Optional[str]], flag: str, given: Optional[int], option: str,
               notes: List[str]) -> Optional[int]:
    """The command line's value, else the script's --flag. The command line wins, as --gpus over the launcher's
    size and --strategy over the script's layout do: scripts take these from environment defaults
    (`${MAX_SEQ_LENGTH:-8192}`) that a run changes; the replacement is noted."""
    written = MF.typed(flags, flag, MF.pos_int)
    if written is not None and given is not None and written != given:
        notes.append(f"{option} {given} replaces the script's --{flag} {written}")
    return given if given is not None else written


def _fragment_tokenizer(flags: Dict[str, Optional[str]], env: Dict[str, str], notes: List[str]) -> None:
    """A modelopt fragment names its tokenizer in TOKENIZER_MODEL, which Megatron-LM's examples/post_training/
    modelopt/*.sh pass as --tokenizer-model ${TOKENIZER_MODEL}."""
    model = env.get("TOKENIZER_MODEL") or env.get("HF_MODEL_CKPT")
    if "tokenizer-model" not in flags and model and "$" not in model:
        flags["tokenizer-model"] = model
        notes.append(f"--tokenizer-model {model}: the fragment's TOKENIZER_MODEL, which modelopt's scripts pass")


def from_megatron_args(text_or_path: Union[str, Path], overrides: Sequence[str] = (), *,
                       seq_len: Optional[int] = None, global_batch_size: Optional[int] = None,
                       world_size: Optional[int] = None) -> ImportedConfig:
    """Model, strategy, workload and (when the launcher fixes it) world size of a Megatron-LM launch: a launch
    script (its shell variables, arrays and branches read, never run), an argument file, argument text, or a model
    fragment (a script that only assigns MODEL_ARGS=...; the layout keys it does not write are left for the search
    to choose). `overrides` are `--set key=value` model fields (e.g. vocab_size when the tokenizer does not tell
    it); `seq_len`, `global_batch_size` and `world_size` are the job from the command line: they fill what the
    script lacks and replace what it writes (named in the notes)."""
    from autoplan.modelio import parse_overrides

    text = _read_text(text_or_path)
    launch = MF.launch_words(text)
    notes = list(launch.notes)
    flags = MF.parse_flags(launch.words)
    _refuse_other_models(launch.entry, flags)
    if "num-layers" not in flags and not hybrid_pattern(flags):
        _refuse_no_model(_source_name(text_or_path), text, launch, flags)
    if launch.fragment:
        _fragment_tokenizer(flags, launch.env, notes)
        notes.append("model fragment: no launch line; the job comes from the command line")
    seq = _job_value(flags, "seq-length", seq_len, "--seq", notes)
    if seq is None:
        raise InputError("Megatron arguments lack --seq-length; add it or pass --seq N")
    tp = MF.typed(flags, K.arg("tp"), MF.pos_int, 1)
    model = megatron_model(flags, seq, tp, parse_overrides(overrides), notes)
    strategy = MF.megatron_strategy(flags, model.num_layers, model.is_moe)
    if launch.fragment:
        strategy = MF.written_layout(flags, strategy, notes)
    if MF.expandable_segments(launch.env):
        strategy["expandable_segments"] = True
    world = MF.launcher_world(launch.launcher)
    gbs = _job_value(flags, "global-batch-size", global_batch_size, "--gbs", notes)
    if gbs is None and (world_size or world) and all(k in strategy for k in ("tp", "pp", "cp", "mbs")):
        dp = (world_size or world) // (strategy["tp"] * strategy["pp"] * strategy["cp"])
        gbs = strategy["mbs"] * dp  # [V] default global batch = mbs x dp
        notes.append(f"--global-batch-size absent: Megatron's default mbs*dp = {gbs}")
    if gbs is None:
        raise InputError("Megatron arguments lack --global-batch-size and the world size or layout is unknown; add "
                         "it or pass --gbs N")
    workload = make_workload(seq, gbs, "Megatron arguments --seq-length/--global-batch-size")
    return ImportedConfig(model=model, strategy=strategy, workload=workload,
                          global_batch_size=gbs, world_size=world, source="megatron", notes=notes)


# ------------------------------------------------------------------------------------------ DeepSpeed
# What DeepSpeed runs whatever its config says: no context parallelism, no interleaving, no Megatron sequence
# parallelism, no TransformerEngine FP8 (autoplan/deepspeed_rules.py); experts replicated unless the
# config turns AutoEP on (`expert_parallel`).
DEEPSPEED_FIXED = {"cp": 1, "vpp": 1, "sp": False, "fp8": "none", "ep": 1, "etp": 1}


def _ds_int(config: Dict[str, Any], key: str, where: str) -> Optional[int]:
    """An integer field; None when absent or "auto" (HF Trainer fills those from its own arguments)."""
    value = config.get(key)
    if value is None or value == "auto":
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"{where}{key} must be a non-negative integer or \"auto\", got {value!r}")
    return value


def _given(config_value: Optional[int], user: Optional[int], key: str, option: str) -> Optional[int]:
    """The config's value, or the user's for an "auto"/absent one; both given and different is an error."""
    if user is not None and config_value is not None and user != config_value:
        raise InputError(f"ds_config {key}={config_value} but {option} {user}; drop {option} or edit the config")
    return config_value if config_value is not None else user


def _ds_batch(config: Dict[str, Any], dp: int, mbs: Optional[int], gbs: Optional[int]) -> Tuple[Optional[int], int]:
    """(micro batch or None when nothing fixes it, global batch) with DeepSpeed's rule
    train_batch = micro x gas x dp (runtime/config.py _batch_assertion)."""
    micro_key = K.deepspeed_leaf("mbs")
    micro = _given(_ds_int(config, micro_key, ""), mbs, micro_key, "--mbs")
    train = _given(_ds_int(config, "train_batch_size", ""), gbs, "train_batch_size", "--gbs")
    gas = _ds_int(config, "gradient_accumulation_steps", "")
    if gas is None and "gradient_accumulation_steps" not in config and micro and train is None:
        gas = 1  # DeepSpeed's default when the key is absent
    if gas is None and "gradient_accumulation_steps" not in config and micro is None and train is not None \
            and micro_key not in config:
        gas = 1  # only train_batch_size: gas 1, micro = train / dp (_set_batch_related_parameters)
    if micro is None and train is not None and gas is not None:
        micro = train // (gas * dp)
    if train is None and micro is not None and gas is not None:
        train = micro * gas * dp
    if train is None:
        raise InputError("ds_config train_batch_size is \"auto\" or absent and cannot be derived; pass --gbs N "
                         "(sequences per optimizer step)")
    if micro == 0:
        raise InputError(f"ds_config: train_batch_size={train} is smaller than gas x dp; fix the batch sizes")
    if micro is not None and gas is not None and train != micro * gas * dp:
        raise InputError(f"ds_config: train_batch_size={train} != micro {micro} x gas {gas} x dp {dp}; fix one")
    if micro is not None and train % (micro * dp):
        raise InputError(f"ds_config: train_batch_size={train} is not divisible by micro {micro} x dp {dp}")
    return micro, train


def _read_ds_json(path: Union[str, Path]) -> Dict[str, Any]:
    from autoplan.fileio import read_text

    text = read_text(path, "DeepSpeed config", "pass the ds_config.json file")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"DeepSpeed config {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(config, dict):
        raise InputError(f"DeepSpeed config {path} must be a JSON object")
    return config


# Master weights, gradients and Adam states kept in 16 bits under ZeRO (deepspeed runtime/precision_config.py;
# runtime/zero/stage_1_and_2.py and stage3.py allocate the master partition in that dtype, base_optimizer.py
# _configure_master_weights). The bf16 ones are read as written (strategy keys bf16_master_weights and
# adam_bf16_states, priced in autoplan/costmodel/memory.py optimizer_bytes_per_param); autoplan trains in bf16, so
# fp16 master weights are refused by name.
_BF16_MASTER = (("bf16_master_weights_and_grads", "bf16_master_weights"), ("bf16_optimizer_states", "adam_bf16_states"))


def _low_precision_master(config: Dict[str, Any]) -> Dict[str, bool]:
    if (config.get("fp16") or {}).get("fp16_master_weights_and_grads"):
        raise InputError("ds_config fp16.fp16_master_weights_and_grads=true (fp16 master weights and gradients) is "
                         "not priced: autoplan prices bf16 training; use bf16 with bf16_master_weights_and_grads, or "
                         "remove it to price fp32 master weights")
    bf16 = config.get("bf16") or {}
    return {key: True for name, key in _BF16_MASTER if bf16.get(name)}


def _offload_notes(zero: Dict[str, Any]) -> List[str]:
    notes = []
    for key, what in (("offload_optimizer", "optimizer states"), ("offload_param", "parameters")):
        device = (zero.get(key) or {}).get("device", "none")
        if device not in ("none", None):
            notes.append(f"zero_optimization.{key} to {device} is not modelled: {what} are priced in GPU memory "
                         f"(memory over-stated, host transfer time left out)")
    return notes


def _autoep(config: Dict[str, Any], model: ModelSpec, notes: List[str]) -> Dict[str, int]:
    """ep and etp of DeepSpeed AutoEP (`expert_parallel`: enabled, autoep_size, expert_tensor_parallel_size;
    deepspeed module_inject/auto_ep_config.py parse_autoep_config), when it is on."""
    section = config.get("expert_parallel", {}) or {}
    if not section.get("enabled", False):
        return {}
    if not model.is_moe:
        notes.append("expert_parallel is enabled but the model is dense: nothing to shard, ep=1")
        return {}
    return {"ep": _ds_int(section, "autoep_size", "expert_parallel.") or 1,
            "etp": _ds_int(section, "expert_tensor_parallel_size", "expert_parallel.") or 1}


def _ds_key(section: Dict[str, Any], key: str) -> Optional[int]:
    """The integer strategy key `key` (autoplan/keys.py `deepspeed`) from its section of a ds_config."""
    where = K.deepspeed_section(key)
    return _ds_int(section, K.deepspeed_leaf(key), where + "." if where else "")


def _ds_recompute(config: Dict[str, Any], pipeline: Dict[str, Any], notes: List[str]) -> Dict[str, Any]:
    interval = _ds_key(pipeline, "recompute") or 0
    if interval:
        return dict(recompute="full", recompute_method="uniform", recompute_layers=interval)
    if "activation_checkpointing" in config:
        notes.append("activation_checkpointing present: assumed full recompute of every layer")
        return dict(recompute="full", recompute_method="uniform", recompute_layers=1)
    return {}  # set in model code (HF Trainer gradient_checkpointing): not in the config


def from_deepspeed_config(path: Union[str, Path], model: ModelSpec, num_gpus: int, *, seq_len: Optional[int] = None,
                          mbs: Optional[int] = None, gbs: Optional[int] = None) -> ImportedConfig:
    """Strategy and batch of a DeepSpeed config for `model` on `num_gpus` (the config holds no architecture).
    `mbs`/`gbs` fill "auto" batch fields (HF Trainer configs). The workload is set only when `seq_len` is given:
    a DeepSpeed config has no sequence length. Keys the config cannot state are DeepSpeed's (DEEPSPEED_FIXED);
    the micro batch (when "auto" and not given) and recompute (when not in the config) are left out."""
    config = _read_ds_json(path)
    notes: List[str] = ignored_deepspeed_keys(config, source=str(path))
    if config and len(notes) == len(config):
        raise InputError(f"DeepSpeed config {path} holds no DeepSpeed setting (its keys: "
                         f"{', '.join(sorted(config)[:5])}): not a ds_config; pass the file given to "
                         f"deepspeed.initialize / --deepspeed_config")
    master = _low_precision_master(config)
    zero = config.get(K.deepspeed_section("zero"), {}) or {}
    pipeline = config.get(K.deepspeed_section("pp"), {}) or {}
    stage = _ds_key(zero, "zero") or 0
    pp = _ds_key(pipeline, "pp") or 1
    tp = _ds_key(config.get(K.deepspeed_section("tp"), {}) or {}, "tp") or 1
    if num_gpus % (tp * pp):
        raise InputError(f"{num_gpus} GPUs are not divisible by autotp_size*stages = {tp}*{pp}")
    micro, train = _ds_batch(config, num_gpus // (tp * pp), mbs, gbs)
    strategy: Dict[str, Any] = {"tp": tp, "pp": pp, "zero": min(stage, 3), **DEEPSPEED_FIXED,
                                **_autoep(config, model, notes), **master}
    if micro is not None:
        strategy["mbs"] = micro
    # runtime/zero/config.py overlap_comm_valid: absent means on for stage 3 only.
    strategy["overlap_grad_reduce"] = bool(zero.get(K.deepspeed_leaf("overlap_grad_reduce"), stage == 3)) \
        if stage > 0 else True
    if stage > 0:  # one switch in DeepSpeed: overlap_comm overlaps the gradient reduction and the weight gathers
        strategy["overlap_param_gather"] = strategy["overlap_grad_reduce"]
    if (config.get(K.deepspeed_section("grad_reduce_bf16"), {}) or {}).get(K.deepspeed_leaf("grad_reduce_bf16")) \
            == "bf16":
        strategy["grad_reduce_bf16"] = True
    notes += _offload_notes(zero)
    strategy.update(_ds_recompute(config, pipeline, notes))
    workload = make_workload(seq_len, train, "ds_config train_batch_size") if seq_len else None
    return ImportedConfig(model=model, strategy=strategy, workload=workload, global_batch_size=train,
                          world_size=num_gpus, source="deepspeed", notes=notes)
