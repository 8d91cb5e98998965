"""Options and input loading shared by the commands."""
from __future__ import annotations

import json
import sys
from typing import List, Optional

from pydantic import ValidationError

from autoplan.errors import InputError
from autoplan.workload import Workload


def load_inputs(model: str, sets: Optional[List[str]], cluster: str, gpus: Optional[int], seq: int, gbs: int):
    from autoplan.clusterio import load_cluster
    from autoplan.modelio import load_model

    if seq is None or seq <= 0:
        raise InputError(f"--seq={seq} must be a positive number of tokens (e.g. --seq 4096)")
    if gbs is None or gbs <= 0:
        raise InputError(f"--gbs={gbs} must be a positive number of sequences (e.g. --gbs 1024)")
    m = load_model(model, sets or ())
    c = load_cluster(cluster, gpus)
    if seq > m.max_position_embeddings:
        raise InputError(f"--seq={seq} exceeds max_position_embeddings={m.max_position_embeddings} of {m.name}; "
                         f"use --seq <= {m.max_position_embeddings} or --set max_position_embeddings={seq}")
    try:
        wl = Workload(seq_len=seq, global_batch_size=gbs)
    except ValidationError as e:
        raise InputError(f"workload: {e.errors()[0]['msg']}") from None
    return m, c, wl


def read_strategy(text: Optional[str]):
    """--strategy: 'k=v,...' or a YAML/JSON file of the same keys."""
    from pathlib import Path

    from autoplan.strategy import coerce_strategy_value, parse_strategy_text

    if not text:
        return {}
    path = Path(text)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.is_file():
        if not path.is_file():
            raise InputError(f"strategy file {text} does not exist; pass 'tp=8,pp=2,...' or a YAML/JSON file")
        import yaml

        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise InputError(f"strategy file {text} is not valid YAML/JSON: {str(e).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise InputError(f"strategy file {text} must hold a mapping of strategy keys (tp: 8, pp: 2, ...)")
        data = data.get("strategy", data)
        return {str(k).lower(): coerce_strategy_value(str(k).lower(), v) for k, v in data.items()}
    return parse_strategy_text(text)


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")
