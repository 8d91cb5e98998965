"""Cluster inputs: a GPU id from `profiles/gpus/<id>.yaml` (read through `importlib.resources`, so it works from an
installed package), a cluster YAML file (`gpu: <id or a full GpuSpec mapping>`, `num_gpus: N`, optional `name`,
optional `comm_profile: <file>`), or the file `autoplan profile-comm` writes (its GPU with the measured collective
latency and bandwidth).
Every bad input becomes a one-line `InputError`."""
from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import yaml
from pydantic import ValidationError

from autoplan.cluster import ClusterSpec, GpuSpec
from autoplan.errors import InputError, did_you_mean
from autoplan.fileio import read_text
from autoplan.modelio import validation_message

__all__ = ["load_gpu", "list_gpus", "gpu_ids", "load_cluster", "CPU_ID", "is_comm_profile", "apply_comm_profile",
           "gpu_id_of_device", "with_resilience"]

CLUSTER_KEYS = ["gpu", "num_gpus", "name", "comm_profile", "resilience", "calibration"]

CPU_ID = "cpu"  # host CPU cores standing in as devices (gloo) for probe runs; see profiles/gpus/cpu.yaml


def _gpu_dir():
    return resources.files("autoplan.profiles") / "gpus"


def gpu_ids() -> List[str]:
    """Ids of the bundled GPU profiles, sorted."""
    return sorted(p.name[: -len(".yaml")] for p in _gpu_dir().iterdir() if p.name.endswith(".yaml"))


def _gpu_from_mapping(data: Mapping[str, Any], where: str) -> GpuSpec:
    try:
        return GpuSpec.model_validate(dict(data))
    except ValidationError as e:
        raise InputError(validation_message(e, where, GpuSpec)) from None


def load_gpu(gpu_id: str) -> GpuSpec:
    """The bundled profile for `gpu_id` (case-insensitive)."""
    key = gpu_id.strip().lower()
    ids = gpu_ids()
    if key not in ids:
        raise InputError(f"unknown GPU {gpu_id!r}{did_you_mean(key, ids)}; known GPUs: {', '.join(ids)} "
                         f"(see `autoplan clusters`)")
    data = yaml.safe_load((_gpu_dir() / f"{key}.yaml").read_text(encoding="utf-8"))
    return _gpu_from_mapping(data, f"GPU profile {key!r}")


def list_gpus() -> List[GpuSpec]:
    """Every bundled GPU profile, sorted by id."""
    return [load_gpu(i) for i in gpu_ids()]


def _read_yaml_mapping(path: Path) -> Any:
    if not path.exists():
        raise InputError(f"cluster file {str(path)!r} does not exist; pass a GPU id ({', '.join(gpu_ids())}) or a "
                         f"cluster YAML")
    if path.is_dir():
        raise InputError(f"cluster path {str(path)!r} is a directory; pass a cluster YAML file")
    try:
        data = yaml.safe_load(read_text(path, "cluster file", "pass a cluster YAML (`gpu: <id>`, `num_gpus: <N>`)"))
    except yaml.YAMLError as e:
        raise InputError(f"cluster file {str(path)!r} is not valid YAML ({' '.join(str(e).split())}); fix the "
                         f"syntax") from None
    if not isinstance(data, dict):
        raise InputError(f"cluster file {str(path)!r} holds a {type(data).__name__}, not a mapping; write "
                         f"`gpu: <id>` and `num_gpus: <N>`")
    return data


def _read_cluster_file(path: Path, data: Dict[str, Any]) -> Dict[str, Any]:
    unknown = set(data) - set(CLUSTER_KEYS)
    if unknown:
        key = sorted(unknown)[0]
        raise InputError(f"cluster file {str(path)!r}: unknown key {key!r}"
                         f"{did_you_mean(key, CLUSTER_KEYS)}; allowed: {', '.join(CLUSTER_KEYS)}")
    if "gpu" not in data:
        raise InputError(f"cluster file {str(path)!r} has no `gpu:`; add `gpu: <id>` (one of "
                         f"{', '.join(gpu_ids())}) or a full GPU mapping")
    return data


# ---------------------------------------------------------------- measured collectives (autoplan profile-comm)

def is_comm_profile(data: Any) -> bool:
    """Whether a mapping is what `autoplan profile-comm` writes (autoplan/profiler/comm.py CommProfile)."""
    return isinstance(data, dict) and {"gpu_overrides", "fits", "device_name"} <= set(data)


def _device_matches(device_name: str, gpu_id: str) -> bool:
    """Every part of the id ('a100', '80g') starts a word of the device name ('NVIDIA A100-SXM4-80GB'); 'b200'
    does not match 'GB200'."""
    name = re.sub(r"[^a-z0-9]+", " ", device_name.lower())
    return all(re.search(rf"(?<![a-z0-9]){re.escape(part)}", name) for part in gpu_id.split("-"))


def gpu_id_of_device(device_name: Any, where: str) -> str:
    """The bundled GPU id a measured device name denotes; InputError when none or several do."""
    matches = [g for g in gpu_ids() if _device_matches(str(device_name or ""), g)]
    if len(matches) != 1:
        found = f"matches {', '.join(matches)}" if matches else "matches no bundled GPU"
        raise InputError(f"comm profile {where}: device {device_name!r} {found}; pass --cluster <gpu id> with "
                         f"--profile {where}")
    return matches[0]


def apply_comm_profile(gpu: GpuSpec, data: Dict[str, Any], where: str) -> GpuSpec:
    """`gpu` with the measured latency/bandwidth overrides of a comm profile; InputError when the profile was
    measured on another GPU or is malformed."""
    from autoplan.profiler.comm import CommProfile

    try:
        profile = CommProfile.model_validate(data)
    except ValidationError as e:
        raise InputError(validation_message(e, f"comm profile {where}", CommProfile)) from None
    if not _device_matches(profile.device_name, gpu.id):
        raise InputError(f"comm profile {where} was measured on {profile.device_name!r}, but the cluster uses "
                         f"{gpu.id}; measure on that GPU or drop the comm profile")
    unknown = sorted(set(profile.gpu_overrides) - set(GpuSpec.model_fields))
    if unknown:
        raise InputError(f"comm profile {where}: gpu_overrides has unknown GpuSpec field {unknown[0]!r}; "
                         f"regenerate it with `autoplan profile-comm`")
    return _gpu_from_mapping({**gpu.model_dump(), **profile.gpu_overrides}, f"comm profile {where} gpu_overrides")


def _gpu_of(value: Any, where: str) -> GpuSpec:
    if isinstance(value, str):
        return load_gpu(value)
    if isinstance(value, dict):
        return _gpu_from_mapping(value, f"{where} gpu")
    raise InputError(f"{where}: gpu={value!r} must be a GPU id or a mapping of GPU fields")


# The largest job planned: 2^20 = 1,048,576 GPUs, eight times the largest the search is benchmarked on
# (Llama-3.1 405B on 131,072 H100, benchmarks/search_speed.py) and beyond any cluster built; NCCL and
# torch.distributed number ranks with 32-bit ints, so no launcher runs past 2^31 anyway. The search's loops are
# bounded by heads, layers and 16 (solvers/space.py), not by the GPU count, so it finishes at any size; a count past
# the bound is a typo, refused before any work.
MAX_GPUS = 2**20


def _check_positive(num_gpus: Any) -> int:
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int):
        raise InputError(f"gpus={num_gpus!r} must be a whole number of GPUs")
    if num_gpus <= 0:
        raise InputError(f"gpus={num_gpus} must be > 0")
    if num_gpus > MAX_GPUS:
        raise InputError(f"gpus={num_gpus} is more than {MAX_GPUS:,} (2^20), the largest job autoplan plans; "
                         f"pass the job's real GPU count")
    return num_gpus


def _check_count(gpu: GpuSpec, num_gpus: Any) -> int:
    """num_gpus > 0. A count that does not fill whole nodes runs on full nodes plus a last node with the rest
    (ClusterSpec.partial_node_gpus); the search keeps tensor-parallel groups inside one node."""
    return _check_positive(num_gpus)


def _cpu_node(gpu: GpuSpec, num_gpus: Optional[int]) -> tuple[GpuSpec, int]:
    """CPU probe devices: any count up to os.cpu_count(), all in one node and one 'scale-up' domain."""
    cores = os.cpu_count() or 1
    count = _check_positive(min(gpu.gpus_per_node, cores) if num_gpus is None else num_gpus)
    if count > cores:
        raise InputError(f"gpus={count} exceeds the {cores} CPU cores of this machine for gpu 'cpu'; use at most "
                         f"{cores}")
    return gpu.model_copy(update={"gpus_per_node": count, "nvlink_domain_size": count}), count


def is_cluster_file(ref: Optional[str]) -> bool:
    return bool(ref) and (ref.endswith((".yaml", ".yml", ".json")) or "/" in ref or "\\" in ref)


def cluster_calibration(ref: Optional[str]) -> Optional[str]:
    """The calibration file a cluster YAML names (`calibration: cal.json`, relative to the YAML), or None: the
    cluster's own alternative to `--calibration FILE` (autoplan/calibration/calfile.py `load_and_apply`)."""
    if not is_cluster_file(ref):
        return None
    path = Path(ref).expanduser()
    data = _read_yaml_mapping(path)
    if is_comm_profile(data) or not data.get("calibration"):
        return None
    return str((path.parent / str(data["calibration"])).expanduser())


def load_cluster(ref: str, num_gpus: Optional[int] = None) -> ClusterSpec:
    """A ClusterSpec from a GPU id (`num_gpus` defaults to one node) or a cluster YAML; `num_gpus` (the CLI's
    --gpus) overrides the file's count."""
    if not ref or not ref.strip():
        raise InputError(f"cluster is empty; pass a GPU id ({', '.join(gpu_ids())}) or a cluster YAML")
    name, resilience = None, {}
    if is_cluster_file(ref):
        path = Path(ref).expanduser()
        data = _read_yaml_mapping(path)
        if is_comm_profile(data):  # `autoplan profile-comm` output: the GPU it ran on, with its measured links
            gpu = apply_comm_profile(load_gpu(gpu_id_of_device(data.get("device_name"), str(path))), data, str(path))
            name = path.stem
        else:
            data = _read_cluster_file(path, data)
            gpu = _gpu_of(data["gpu"], f"cluster file {str(path)!r}")
            if data.get("comm_profile"):
                comm_path = (path.parent / str(data["comm_profile"])).expanduser()
                gpu = apply_comm_profile(gpu, _read_yaml_mapping(comm_path), str(comm_path))
            name = data.get("name") or path.stem
            resilience = data.get("resilience") or {}
            if not isinstance(resilience, dict):
                raise InputError(f"cluster file {str(path)!r}: resilience={resilience!r} must be a mapping of "
                                 f"ResilienceSpec fields (e.g. `resilience: {{ckpt_method: async}}`)")
            if num_gpus is None:
                num_gpus = data.get("num_gpus")
    else:
        gpu = load_gpu(ref)
    if gpu.id == CPU_ID:
        gpu, count = _cpu_node(gpu, num_gpus)
    else:
        count = _check_count(gpu, gpu.gpus_per_node if num_gpus is None else num_gpus)
    cluster = ClusterSpec(gpu=gpu, num_gpus=count, name=str(name) if name is not None else None)
    return with_resilience(cluster, resilience, f"cluster file {ref!r} resilience") if resilience else cluster


def with_resilience(cluster: ClusterSpec, updates: Mapping[str, Any], where: str) -> ClusterSpec:
    """`cluster` with some ResilienceSpec fields replaced (a cluster file's `resilience:`, --resilience,
    --ckpt-method); one-line InputError naming the field and its rule."""
    from autoplan.resilience import ResilienceSpec

    merged = {**cluster.resilience.model_dump(exclude_unset=True), **dict(updates)}
    if {"node_mtbf_h", "gpu_mtbf_h"} & set(updates):  # a rate given here replaces one given before
        merged = {k: v for k, v in merged.items() if k not in ({"node_mtbf_h", "gpu_mtbf_h"} - set(updates))}
    try:
        spec = ResilienceSpec.model_validate(merged)
    except ValidationError as e:
        raise InputError(validation_message(e, where, ResilienceSpec)) from None
    return cluster.model_copy(update={"resilience": spec})
