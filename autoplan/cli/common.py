"""Options and input loading shared by the commands."""
from __future__ import annotations

import json
import sys
from typing import List, Optional

from autoplan.errors import InputError
from autoplan.workload import Workload, make_workload, workload_warning


# `plan` and `estimate` take the same workload when --seq / --gbs are left out.
DEFAULT_SEQ = 8192
DEFAULT_GBS = 128


def load_inputs(model: str, sets: Optional[List[str]], cluster: str, gpus: Optional[int], seq: Optional[int],
                gbs: Optional[int]):
    """(model, cluster, workload) of the command line; --seq and --gbs default to DEFAULT_SEQ and DEFAULT_GBS."""
    from autoplan.clusterio import load_cluster
    from autoplan.modelio import load_model

    wl = make_workload(DEFAULT_SEQ if seq is None else seq, DEFAULT_GBS if gbs is None else gbs)
    m = load_model(model, sets or ())
    c = load_cluster(cluster, gpus)
    if wl.seq_len > m.max_position_embeddings:
        raise InputError(f"--seq={wl.seq_len} exceeds max_position_embeddings={m.max_position_embeddings} of "
                         f"{m.name}; use --seq <= {m.max_position_embeddings} or --set "
                         f"max_position_embeddings={wl.seq_len}")
    warn_workload(wl)
    return m, c, wl


CKPT_METHOD_HELP = ("Checkpoint method the goodput is priced with: blocking, async (Megatron --async-save; "
                    "default) or local (NVIDIA Resiliency Extension local checkpoints, replicated).")
RESILIENCE_HELP = ("Override a resilience input: key=value (e.g. failures_per_1k_node_days=5, spare_nodes=16, "
                   "storage_write_gbytes_per_s_total=500); fields of autoplan/resilience.py ResilienceSpec.")


def apply_resilience(cluster, ckpt_method: Optional[str], items: Optional[List[str]]):
    """The cluster with --ckpt-method and --resilience key=value applied over its file's `resilience:`."""
    from autoplan.clusterio import with_resilience

    updates = {}
    for item in items or []:
        for part in (p.strip() for p in item.split(",") if p.strip()):
            if "=" not in part:
                raise InputError(f"--resilience {part!r} must be key=value (e.g. --resilience spare_nodes=16)")
            key, value = (x.strip() for x in part.split("=", 1))
            updates[key.lower().replace("-", "_")] = value
    if ckpt_method is not None:
        updates["ckpt_method"] = ckpt_method
    return with_resilience(cluster, updates, "--resilience/--ckpt-method") if updates else cluster


def warn_workload(wl: Workload) -> None:
    """A legal but absurd batch is priced with one warning line on stderr (autoplan.workload.workload_warning)."""
    warning = workload_warning(wl)
    if warning:
        print(warning, file=sys.stderr)


def read_strategy(text: Optional[str]):
    """--strategy: 'k=v,...' or a YAML/JSON file of the same keys."""
    from pathlib import Path

    from autoplan.strategy import coerce_strategy_value, parse_strategy_text

    if not text:
        return {}
    path = Path(text)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or _is_file(path):
        import yaml

        from autoplan.fileio import read_text

        body = read_text(path, "strategy file", "pass 'tp=8,pp=2,...' or a YAML/JSON file of strategy keys")
        try:
            data = yaml.safe_load(body)
        except yaml.YAMLError as e:
            raise InputError(f"strategy file {text} is not valid YAML/JSON: {str(e).splitlines()[0]}") from None
        data = data.get("strategy", data) if isinstance(data, dict) else data
        if not isinstance(data, dict):
            raise InputError(f"strategy file {text} must hold a mapping of strategy keys (tp: 8, pp: 2, ...)")
        return {str(k).lower(): coerce_strategy_value(str(k).lower(), v) for k, v in data.items()}
    return parse_strategy_text(text)


def _is_file(path) -> bool:
    """Whether `path` names a file; text too long or odd to be a path (strategy text) is not one."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")
