"""The import graph of autoplan/, solvers/, integrations/, profiles/ and benchmarks/ has no circle: every arrow
(an `import` anywhere in a module, at its top or inside a function) points one way. Read from the source with
`ast`, nothing imported; the package a folder installs as is read from pyproject.toml."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("autoplan", "solvers", "integrations", "profiles", "benchmarks")


def package_names() -> Dict[str, str]:
    """Folder -> the dotted package it installs as (pyproject's package-dir; a folder not named there is itself)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapped = config["tool"]["setuptools"].get("package-dir", {})
    names = {folder: folder for folder in FOLDERS}
    names.update({folder: package for package, folder in mapped.items() if folder in names})
    return names


def modules(root: Path = ROOT) -> Dict[str, Path]:
    out = {}
    for folder, package in package_names().items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package] + parts)] = path
    return out


def _known(name: str, known) -> Optional[str]:
    """The longest prefix of `name` that is one of the modules (`a.b.f` for a function f of module a.b)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str, path: Path, known) -> Set[str]:
    """Modules of `known` that module `name` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[:len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import f`, the module mod.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found |= {t for t in (_known(t, known) for t in targets) if t and t != name}
    return found


def import_graph(root: Path = ROOT) -> Dict[str, Set[str]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One circle through each strongly connected set of two or more modules, as [a, b, ..., a]."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[Set[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, group) for group in groups]


def _circle(graph: Dict[str, Set[str]], group: Set[str]) -> List[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    previous = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    back = [v]
                    while previous[back[-1]] is not None:
                        back.append(previous[back[-1]])
                    return back[::-1] + [start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle found in the connected set {sorted(group)}")


def test_the_graph_reads_the_arrows_it_should():
    graph = import_graph()
    assert "autoplan.costmodel.compute" in graph["autoplan.costmodel.rank"]  # `from ... import compute as C`
    assert "autoplan.solvers.cpsat" in graph["autoplan.solvers.api"]  # inside a function, mapped folder
    assert "autoplan.costmodel.layers.base" in graph["autoplan.costmodel.layers.dense"]
    assert "benchmarks.published" in graph["benchmarks.accuracy"]


def test_cycles_finds_and_names_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    found = cycles(import_graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_installed_code_imports_folders_by_their_package_names():
    """Code that `pip install` places in a package (autoplan/, and the folders pyproject installs under autoplan.)
    imports the others by the names they install as: `integrations` is `autoplan.integrations` once installed, and a
    bare `from integrations...` only works with the repository root on sys.path (it failed `autoplan vlm --emit
    mimo` run from any other folder)."""
    renamed = {folder: package for folder, package in package_names().items() if folder != package}
    installed = {"autoplan", *renamed}
    wrong = []
    for folder in sorted(installed):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                          if n.split(".")[0] in renamed]
    assert not wrong, wrong
