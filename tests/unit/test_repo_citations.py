"""Every citation points inside the repository: no file cites a folder beside it (`../shared/...`) or a path of
one machine's disk (`/work/...`), which a reader of the repository cannot open. Cited facts live in the repo
(`profiles/gpu_reference.md`, `docs/sources.md`, `data/README.md`)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".git", "__pycache__", ".pytest_cache", "node_modules", ".venv", "venv", "build", "dist"}
# A parent-relative path into a folder outside the repository, or an absolute path under a workstation's root.
OUTSIDE = re.compile(r"\.\./shared/|/work/[A-Za-z0-9_.-]+|\bshared/reference/")


def repository_files(root: Path = ROOT):
    """The files of the repository: what git tracks or would add (not what it ignores, such as a virtual
    environment); outside a git checkout, every file below `root` but those in SKIPPED_DIRS."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout
        return sorted(root / name for name in listed.decode().split("\0") if name)
    except (OSError, subprocess.CalledProcessError):
        return sorted(path for path in root.rglob("*") if not any(
            part in SKIPPED_DIRS or part.endswith(".egg-info") for part in path.relative_to(root).parts))


def repository_text_files(root: Path = ROOT):
    for path in repository_files(root):
        if not path.is_file():
            continue  # listed by git but deleted in the working tree
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        yield path.relative_to(root), data.decode("utf-8", errors="replace")


def outside_citations(root: Path = ROOT):
    """(file, line number, line) of every line that cites a path outside the repository."""
    me = Path(__file__).resolve().relative_to(root)
    for rel, text in repository_text_files(root):
        if rel == me:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                yield str(rel), number, line.strip()


def test_the_pattern_catches_what_it_should():
    assert OUTSIDE.search("see /work/shared/reference/gpus.md sec. 3")
    assert OUTSIDE.search("(../shared/reference/engines.md)")
    assert OUTSIDE.search("copied from shared/reference/gpus.md")
    assert not OUTSIDE.search("see profiles/gpu_reference.md sec. 3 and docs/sources.md")
    assert not OUTSIDE.search("#!/usr/bin/env bash")


def test_no_citation_outside_the_repository():
    found = list(outside_citations())
    assert not found, "cites a path outside the repository:\n" + "\n".join(f"{f}:{n}: {line}" for f, n, line in found)


def test_the_cited_references_exist():
    for rel in ("profiles/gpu_reference.md", "docs/sources.md", "data/README.md"):
        assert (ROOT / rel).is_file(), rel
    reference = (ROOT / "profiles/gpu_reference.md").read_text()
    for label in ("## 1. Accelerator specs", "## 3. Measured / effective numbers", "- N11.", "- S6.", "- S12."):
        assert label in reference, label  # what the GPU profiles cite by section, note and source
