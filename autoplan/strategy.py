"""`Strategy`: one parallel layout and its memory/precision switches, with the contract key names.

Key names follow Megatron-LM's arguments: tp (--tensor-model-parallel-size), pp, vpp (model chunks per pipeline
rank, --num-virtual-stages-per-pipeline-rank), cp, ep, etp, mbs, sp, zero (0 DDP, 1 distributed optimizer /
ZeRO-1, 2, 3), recompute, fp8."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from autoplan import cuda_graphs as G
from autoplan import keys as K
from autoplan import recompute as R
from autoplan.errors import InputError, did_you_mean
from autoplan.layout_string import layout_vpp

Recompute, Fp8, Fp8Recipe = K.Recompute, K.Fp8, K.Fp8Recipe

# Keys that are part of the command-line contract, and the extras that plan output may carry (autoplan/keys.py
# `role`).
CONTRACT_KEYS = K.names("contract")
DETAIL_KEYS = K.names("detail")
# Megatron's other ways to split the layers over pipeline ranks (autoplan/pipeline_split.py); shown when set.
SPLIT_SWITCHES = K.names("split")
# Every key that sets how the layers are split over pipeline ranks.
SPLIT_KEYS = ("first_stage_layers", "last_stage_layers") + SPLIT_SWITCHES + ("pipeline_layout",)
OVERLAP_KEYS = K.NAMES  # the switches (autoplan/keys.py)


def _module_set(names: Optional[Tuple[str, ...]], valid: Tuple[str, ...], canonical, what: str,
                key: str) -> Optional[Tuple[str, ...]]:
    """A module-name set checked against `valid` and put in `canonical` order; None stays None."""
    if names is None:
        return None
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(f"unknown {what} {unknown[0]!r}{did_you_mean(unknown[0], valid)}; valid: {', '.join(valid)}")
    if not names:
        raise ValueError(f"{key} is empty; name at least one module or drop the key")
    return canonical(names)


class Strategy(BaseModel):
    """A complete parallel strategy. dp is derived: world / (tp * pp * cp)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Every key is declared in autoplan/keys.py (type, bounds, default, doc, and what it becomes in Layouts, the
    # search, the emitters and the importers); the class body is a plain namespace, so the fields are added to it
    # here, in the registry's order.
    __annotations__ = {}
    for _name, (_kind, _field) in K.strategy_fields().items():
        __annotations__[_name] = _kind
        locals()[_name] = _field
    del _name, _kind, _field

    @model_validator(mode="before")
    @classmethod
    def _vpp_from_layout(cls, data: Any) -> Any:
        """A layout string states the model chunks per rank: vpp = its stages / pp (layout_string.layout_vpp) when
        vpp is not given; a vpp given beside it is checked against it (pipeline_split.layout_problem)."""
        if isinstance(data, dict) and data.get("pipeline_layout") and data.get("vpp") is None:
            try:
                vpp = layout_vpp(str(data["pipeline_layout"]), int(data.get("pp") or 1))
            except (TypeError, ValueError):
                return data  # the layout's own rule names the bad symbol or pp
            if vpp:
                data = {**data, "vpp": vpp}
        return data

    @model_validator(mode="before")
    @classmethod
    def _full_recompute_defaults(cls, data: Any) -> Any:
        # Megatron's full recompute needs a method and a layer count; uniform/1 recomputes every layer.
        if isinstance(data, dict) and data.get("recompute") == "full":
            data = dict(data)
            data.setdefault("recompute_method", "uniform")
            data.setdefault("recompute_layers", 1)
            data["recompute_method"] = data["recompute_method"] or "uniform"
            data["recompute_layers"] = data["recompute_layers"] or 1
        return data

    @field_validator("recompute_modules")
    @classmethod
    def _known_modules(cls, names: Optional[Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
        """Megatron's module names, in one canonical order without repeats."""
        return _module_set(names, R.MODULES, R.canonical, "recompute module", "recompute_modules")

    @field_validator("cuda_graph_modules")
    @classmethod
    def _known_graph_modules(cls, names: Optional[Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
        """Megatron's CUDA-graph module names, in one canonical order without repeats."""
        names = _module_set(names, G.MODULES, G.canonical, "CUDA-graph module", "cuda_graph_modules")
        if names and "full_iteration" in names and len(names) > 1:
            raise ValueError(f"cuda_graph_modules={'+'.join(names)}: full_iteration captures the whole step and "
                             f"takes no other module; give full_iteration alone or only per-layer modules")
        return names

    @model_validator(mode="after")
    def _local_rules(self) -> "Strategy":
        if self.recompute != "full" and (self.recompute_method is not None or self.recompute_layers is not None):
            raise ValueError(f"recompute_method/recompute_layers apply only to recompute=full "
                             f"(got recompute={self.recompute}); drop them or set recompute=full")
        if self.recompute_modules is not None:
            if self.recompute != "selective":
                raise ValueError(f"recompute_modules apply only to recompute=selective (got recompute="
                                 f"{self.recompute}); drop them or set recompute=selective")
        if self.fp8 == "none" and self.fp8_recipe is not None:
            raise ValueError(f"fp8_recipe={self.fp8_recipe} needs fp8=hybrid or e4m3")
        return self

    @property
    def uses_fp8(self) -> bool:
        return self.fp8 != "none"

    @property
    def tp_overlap_on(self) -> bool:
        """Whether TP communication overlap is on (the default follows sequence parallelism)."""
        return self.sp if self.tp_comm_overlap is None else self.tp_comm_overlap

    @property
    def distributed_optimizer(self) -> bool:
        return self.zero >= 1

    def label(self, moe: bool = False) -> str:
        """Short human label, e.g. 'tp8 pp4 v2 dp8 mbs1 sp sel'. With moe=True the expert TP degree is shown whenever
        it differs from tp (also at ep=1, where etp1 under tp2 is a different plan from etp2)."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp != self.tp and (self.ep > 1 or moe):
            parts.append(f"etp{self.etp}")
        if self.dp:
            parts.append(f"dp{self.dp}")
        parts.append(f"mbs{self.mbs}")
        if self.sp:
            parts.append("sp")
        parts.append(f"z{self.zero}")
        if self.recompute == "selective":
            mods = R.canonical(self.recompute_modules)
            parts.append("rc-sel" if mods == R.DEFAULT else "rc-sel(" + "+".join(R.SHORT[n] for n in mods) + ")")
        elif self.recompute == "full":
            parts.append(f"rc-full{self.recompute_layers}{'b' if self.recompute_method == 'block' else 'u'}")
        if self.uses_fp8:
            parts.append("fp8")
        if self.first_stage_layers is not None or self.last_stage_layers is not None:
            parts.append(f"stages[{self.first_stage_layers},{self.last_stage_layers}]")
        if self.account_for_embedding or self.account_for_loss:
            parts.append("split[" + "+".join(n for n, on in (("E", self.account_for_embedding),
                                                              ("L", self.account_for_loss)) if on) + "]")
        if self.pipeline_layout:
            parts.append(f"layout[{self.pipeline_layout}]")
        if self.cuda_graph_modules:
            parts.append("cg(" + "+".join(G.SHORT[n] for n in self.cuda_graph_modules) + ")")
        return " ".join(parts)

    def to_dict(self) -> Dict[str, Any]:
        """Stable JSON form: contract keys, details that are set, and overlap switches only when not default."""
        out: Dict[str, Any] = {k: getattr(self, k) for k in CONTRACT_KEYS}
        for k in DETAIL_KEYS:
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        for k in OVERLAP_KEYS + SPLIT_SWITCHES:
            v = getattr(self, k)
            if v != Strategy.model_fields[k].default:
                out[k] = v
        return out

    def key(self) -> str:
        """One string per distinct strategy (its stable JSON form, keys sorted): for deduplication and lookups."""
        return json.dumps(self.to_dict(), sort_keys=True)


_INT_KEYS = K.keys_of_kind(int, Optional[int])
_BOOL_KEYS = K.keys_of_kind(bool, Optional[bool])
_LIST_KEYS = K.keys_of_kind(Optional[Tuple[str, ...]])  # module sets: a file may give a list
ALL_KEYS = tuple(Strategy.model_fields)


def coerce_strategy_value(key: str, raw: Any) -> Any:
    """Turn a command-line or file value into the field's type (a key's own `parse` in autoplan/keys.py where its
    text is not a plain integer, boolean or word); one-line InputError when it cannot."""
    if key not in Strategy.model_fields:
        raise InputError(f"unknown strategy key {key!r}{did_you_mean(key, ALL_KEYS)}; "
                         f"valid keys: {', '.join(ALL_KEYS)}")
    parse = K.BY_KEY[key].parse
    if isinstance(raw, str):
        text = raw.strip()
        low = text.lower()
        if key in _INT_KEYS:
            try:
                return int(text)
            except ValueError:
                raise InputError(f"strategy key {key} must be an integer, got {text!r}") from None
        if key in _BOOL_KEYS:
            if low in K.BOOL_TRUE:
                return True
            if low in K.BOOL_FALSE:
                return False
            raise InputError(f"strategy key {key} must be true or false, got {text!r}")
        return parse(text) if parse is not None else low
    if key in _LIST_KEYS and isinstance(raw, (list, tuple)):
        return parse(raw)
    return raw


def strategy_items(text: str) -> List[str]:
    """'tp=8,pipeline_layout=Ettt|(tt|)*29,m|L' -> ['tp=8', 'pipeline_layout=Ettt|(tt|)*29,m|L']: items split at
    commas, except the cosmetic commas a layout string may hold (Megatron ignores them)."""
    items: List[str] = []
    for piece in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in piece and items and items[-1].lower().replace("-", "_").startswith("pipeline_layout="):
            items[-1] += "," + piece
        else:
            items.append(piece)
    return items


def parse_strategy_text(text: str) -> Dict[str, Any]:
    """'tp=8,pp=4,sp=true' -> {'tp': 8, 'pp': 4, 'sp': True}. Keys left out are absent (chosen later)."""
    out: Dict[str, Any] = {}
    for item in strategy_items(text):
        if "=" not in item:
            raise InputError(f"strategy item {item!r} must be key=value (e.g. tp=8,pp=4)")
        key, value = (s.strip() for s in item.split("=", 1))
        key = key.lower().replace("-", "_")
        if key in out:
            raise InputError(f"strategy key {key} given twice")
        out[key] = coerce_strategy_value(key, value)
    return out


def strategy_from_mapping(values: Dict[str, Any]) -> Strategy:
    """Build a Strategy, turning pydantic's errors into one-line InputErrors."""
    from pydantic import ValidationError

    try:
        return Strategy(**{k: coerce_strategy_value(k, v) for k, v in values.items()})
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "strategy"
        message = err["msg"].removeprefix("Value error, ")
        raise InputError(f"strategy {loc}={err.get('input')!r}: {message}") from None
