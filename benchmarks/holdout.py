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

Test split (frozen 2026-12-04, before any error of it was computed; the rule reads names only): every row of the
newest Megatron-Bridge release in the table (source `mb-26.08`, TEST_SOURCES) and every row of one model family,
the first MoE family in SHA-256 order that the validation rule above trains on (`gpt-oss`, TEST_FAMILIES;
`test_family_by_rule` recomputes it). Test rows are neither fitted on nor held out for validation: the side rule
gives them "test" before anything else, `benchmarks/accuracy.py` leaves them out of every table and prints them
only with `--test`, which is run once a change is final; no model variant is chosen by a test figure. The
constants of autoplan/costmodel/calibration.py were fitted, before this split existed, on every row, test rows
included: test figures use the constants refitted on the training rows only.

Rotation: the validation rule with the positions shifted by `offset` (offset, offset + 3, ...) holds out other
families and sources; `benchmarks/accuracy.py` prints the spread of the validation figures over the offsets 0, 1,
2 beside the headline (offset 0). The test split is the same under every offset.

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
# The frozen test split (module docstring). `test_family_by_rule` must give TEST_FAMILIES.
TEST_SOURCES: Tuple[str, ...] = ("mb-26.08",)
TEST_FAMILIES: Tuple[str, ...] = ("gpt-oss",)
SIDES = ("train", "family", "source", "test")


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


def held_out_names(names: Iterable[str], offset: int = 0) -> Tuple[str, ...]:
    """The names at positions offset, offset + HOLD_EVERY, ... of the SHA-256 order."""
    return tuple(n for i, n in enumerate(_hash_order(names)) if i % HOLD_EVERY == offset % HOLD_EVERY)


def held_out_families(offset: int = 0) -> Tuple[str, ...]:
    out: List[str] = []
    for arch in ("dense", "moe"):
        out += held_out_names((f for f, a in ARCH_OF_FAMILY.items() if a == arch), offset)
    return tuple(f for f in out if f not in TEST_FAMILIES)


def held_out_sources(offset: int = 0) -> Tuple[str, ...]:
    return tuple(s for s in held_out_names(SOURCES, offset) if s not in TEST_SOURCES)


def test_family_by_rule() -> str:
    """The first MoE family in SHA-256 order that the validation rule (offset 0) trains on."""
    held = set(held_out_names(f for f, a in ARCH_OF_FAMILY.items() if a == "moe"))
    return next(f for f in _hash_order(f for f, a in ARCH_OF_FAMILY.items() if a == "moe") if f not in held)


def is_test(model_name: str, row_id: str) -> bool:
    return family_of(model_name) in TEST_FAMILIES or source_of(row_id) in TEST_SOURCES


def side(model_name: str, row_id: str, offset: int = 0) -> str:
    """'test' (the frozen test split), 'family' (unseen family), 'source' (seen family, unseen publication) or
    'train', under the validation rule at `offset`."""
    if is_test(model_name, row_id):
        return "test"
    if family_of(model_name) in held_out_families(offset):
        return "family"
    if source_of(row_id) in held_out_sources(offset):
        return "source"
    return "train"


def split(runs: Sequence, offset: int = 0) -> Dict[str, List[int]]:
    """Row indices of `runs` (objects with `model_name` and `id`) per side: 'train', 'family', 'source', 'test',
    and 'holdout' = family + source (the validation rows; never the test rows)."""
    out: Dict[str, List[int]] = {name: [] for name in SIDES + ("holdout",)}
    for i, r in enumerate(runs):
        s = side(r.model_name, r.id, offset)
        out[s].append(i)
        if s in ("family", "source"):
            out["holdout"].append(i)
    return out


def describe(offset: int = 0) -> str:
    return (f"held-out families: {', '.join(held_out_families(offset))}; held-out sources: "
            f"{', '.join(held_out_sources(offset))} (SHA-256 order, every {HOLD_EVERY}rd from position {offset}); "
            f"test split (not fitted on, not in these tables): families {', '.join(TEST_FAMILIES)}, sources "
            f"{', '.join(TEST_SOURCES)}")
