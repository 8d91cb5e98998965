"""The Megatron-LM releases a launch can target, and which argument names and values each one's parser accepts.

Each release's argument list is `megatron_releases/<tag>.txt`, every --option of the parser built by that tag's
megatron/training/arguments.py (add_megatron_arguments) with its choices, read out of the release's source by
tests/engine_checks/megatron_release_args.py. The emitter writes the newest names; `RENAMES` is the one table of
names an older release spells differently, and any other name or value the target's parser lacks refuses the emit,
naming the flag and the releases that accept it."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from autoplan.errors import InputError

# tag -> NVIDIA/Megatron-LM commit. core_v0.16.1 is the newest megatron-core that installs on Python 3.11 (the
# engine checks run it); core_v0.19.0 is the newest release.
RELEASES: Dict[str, str] = {
    "core_v0.16.1": "55ac7082517c3878ae653c07c09c534b8aed49f6",
    "core_v0.17.1": "266f1c97dca477ca8b92c16087506da2000b0b84",
    "core_v0.18.2": "571370c829ca768fe37244f4e2e7f28d8accc4ab",
    "core_v0.19.0": "5be9626709af2722333bf54797c954c09edeada3",
}
DEFAULT_RELEASE = "core_v0.19.0"

# Newest name -> {release: the name that release's arguments.py uses}. cuda-graph-modules took over the module list
# of cuda-graph-scope (both nargs="+") in core_v0.18; hybrid-layer-pattern replaced hybrid-override-pattern (kept
# as a deprecated alias) in core_v0.17.
RENAMES: Dict[str, Dict[str, str]] = {
    "cuda-graph-modules": {"core_v0.16.1": "cuda-graph-scope", "core_v0.17.1": "cuda-graph-scope"},
    "hybrid-layer-pattern": {"core_v0.16.1": "hybrid-override-pattern"},
}

_FOLDER = Path(__file__).parent / "megatron_releases"


def release_tag(version: str) -> str:
    """The tag of --megatron-version: a tag ('core_v0.16.1') or its version ('0.16.1', '0.16')."""
    wanted = version.strip()
    for tag in RELEASES:
        number = tag[len("core_v"):]
        if wanted in (tag, number, number.rsplit(".", 1)[0]):
            return tag
    raise InputError(f"--megatron-version {version!r} is not a release autoplan checks launches against; use one "
                     f"of {', '.join(RELEASES)} (or its version number, e.g. 0.16)")


@lru_cache(maxsize=None)
def release_arguments(tag: str) -> Dict[str, Tuple[str, ...]]:
    """{argument name: its choices (empty when any value goes)} of one release's parser."""
    out: Dict[str, Tuple[str, ...]] = {}
    for line in (_FOLDER / f"{tag}.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, *choices = line.split()
            out[name] = tuple(choices)
    return out


def describe(tag: str) -> str:
    """'Megatron-LM core_v0.19.0 (commit 5be9626...)' for file headers."""
    return f"Megatron-LM {tag} (NVIDIA/Megatron-LM commit {RELEASES[tag]})"


def for_release(argv: List[str], tag: str) -> List[str]:
    """The argv with the release's names (`RENAMES`); InputError naming the first flag or value its parser lacks."""
    out = [f"--{RENAMES.get(w[2:], {}).get(tag, w[2:])}" if w.startswith("--") else w for w in argv]
    problem = release_problem(out, tag)
    if problem:
        raise InputError(problem)
    return out


def release_problem(argv: List[str], tag: str) -> Optional[str]:
    """Why the release's parser rejects `argv` (an unknown flag, a value outside its choices), or None."""
    known = release_arguments(tag)
    flag: Optional[str] = None
    for word in argv:
        if word.startswith("--"):
            flag = word[2:]
            if flag not in known:
                return _unsupported(f"--{flag}", tag, lambda args: flag in args)
        elif flag is not None and known[flag] and word not in known[flag]:
            name, value = flag, word
            return _unsupported(f"--{name} {value}", tag, lambda args: value in args.get(name, ()) or
                                (name in args and not args[name]), choices=known[name])
    return None


def _unsupported(what: str, tag: str, accepts, choices: Tuple[str, ...] = ()) -> str:
    others = [t for t in RELEASES if t != tag and accepts(release_arguments(t))]
    allowed = f" (it accepts {', '.join(choices)})" if choices else ""
    fix = f"pass --megatron-version {others[-1]}" if others else "this plan cannot be launched with Megatron-LM"
    where = f"; {', '.join(others)} accept{'s' if len(others) == 1 else ''} it" if others else ""
    return f"{what} is not in the argument parser of {describe(tag)}{allowed}{where}; {fix}"
