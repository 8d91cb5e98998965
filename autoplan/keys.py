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
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np
from pydantic import Field

from autoplan import recompute as R

Columns = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Switch:
    """One strategy switch. `encode(strategy)` is its `Layouts` column value (None: the field as it is);
    `decode(layouts, i)` turns row i's column back into the field (None: the column cast to `kind`);
    `search(columns, engine)` is the column the search gives every candidate, from the grid's columns (`fp8`,
    `zero`, `sp`, bool/int arrays) and the engine (None: off, set only by `--fix`); `searched` says so in words.
    `megatron` lists the flags the Megatron emitter writes when the switch is on, `passthrough` that it writes
    exactly those, with no other condition, and the Megatron importer reads them back as the switch (both
    generated from here); `deepspeed` is the DeepSpeed config key that carries it ('' = DeepSpeed refuses it or
    writes nothing for it); `imported` names the importers that read it.
    The engine rules a switch must meet are in autoplan/switch_rules.py."""

    name: str
    kind: Any  # the field's annotation: bool, int or Optional[bool]
    default: Any
    doc: str
    searched: str
    megatron: Tuple[str, ...] = ()
    passthrough: bool = False
    deepspeed: str = ""
    imported: Tuple[str, ...] = ()
    ge: Optional[int] = None
    encode: Optional[Callable[[Any], Any]] = None
    decode: Optional[Callable[[Any, int], Any]] = None
    search: Optional[Callable[[Columns, str], np.ndarray]] = None
    dtype: Any = bool
    # `estimate` gives a complete strategy that does not state the switch the value the search would
    # (complete.fill_searched_switches); the switches that change neither the numerics nor what the user sized.
    estimate_fills: bool = False

    def pydantic_field(self):
        """The pydantic field `Strategy` declares."""
        return Field(self.default, description=self.doc, **({} if self.ge is None else {"ge": self.ge}))

    def column(self, strategy) -> Any:
        return getattr(strategy, self.name) if self.encode is None else self.encode(strategy)

    def value(self, layouts, i: int) -> Any:
        if self.decode is not None:
            return self.decode(layouts, i)
        raw = getattr(layouts, self.name)[i]
        return int(raw) if self.dtype is np.int64 else bool(raw)

    def grid(self, columns: Columns, engine: str, n: int) -> np.ndarray:
        """The search's column for n candidates."""
        if self.search is None:
            return np.zeros(n, self.dtype)
        return np.broadcast_to(np.asarray(self.search(columns, engine), self.dtype), (n,)).copy()


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
           encode=lambda s: s.tp_overlap_on and s.sp and s.tp > 1, decode=_tp_overlap_value,
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
           encode=lambda s: s.fp8_param and s.uses_fp8,
           search=lambda c, e: c["fp8"].astype(bool) & (c["zero"] >= 1) & (e != "deepspeed")),
    Switch("cpu_offload_layers", int, 0, "Decoder layers whose saved activations are offloaded to host memory "
                                         "(Megatron --cpu-offloading-num-layers), layers; 0 = off; needs pp=1.",
           searched="fixed only", megatron=("--cpu-offloading-num-layers N",), imported=("megatron",), ge=0,
           dtype=np.int64),
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
           imported=("megatron",), estimate_fills=True, search=lambda c, e: (c["ep"] > 1) & (e != "deepspeed")),
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
    Switch("adam_bf16_states", bool, False, "Adam's two moments kept in bf16 (Megatron "
                                            "--use-precision-aware-optimizer --exp-avg-dtype bf16 "
                                            "--exp-avg-sq-dtype bf16): 8 optimizer bytes per parameter (fp32 master "
                                            "+ two bf16 moments) instead of 12; needs the distributed optimizer "
                                            "(zero=1); Megatron engine only.",
           searched="fixed only (numerics)", megatron=("--use-precision-aware-optimizer", "--exp-avg-dtype bf16",
                                                       "--exp-avg-sq-dtype bf16"), imported=("megatron",)),
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
           imported=("megatron",)),
)
BY_NAME: Dict[str, Switch] = {k.name: k for k in SWITCHES}
NAMES: Tuple[str, ...] = tuple(BY_NAME)
INT_NAMES = frozenset(k.name for k in SWITCHES if k.dtype is np.int64)
BOOL_NAMES = frozenset(NAMES) - INT_NAMES


def strategy_fields() -> Dict[str, Tuple[Any, Any]]:
    """name -> (annotation, pydantic field), for `Strategy`'s class body."""
    return {k.name: (k.kind, k.pydantic_field()) for k in SWITCHES}


def columns_of(strategies) -> Dict[str, np.ndarray]:
    """The `Layouts` switch columns of a list of strategies."""
    return {k.name: np.array([k.column(s) for s in strategies], dtype=k.dtype) for k in SWITCHES}


def values_of(layouts, i: int) -> Dict[str, Any]:
    """Row i's switch columns as `Strategy` fields."""
    return {k.name: k.value(layouts, i) for k in SWITCHES}


def search_columns(columns: Columns, engine: str, n: int) -> Dict[str, np.ndarray]:
    """The switch columns the search gives n candidates before any `--fix`."""
    return {k.name: k.grid(columns, engine, n) for k in SWITCHES}


def megatron_passthrough(strategy) -> list:
    """The plain Megatron flags of the switches that are on (`Switch.passthrough`), in registry order."""
    return [arg for k in SWITCHES if k.passthrough and getattr(strategy, k.name)
            for flag in k.megatron for arg in flag.split()]


def imported_passthrough(flags: Mapping[str, Any]) -> Dict[str, bool]:
    """The plain-flag switches a parsed Megatron command line turns on (`flags` holds names without dashes)."""
    return {k.name: True for k in SWITCHES
            if k.passthrough and all(f.split()[0].lstrip("-") in flags for f in k.megatron)}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def key_table() -> str:
    """The README's table of strategy switches (tests/test_keys.py holds the README to it)."""
    rows = ["| key | type | default | search | Megatron | DeepSpeed | imported from | meaning |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in SWITCHES:
        kind = {bool: "bool", int: "int"}.get(k.kind, "bool or unset")
        default = "unset" if k.default is None else str(k.default).lower()
        megatron = ", ".join(f"`{f}`" for f in k.megatron) or "none"
        deepspeed = f"`{k.deepspeed}`" if k.deepspeed else "none"
        rows.append(f"| `{k.name}` | {kind} | {default} | {_cell(k.searched)} | {_cell(megatron)} | "
                    f"{_cell(deepspeed)} | {', '.join(k.imported) or 'none'} | {_cell(k.doc)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m autoplan.keys: the README's table
    print(key_table(), end="")
