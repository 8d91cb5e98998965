"""Model inputs: a catalogue name, a Hugging Face `config.json`, or a native YAML/JSON of `ModelSpec` fields,
plus `--set key=value` overrides. Every bad input becomes a one-line `InputError`."""
from __future__ import annotations

import json
import re
import typing
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Type

import yaml
from pydantic import BaseModel, ValidationError

from autoplan.errors import InputError, did_you_mean
from autoplan.fileio import read_text
from autoplan import hf_meta
from autoplan.hf_config import SUPPORTED_MODEL_TYPES, hf_config_fields
from autoplan.hf_fields import GATE_ACTIVATIONS
from autoplan.model import ModelSpec

__all__ = ["load_model", "from_hf_config", "list_catalogue", "catalogue_names", "apply_overrides", "parse_overrides",
           "validation_message"]

_FILE_SUFFIXES = (".json", ".yaml", ".yml")


# ---------------------------------------------------------------- errors

def validation_message(err: ValidationError, where: str, model: Type[BaseModel] = ModelSpec) -> str:
    """A pydantic ValidationError as one line: where, the missing fields, then each bad value with its rule."""
    missing = [".".join(map(str, e["loc"])) for e in err.errors() if e["type"] == "missing"]
    parts = [f"missing required field(s) {', '.join(missing)}; add them"] if missing else []
    for e in err.errors():
        if e["type"] == "missing":
            continue
        field = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown field{did_you_mean(str(e['loc'][-1]), model.model_fields)}"
        parts.append(f"{field}={e['input']!r}: {msg}" if field else msg)
    return f"{where}: " + "; ".join(parts)


def _build(fields: Mapping[str, Any], where: str) -> ModelSpec:
    try:
        return ModelSpec.model_validate(dict(fields))
    except ValidationError as e:
        raise InputError(validation_message(e, where)) from None


# ---------------------------------------------------------------- Hugging Face configs

def from_hf_config(cfg: Mapping[str, Any], name: str, *, where: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face config mapping (`model_type` picks the parser; see autoplan.hf_config)."""
    where = where or f"HF config {name!r}"
    model_type = cfg.get("model_type")
    # A vision-language config goes to hf_config_fields, which points it to `autoplan vlm` (encoder and LLM together).
    vision = isinstance(cfg.get("vision_config"), Mapping)
    if isinstance(model_type, str) and model_type not in SUPPORTED_MODEL_TYPES and not vision and hf_meta.available():
        try:
            return _from_structure(cfg, name, model_type, where)
        except InputError as e:
            raise InputError(f"{e} (model types read without it: {', '.join(SUPPORTED_MODEL_TYPES)})") from None
    return _build({"name": name, **hf_config_fields(cfg, where)}, where)


def _from_structure(cfg: Mapping[str, Any], name: str, model_type: str, where: str) -> ModelSpec:
    """A model_type no hand-written reader knows, read from the model transformers builds for it
    (autoplan/hf_meta.py): priced only when the ModelSpec read from its layers counts exactly the parameters of
    the built model; refused in one line naming what differs otherwise."""
    structure = hf_meta.load_structure(cfg, where)
    positions = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    fields = hf_meta.spec_fields(structure, where, positions if isinstance(positions, int) and positions > 0
                                 else 4096)
    act = cfg.get("hidden_act") or (cfg.get("text_config") or {}).get("hidden_act") or "silu"
    gate = GATE_ACTIVATIONS.get(act) if isinstance(act, str) else None
    if gate is None:
        raise InputError(f"{where}: hidden_act={act!r} is not a gated-MLP activation the cost model knows; supported: "
                         f"{', '.join(GATE_ACTIVATIONS)} (or pass a native model YAML of ModelSpec fields)")
    note = (f"{model_type}: read from the structure transformers builds (no hand-written reader): RoPE and a gated "
            f"MLP assumed, parameter count checked against the built model")
    spec = _build({"name": name, **fields, "gate_activation": gate, "notes": (note,)}, where)
    reason = hf_meta.check_fields(spec, structure, where)
    if reason:
        raise InputError(f"{reason}; pass a native model YAML of ModelSpec fields")
    return spec


# ---------------------------------------------------------------- files

def _read_mapping(path: Path) -> Dict[str, Any]:
    """The top-level mapping of a JSON or YAML file; InputError with the path and the fix otherwise."""
    if not path.exists():
        raise InputError(f"model file {str(path)!r} does not exist; pass a catalogue name (see `autoplan models`), "
                         f"a config.json or a model YAML")
    if path.is_dir():
        raise InputError(f"model path {str(path)!r} is a directory without a config.json; pass the config.json "
                         f"file itself")
    text = read_text(path, "model file", "pass a Hugging Face config.json or a model YAML")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        detail = " ".join(str(e).split())
        raise InputError(f"model file {str(path)!r} is not valid {kind} ({detail}); fix the syntax") from None
    if not isinstance(data, dict):
        raise InputError(f"model file {str(path)!r} holds a {type(data).__name__}, not a mapping of fields; "
                         f"write `key: value` pairs at the top level")
    return data


def _name_for(path: Path) -> str:
    """`org/Model-X/config.json` -> 'Model-X'; `llama3_8b.json` -> 'llama3_8b'."""
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


def _load_file(path: Path, name: Optional[str] = None) -> ModelSpec:
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    data = _read_mapping(path)
    where = f"model file {str(path)!r}"
    if "model_type" in data:
        return from_hf_config(data, name or _name_for(path), where=where)
    return _build({"name": name or _name_for(path), **data}, where)


# A Hugging Face Hub model id, `org/name` (huggingface_hub's repo-id rule: letters, digits, '-', '_', '.').
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def hub_config(ref: str) -> Optional[Path]:
    """The cached config.json of Hub id `ref` (`Qwen/Qwen3-8B`), as transformers and huggingface_hub left it in the
    local cache (HF_HUB_CACHE / HF_HOME, `huggingface_hub.try_to_load_from_cache`, the `main` revision); None when
    `ref` is not a Hub id or is a path here. Nothing is downloaded: InputError when the id is not cached, saying how
    to fetch the file."""
    if not _HUB_ID.fullmatch(ref) or ref.endswith(_FILE_SUFFIXES) or Path(ref).expanduser().exists():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        raise InputError(f"model {ref!r}: no such file; to read a Hugging Face Hub id from the local cache install "
                         f"huggingface_hub (pip install 'autoplan[hf]'), or pass the model's config.json") from None
    found = try_to_load_from_cache(ref, "config.json")
    if isinstance(found, str) and Path(found).is_file():
        return Path(found)
    raise InputError(f"model {ref!r}: no such file, and no config.json of Hub model {ref} in the local cache "
                     f"({HF_HUB_CACHE}); nothing is downloaded: fetch it (`hf download {ref} config.json`) and pass "
                     f"the file, or pass a catalogue name (see `autoplan models`)")


# ---------------------------------------------------------------- catalogue

def _catalogue_dir():
    return resources.files("autoplan") / "catalogue"


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _natural_key(name: str):
    """'gpt-18b' sorts before 'gpt-145b': compare digit runs as numbers."""
    return [float(t) if t.replace(".", "", 1).isdigit() else t for t in re.split(r"(\d+(?:\.\d+)?)", name)]


def catalogue_names() -> List[str]:
    """Catalogue model names, in natural order."""
    names = [p.name[: -len(".yaml")] for p in _catalogue_dir().iterdir() if p.name.endswith(".yaml")]
    return sorted(names, key=_natural_key)


def _load_catalogue_entry(name: str) -> ModelSpec:
    entry = _catalogue_dir() / f"{name}.yaml"
    data = yaml.safe_load(entry.read_text(encoding="utf-8"))
    return _build({"name": name, **data}, f"catalogue entry {name!r}")


def list_catalogue() -> List[ModelSpec]:
    """Every catalogue model, in natural name order."""
    return [_load_catalogue_entry(n) for n in catalogue_names()]


# ---------------------------------------------------------------- overrides

def _coerce(raw: str, annotation: Any, key: str) -> Any:
    """`raw` converted to the field's annotated type (int, float, bool, str, Literal, Optional[...])."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union:
        if type(None) in args and raw.strip().lower() in ("none", "null", ""):
            return None
        annotation = next(a for a in args if a is not type(None))
    if annotation is bool:
        lowered = raw.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise InputError(f"--set {key}={raw!r}: expected a boolean (true/false)")
    if annotation in (int, float):
        try:
            return annotation(raw)
        except ValueError:
            kind = "an integer" if annotation is int else "a number"
            raise InputError(f"--set {key}={raw!r}: expected {kind}") from None
    return raw  # str and Literal: pydantic checks the allowed values


def parse_overrides(overrides: Sequence[str]) -> Dict[str, Any]:
    """`["num_layers=40", "tie_embeddings=true"]` -> typed values keyed by ModelSpec field."""
    fields = ModelSpec.model_fields
    updates: Dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--set {item!r} is not key=value; write e.g. --set num_layers=40")
        if key not in fields:
            raise InputError(f"--set {key}: unknown model field{did_you_mean(key, fields)}; fields: "
                             f"{', '.join(fields)}")
        updates[key] = _coerce(raw.strip(), fields[key].annotation, key)
    return updates


def apply_overrides(spec: ModelSpec, overrides: Sequence[str]) -> ModelSpec:
    """`spec` with `key=value` overrides applied and the result re-validated."""
    if not overrides:
        return spec
    return _build({**spec.model_dump(), **parse_overrides(overrides)}, f"model {spec.name!r} after --set")


# ---------------------------------------------------------------- entry point

def _looks_like_path(ref: str) -> bool:
    return ref.endswith(_FILE_SUFFIXES) or "/" in ref or "\\" in ref or Path(ref).exists()


def load_model(ref: str, overrides: Sequence[str] = ()) -> ModelSpec:
    """A ModelSpec from a catalogue name (case-insensitive, '_' = '-'), a Hugging Face config.json, or a native
    YAML/JSON file of ModelSpec fields, with `key=value` overrides applied."""
    if not ref or not ref.strip():
        raise InputError("model is empty; pass a catalogue name (see `autoplan models`) or a config file")
    cached = hub_config(ref)
    if cached is not None:
        spec = _load_file(cached, name=ref.split("/")[1])
    elif _looks_like_path(ref):
        spec = _load_file(Path(ref).expanduser())
    else:
        names = catalogue_names()
        key = _normalise(ref)
        if key not in names:
            raise InputError(f"unknown model {ref!r}{did_you_mean(key, names)}; run `autoplan models` for the "
                             f"catalogue, or pass a config.json / model YAML path")
        spec = _load_catalogue_entry(key)
    return apply_overrides(spec, overrides)
