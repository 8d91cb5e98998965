"""Reading the user's files and writing the command line's outputs.

Reading: every file the user names (a strategy, a model or cluster spec, a plan, a profile, an engine config) is
UTF-8 text; `read_text` turns a missing, unreadable, oversized, binary or non-UTF-8 file into one-line InputError
naming the file, the rule and the fix, never a UnicodeDecodeError.

Writing: `write_files` writes a set of files all or none. Each file is written to a temporary file in its own
folder and renamed over its name only after every file of the set is complete, so a full disk, a read-only folder
or an interrupted run leaves no half-written file behind (POSIX rename(2) replaces a name atomically within one file
system), and folders it had to create are removed again."""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable, List, Mapping, Tuple, Union

from autoplan.errors import InputError

PathLike = Union[str, Path]

# The largest input file read: 64 MiB, over 100x the largest file of that kind in the repository (a measured layer
# profile, benchmarks/results/*.profile.json, 0.5 MB); a bigger one is not a config and would only stall the parse.
MAX_INPUT_BYTES = 64 * 2**20


def read_text(path: PathLike, what: str, fix: str) -> str:
    """The text of the file `what` (e.g. "strategy file") at `path`; `fix` ends every error message. A leading
    UTF-8 byte-order mark is dropped."""
    p = Path(path).expanduser()
    try:
        info = p.stat()
    except FileNotFoundError:
        raise InputError(f"{what} {path}: file not found; {fix}") from None
    except OSError as e:
        raise InputError(f"{what} {path} cannot be read ({e.strerror}); {fix}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{what} {path} is a directory; {fix}")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{what} {path} is not a regular file (a device or pipe); {fix}")
    if info.st_size > MAX_INPUT_BYTES:
        raise InputError(f"{what} {path} holds {info.st_size:,} bytes, more than the {MAX_INPUT_BYTES:,} a config "
                         f"file can hold; {fix}")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputError(f"{what} {path} cannot be read ({e.strerror}); {fix}") from None
    return decode_text(data, f"{what} {path}", fix)


def decode_text(data: bytes, where: str, fix: str) -> str:
    """UTF-8 `data` as text; a NUL byte (binary data) or an invalid UTF-8 sequence is a one-line InputError."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputError(f"{where} is binary (a NUL byte at offset {nul}), not UTF-8 text; {fix}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{where} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                         f"{fix}") from None


def write_text(path: PathLike, text: str, executable: bool = False) -> Path:
    """Write one file atomically (see `write_files`)."""
    return write_files({path: text}, executable=[path] if executable else ())[0]


def write_files(files: Mapping[PathLike, str], executable: Iterable[PathLike] = ()) -> List[Path]:
    """Write {path: text} all or none; paths in `executable` get mode 0o755, the others the usual 0o666 less the
    umask. A failure (no space, a read-only folder, missing permission, a folder where a file should be) raises
    one-line InputError after removing every temporary file and every folder this call created and putting back
    any file it had already replaced. Returns the written paths in the order given."""
    runnable = {Path(p) for p in executable}
    targets = [(Path(p), text) for p, text in files.items()]
    mask = _umask()
    created: List[Path] = []
    staged: List[Tuple[str, Path]] = []
    backups: List[Tuple[str, Path]] = []
    renamed: List[Path] = []
    existed: set = set()
    path = targets[0][0] if targets else Path()
    try:
        for path, _ in targets:
            if path.is_dir():
                raise InputError(f"cannot write {path}: it is a directory; remove it or pass another --out")
            created += _make_parents(path.parent)
        for path, text in targets:
            staged.append((_stage(path, text, 0o755 if path in runnable else 0o666 & ~mask), path))
        existed = {p for _, p in staged if p.is_file()}
        for _, p in staged:
            backup = _backup(p)
            if backup:
                backups.append((backup, p))
        for tmp, path in staged:
            os.replace(tmp, path)
            renamed.append(path)
    except OSError as e:
        _undo(staged, backups, renamed, existed, created)
        raise InputError(f"cannot write {path}: {e.strerror or e}; nothing was written (free space, make the "
                         f"folder writable or pass another --out)") from None
    except BaseException:
        _undo(staged, backups, renamed, existed, created)
        raise
    for backup, _ in backups:
        os.unlink(backup)
    return [p for p, _ in targets]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _make_parents(folder: Path) -> List[Path]:
    """Create `folder` and its missing parents; the ones created, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    missing.reverse()
    for f in missing:
        f.mkdir()
    return missing


def _stage(path: Path, text: str, mode: int) -> str:
    """A complete temporary copy of `path`'s new content beside it (same folder, so the rename is atomic)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _backup(path: Path) -> str:
    """A hard link to the file `path` now holds, or '' when there is none: what a failed rename later in the set
    puts back. A link costs no space; where links are refused the old file is not kept."""
    if not path.is_file():
        return ""
    fd, backup = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old")
    os.close(fd)
    os.unlink(backup)
    try:
        os.link(path, backup)
    except OSError:
        return ""
    return backup


def _undo(staged: List[Tuple[str, Path]], backups: List[Tuple[str, Path]], renamed: List[Path], existed: set,
          created: List[Path]) -> None:
    """Put the folders back as they were: temporaries removed, replaced files restored, new files deleted (a
    replaced file that could not be linked keeps its new, complete content)."""
    kept = dict((p, b) for b, p in backups)
    for path in renamed:
        if path in kept:
            os.replace(kept.pop(path), path)
        elif path not in existed:
            os.unlink(path)
    for backup in kept.values():
        os.unlink(backup)
    for tmp, _ in staged:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty: something else wrote into it meanwhile
