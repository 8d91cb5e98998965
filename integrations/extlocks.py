"""torch's JIT extension-build locks: find them, tell a live build from a stale lock, clear the ones a killed
launch left.

torch.utils.cpp_extension builds an extension (DeepSpeed JIT-builds its ops this way) under
`<root>/<name>/` and serialises builders with a `FileBaton` on `<root>/<name>/lock`: the first process creates the
file with O_CREAT|O_EXCL, builds, and removes it in a `finally`; every other process polls for the file to go away,
with no time limit (torch/utils/file_baton.py `wait`). A builder killed by a signal never reaches its `finally`, so
its lock stays and every later load of that extension waits forever. The lock records no owner, so a lock is
taken as live while some process works inside its folder: torch runs ninja and the compilers with that folder as
their working directory (torch/utils/cpp_extension.py `_run_ninja_build`, `cwd=build_directory`); outside it the
holder only hashes sources and writes build.ninja, well under `SETTLE_S`.

`<root>` is $TORCH_EXTENSIONS_DIR, else `<user cache>/torch_extensions/py<XY>_<cpu|cuXYZ|rocmXYZ>`
(cpp_extension.py `_get_build_directory`, `get_default_build_root`; the user cache is $XDG_CACHE_HOME or
~/.cache, torch/_appdirs.py `user_cache_dir`). `extension_roots` returns the folder(s) to scan without importing
torch: $TORCH_EXTENSIONS_DIR, else `<user cache>/torch_extensions` one level up, whose `*/<name>/lock` are scanned.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

# Seconds a lock may exist with no process in its folder before it counts as stale: the holder spends that time
# only hashing the sources and writing build.ninja before ninja starts in the folder (cpp_extension.py
# `_jit_compile`), a fraction of a second; 10 s leaves room for a loaded machine.
SETTLE_S = 10.0


def extension_roots(env: Optional[dict] = None) -> List[Path]:
    """Folders whose `<name>/lock` or `*/<name>/lock` files are torch extension-build locks."""
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return [Path(env["TORCH_EXTENSIONS_DIR"])]
    cache = env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return [Path(cache) / "torch_extensions"]


def environment_root(python: str, env: Optional[dict] = None) -> Path:
    """A build folder of this Python environment's own, for probes when $TORCH_EXTENSIONS_DIR is unset.

    torch's default folder is shared by every environment of the user with the same Python version and
    accelerator, and each process re-runs the build under the lock with its own source and include paths
    (cpp_extension.py `_jit_compile`: a fresh process always writes build.ninja; ninja rebuilds when a command
    changed). Two environments with one DeepSpeed version therefore rebuild each other's ops on every start, and a
    probe's ranks would compile inside their timeout; a folder per interpreter keeps each environment's ops built."""
    env = os.environ if env is None else env
    cache = env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    # The environment is the folder holding the interpreter, not the binary it links to: every venv's `bin/python`
    # is a symlink to the same base interpreter, so resolving the file would give all venvs one folder.
    tag = hashlib.sha1(os.path.realpath(os.path.dirname(os.path.abspath(python))).encode()).hexdigest()[:12]
    return Path(cache) / "torch_extensions" / f"autoplan-env-{tag}"


def own_build_folder(caller_env: Mapping[str, str], python: str) -> Dict[str, str]:
    """{"TORCH_EXTENSIONS_DIR": `python`'s environment_root} for a launch from `caller_env`, or {} when
    `caller_env` names a build folder already (a non-empty TORCH_EXTENSIONS_DIR, which is then left as it is)."""
    if caller_env.get("TORCH_EXTENSIONS_DIR"):
        return {}
    return {"TORCH_EXTENSIONS_DIR": str(environment_root(python))}


def with_own_build_folder(env: dict, python: str) -> dict:
    """`env` (a copy of os.environ) with own_build_folder applied: what engine checks and launches of emitted files
    run with."""
    env.update(own_build_folder(env, python))
    return env


def find_locks(roots: Iterable[Path]) -> List[Path]:
    """Every extension-build lock under the roots (one or two folder levels down)."""
    found: List[Path] = []
    for root in roots:
        found += [p for p in root.glob("*/lock") if p.is_file()]
        found += [p for p in root.glob("*/*/lock") if p.is_file()]
    return sorted(set(found))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def builders_in(folder: Path) -> List[int]:
    """Processes (that this user may inspect) whose working directory is `folder` or below: ninja and the
    compilers of a live build. Processes of other users are not readable and not counted."""
    target = os.path.realpath(folder)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if _inside(cwd, target):
            pids.append(int(entry.name))
    return pids


def lock_age_s(lock: Path) -> Optional[float]:
    try:
        return time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return None


def is_stale(lock: Path, settle_s: float = SETTLE_S) -> bool:
    """A lock older than `settle_s` with no process building in its folder: its builder is gone."""
    age = lock_age_s(lock)
    return age is not None and age > settle_s and not builders_in(lock.parent)


def stale_message(lock: Path) -> str:
    """One line: what is wrong, and the command that fixes it."""
    return (f"stale torch extension-build lock {lock} (no process is building {lock.parent.name}; a build was "
            f"killed before it finished), so every DeepSpeed start would wait on it forever; remove it: rm {lock}")


def clear_orphans(roots: Iterable[Path], since: float) -> List[Path]:
    """Remove the locks created at or after `since` (time.time()) that no process builds in: those a launch that
    was just killed left behind. Older locks are not ours to remove; `is_stale` reports them. Returns the removed."""
    removed = []
    for lock in find_locks(roots):
        try:
            created = lock.stat().st_mtime
        except FileNotFoundError:
            continue
        if created >= since - 1.0 and not builders_in(lock.parent):  # 1 s: file-system timestamp granularity
            try:
                lock.unlink()
                removed.append(lock)
            except FileNotFoundError:
                pass
    return removed
