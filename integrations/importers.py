"""Read existing launch configurations: a Megatron-LM argument list or launch script, or a DeepSpeed config.

Defaults for arguments that are absent are Megatron-LM's own (megatron/training/arguments.py and
TransformerConfig): tied embeddings, biases on, LayerNorm, GELU, learned absolute positions, ffn = 4h.
Real Megatron arguments that do not describe the model, the layout or the batch are ignored."""
from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoplan.errors import InputError
from autoplan.model import ModelSpec
from autoplan.workload import Workload
from autoplan.integrations.engines import check_deepspeed_keys


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
_LIST_FLAGS = {"recompute-modules"}  # nargs="+" arguments this reader uses
_FLAG_FLAGS = {  # store_true flags this reader uses
    "group-query-attention", "multi-latent-attention", "swiglu", "untie-embeddings-and-output-weights",
    "disable-bias-linear", "add-qkv-bias", "qk-layernorm", "moe-grouped-gemm", "sequence-parallel",
    "use-distributed-optimizer", "use-megatron-fsdp", "overlap-grad-reduce", "overlap-param-gather",
    "tp-comm-overlap", "overlap-moe-expert-parallel-comm", "bf16", "fp16", "mock-data", "grad-reduce-in-bf16",
    "moe-enable-deepep",
}
_LAUNCHER_SIZES = {"nproc_per_node", "nproc-per-node", "nnodes"}


def _read_text(text_or_path: Union[str, Path]) -> str:
    if isinstance(text_or_path, Path) or ("\n" not in str(text_or_path) and os.path.isfile(str(text_or_path))):
        path = Path(text_or_path)
        if not path.is_file():
            raise InputError(f"Megatron arguments file {path} does not exist")
        return path.read_text()
    return str(text_or_path)


def _tokens(text: str) -> List[str]:
    """Shell words of a launch script or argument list: comments dropped, line continuations joined."""
    text = re.sub(r"\\\r?\n", " ", text)
    try:
        return shlex.split(text, comments=True)
    except ValueError as e:
        raise InputError(f"cannot split the Megatron arguments into shell words ({e}); check the quoting") from None


def parse_megatron_flags(text: str) -> Tuple[Dict[str, Optional[str]], Dict[str, str]]:
    """({flag: value or None}, {launcher option: value}) from shell words; the last occurrence wins (argparse)."""
    words = _tokens(text)
    flags: Dict[str, Optional[str]] = {}
    launcher: Dict[str, str] = {}
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        name, _, inline = word[2:].partition("=")
        nxt = words[i + 1] if i + 1 < len(words) else None
        takes_value = name not in _FLAG_FLAGS and nxt is not None and not nxt.startswith("--") and not inline
        value = inline or (nxt if takes_value else None)
        if name in _LIST_FLAGS and takes_value:  # nargs="+": every following word up to the next flag
            rest = words[i + 1:]
            value = " ".join(itertools.takewhile(lambda w: not w.startswith("--"), rest))
        if name in _LAUNCHER_SIZES and value is not None:
            launcher[name.replace("-", "_")] = value
        else:
            flags[name] = value
    return flags, launcher


def _typed(flags: Dict[str, Optional[str]], name: str, kind: Callable[[str], Any], default: Any = None) -> Any:
    if name not in flags:
        return default
    raw = flags[name]
    if raw is None or "$" in raw:
        why = "uses a shell variable; expand it first" if raw else "has no value"
        raise InputError(f"--{name} {raw or ''}: the value {why}".replace("  ", " "))
    try:
        return kind(raw)
    except ValueError:
        raise InputError(f"--{name} expects {kind.__name__ if kind is not _pos_int else 'a positive integer'}, "
                         f"got {raw!r}") from None


def _pos_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError(raw)
    return value


def _eval_pattern(raw: str) -> List[int]:
    """Megatron's list-expression patterns ('[0]*3+[1]*58', '([1]*3+[0])*2') without eval: lists, + and *."""
    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = ev(node.left), ev(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(raw)

    try:
        value = ev(ast.parse(raw.strip(), mode="eval"))
    except (SyntaxError, ValueError, TypeError):
        raise InputError(f"--moe-layer-freq {raw!r} is not a list pattern like '[0]*3+[1]*58'") from None
    if not isinstance(value, list) or any(v not in (0, 1) for v in value):
        raise InputError(f"--moe-layer-freq {raw!r} must give a list of 0 and 1")
    return value


def _moe_layout(flags: Dict[str, Optional[str]], num_layers: int) -> Tuple[int, int]:
    """(first_k_dense_layers, moe_layer_freq) from --moe-layer-freq."""
    raw = flags.get("moe-layer-freq")
    if raw is None:
        return 0, 1
    if "[" not in raw:
        return 0, _typed(flags, "moe-layer-freq", _pos_int)  # [V] integer N: layer i is MoE when i % N == 0
    pattern = _eval_pattern(raw)
    if len(pattern) != num_layers or 1 not in pattern:
        raise InputError(f"--moe-layer-freq pattern has {len(pattern)} entries and "
                         f"{sum(pattern)} MoE layers; it needs {num_layers} entries with at least one 1")
    first = pattern.index(1)
    ones = [i for i, v in enumerate(pattern) if v]
    freq = ones[1] - ones[0] if len(ones) > 1 else num_layers - first
    expected = [int(i >= first and (i - first) % freq == 0) for i in range(num_layers)]
    if expected != pattern:
        raise InputError(f"--moe-layer-freq {raw!r} is not 'k dense layers, then every n-th layer MoE'; "
                         f"autoplan models only that shape")
    return first, freq


def _window(flags: Dict[str, Optional[str]], num_layers: int) -> Tuple[int, int]:
    """(sliding_window, num_sliding_window_layers) from --window-size and --window-attn-skip-freq."""
    raw = flags.get("window-size")
    if raw is None:
        return 0, 0
    try:
        left = int(raw.strip("()").split(",")[0])
    except ValueError:
        raise InputError(f"--window-size expects 'left,right' integers, got {raw!r}") from None
    skip = flags.get("window-attn-skip-freq")
    if skip is None:
        return left, num_layers
    # core/transformer/utils.py is_layer_window_attention: int N -> layer_number % N != 0; list -> entry != 0.
    pattern = _eval_pattern(skip) if "[" in skip else \
        [int((i + 1) % _typed(flags, "window-attn-skip-freq", _pos_int) != 0) for i in range(num_layers)]
    return left, sum(pattern)


def _megatron_model(f: Dict[str, Optional[str]], seq_len: int) -> ModelSpec:
    layers = _typed(f, "num-layers", _pos_int)
    hidden = _typed(f, "hidden-size", _pos_int)
    heads = _typed(f, "num-attention-heads", _pos_int)
    vocab = _typed(f, "vocab-size", _pos_int)
    for name, value in (("num-layers", layers), ("hidden-size", hidden), ("num-attention-heads", heads),
                        ("vocab-size", vocab)):
        if value is None:
            raise InputError(f"Megatron arguments lack --{name}; add it (the model cannot be built without it)")
    swiglu = "swiglu" in f
    # [V] ffn default: 4h, or 2/3 of that rounded down to a multiple of 64 with SwiGLU.
    default_ffn = int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden
    ffn = _typed(f, "ffn-hidden-size", _pos_int, default_ffn)
    first_dense, freq = _moe_layout(f, layers)
    window, window_layers = _window(f, layers)
    experts = _typed(f, "num-experts", int, 0) or 0
    mla = "multi-latent-attention" in f
    values: Dict[str, Any] = dict(
        name="imported-megatron", num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_query_groups=_typed(f, "num-query-groups", _pos_int, 1) if "group-query-attention" in f else heads,
        kv_channels=_typed(f, "kv-channels", _pos_int, hidden // heads), vocab_size=vocab,
        max_position_embeddings=_typed(f, "max-position-embeddings", _pos_int, seq_len),
        activation="swiglu" if swiglu else "gelu",
        normalization="rmsnorm" if _typed(f, "normalization", str, "LayerNorm") == "RMSNorm" else "layernorm",
        position_embedding="rope" if _typed(f, "position-embedding-type", str, "learned_absolute") == "rope"
        else "learned",
        rotary_base=_typed(f, "rotary-base", float, 10000.0),
        hidden_dropout=_typed(f, "hidden-dropout", float, 0.1),  # default: transformer_config.py
        tie_embeddings="untie-embeddings-and-output-weights" not in f,
        add_bias_linear="disable-bias-linear" not in f, add_qkv_bias="add-qkv-bias" in f,
        qk_layernorm="qk-layernorm" in f, multi_latent_attention=mla,
        num_experts=experts, sliding_window=window, num_sliding_window_layers=window_layers)
    if mla:  # defaults from MLATransformerConfig
        values.update(q_lora_rank=_typed(f, "q-lora-rank", _pos_int), kv_lora_rank=_typed(f, "kv-lora-rank", int, 512),
                      qk_head_dim=_typed(f, "qk-head-dim", int, 128),
                      qk_pos_emb_head_dim=_typed(f, "qk-pos-emb-head-dim", int, 64),
                      v_head_dim=_typed(f, "v-head-dim", int, 128))
    if experts:
        values.update(moe_router_topk=_typed(f, "moe-router-topk", _pos_int, 2),
                      moe_ffn_hidden_size=_typed(f, "moe-ffn-hidden-size", _pos_int, ffn),
                      shared_expert_ffn_hidden_size=_typed(f, "moe-shared-expert-intermediate-size", int, 0),
                      first_k_dense_layers=first_dense, moe_layer_freq=freq)
    try:
        return ModelSpec(**values)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"Megatron arguments give an invalid model: {err['msg']}") from None


def _megatron_strategy(f: Dict[str, Optional[str]], num_layers: int, is_moe: bool) -> Dict[str, Any]:
    tp = _typed(f, "tensor-model-parallel-size", _pos_int, 1)
    pp = _typed(f, "pipeline-model-parallel-size", _pos_int, 1)
    s: Dict[str, Any] = {"tp": tp, "pp": pp, "cp": _typed(f, "context-parallel-size", _pos_int, 1),
                         "mbs": _typed(f, "micro-batch-size", _pos_int, 1), "sp": "sequence-parallel" in f and tp > 1}
    vpp = _typed(f, "num-virtual-stages-per-pipeline-rank", _pos_int)
    per_virtual = _typed(f, "num-layers-per-virtual-pipeline-stage", _pos_int)
    if per_virtual:  # [V] vpp = layers per pipeline rank / layers per virtual stage
        vpp = num_layers // pp // per_virtual
    s["vpp"] = vpp or 1
    if is_moe:
        s["ep"] = _typed(f, "expert-model-parallel-size", _pos_int, 1)
        s["etp"] = _typed(f, "expert-tensor-parallel-size", _pos_int, tp)  # [V] defaults to tp
    if "use-megatron-fsdp" in f:
        strategy = _typed(f, "data-parallel-sharding-strategy", str, "optim_grads_params")
        s["zero"] = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(strategy, 3)
    else:
        s["zero"] = 1 if "use-distributed-optimizer" in f else 0
    granularity = _typed(f, "recompute-granularity", str)
    s["recompute"] = granularity or "none"
    if granularity == "selective" and f.get("recompute-modules"):
        s["recompute_modules"] = tuple(f["recompute-modules"].split())
    if granularity == "full":
        s["recompute_method"] = _typed(f, "recompute-method", str, "uniform")
        s["recompute_layers"] = _typed(f, "recompute-num-layers", _pos_int, 1)
    fp8 = _typed(f, "fp8-format", str)
    if fp8:
        s["fp8"] = fp8
        s["fp8_recipe"] = _typed(f, "fp8-recipe", str, "delayed")
    for key, flag in (("first_stage_layers", "decoder-first-pipeline-num-layers"),
                      ("last_stage_layers", "decoder-last-pipeline-num-layers")):
        if flag in f:
            s[key] = _typed(f, flag, int)
    s["overlap_grad_reduce"] = "overlap-grad-reduce" in f
    if s["zero"] >= 1 and s["overlap_grad_reduce"]:  # [V] only expressible with both
        s["overlap_param_gather"] = "overlap-param-gather" in f
    if ("tp-comm-overlap" in f) != s["sp"]:  # the Strategy default (None) follows sp
        s["tp_comm_overlap"] = "tp-comm-overlap" in f
    if "grad-reduce-in-bf16" in f:
        s["grad_reduce_bf16"] = True
    if is_moe:
        s["moe_a2a_overlap"] = "overlap-moe-expert-parallel-comm" in f
        if _flex_dedup_dispatcher(f):
            s["moe_flex_dispatcher"] = True
    return s


def _flex_dedup_dispatcher(f: Dict[str, Optional[str]]) -> bool:
    """The flex dispatcher with a node-deduplicating backend: deepep (the default backend) or hybridep, or the
    deprecated --moe-enable-deepep [TC] (transformer_config.py __post_init__ routes it to backend deepep).
    ncclep is left on the alltoall pricing."""
    if _typed(f, "moe-token-dispatcher-type", str) != "flex":
        return False
    return "moe-enable-deepep" in f or _typed(f, "moe-flex-dispatcher-backend", str, "deepep") in ("deepep", "hybridep")


def from_megatron_args(text_or_path: Union[str, Path]) -> ImportedConfig:
    """Model, strategy, workload and (when the launcher fixes it) world size of a Megatron-LM launch."""
    flags, launcher = parse_megatron_flags(_read_text(text_or_path))
    seq_len = _typed(flags, "seq-length", _pos_int)
    if seq_len is None:
        raise InputError("Megatron arguments lack --seq-length; add it")
    model = _megatron_model(flags, seq_len)
    strategy = _megatron_strategy(flags, model.num_layers, model.is_moe)
    world = None
    if launcher.get("nproc_per_node", "").isdigit() and launcher.get("nnodes", "1").isdigit():
        world = int(launcher["nproc_per_node"]) * int(launcher.get("nnodes", "1"))
    gbs = _typed(flags, "global-batch-size", _pos_int)
    notes = []
    if gbs is None and world:
        dp = world // (strategy["tp"] * strategy["pp"] * strategy["cp"])
        gbs = strategy["mbs"] * dp  # [V] default global batch = mbs x dp
        notes.append(f"--global-batch-size absent: Megatron's default mbs*dp = {gbs}")
    if gbs is None:
        raise InputError("Megatron arguments lack --global-batch-size and the world size is unknown; add it")
    return ImportedConfig(model=model, strategy=strategy, workload=Workload(seq_len=seq_len, global_batch_size=gbs),
                          global_batch_size=gbs, world_size=world, source="megatron", notes=notes)


# ------------------------------------------------------------------------------------------ DeepSpeed
def _ds_int(config: Dict[str, Any], key: str, where: str) -> Optional[int]:
    value = config.get(key)
    if value is None or value == "auto":
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"{where}{key} must be a non-negative integer, got {value!r}")
    return value


def _ds_batch(config: Dict[str, Any], dp: int) -> Tuple[int, int]:
    """(micro batch, global batch) with DeepSpeed's rule train_batch = micro x gas x dp (runtime/config.py)."""
    train, micro = _ds_int(config, "train_batch_size", ""), _ds_int(config, "train_micro_batch_size_per_gpu", "")
    gas = _ds_int(config, "gradient_accumulation_steps", "")
    if micro is None and train is not None:
        micro = train // ((gas or 1) * dp)
    if micro is None or micro == 0:
        raise InputError("ds_config needs train_micro_batch_size_per_gpu (or train_batch_size) > 0")
    if train is None:
        train = micro * (gas or 1) * dp
    if gas is not None and train != micro * gas * dp:
        raise InputError(f"ds_config: train_batch_size={train} != micro {micro} x gas {gas} x dp {dp}; fix one")
    if train % (micro * dp):
        raise InputError(f"ds_config: train_batch_size={train} is not divisible by micro {micro} x dp {dp}")
    return micro, train


def from_deepspeed_config(path: Union[str, Path], model: ModelSpec, num_gpus: int, *,
                          seq_len: Optional[int] = None) -> ImportedConfig:
    """Strategy and batch of a DeepSpeed config for `model` on `num_gpus` (the config holds no architecture).
    The workload is set only when `seq_len` is given: a DeepSpeed config has no sequence length."""
    try:
        config = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"DeepSpeed config {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise InputError(f"DeepSpeed config {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(config, dict):
        raise InputError(f"DeepSpeed config {path} must be a JSON object")
    check_deepspeed_keys(config, source=str(path))
    zero = config.get("zero_optimization", {}) or {}
    pipeline = config.get("pipeline", {}) or {}
    stage = _ds_int(zero, "stage", "zero_optimization.") or 0
    pp = _ds_int(pipeline, "stages", "pipeline.") or 1
    tp = _ds_int(config.get("tensor_parallel", {}) or {}, "autotp_size", "tensor_parallel.") or 1
    if num_gpus % (tp * pp):
        raise InputError(f"{num_gpus} GPUs are not divisible by autotp_size*stages = {tp}*{pp}")
    mbs, gbs = _ds_batch(config, num_gpus // (tp * pp))
    strategy: Dict[str, Any] = {"tp": tp, "pp": pp, "mbs": mbs, "zero": min(stage, 3)}
    if stage > 0 and "overlap_comm" in zero:
        strategy["overlap_grad_reduce"] = bool(zero["overlap_comm"])
    if (config.get("data_types", {}) or {}).get("grad_accum_dtype") == "bf16":
        strategy["grad_reduce_bf16"] = True
    notes: List[str] = []
    interval = _ds_int(pipeline, "activation_checkpoint_interval", "pipeline.") or 0
    if interval:
        strategy.update(recompute="full", recompute_method="uniform", recompute_layers=interval)
    elif "activation_checkpointing" in config:
        strategy.update(recompute="full", recompute_method="uniform", recompute_layers=1)
        notes.append("activation_checkpointing present: assumed full recompute of every layer")
    workload = Workload(seq_len=seq_len, global_batch_size=gbs) if seq_len else None
    return ImportedConfig(model=model, strategy=strategy, workload=workload, global_batch_size=gbs,
                          world_size=num_gpus, source="deepspeed", notes=notes)
