"""Write a file so that a reader sees the old content or the new, never a part: the text goes to a temporary file
in the same folder, is flushed to disk, and `os.replace` (atomic on POSIX within one file system) puts it in place.
A process killed mid-write leaves at most a `.<name>.*.tmp` file, never a truncated result."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Optional


def write_text_atomic(path: Path, text: str, mode: Optional[int] = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

