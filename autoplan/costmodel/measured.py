"""Measured layer times for the cost model: load a `MeasuredProfile` (written by `autoplan profile`) and find the
shipped one for a GPU and model.

The cost model calls `profile.layer_time(kind, pass_, tp, mbs, seq, dtype, ep)` per layer kind ("attention",
"mlp", "moe", "embedding", "head"; norms are folded into attention/mlp/moe/head) and uses the non-NaN values in
place of its analytic per-layer times. Times are per decoder layer (embedding/head: per model) for one micro batch
of `mbs` sequences of `seq` tokens on one rank."""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Union

import numpy as np
from pydantic import ValidationError

from autoplan.errors import InputError
from autoplan.fileio import read_text, write_text
from autoplan.cluster import ClusterSpec
from autoplan.model import ModelSpec
from autoplan.profiler.schema import LAYER_KINDS, PASSES, SCHEMA_VERSION, MeasuredProfile

__all__ = ["MeasuredProfile", "LAYER_KINDS", "PASSES", "SCHEMA_VERSION", "load_profile", "find_profile",
           "shipped_profiles", "check_matches", "Profiles", "resolve_profiles", "measured_compute"]


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "<root>"
    return f"{where}: {err['msg']}"


def parse_profile(text: str, origin: str) -> MeasuredProfile:
    """Validate profile JSON text; `origin` names it in the one-line InputError."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"measured profile {origin} is not valid JSON ({e.msg} at line {e.lineno}); "
                         f"regenerate it with `autoplan profile`") from None
    if not isinstance(data, dict):
        raise InputError(f"measured profile {origin} must hold a JSON object, got {type(data).__name__}; "
                         f"regenerate it with `autoplan profile`")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError(f"measured profile {origin} has schema_version={version!r}, this autoplan reads "
                         f"schema_version={SCHEMA_VERSION}; regenerate it with `autoplan profile`")
    try:
        return MeasuredProfile.model_validate(data)
    except ValidationError as e:
        raise InputError(f"measured profile {origin} does not match the profile schema ({_first_error(e)}); "
                         f"regenerate it with `autoplan profile`") from None


# ModelSpec fields that set a layer's shapes: a profile measured for other values does not describe the model.
LAYER_SHAPE_FIELDS = ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                      "vocab_size", "activation", "normalization", "position_embedding", "add_bias_linear",
                      "add_qkv_bias", "qk_layernorm", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
                      "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "num_experts", "moe_router_topk",
                      "moe_ffn_hidden_size", "shared_expert_ffn_hidden_size", "sandwich_norm")


def check_matches(profile: MeasuredProfile, origin: str, model: Optional[ModelSpec] = None,
                  gpu_id: Optional[str] = None) -> None:
    """One-line InputError when the profile was measured for other layer shapes or on another device."""
    if model is not None:
        for field in LAYER_SHAPE_FIELDS:
            mine, theirs = getattr(profile.model, field), getattr(model, field)
            if mine != theirs:
                raise InputError(f"measured profile {origin} was measured for {profile.model.name} with "
                                 f"{field}={mine}, but {model.name} has {field}={theirs}; profile this model with "
                                 f"`autoplan profile --model ...` or drop --profile")
    if gpu_id is not None and profile.device.gpu_id.lower() != gpu_id.lower():
        raise InputError(f"measured profile {origin} was measured on {profile.device.gpu_id}, but the cluster "
                         f"uses {gpu_id}; profile on that GPU or drop --profile")


def load_profile(path: Union[str, Path], model: Optional[ModelSpec] = None,
                 gpu_id: Optional[str] = None) -> MeasuredProfile:
    """Read and validate a profile file; bad files, and (when given) a profile of other layer shapes or of
    another GPU, raise a one-line InputError."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"measured profile {p} does not exist; pass a file written by `autoplan profile --out`")
    text = read_text(p, "measured profile", "pass a file written by `autoplan profile --out`")
    profile = parse_profile(text, str(p)).with_path(str(p))
    check_matches(profile, str(p), model, gpu_id)
    return profile


def save_profile(profile: MeasuredProfile, path: Union[str, Path]) -> Path:
    """Write a profile as indented JSON, atomically (creating the folder)."""
    p = Path(path)
    write_text(p, profile.model_dump_json(indent=1, by_alias=True) + "\n")
    return p


def shipped_profiles() -> Iterator[tuple[str, MeasuredProfile]]:
    """(file name, profile) for every profile under `profiles/measured/` in the installed package."""
    folder = resources.files("autoplan.profiles").joinpath("measured")
    if not folder.is_dir():
        return
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            origin = f"profiles/measured/{entry.name}"
            yield entry.name, parse_profile(entry.read_text(encoding="utf-8"), origin).with_path(origin)


def find_profile(gpu_id: str, model_name: str) -> Optional[MeasuredProfile]:
    """The shipped profile measured on `gpu_id` for `model_name` (both case-insensitive), or None. The caller
    should still `check_matches` it against the model (a name with --set overrides keeps its name)."""
    for _, profile in shipped_profiles():
        if (profile.device.gpu_id.lower() == gpu_id.lower()
                and profile.model.name.lower() == model_name.lower()):
            return profile
    return None


# ---------------------------------------------------------------- --profile for estimate and plan

@dataclass(frozen=True)
class Profiles:
    """What --profile gave the cost model: measured layer times and a cluster whose GPU carries the measured
    collective latency/bandwidth, with one note per source used."""

    layers: Optional[MeasuredProfile]
    cluster: ClusterSpec
    notes: Tuple[str, ...]


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise InputError(f"measured profile {path}: file not found; pass a file written by `autoplan profile --out` "
                         f"or `autoplan profile-comm --out`")
    text = read_text(path, "measured profile", "regenerate it with `autoplan profile` or `autoplan profile-comm`")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"measured profile {path} is not valid JSON ({e.msg} at line {e.lineno}); regenerate it") \
            from None
    if not isinstance(data, dict):
        raise InputError(f"measured profile {path} must hold a JSON object, got {type(data).__name__}")
    return data


def resolve_profiles(spec: Optional[str], model: ModelSpec, cluster: ClusterSpec) -> Profiles:
    """--profile FILE[,FILE]: layer profiles (`autoplan profile`) and comm profiles (`autoplan profile-comm`), each
    checked against the model and the cluster's GPU — the one check `estimate` and `plan` share. With no --profile,
    the shipped layer profile of this GPU and model is used when its layer shapes match."""
    from autoplan.clusterio import apply_comm_profile, is_comm_profile

    layers, notes = None, []
    for item in [p.strip() for p in (spec or "").split(",") if p.strip()]:
        path = Path(item).expanduser()
        data = _read_json(path)
        if is_comm_profile(data):
            gpu = apply_comm_profile(cluster.gpu, data, str(path))
            cluster = cluster.model_copy(update={"gpu": gpu})
            changed = ", ".join(f"{k}={v:g}" for k, v in sorted(data["gpu_overrides"].items()))
            notes.append(f"collectives from comm profile {path}: {changed or 'no overrides (see its notes)'}")
            continue
        if layers is not None:
            raise InputError(f"--profile names two layer profiles ({layers.path} and {path}); pass one")
        layers = load_profile(path, model=model, gpu_id=cluster.gpu.id)
        notes.append(f"layer times measured in {path} where they cover the strategy")
    if spec is None:
        layers = _shipped(cluster.gpu.id, model, notes)
    return Profiles(layers=layers, cluster=cluster, notes=tuple(notes))


def _shipped(gpu_id: str, model: ModelSpec, notes: List[str]) -> Optional[MeasuredProfile]:
    profile = find_profile(gpu_id, model.name)
    if profile is None:
        return None
    try:
        check_matches(profile, str(profile.path), model, gpu_id)
    except InputError as e:
        notes.append(f"shipped profile not used: {e}")
        return None
    notes.append(f"layer times measured in shipped {profile.path} where they cover the strategy")
    return profile


def measured_compute(profile: MeasuredProfile, model: ModelSpec, lay, seq_len: int) -> np.ndarray:
    """Per candidate of `lay` (costmodel.layout.Layouts): True where the profile priced at least one layer pass —
    the lookups of costmodel/rank.py apply_profile (attention + MLP or MoE per pass, in the candidate's
    precision, at seq / cp tokens), finite where a measured point covers them."""
    seq = np.full(len(lay), float(seq_len)) / lay.cp
    used = np.zeros(len(lay), dtype=bool)
    for mlp_kind in ("mlp", "moe") if model.is_moe else ("mlp",):
        for pass_ in PASSES:
            for dtype, rows in (("bf16", ~np.asarray(lay.fp8, bool)), ("fp8", np.asarray(lay.fp8, bool))):
                t = (profile.layer_time("attention", pass_, lay.tp, lay.mbs, seq, dtype, ep=lay.ep)
                     + profile.layer_time(mlp_kind, pass_, lay.tp, lay.mbs, seq, dtype, ep=lay.ep))
                used |= rows & np.isfinite(t)
    return used
