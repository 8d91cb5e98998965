"""Megatron's pipeline layout strings ([PL] PipelineParallelLayerLayout, megatron/core/transformer/
pipeline_parallel_layer_layout.py): the virtual stages a string names, and the model chunks per rank it implies,
vpp = stages / pp ([V] validate_args, megatron/training/arguments.py), derived here once: `Strategy` fills vpp from
its pipeline_layout with it, and the importers and checks read it from here (autoplan/pipeline_split.py holds the
rest of the pipeline split)."""
from __future__ import annotations

import re
from typing import List, Optional

LAYOUT_SYMBOLS = {"E": "embedding", "t": "decoder layer", "m": "MTP layer", "L": "loss"}


def parse_layout(text: str) -> List[str]:
    """[PL] parse_str_to_list: the virtual stages of a layout string, each as its symbols ('Ett', 'tt', ...).
    Commas are cosmetic; '(x)*n' and 'x*n' repeat. Raises ValueError naming an unknown symbol."""
    flat = text.replace(",", "").replace(" ", "")
    flat = re.sub(r"\(([^)]+)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), flat)
    flat = re.sub(r"(.)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), flat)
    bad = sorted(set(flat) - set(LAYOUT_SYMBOLS) - {"|"})
    if bad:
        raise ValueError(f"symbol {bad[0]!r} is not a layer ({', '.join(f'{k} {v}' for k, v in LAYOUT_SYMBOLS.items())})")
    return flat.split("|")


def layout_vpp(text: str, pp: int) -> Optional[int]:
    """Model chunks per rank a layout string implies ([V] stages / pp), or None when pp does not divide them."""
    stages = len(parse_layout(text))
    return stages // pp if stages % pp == 0 else None
