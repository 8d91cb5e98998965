"""The strategy's switches, each declared once: its type, default and doc (the `Strategy` field), its `Layouts`
column and encoding, whether and how the search sets it, the Megatron flag(s) and DeepSpeed key it becomes, and
which importers read it back.

`Strategy` (autoplan/strategy.py) takes its switch fields from `SWITCHES`; `Layouts` (costmodel/layout.py) takes
one column per switch, named as the key; `layouts_from_strategies`, `Layouts.strategy`, the search's grid
(solvers/space.py), the Megatron emitter's and importer's plain flags (integrations/megatron.py, megatron_flags.py)
and the README's table of switches (`key_table`) are read from here. A switch is one field of Megatron's
`TransformerConfig` / `arguments.py` kind: a dataclass field that carries its command-line name with it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Literal, Mapping, Optional, Tuple, Union, get_args, get_origin

import numpy as np
from pydantic import Field

from autoplan import cuda_graphs as G
from autoplan import recompute as R

Columns = Mapping[str, np.ndarray]


Recompute = Literal["none", "selective", "full"]
Fp8 = Literal["none", "hybrid", "e4m3"]
Fp8Recipe = Literal["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"]  # nvfp4: FP4 GEMMs (--fp4-format)
# What a key is to a plan: `contract` keys are always written (the command-line contract), `detail` keys when set,
# `split` and `switch` keys when not at their default (Strategy.to_dict).
ROLES = ("contract", "detail", "split", "switch")
# The engines a strategy is written for (a key's Megatron flags and DeepSpeed config key).
Engine = Literal["megatron", "deepspeed"]
ENGINES: Tuple[str, ...] = get_args(Engine)


@dataclass(frozen=True)
class Key:
    """One strategy key. `kind`, `default`, `doc` and the bounds (`gt`, `ge`, `le`) make its `Strategy` field;
    `role` says when plan JSON writes it (ROLES). `column` is its `Layouts` column ('' = it has none of its own:
    `layouts` says which column carries it) of `dtype`; `encode(strategy, row)` is the column's value, `row` the
    per-strategy context `Layouts` is built with (num_gpus, the pipeline end ranks `ends`), else `code(value)` of
    the field's value alone (a code or bit mask), else the field's value as it is; `decode(layouts, i)` turns row i
    back into the field (None: the column cast to the field's type). `search(columns, engine)` is the column the
    search gives every candidate of a switch, from the grid's columns (`fp8`, `zero`, `sp`, bool/int arrays) and the
    engine (None: off, set only by `--fix`); `searched` says how the search sets the key, in words. `megatron`
    lists the flags the Megatron emitter writes for it, `passthrough` that it writes exactly those when the key is
    on, with no other condition, and the Megatron importer reads them back as the key (both generated from here);
    `deepspeed` is the DeepSpeed config key that carries it ('' = DeepSpeed refuses it or writes nothing for it);
    `imported` names the importers that read it; `parse` reads its command-line text where that is not a plain
    integer, boolean or word. The engine rules a switch must meet are in autoplan/switch_rules.py;
    `deepspeed_lacks` (DeepSpeed has no counterpart of the key) generates a rule of autoplan/deepspeed_rules.py."""

    name: str
    kind: Any  # the field's annotation
    default: Any
    doc: str
    searched: str
    megatron: Tuple[str, ...] = ()
    passthrough: bool = False
    deepspeed: str = ""
    imported: Tuple[str, ...] = ()
    ge: Optional[int] = None
    encode: Optional[Callable[[Any, Any], Any]] = None
    decode: Optional[Callable[[Any, int], Any]] = None
    search: Optional[Callable[[Columns, str], np.ndarray]] = None
    dtype: Any = bool
    role: str = "switch"
    gt: Optional[int] = None
    le: Optional[int] = None
    column: Optional[str] = None  # None: named as the key
    layouts: str = ""  # the column's encoding in words, when it is not the value as it is
    required_column: bool = False  # every `Layouts` holds the column (else one left out is the default)
    code: Optional[Callable[[Any], Any]] = None  # the column's value from the field's value alone (a code, a mask)
    # DeepSpeed has no counterpart of the key: the one line that refuses it wherever it is set ('' = DeepSpeed runs
    # it, or other rules decide), with {shown} for the key as the strategy states it (te_op_fuser=true, fp8=hybrid)
    # and {flag} for its first Megatron argument. autoplan/deepspeed_rules.py makes it a rule of the DeepSpeed rule
    # book, which the DeepSpeed emitter, the search under --engine deepspeed and validate read.
    deepspeed_lacks: str = ""
    # The value of command-line or file text (stripped) or of a list, for keys whose text is not a plain integer,
    # boolean or lower-case word (strategy.coerce_strategy_value); None: by the field's type.
    parse: Optional[Callable[[Any], Any]] = None
    # `estimate` gives a complete strategy that does not state the switch the value the search would
    # (complete.fill_searched_switches); the switches that change neither the numerics nor what the user sized.
    estimate_fills: bool = False

    def pydantic_field(self):
        """The pydantic field `Strategy` declares."""
        bounds = {b: getattr(self, b) for b in ("gt", "ge", "le") if getattr(self, b) is not None}
        return Field(self.default, description=self.doc, **bounds)

    @property
    def column_name(self) -> str:
        return self.name if self.column is None else self.column

    def column_value(self, strategy, row=None) -> Any:
        if self.encode is not None:
            return self.encode(strategy, row)
        return self.coded(getattr(strategy, self.name))

    def coded(self, value) -> Any:
        """A value of the field as its column holds it (`code`; else as it is): what a rule over candidates reads."""
        return value if self.code is None else self.code(value)

    def value(self, layouts, i: int) -> Any:
        if self.decode is not None:
            return self.decode(layouts, i)
        raw = getattr(layouts, self.column_name)[i]
        return int(raw) if self.dtype is np.int64 else bool(raw)

    def grid(self, columns: Columns, engine: str, n: int) -> np.ndarray:
        """The search's column for n candidates (off under DeepSpeed for a key it lacks)."""
        if self.search is None or (self.deepspeed_lacks and engine == "deepspeed"):
            return np.zeros(n, self.dtype)
        return np.broadcast_to(np.asarray(self.search(columns, engine), self.dtype), (n,)).copy()


Switch = Key  # a key of role "switch"


def _megatron_only(columns: Columns, engine: str) -> np.ndarray:
    return np.asarray(engine != "deepspeed")


def _a2a_overlap_legal(columns: Columns) -> np.ndarray:
    """Candidates that can run the 1F1B all-to-all overlap (switch_rules.py moe_a2a_overlap rules; validate.py: no
    moe recompute module)."""
    pp, vpp = np.asarray(columns["pp"]), np.asarray(columns["vpp"])
    return ((np.asarray(columns["ep"]) > 1) & ~((pp > 1) & (vpp == 1)) & (np.asarray(columns["rc"]) != 2)
            & ~((np.asarray(columns["rc"]) == 1) & R.has(np.asarray(columns["mods"]), "moe")))


def _tp_overlap_value(layouts, i: int) -> Optional[bool]:
    """None (follow sp) when the column equals the row's sp, else the column."""
    on = bool(layouts.tp_comm_overlap[i])
    return None if on == bool(layouts.sp[i]) else on


RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
# zero as Megatron-FSDP's --data-parallel-sharding-strategy (arguments.py choices) writes it.
FSDP_SHARDING = {0: "no_shard", 1: "optim", 2: "optim_grads", 3: "optim_grads_params"}
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}
BOOL_TRUE = {"true", "1", "yes", "on"}
BOOL_FALSE = {"false", "0", "no", "off"}


def _fp8_text(text: str) -> str:
    """fp8=true is the hybrid format, fp8=false none."""
    low = text.lower() if isinstance(text, str) else text
    return "hybrid" if low in BOOL_TRUE else "none" if low in BOOL_FALSE else low


def _recompute_text(text: str) -> str:
    low = text.lower() if isinstance(text, str) else text
    return "none" if low in BOOL_FALSE else low


def _module_names(text, off=frozenset()):
    """core_attn+moe_act (',' separates strategy keys; '/' also joins), or a list of names; a word of `off`: None."""
    if isinstance(text, (list, tuple)):
        return tuple(str(n).strip().lower() for n in text)
    if not isinstance(text, str):
        return text
    low = text.lower()
    if low in off:
        return None
    return tuple(n.strip() for n in low.replace("/", "+").split("+") if n.strip())


def _int(name: str, doc: str, searched: str, megatron: Tuple[str, ...], deepspeed: str = "",
         imported: Tuple[str, ...] = ("megatron", "deepspeed"), **kw) -> Key:
    """A positive integer degree or size, a contract key."""
    return Key(name, int, 1, doc, searched, megatron=megatron, deepspeed=deepspeed, imported=imported, gt=0,
               dtype=np.int64, role="contract", required_column=True, **kw)


def _full_only(layouts, i: int) -> bool:
    return int(layouts.recompute[i]) == RECOMPUTE_CODES["full"]


def _decoder_split(layouts, i: int) -> bool:
    """Whether row i's first/last are --decoder-first/last-pipeline-num-layers (not a layout's or account_for_*'s
    end ranks)."""
    return layouts.layout[i] is None and not layouts.account[i]


def _end(layouts, i: int, column: str) -> Optional[int]:
    value = getattr(layouts, column)[i]
    return int(value) if value >= 0 and _decoder_split(layouts, i) else None


def _modules_value(layouts, i: int):
    """Strategy.recompute_modules for a row: None for Megatron's default set (and when not selective)."""
    bits = int(layouts.recompute_modules[i])
    if int(layouts.recompute[i]) != RECOMPUTE_CODES["selective"] or bits == R.mask(R.DEFAULT):
        return None
    return R.names_of(bits)


# The keys before the switches, in `Strategy`'s field order (tp..pipeline_layout).
LAYOUT_KEYS: Tuple[Key, ...] = (
    _int("tp", "Tensor-parallel degree; 1 = off.", "TP degrees inside the NVLink domain (--allow "
         "tp-outside-domain: all)", ("--tensor-model-parallel-size N",), "tensor_parallel.autotp_size"),
    _int("pp", "Pipeline-parallel stages; 1 = off.", "every legal degree", ("--pipeline-model-parallel-size N",),
         "pipeline.stages"),
    _int("vpp", "Model chunks per pipeline rank (interleaved 1F1B); 1 = no interleaving.",
         "every legal chunk count (from pipeline_layout when one is given)",
         ("--num-virtual-stages-per-pipeline-rank N",), imported=("megatron",)),
    _int("cp", "Context-parallel degree (sequence split for attention); 1 = off.", "every legal degree",
         ("--context-parallel-size N",), imported=("megatron",)),
    _int("ep", "Expert-parallel degree (inside dp*cp, MoE parallel folding); 1 = off.",
         "every legal degree (MoE), across NVLink domains too (all-to-all priced over the network)",
         ("--expert-model-parallel-size N",), imported=("megatron",)),
    _int("etp", "Tensor-parallel degree of expert layers.", "every legal degree (MoE)",
         ("--expert-tensor-parallel-size N",), imported=("megatron",)),
    Key("dp", Optional[int], None, "Data-parallel degree; derived when None.", "derived: GPUs / (tp*pp*cp)",
        imported=("megatron", "deepspeed"), gt=0, dtype=np.int64, required_column=True, role="detail",
        layouts="GPUs / (tp*pp*cp) "
        "when unset", encode=lambda s, r: s.dp or max(1, r.num_gpus // (s.tp * s.pp * s.cp))),
    _int("mbs", "Micro-batch size, sequences.", "powers of two that divide the batch (--allow non-pow2-mbs: all)",
         ("--micro-batch-size N",), "train_micro_batch_size_per_gpu"),
    Key("sp", bool, False, "Sequence parallelism (needs tp > 1).", "on with tp>1 (--allow no-sp: both)",
        megatron=("--sequence-parallel",), imported=("megatron",), required_column=True, role="contract",
        layouts="false at tp=1",
        encode=lambda s, r: s.sp and s.tp > 1),
    Key("zero", int, 1, "0 = DDP, 1 = distributed optimizer / ZeRO-1, 2 = +grads, 3 = +params.",
        "every level the engine runs", megatron=("--use-distributed-optimizer", "--use-megatron-fsdp",
                                                   "--data-parallel-sharding-strategy S"),
        deepspeed="zero_optimization.stage", imported=("megatron", "deepspeed"), ge=0, le=3, dtype=np.int64,
        required_column=True, role="contract"),
    Key("recompute", Recompute, "none", "Activation recompute granularity.", "none, selective and full",
        megatron=("--recompute-granularity G",), deepspeed="pipeline.activation_checkpoint_interval",
        parse=_recompute_text,
        imported=("megatron", "deepspeed"), dtype=np.int64, required_column=True, role="contract",
        layouts="0 none, 1 selective, 2 full",
        code=RECOMPUTE_CODES.__getitem__, decode=lambda lay, i: RECOMPUTE_NAMES[int(lay.recompute[i])]),
    Key("recompute_method", Optional[Literal["uniform", "block"]], None, "For full recompute.",
        "uniform and block (full recompute)", megatron=("--recompute-method M",), imported=("megatron",),
        required_column=True, role="detail", column="recompute_block", layouts="true for block",
        code=lambda method: method == "block",
        decode=lambda lay, i: ("block" if lay.recompute_block[i] else "uniform") if _full_only(lay, i) else None),
    Key("recompute_layers", Optional[int], None, "Full recompute: layers per pipeline rank (block) or per group.",
        "powers of two up to a chunk's layers (full recompute)", megatron=("--recompute-num-layers N",),
        imported=("megatron",), gt=0, dtype=np.int64, required_column=True, role="detail", layouts="0 when unset",
        code=lambda n: n or 0,
        decode=lambda lay, i: int(lay.recompute_layers[i]) if _full_only(lay, i) else None),
    Key("recompute_modules", Optional[Tuple[str, ...]], None,
        "Selective recompute: the modules rebuilt in backward (Megatron --recompute-modules: core_attn, layernorm, "
        "moe_act, mla_up_proj, mlp, moe, shared_experts); None = Megatron's default, core_attn.",
        "a ladder of module sets (selective recompute)", megatron=("--recompute-modules M...",),
        imported=("megatron",), dtype=np.int64, required_column=True, role="detail",
        layouts="bit mask of autoplan/recompute.py MODULES", code=R.mask, parse=_module_names,
        decode=_modules_value),
    Key("fp8", Fp8, "none", "FP8 GEMMs: none, hybrid (e4m3 fwd / e5m2 bwd) or e4m3.",
        "off unless --precision fp8 or fixed", megatron=("--fp8-format F",), imported=("megatron",),
        required_column=True, role="contract", parse=_fp8_text,
        deepspeed_lacks="DeepSpeed has no TransformerEngine FP8 training ({shown}); use --engine megatron or fp8=none",
        layouts="true for FP8 GEMMs (the format is a label the cost model prices alike)",
        encode=lambda s, r: s.uses_fp8, decode=lambda lay, i: "hybrid" if lay.fp8[i] else "none"),
    Key("fp8_recipe", Optional[Fp8Recipe], None, "FP8 scaling recipe; default per GPU.", "fixed only (numerics)",
        megatron=("--fp8-recipe R", "--fp4-format e2m1 --fp4-recipe nvfp4"), imported=("megatron",),
        dtype=object, role="detail", layouts="the recipe as written (None on non-FP8 rows); the effective "
        "recipe's `fp4`, `fp8_delayed` and `quant_bytes` columns beside it (costmodel/layout.py recipe_columns)",
        encode=lambda s, r: s.fp8_recipe if s.uses_fp8 else None,
        decode=lambda lay, i: lay.fp8_recipe[i] if lay.fp8[i] else None),
    Key("first_stage_layers", Optional[int], None, "Layers on the first pipeline stage (uneven).",
        "even split and the CP-SAT refinement's uneven ends", megatron=("--decoder-first-pipeline-num-layers N",),
        imported=("megatron",), ge=0, dtype=np.int64, required_column=True, role="detail", column="first",
        layouts="the first rank's layers (also a layout's), -1 = even",
        encode=lambda s, r: r.ends[0], decode=lambda lay, i: _end(lay, i, "first")),
    Key("last_stage_layers", Optional[int], None, "Layers on the last pipeline stage (uneven).",
        "even split and the CP-SAT refinement's uneven ends", megatron=("--decoder-last-pipeline-num-layers N",),
        imported=("megatron",), ge=0, dtype=np.int64, required_column=True, role="detail", column="last",
        layouts="the last rank's layers (also a layout's), -1 = even",
        encode=lambda s, r: r.ends[1], decode=lambda lay, i: _end(lay, i, "last")),
    Key("account_for_embedding", bool, False, "The embedding counts as one layer in the pipeline split (Megatron "
                                              "--account-for-embedding-in-pipeline-split): the first virtual stage "
                                              "builds one decoder layer fewer.",
        "where an even split needs it", megatron=("--account-for-embedding-in-pipeline-split",), passthrough=True,
        imported=("megatron",), dtype=np.int64, role="split", column="account",
        layouts="bit 1 (bit 2: account_for_loss)",
        encode=lambda s, r: int(s.account_for_embedding) + 2 * int(s.account_for_loss),
        decode=lambda lay, i: bool(lay.account[i] & 1)),
    Key("account_for_loss", bool, False, "The loss counts as one layer in the pipeline split (Megatron "
                                         "--account-for-loss-in-pipeline-split): the last virtual stage builds one "
                                         "decoder layer fewer.",
        "where an even split needs it", megatron=("--account-for-loss-in-pipeline-split",), passthrough=True,
        imported=("megatron",), role="split", column="", layouts="`account` bit 2",
        decode=lambda lay, i: bool(lay.account[i] & 2)),
    Key("pipeline_layout", Optional[str], None, "Layers of every virtual pipeline stage (Megatron "
                                                "--pipeline-model-parallel-layout, e.g. 'Et|(tt|)*30L': E embedding, "
                                                "t decoder layer, m MTP layer, L loss, | between stages); sets vpp = "
                                                "stages / pp.",
        "balanced layouts where the model needs one (MTP)", megatron=("--pipeline-model-parallel-layout S",),
        imported=("megatron",), dtype=object, role="detail", column="layout",
        parse=lambda text: text,  # case matters: E, t, m, L
        layouts="the string, None = none", decode=lambda lay, i: lay.layout[i]),
)
# The keys after the switches.
LATE_KEYS: Tuple[Key, ...] = (
    Key("cuda_graph_modules", Optional[Tuple[str, ...]], None,
        "Parts of the step replayed from CUDA graphs: full_iteration (Megatron --cuda-graph-impl full_iteration, "
        "alone) or per-layer modules (--cuda-graph-impl transformer_engine --cuda-graph-modules: attn, mlp, moe, "
        "moe_router, moe_preprocess, mamba); their ops run without the host's per-op dispatch; None = no CUDA "
        "graphs.", "fixed only", megatron=("--cuda-graph-impl I", "--cuda-graph-modules M..."),
        imported=("megatron",), dtype=np.int64, role="detail", layouts="bit mask of autoplan/cuda_graphs.py MODULES",
        deepspeed_lacks="cuda_graph_modules is a Megatron-LM feature ({flag}); drop it or use engine megatron",
        code=G.mask, parse=lambda text: _module_names(text, BOOL_FALSE | {"none"}),
        decode=lambda lay, i: G.names_of(int(lay.cuda_graph_modules[i])) or None),
)


# The order is the order `Strategy.to_dict` writes the switches in (plan and estimate JSON).
SWITCHES: Tuple[Switch, ...] = (
    Switch("overlap_grad_reduce", bool, True, "Overlap DP gradient reduction with backward.",
           searched="on", megatron=("--overlap-grad-reduce",), deepspeed="zero_optimization.overlap_comm",
           imported=("megatron", "deepspeed"), search=lambda c, e: np.asarray(True)),
    Switch("overlap_param_gather", bool, True, "Overlap distributed-optimizer param all-gather.",
           searched="on with the distributed optimizer (zero>=1)", megatron=("--overlap-param-gather",),
           deepspeed="zero_optimization.overlap_comm", imported=("megatron", "deepspeed"),
           search=lambda c, e: c["zero"] >= 1),
    Switch("tp_comm_overlap", Optional[bool], None, "Overlap TP communication with GEMMs (userbuffers); None = on "
                                                    "exactly when sp is on.",
           searched="on with sp", megatron=("--tp-comm-overlap",), imported=("megatron",),
           deepspeed_lacks="DeepSpeed cannot overlap TP communication with GEMMs ({shown}); use --engine megatron or "
                           "tp_comm_overlap=false",
           encode=lambda s, r: s.tp_overlap_on and s.sp and s.tp > 1, decode=_tp_overlap_value,
           search=lambda c, e: c["sp"]),
    Switch("moe_a2a_overlap", bool, False, "Overlap MoE all-to-all with compute (1F1B a2a overlap).",
           # On wherever Megatron can run it (switch_rules.py: ep > 1, the interleaved schedule when pp > 1, no full
           # recompute; validate.py: no moe recompute module): it only hides all-to-all time, at the memory of one
           # more micro batch in flight, which the cost model prices (rank.py, schedules.py warm-up + 1).
           searched="on where Megatron runs it (ep>1, vpp>1 when pp>1, no full recompute)",
           megatron=("--overlap-moe-expert-parallel-comm",), imported=("megatron",), estimate_fills=True,
           search=lambda c, e: _a2a_overlap_legal(c) & (e != "deepspeed")),
    Switch("grad_reduce_bf16", bool, False, "Keep and reduce gradients in bf16 (Megatron --grad-reduce-in-bf16) "
                                            "instead of fp32 main grads.",
           searched="fixed only (numerics)", megatron=("--grad-reduce-in-bf16",),
           deepspeed="data_types.grad_accum_dtype", imported=("megatron", "deepspeed")),
    Switch("fp8_param", bool, False, "FP8 primary weights (Megatron --fp8-param-gather): the compute weights exist "
                                     "only as FP8 tensors (no bf16 copy, ~1 byte/param plus the transpose or "
                                     "column-wise copy) and the parameter all-gather moves FP8; needs fp8 and "
                                     "zero>=1.",
           # FP8 primary weights wherever legal (fp8 and the distributed optimizer, validate._optimizer): less memory
           # and an FP8 parameter gather, the GEMMs unchanged (Megatron-Bridge's FP8 recipes all set
           # fp8_param_gather).
           searched="on with fp8 and zero>=1 (Megatron)", megatron=("--fp8-param-gather",), imported=("megatron",),
           encode=lambda s, r: s.fp8_param and s.uses_fp8,
           search=lambda c, e: c["fp8"].astype(bool) & (c["zero"] >= 1) & (e != "deepspeed")),
    Switch("cpu_offload_layers", int, 0, "Decoder layers whose saved activations are offloaded to host memory "
                                         "(Megatron --cpu-offloading-num-layers), layers; 0 = off; needs pp=1.",
           searched="fixed only", megatron=("--cpu-offloading-num-layers N",), imported=("megatron",), ge=0,
           dtype=np.int64, deepspeed_lacks="DeepSpeed's config cannot offload the activations of chosen layers "
                                           "({shown}); use --engine megatron or cpu_offload_layers=0"),
    Switch("moe_flex_dispatcher", bool, False, "MoE flex token dispatcher with a node-deduplicating backend "
                                               "(Megatron --moe-token-dispatcher-type flex with "
                                               "--moe-flex-dispatcher-backend deepep|hybridep, or the deprecated "
                                               "--moe-enable-deepep): a token crosses the network once per "
                                               "destination node and fans out to that node's experts over NVLink; "
                                               "False = the alltoall dispatcher, one copy per selected expert; "
                                               "needs ep > 1.",
           # On wherever experts are parallel on Megatron: it moves no more bytes than the alltoall dispatcher over
           # either link (collectives.flex_all_to_all_time; Megatron's MoE guide recommends it for cross-node EP);
           # its buffers are priced (memory.flex_dispatcher_buffer_bytes).
           searched="on with ep>1 (Megatron)", megatron=("--moe-token-dispatcher-type flex",
                                                        "--moe-flex-dispatcher-backend hybridep"),
           imported=("megatron",), estimate_fills=True, search=lambda c, e: c["ep"] > 1,
           deepspeed_lacks="DeepSpeed has no DeepEP / HybridEP token dispatcher ({shown}); use --engine megatron or "
                           "moe_flex_dispatcher=false"),
    # Memory switches that never cost time: on, and written by the Megatron emitter (--cross-entropy-fusion-impl te,
    # PYTORCH_CUDA_ALLOC_CONF in train.sh); the DeepSpeed launch files set neither.
    Switch("te_cross_entropy", bool, False, "TransformerEngine fused cross entropy (Megatron "
                                            "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te): the logits "
                                            "gradient is written into the bf16 logits, 2 bytes per logit held "
                                            "instead of 6; Megatron engine only.",
           searched="on (Megatron)", megatron=("--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl te"),
           imported=("megatron",), search=_megatron_only),
    Switch("expandable_segments", bool, False, "PyTorch caching allocator with expandable segments "
                                               "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): no "
                                               "fragmentation allowance is added (calibration.py).",
           searched="on (Megatron)", megatron=("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in train.sh",),
           imported=("megatron",), search=_megatron_only),
    Switch("adam_bf16_states", bool, False, "Adam's two moments kept in bf16: Megatron "
                                            "--use-precision-aware-optimizer --exp-avg-dtype bf16 "
                                            "--exp-avg-sq-dtype bf16, 8 optimizer bytes per parameter (fp32 master "
                                            "+ two bf16 moments) instead of 12, needs the distributed optimizer "
                                            "(zero=1); DeepSpeed bf16.bf16_optimizer_states, the moments of the "
                                            "bf16 master weights (bf16_master_weights, which it needs): 6 bytes.",
           searched="fixed only (numerics)", megatron=("--use-precision-aware-optimizer", "--exp-avg-dtype bf16",
                                                       "--exp-avg-sq-dtype bf16"),
           deepspeed="bf16.bf16_optimizer_states", imported=("megatron", "deepspeed")),
    Switch("bf16_master_weights", bool, False, "DeepSpeed ZeRO's master weights and gradient partition kept in "
                                               "bf16 (bf16.bf16_master_weights_and_grads): a 2-byte master copy "
                                               "instead of 4 and bf16 partitioned gradients; needs zero>=1 and, "
                                               "unless the Adam moments are bf16 too (adam_bf16_states), "
                                               "ZeRO-Offload, which autoplan does not write; DeepSpeed engine only.",
           searched="fixed only (numerics)", deepspeed="bf16.bf16_master_weights_and_grads",
           imported=("deepspeed",)),
    Switch("fused_weighted_squared_relu", bool, False, (
        "Non-gated MoE experts weight their routed copies inside Megatron's fused squared-ReLU kernel "
        "(TransformerConfig.use_fused_weighted_squared_relu, set by Megatron-Bridge's Nemotron-3 recipes; no "
        "Megatron-LM command-line flag): only the routing probabilities are saved for the weighting, not the bf16 "
        "activation output; no effect on gated (SwiGLU) experts, which are always weighted in a fused kernel."),
           searched="fixed only"),
    Switch("te_op_fuser", bool, False, (
        "TransformerEngine's operation fuser for the MoE experts (Megatron --use-transformer-engine-op-fuser): the "
        "grouped MLP's bias, clamped activation and routing-probability weighting run inside fused ops instead of "
        "Megatron's per-expert bias loop and eager clamps; Megatron engine only."),
           searched="fixed only", megatron=("--use-transformer-engine-op-fuser",), passthrough=True,
           imported=("megatron",), deepspeed_lacks="{shown} is Megatron's {flag}; DeepSpeed has none; set "
                                                   "te_op_fuser=false or use engine megatron"),
)
KEYS: Tuple[Key, ...] = LAYOUT_KEYS + SWITCHES + LATE_KEYS  # every strategy key, in `Strategy`'s field order
BY_KEY: Dict[str, Key] = {k.name: k for k in KEYS}
BY_NAME: Dict[str, Key] = {k.name: k for k in SWITCHES}
NAMES: Tuple[str, ...] = tuple(BY_NAME)  # the switches
INT_NAMES = frozenset(k.name for k in SWITCHES if k.dtype is np.int64)
BOOL_NAMES = frozenset(NAMES) - INT_NAMES


def names(role: str) -> Tuple[str, ...]:
    """The keys of one role (ROLES), in field order."""
    return tuple(k.name for k in KEYS if k.role == role)


def keys_of_kind(*kinds) -> frozenset:
    """The keys whose field is of one of `kinds` (e.g. int, Optional[int])."""
    return frozenset(k.name for k in KEYS if k.kind in kinds)


def strategy_fields() -> Dict[str, Tuple[Any, Any]]:
    """name -> (annotation, pydantic field), for `Strategy`'s class body."""
    return {k.name: (k.kind, k.pydantic_field()) for k in KEYS}


def column_keys() -> Tuple[Key, ...]:
    """The keys that own a `Layouts` column."""
    return tuple(k for k in KEYS if k.column != "")


def columns_of(strategies, rows=None) -> Dict[str, np.ndarray]:
    """The `Layouts` key columns of a list of strategies; `rows` holds each one's context (see `Key`), needed by
    the keys whose encoding reads it (dp, the pipeline end ranks); without it, the switch columns only."""
    owned = column_keys() if rows is not None else SWITCHES
    rows = rows if rows is not None else [None] * len(strategies)
    return {k.column_name: np.array([k.column_value(s, r) for s, r in zip(strategies, rows)], dtype=k.dtype)
            for k in owned}


def values_of(layouts, i: int, keys=None) -> Dict[str, Any]:
    """Row i's key columns as `Strategy` fields (every key; `keys` to read some only)."""
    return {k.name: k.value(layouts, i) for k in (KEYS if keys is None else keys)}


def search_columns(columns: Columns, engine: str, n: int) -> Dict[str, np.ndarray]:
    """The switch columns the search gives n candidates before any `--fix`."""
    return {k.name: k.grid(columns, engine, n) for k in SWITCHES}


def megatron_passthrough(strategy, keys: Optional[Tuple[str, ...]] = None) -> list:
    """The plain Megatron flags of the keys that are on (`Key.passthrough`), in registry order: the switches', or
    those of `keys`."""
    chosen = SWITCHES if keys is None else tuple(BY_KEY[k] for k in keys)
    return [arg for k in chosen if k.passthrough and getattr(strategy, k.name)
            for flag in k.megatron for arg in flag.split()]


def imported_passthrough(flags: Mapping[str, Any], keys: Optional[Tuple[str, ...]] = None) -> Dict[str, bool]:
    """The plain-flag keys a parsed Megatron command line turns on (`flags` holds names without dashes): the
    switches', or those of `keys`."""
    chosen = SWITCHES if keys is None else tuple(BY_KEY[k] for k in keys)
    return {k.name: True for k in chosen
            if k.passthrough and all(f.split()[0].lstrip("-") in flags for f in k.megatron)}


def megatron_words(name: str, entry: Optional[int] = None) -> Tuple[Tuple[str, Optional[str]], ...]:
    """Key `name`'s Megatron arguments as (argument without dashes, value): value None for a flag that takes none,
    the written word for a fixed value ('--moe-token-dispatcher-type flex'), '' for one the strategy's value fills
    (an upper-case placeholder: 'N', 'F', 'M...'). Entries that are not arguments (an environment variable) give
    none. `entry`: of the i-th entry of `Key.megatron` only."""
    out = []
    entries = BY_KEY[name].megatron
    for text in entries if entry is None else entries[entry:entry + 1]:
        words = text.split()
        for i, word in enumerate(words):
            if not word.startswith("--"):
                continue
            nxt = words[i + 1] if i + 1 < len(words) else None
            value = None if nxt is None or nxt.startswith("--") else ("" if nxt[0].isupper() else nxt)
            out.append((word[2:], value))
    return tuple(out)


def arg(name: str, i: int = 0) -> str:
    """The i-th Megatron argument of key `name`, without dashes (as a parsed command line holds it)."""
    return megatron_words(name)[i][0]


def flag(name: str, i: int = 0) -> str:
    """The i-th Megatron argument of key `name` as written on a command line ('--tensor-model-parallel-size')."""
    return "--" + arg(name, i)


def written(name: str, entry: Optional[int] = None) -> list:
    """The arguments key `name` writes when on, for a key whose Megatron arguments carry no value of the strategy's
    (flags and fixed words only, e.g. adam_bf16_states); `entry`: the i-th entry of `Key.megatron` only."""
    out = []
    for a, value in megatron_words(name, entry):
        if value == "":
            raise ValueError(f"{name}: --{a} takes the strategy's value; write it with `valued`")
        out += ["--" + a] + ([] if value is None else [value])
    return out


def valued(name: str, value, i: int = 0) -> list:
    """[the i-th Megatron argument of key `name`, its value as text]."""
    return [flag(name, i), str(value)]


def megatron_args() -> Dict[str, bool]:
    """Every Megatron argument the registry names -> whether it takes a value (False: a store_true flag)."""
    return {a: v is not None for k in KEYS for a, v in megatron_words(k.name)}


def megatron_list_args() -> frozenset:
    """The registry's Megatron arguments that take a list of words (nargs="+", a placeholder written 'M...')."""
    return frozenset(w[2:] for k in KEYS for text in k.megatron for w, nxt in zip(text.split(), text.split()[1:])
                     if w.startswith("--") and nxt.endswith("..."))


def deepspeed_path(name: str) -> Tuple[str, ...]:
    """Key `name`'s DeepSpeed config key as a path of nested sections ('zero_optimization.stage')."""
    return tuple(BY_KEY[name].deepspeed.split("."))


def deepspeed_leaf(name: str) -> str:
    """The last part of key `name`'s DeepSpeed config key (what its section holds it under)."""
    return deepspeed_path(name)[-1]


def deepspeed_section(name: str) -> str:
    """The section of key `name`'s DeepSpeed config key ('' at the top level)."""
    return ".".join(deepspeed_path(name)[:-1])


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def type_words(key: Key) -> str:
    """The key's type and legal values in words (the README table, --help)."""
    kind, unset = key.kind, ""
    if get_origin(kind) is Union:  # Optional[x]
        kind, unset = next(a for a in get_args(kind) if a is not type(None)), " or unset"
    if get_origin(kind) is Literal:
        words = "|".join(get_args(kind))
    elif get_origin(kind) is tuple:
        words = "module names joined by +"
    else:
        words = kind.__name__
        low = key.gt + 1 if key.gt is not None else key.ge
        if low is not None:
            words += f" {low}..{key.le}" if key.le is not None else f" >= {low}"
    return words + unset


def _layouts_words(key: Key) -> str:
    if key.column == "":
        return key.layouts
    return f"`{key.column_name}`" + (f": {key.layouts}" if key.layouts else "")


def key_table() -> str:
    """The README's table of strategy keys (tests/unit/test_keys.py holds the README to it)."""
    rows = ["| key | type | default | search | Layouts | Megatron | DeepSpeed | imported from | meaning |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in KEYS:
        default = "unset" if k.default is None else str(k.default).lower()
        megatron = ", ".join(f"`{f}`" for f in k.megatron) or "none"
        deepspeed = f"`{k.deepspeed}`" if k.deepspeed else "none"
        rows.append(f"| `{k.name}` | {_cell(type_words(k))} | {default} | {_cell(k.searched)} | "
                    f"{_cell(_layouts_words(k))} | {_cell(megatron)} | {_cell(deepspeed)} | "
                    f"{', '.join(k.imported) or 'none'} | {_cell(k.doc)} |")
    return "\n".join(rows) + "\n"


def help_text() -> str:
    """The strategy keys for --help: each key with its type."""
    return "; ".join(f"{k.name} ({type_words(k)})" for k in KEYS)


if __name__ == "__main__":  # python -m autoplan.keys: the README's table
    print(key_table(), end="")
