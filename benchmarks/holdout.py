"""Hold-out protocol: which published rows the constants may be fitted on, and which only check them.

Rows are split by model family and by source (a source is one publication: one container release of the
Megatron-Bridge performance summary, its point release included, or one NeMo performance page), never by row,
so a held-out row comes from a model family or a publication that no fitted constant has seen.

The rule (fixed in code before any error of the split was computed; it reads names only, never errors):
  1. Families are grouped by architecture (dense, MoE); within each group they are sorted by the SHA-256 hex digest
     of the family name, and the families at positions 0, 3, 6, ... are held out (every third, starting with the
     first).
  2. Sources are sorted by the SHA-256 hex digest of the source name and the sources at positions 0, 3, 6, ...
     are held out.
  3. A row trains only when both its family and its source train; every other row is held out. Held-out rows are
     reported in three groups: unseen family, unseen source only, and all.

Families are those of the rows the benchmark prices (DeepSeek-V4, whose dimensions the table does not give, is
never priced and has none). A row that belongs to no family or source listed here raises (a new model or publication must be named here
first, so the split cannot be chosen after its errors are known).
"""
from __future__ import annotations

import hashlib
from typing import Dict, Iterable, List, Sequence, Tuple

from benchmarks.recipes import release_of

# CSV model name prefix -> family. Families group one public architecture line (same attention, MLP and layer
# types at different sizes).
FAMILY_PREFIXES: Tuple[Tuple[str, str], ...] = (
    ("LLAMA3", "llama3"), ("LLAMA2", "llama2"), ("GPT3", "gpt3"), ("Nemotron-", "nemotron4"),
    ("Nemotron_3", "nemotron3-hybrid"), ("DeepSeekV3", "deepseek-v3"), ("GPT OSS", "gpt-oss"),
    ("Qwen3", "qwen3-moe"),
)
ARCH_OF_FAMILY: Dict[str, str] = {
    "llama3": "dense", "llama2": "dense", "gpt3": "dense", "nemotron4": "dense",
    "deepseek-v3": "moe", "gpt-oss": "moe", "qwen3-moe": "moe", "nemotron3-hybrid": "moe",
}
SOURCES: Tuple[str, ...] = ("mb-25.09", "mb-25.11", "mb-26.02", "mb-26.04", "mb-26.06", "mb-26.08", "nemo-24.07",
                            "nemo-24.03")
HOLD_EVERY = 3  # every third name in hash order is held out


def family_of(model_name: str) -> str:
    """Family of a CSV model name, e.g. 'LLAMA3.1_405B' -> 'llama3'."""
    for prefix, family in FAMILY_PREFIXES:
        if model_name.startswith(prefix):
            return family
    raise ValueError(f"model {model_name!r} has no family in benchmarks/holdout.py FAMILY_PREFIXES; add it there")


def source_of(row_id: str) -> str:
    """Publication of a row id: 'mb-26.04' for Megatron-Bridge 26.04 and 26.04.01, 'nemo-24.07', 'nemo-24.03'."""
    release = release_of(row_id)
    if release is not None:
        source = "mb-" + ".".join(release.split(".")[:2])
    elif row_id.startswith("nemo2407_"):
        source = "nemo-24.07"
    elif row_id.startswith("nemo_longseq_"):
        source = "nemo-24.03"  # performance_long_sequence.md, container 24.03.01
    else:
        source = row_id
    if source not in SOURCES:
        raise ValueError(f"row {row_id!r} has source {source!r}, not in benchmarks/holdout.py SOURCES; add it there")
    return source


def _hash_order(names: Iterable[str]) -> List[str]:
    return sorted(names, key=lambda n: hashlib.sha256(n.encode("utf-8")).hexdigest())


def held_out_names(names: Iterable[str]) -> Tuple[str, ...]:
    """The names at positions 0, HOLD_EVERY, 2 HOLD_EVERY, ... of the SHA-256 order."""
    return tuple(n for i, n in enumerate(_hash_order(names)) if i % HOLD_EVERY == 0)


def held_out_families() -> Tuple[str, ...]:
    out: List[str] = []
    for arch in ("dense", "moe"):
        out += held_out_names(f for f, a in ARCH_OF_FAMILY.items() if a == arch)
    return tuple(out)


def held_out_sources() -> Tuple[str, ...]:
    return held_out_names(SOURCES)


def side(model_name: str, row_id: str) -> str:
    """'train', 'family' (unseen family) or 'source' (seen family, unseen publication)."""
    if family_of(model_name) in held_out_families():
        return "family"
    if source_of(row_id) in held_out_sources():
        return "source"
    return "train"


def split(runs: Sequence) -> Dict[str, List[int]]:
    """Row indices of `runs` (objects with `model_name` and `id`) per side: 'train', 'family', 'source', and
    'holdout' = family + source."""
    out: Dict[str, List[int]] = {"train": [], "family": [], "source": [], "holdout": []}
    for i, r in enumerate(runs):
        s = side(r.model_name, r.id)
        out[s].append(i)
        if s != "train":
            out["holdout"].append(i)
    return out


def describe() -> str:
    return (f"held-out families: {', '.join(held_out_families())}; held-out sources: "
            f"{', '.join(held_out_sources())} (SHA-256 order, every {HOLD_EVERY}rd from the first)")
