"""The Rich console the commands print their tables to."""
from __future__ import annotations

from rich.console import Console


def console(width: int = 200) -> Console:
    """A console on stdout: a terminal's own width on a terminal; off one (pipes, tests) `width` columns, wide
    enough that table rows do not wrap."""
    out = Console()
    return out if out.is_terminal else Console(width=width)
