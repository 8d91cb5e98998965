"""Megatron-LM command lines: the `pretrain_*.py` arguments of a launch script (read with
`autoplan.integrations.shell`, never run) or of a plain argument list, and the layout and batch they set (the model:
`autoplan.integrations.megatron_model_args`).

Defaults for arguments that are absent are Megatron-LM's own (megatron/training/arguments.py [V] and
TransformerConfig [TC]): tied embeddings, biases on, LayerNorm, GELU, learned absolute positions, ffn = 4h,
no recompute, bf16/fp16 without FP8, DDP. Arguments that do not describe the model, the layout, the precision or
the batch (learning rate, data paths, logging) are ignored."""
from __future__ import annotations

import ast
import itertools
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from autoplan import cuda_graphs as G
from autoplan import keys as K
from autoplan.errors import InputError
from autoplan.integrations.shell import command_words, read_script

# nargs="+" arguments this reader uses: the strategy keys' (autoplan/keys.py) and the deprecated --cuda-graph-scope.
_LIST_FLAGS = {"cuda-graph-scope"} | K.megatron_list_args()
FLAG_FLAGS = frozenset({  # store_true flags: they never take the next word as a value; the strategy keys' own
    # are the registry's (autoplan/keys.py)
    "group-query-attention", "multi-latent-attention", "swiglu", "quick-geglu", "untie-embeddings-and-output-weights",
    "disable-bias-linear", "add-qkv-bias", "qk-layernorm", "moe-grouped-gemm", "bf16", "fp16", "mock-data",
    "moe-enable-deepep", "recompute-activations", "moe-permute-fusion", "log-throughput", "use-mcore-models",
    "no-position-embedding", "cpu-offloading", "use-rope-scaling", "no-bias-gelu-fusion", "no-rope-fusion",
    "enable-gpt-oss", "enable-cuda-graph", "external-cuda-graph", "te-rng-tracker", "no-check-for-nan-in-loss-and-grad",
    "moe-router-pre-softmax", "moe-router-enable-expert-bias", "squared-relu",
}) | {a for a, valued in K.megatron_args().items() if not valued}
# Every argument this reader uses; `NOT_PRICED_FLAGS` are the emitter's arguments that do not change the price
# (data, tokenizer type, optimizer hyper-parameters, logging, checkpoints). tests/unit/test_import_megatron.py checks
# that the emitter writes nothing outside these two sets, so an emitted switch is never lost on the way back.
READ_FLAGS = frozenset({
    "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "group-query-attention", "num-query-groups",
    "kv-channels", "vocab-size", "tokenizer-type", "tokenizer-model", "vocab-file", "merge-file",
    "make-vocab-size-divisible-by", "max-position-embeddings", "seq-length", "swiglu", "quick-geglu", "normalization",
    "position-embedding-type", "rotary-base", "rotary-percent", "hidden-dropout", "untie-embeddings-and-output-weights",
    "disable-bias-linear", "add-qkv-bias", "qk-layernorm", "multi-latent-attention", "q-lora-rank", "kv-lora-rank",
    "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim", "num-experts", "moe-router-topk", "moe-ffn-hidden-size",
    "moe-shared-expert-intermediate-size", "moe-layer-freq", "window-size", "window-attn-skip-freq", "mtp-num-layers",
    "num-layers-per-virtual-pipeline-stage", "recompute-activations", "moe-enable-deepep", "global-batch-size",
    "use-rope-scaling", "rope-scaling-factor", "rotary-scaling-factor", "yarn-original-max-position-embeddings",
    "softmax-type", "activation-func-clamp-value", "moe-aux-loss-coeff", "rope-type", "mscale", "mscale-all-dim",
    "no-yarn-correction-range-round-to-int", "yarn-beta-fast", "yarn-beta-slow", "cuda-graph-scope",
    "enable-cuda-graph", "external-cuda-graph", "moe-router-score-function", "moe-router-pre-softmax",
    "moe-router-enable-expert-bias", "moe-router-topk-scaling-factor", "moe-router-num-groups", "moe-router-group-topk",
    "moe-router-load-balancing-type", "hybrid-layer-pattern", "hybrid-override-pattern", "mtp-hybrid-override-pattern",
    "mamba-num-heads", "mamba-head-dim", "mamba-state-dim", "mamba-num-groups", "moe-latent-size", "padded-vocab-size",
    "squared-relu", "experimental-attention-variant", "linear-attention-freq", "linear-conv-kernel-dim",
    "linear-key-head-dim", "linear-value-head-dim", "linear-num-key-heads", "linear-num-value-heads",
    "attention-output-gate", "moe-shared-expert-gate", "apply-layernorm-1p", "dsa-indexer-n-heads",
    "dsa-indexer-head-dim", "dsa-indexer-topk", "dsa-indexer-loss-coeff", "dsa-indexer-topk-freq",
    "dsa-indexer-skip-topk-offset",
}) | frozenset(K.megatron_args())  # and every strategy key's (autoplan/keys.py)
NOT_PRICED_FLAGS = frozenset({
    "mock-data", "attention-dropout", "init-method-std", "bf16", "fp16", "ckpt-format", "moe-grouped-gemm",
    "moe-permute-fusion", "train-iters", "lr", "min-lr", "glu-linear-offset",
    "no-bias-gelu-fusion", "no-rope-fusion", "moe-router-dtype",
    "lr-decay-style", "lr-warmup-iters", "weight-decay", "clip-grad", "adam-beta1", "adam-beta2", "log-interval",
    "log-throughput", "log-memory-interval", "eval-iters", "save", "load", "save-interval", "data-path",
    "te-rng-tracker", "no-check-for-nan-in-loss-and-grad",
})
_LAUNCHER_SIZES = {"nproc_per_node", "nproc-per-node", "nnodes"}
_ENTRY = re.compile(r"(^|/)pretrain_\w+\.py$")
# A placeholder the example asks the user to fill in (`--vocab-file <PATH TO gpt-vocab.json>`, Megatron-LM's older
# examples): one word, not the redirections bash would read, so that the argument keeps its value.
_PLACEHOLDER = re.compile(r"(?<=[\s=\"'])<([A-Za-z][^<>\n|;&]*)>")
_MODULE_ENTRY = re.compile(r"(^|\.)pretrain_\w+$")

# ---------------------------------------------------------------------------------------------- reading words
class Launch(NamedTuple):
    """What a launch script or argument list runs."""

    launcher: List[str]  # words before the entry script (torchrun and its options)
    words: List[str]  # the entry script's arguments
    notes: List[str]
    env: Dict[str, str]  # scalar variables of the script
    entry: Optional[str]  # the pretrain_*.py it runs; None for an argument list or a model fragment
    fragment: bool  # arguments gathered from variables (MODEL_ARGS=...) of a script that runs nothing


def launch_words(text: str) -> Launch:
    """The launcher, arguments, notes and scalar variables of a launch script, an argument list, or a model
    fragment: a script that only assigns argument variables (Megatron-LM's examples/post_training/modelopt/conf/
    ORG/MODEL.sh `MODEL_ARGS="..."`, examples/rl/model_configs/*.sh `MODEL_OPTIONS="..."`), whose arguments are
    the flag words of its variables in the order they were assigned."""
    script = read_script(_PLACEHOLDER.sub(lambda m: m.group(1).replace(" ", "_"), text))
    scalars = {k: v for k, v in script.variables.items() if isinstance(v, str)}
    for command in reversed(script.commands):  # the last launch is the one that runs last
        found = _split_at_entry(command)
        if found:
            return Launch(found[0], found[1], script.notes, scalars, found[2], False)
    for value in scalars.values():  # TRAINING_CMD="... python pretrain_gpt.py ..." run later
        found = _split_at_entry(value)
        if found:
            return Launch(found[0], found[1], script.notes, scalars, found[2], False)
    words = [w for command in script.commands for w in _words(command)]
    if any(w.startswith("--") for w in words):
        return Launch([], words, script.notes, scalars, None, False)
    gathered = [w for value in script.variables.values() for w in _variable_words(value)]
    return Launch([], gathered, script.notes, scalars, None, bool(gathered))


def _variable_words(value: Union[str, List[str]]) -> List[str]:
    """The words of a variable that holds command-line arguments (its first word is a --flag), else none."""
    try:
        words = value if isinstance(value, list) else _words(value) if "--" in value else []
    except InputError:  # a message or command text, not arguments
        return []
    return words if words and words[0].startswith("--") else []


def _words(command: str) -> List[str]:
    try:
        return command_words(command)
    except ValueError as e:
        raise InputError(f"cannot split the Megatron arguments into shell words ({e}); check the quoting") from None


def _split_at_entry(command: str) -> Optional[Tuple[List[str], List[str], str]]:
    """(words before, words after, the entry script's name) of one command that runs a pretrain_*.py; quoted inner
    commands (bash -c "...") are looked into."""
    words = _words(command)
    for i, word in enumerate(words):
        if _ENTRY.search(word):
            return words[:i], _arguments(words[i + 1:]), word.rsplit("/", 1)[-1]
        if word == "-m" and i + 1 < len(words) and _MODULE_ENTRY.search(words[i + 1]):  # python -m pkg.pretrain_x
            return words[:i], _arguments(words[i + 2:]), words[i + 1].rsplit(".", 1)[-1] + ".py"
        if " " in word and ".py" in word:
            inner = _split_at_entry(word)
            if inner:
                return inner
    return None


def _arguments(words: Sequence[str]) -> List[str]:
    """The words up to the end of the command (; && || | &), redirections (> file, < file, 2>&1) left out."""
    out: List[str] = []
    skip = False
    for word in words:
        if word in (";", "&&", "||", "|", "&", ";;"):
            break
        if skip:
            skip = False
        elif set(word) <= set("<>&") and word:
            skip = True  # the redirection's target
        else:
            out.append(word)
    return out


def parse_flags(words: Sequence[str]) -> Dict[str, Optional[str]]:
    """{flag: value or None}; the last occurrence wins (argparse)."""
    flags: Dict[str, Optional[str]] = {}
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        name, _, inline = word[2:].partition("=")
        nxt = words[i + 1] if i + 1 < len(words) else None
        takes_value = name not in FLAG_FLAGS and nxt is not None and not nxt.startswith("--") and not inline
        value = inline or (nxt if takes_value else None)
        if name in _LIST_FLAGS and takes_value:  # nargs="+": every following word up to the next flag
            value = " ".join(itertools.takewhile(lambda w: not w.startswith("--"), words[i + 1:]))
        flags[name] = value
    return flags


def launcher_world(words: Sequence[str]) -> Optional[int]:
    """GPUs of a torchrun / torch.distributed.run launcher: nproc_per_node x nnodes, when both are numbers."""
    sizes = {}
    for i, word in enumerate(words):
        name, _, inline = word.lstrip("-").partition("=")
        if word.startswith("--") and name in _LAUNCHER_SIZES:
            sizes[name.replace("-", "_")] = inline or (words[i + 1] if i + 1 < len(words) else "")
    per_node, nodes = sizes.get("nproc_per_node", ""), sizes.get("nnodes", "1")
    return int(per_node) * int(nodes) if per_node.isdigit() and nodes.isdigit() else None


# ---------------------------------------------------------------------------------------------- typed values
def typed(flags: Dict[str, Optional[str]], name: str, kind: Callable[[str], Any], default: Any = None) -> Any:
    """The value of --name as `kind`; one-line InputError for a missing value or a shell variable left unknown."""
    if name not in flags:
        return default
    raw = flags[name]
    if raw is None:
        raise InputError(f"--{name} has no value; write one after it")
    var = re.search(r"\$\{?([A-Za-z_]\w*|\d)", raw)
    if var:
        raise InputError(f"--{name} {raw}: the shell variable {var.group(1)} is not assigned in the file (it comes "
                         f"from the environment, a script argument or a sourced file); assign it in the script or "
                         f"write the value")
    try:
        return kind(raw)
    except ValueError:
        what = "a positive integer" if kind is pos_int else kind.__name__
        raise InputError(f"--{name} expects {what}, got {raw!r}") from None


def pos_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError(raw)
    return value


def eval_pattern(raw: str, flag: str) -> List[int]:
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
        if raw[:1] in "'\"" and raw[-1:] == raw[:1]:  # quotes the shell passed on: no eval re-reads them here
            raise InputError(f"--{flag} {raw!r} is not a list pattern like '[0]*3+[1]*58': its quotes reach "
                             f"Megatron, whose _eval_pattern refuses them too (only an `eval` of the command "
                             f"removes them); drop the inner quotes") from None
        raise InputError(f"--{flag} {raw!r} is not a list pattern like '[0]*3+[1]*58'") from None
    if not isinstance(value, list) or any(v not in (0, 1) for v in value):
        raise InputError(f"--{flag} {raw!r} must give a list of 0 and 1")
    return value


# ---------------------------------------------------------------------------------------------- strategy
def megatron_strategy(f: Dict[str, Optional[str]], num_layers: int, is_moe: bool) -> Dict[str, Any]:
    """Every strategy key the arguments fix, with Megatron's defaults for absent ones (so nothing is chosen)."""
    tp = typed(f, K.arg("tp"), pos_int, 1)
    pp = typed(f, K.arg("pp"), pos_int, 1)
    s: Dict[str, Any] = {"tp": tp, "pp": pp, "cp": typed(f, K.arg("cp"), pos_int, 1),
                         "mbs": typed(f, K.arg("mbs"), pos_int, 1), "sp": K.arg("sp") in f and tp > 1}
    vpp = typed(f, K.arg("vpp"), pos_int)
    per_virtual = typed(f, "num-layers-per-virtual-pipeline-stage", pos_int)
    if per_virtual:  # [V] vpp = layers per pipeline rank / layers per virtual stage
        vpp = num_layers // pp // per_virtual
    s["vpp"] = vpp or 1
    s.update(_pipeline_split(f, pp))
    s["ep"] = typed(f, K.arg("ep"), pos_int, 1) if is_moe else 1
    s["etp"] = typed(f, K.arg("etp"), pos_int, tp) if is_moe else 1  # [V] defaults to tp
    s["zero"] = _zero(f)
    s.update(_recompute(f))
    s.update(_precision(f))
    for key in ("first_stage_layers", "last_stage_layers"):
        if K.arg(key) in f:
            s[key] = typed(f, K.arg(key), int)
    s.update(_overlaps(f, s, is_moe))
    s.update(K.imported_passthrough(f))  # the switches that are one flag each (autoplan/keys.py)
    graphs = _cuda_graphs(f, is_moe)
    if graphs:
        s["cuda_graph_modules"] = graphs
    offload = typed(f, K.arg("cpu_offload_layers"), int, 0)
    if offload:
        s["cpu_offload_layers"] = offload
    # [TC] model_parallel_config.py: the TE kernel only with --cross-entropy-fusion-impl te (default native).
    if _written(f, "te_cross_entropy", {K.arg("te_cross_entropy", 1): "native"}):
        s["te_cross_entropy"] = True
    return s


def _written(f: Dict[str, Optional[str]], key: str, defaults: Optional[Dict[str, str]] = None) -> bool:
    """Whether the arguments hold every argument key `key` writes (autoplan/keys.py), with its fixed value; an
    argument absent from `f` takes its default from `defaults` (else it is missing)."""
    defaults = defaults or {}
    for a, value in K.megatron_words(key):
        if a not in f and a not in defaults:
            return False
        if value is not None and typed(f, a, str, defaults.get(a)) != value:
            return False
    return True


def _cuda_graphs(f: Dict[str, Optional[str]], is_moe: bool) -> Optional[Tuple[str, ...]]:
    """Strategy.cuda_graph_modules from --cuda-graph-impl and --cuda-graph-modules (or the deprecated
    --cuda-graph-scope, --enable-cuda-graph = local, --external-cuda-graph = transformer_engine) [V]/[TC]:
    impl full_iteration, or a module list naming full_iteration, is the full-iteration graph; an empty module list
    captures whole layers (attention and the MLP or MoE half); impl none captures nothing."""
    impl = typed(f, K.arg("cuda_graph_modules"), str)
    if impl is None:
        impl = "local" if "enable-cuda-graph" in f else "transformer_engine" if "external-cuda-graph" in f else "none"
    if impl == "none":
        return None
    names = (f.get(K.arg("cuda_graph_modules", 1)) or f.get("cuda-graph-scope") or "").split()
    if impl == "full_iteration" or "full_iteration" in names:
        return G.FULL_ITERATION
    names = [n for n in names if n != "full"]  # the deprecated "full" = whole layers
    if not names:
        return ("attn", "moe" if is_moe else "mlp")
    return tuple(names)


def expandable_segments(env: Dict[str, str]) -> bool:
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True set in the script (PyTorch's caching allocator option)."""
    options = env.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").split(",")
    return "expandable_segments:True" in options


def _pipeline_split(f: Dict[str, Optional[str]], pp: int) -> Dict[str, Any]:
    """--pipeline-model-parallel-layout (which sets vpp: [V] stages / pp) and the account-for flags."""
    from autoplan.pipeline_split import layout_vpp

    out: Dict[str, Any] = {}
    layout = typed(f, K.arg("pipeline_layout"), str)
    if layout:
        try:
            vpp = layout_vpp(layout, pp)
        except ValueError as e:
            raise InputError(f"--pipeline-model-parallel-layout {layout!r}: {e}") from None
        if vpp is None:
            raise InputError(f"--pipeline-model-parallel-layout {layout!r}: its stage count is not a multiple of "
                             f"pp={pp}; fix the layout or pp")
        out.update(pipeline_layout=layout, vpp=vpp)
    out.update(K.imported_passthrough(f, K.names("split")))  # the account-for flags (autoplan/keys.py)
    return out


def _zero(f: Dict[str, Optional[str]]) -> int:
    if K.arg("zero", 1) in f:
        strategy = typed(f, K.arg("zero", 2), str, K.FSDP_SHARDING[3])
        levels = {text: zero for zero, text in K.FSDP_SHARDING.items()}
        if strategy not in levels:
            raise InputError(f"{K.flag('zero', 2)} {strategy!r} is not one of {', '.join(levels)}")
        return levels[strategy]
    return 1 if K.arg("zero", 0) in f else 0


def _recompute(f: Dict[str, Optional[str]]) -> Dict[str, Any]:
    granularity = typed(f, K.arg("recompute"), str)
    if granularity is None and "recompute-activations" in f:
        granularity = "selective"  # [V] --recompute-activations sets recompute_granularity='selective'
    out: Dict[str, Any] = {"recompute": granularity or "none"}
    if granularity == "selective" and f.get(K.arg("recompute_modules")):
        out["recompute_modules"] = tuple(f[K.arg("recompute_modules")].split())
    if granularity == "full":
        out["recompute_method"] = typed(f, K.arg("recompute_method"), str, "uniform")
        out["recompute_layers"] = typed(f, K.arg("recompute_layers"), pos_int, 1)
    return out


def _precision(f: Dict[str, Optional[str]]) -> Dict[str, Any]:
    if K.arg("fp8_recipe", 1) in f:  # NVFP4 GEMMs: the Strategy's fp8 with recipe nvfp4 (what the emitter writes back)
        return {"fp8": "hybrid", "fp8_recipe": typed(f, K.arg("fp8_recipe", 2), str, "nvfp4")}
    fp8 = typed(f, K.arg("fp8"), str)
    if not fp8:
        return {"fp8": "none"}  # bf16 / fp16 as written: no FP8 GEMMs
    out: Dict[str, Any] = {"fp8": fp8, "fp8_recipe": typed(f, K.arg("fp8_recipe"), str, "delayed")}
    if K.arg("fp8_param") in f:
        out["fp8_param"] = True
    return out


def _overlaps(f: Dict[str, Optional[str]], s: Dict[str, Any], is_moe: bool) -> Dict[str, Any]:
    out: Dict[str, Any] = {"overlap_grad_reduce": _written(f, "overlap_grad_reduce")}
    if s["zero"] >= 1 and out["overlap_grad_reduce"]:  # [V] only expressible with both
        out["overlap_param_gather"] = _written(f, "overlap_param_gather")
    if _written(f, "tp_comm_overlap") != s["sp"]:  # the Strategy default (None) follows sp
        out["tp_comm_overlap"] = _written(f, "tp_comm_overlap")
    if _written(f, "grad_reduce_bf16"):
        out["grad_reduce_bf16"] = True
    # [V] arguments.py: the moments' dtypes apply only with --use-precision-aware-optimizer; fp32 moments (the
    # default) stay priced at 12 bytes per parameter, and fp16 / fp8 moments are priced as bf16's or above.
    if K.arg("adam_bf16_states") in f and s["zero"] == 1 and \
            all(typed(f, K.arg("adam_bf16_states", i), str, "fp32") != "fp32" for i in (1, 2)):
        out["adam_bf16_states"] = True
    if is_moe:
        out["moe_a2a_overlap"] = _written(f, "moe_a2a_overlap")
        # Stated either way: a config without the flex dispatcher runs alltoall, and `estimate` prices it so
        # (an unstated switch would be filled as the search sets it, complete.fill_searched_switches).
        out["moe_flex_dispatcher"] = _flex_dedup_dispatcher(f)
    return out


def _flex_dedup_dispatcher(f: Dict[str, Optional[str]]) -> bool:
    """The flex dispatcher with a node-deduplicating backend: deepep (the default backend) or hybridep, or the
    deprecated --moe-enable-deepep [TC] (transformer_config.py __post_init__ routes it to backend deepep).
    ncclep is left on the alltoall pricing."""
    if typed(f, K.arg("moe_flex_dispatcher"), str) != K.megatron_words("moe_flex_dispatcher")[0][1]:
        return False
    backend = typed(f, K.arg("moe_flex_dispatcher", 1), str, "deepep")
    return "moe-enable-deepep" in f or backend in ("deepep", "hybridep")


# The layout keys a model fragment may leave to the launcher, with the arguments that write each one. A fragment
# (examples/post_training/modelopt/conf/*.sh) describes the model; Megatron-LM's scripts around it pass the layout
# (conf/arguments.sh: --tensor-model-parallel-size ${TP} ... ). Numerics (precision, FP8) stay as written.
# The keys' own arguments are the registry's (autoplan/keys.py); the others are the older spellings that set them
# and the arguments they follow (etp and sp default from tp).
_LAYOUT_FLAGS = {
    "tp": (K.arg("tp"),), "pp": (K.arg("pp"),), "cp": (K.arg("cp"),),
    "vpp": (K.arg("vpp"), "num-layers-per-virtual-pipeline-stage", K.arg("pipeline_layout")),
    "ep": (K.arg("ep"),), "etp": (K.arg("etp"), K.arg("tp")), "mbs": (K.arg("mbs"),), "sp": (K.arg("tp"),),
    "tp_comm_overlap": (K.arg("tp_comm_overlap"),), "zero": (K.arg("zero", 0), K.arg("zero", 1)),
    "overlap_grad_reduce": (K.arg("overlap_grad_reduce"),), "overlap_param_gather": (K.arg("overlap_param_gather"),),
    "recompute": (K.arg("recompute"), "recompute-activations"),
}


def written_layout(f: Dict[str, Optional[str]], s: Dict[str, Any], notes: List[str]) -> Dict[str, Any]:
    """A model fragment's strategy: the layout keys none of whose arguments it writes are dropped (the search
    chooses them, and says so); everything it writes is kept."""
    left = [k for k, flags in _LAYOUT_FLAGS.items() if k in s and not any(flag in f for flag in flags)]
    if left:
        notes.append(f"the fragment does not write {', '.join(left)}: chosen by the search")
    return {k: v for k, v in s.items() if k not in left}
