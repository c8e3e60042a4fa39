#!/usr/bin/env python
"""Check the import layers of the repository: every `import` / `from ... import` node anywhere in a module (top level,
inside functions, under `if TYPE_CHECKING`) and every `importlib.import_module("literal")` call counts.

    pipelines   imports only pipelines
    gen         imports pipelines and gen         (never detectors)
    detectors   imports pipelines and detectors   (never gen)
    oodforge    imports pipelines, gen, detectors, oodforge (the command and the public API; nothing below imports it)
    scripts     imports pipelines, gen, detectors, oodforge (nothing imports scripts)
    benchmarks  imports anything                  (nothing imports benchmarks; tests may)

    within detectors, the methods never import the experiment harness (detectors.harness); only the harness and
    the package's public `detectors/__init__.py` may

and no two modules of these packages import each other, directly or through others (an import circle); and the map at
the top of docs/architecture.md is true: every package folder of these packages is in it, every folder in it exists,
and README.md links it rather than keeping a folder map of its own.
Prints one line per fault (`file:line: a imports b ...`) and exits 1 when there is any; tests are not checked.

    python scripts/check_layers.py            # the repository this script lives in
    python scripts/check_layers.py --root DIR
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelines.cli import README_SECTIONS, parser, run_main

PACKAGES = ("pipelines", "gen", "detectors", "oodforge", "benchmarks", "scripts")
ALLOWED: dict[str, frozenset[str]] = {
    "pipelines": frozenset({"pipelines"}),
    "gen": frozenset({"pipelines", "gen"}),
    "detectors": frozenset({"pipelines", "detectors"}),
    "oodforge": frozenset({"pipelines", "gen", "detectors", "oodforge"}),
    "scripts": frozenset({"pipelines", "gen", "detectors", "oodforge"}),
    "benchmarks": frozenset({"pipelines", "gen", "detectors", "oodforge", "scripts", "benchmarks"}),
}
HARNESS = "detectors.harness"
MAP = "docs/architecture.md"


@dataclass(frozen=True)
class Edge:
    """`source` imports `target` at `file:line`."""

    source: str
    target: str
    file: str
    line: int


def module_name(path: Path, root: Path) -> str:
    """Dotted module name of a file below `root` (`pkg/__init__.py` -> `pkg`)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_modules(root: Path) -> dict[str, Path]:
    """Every module of the checked packages, by dotted name."""
    return {module_name(p, root): p for top in PACKAGES if (root / top).is_dir()
            for p in sorted((root / top).rglob("*.py"))}


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a (possibly relative) `from` import names."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Module names an AST node imports (a `from a import b` names `a.b` when that is a module, else `a`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _absolute(node, module, is_package)
        return [f"{base}.{alias.name}" if base else alias.name for alias in node.names] + [base]
    if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return [node.args[0].value]
    return []


def imports(path: Path, module: str, known: dict[str, Path], root: Path) -> list[Edge]:
    """Edges from `module` to the repository modules it imports anywhere in its file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []
    for node in ast.walk(tree):
        names = _targets(node, module, is_package)
        if isinstance(node, ast.ImportFrom) and names:
            names = [n for n in names[:-1] if n in known] or names[-1:]  # `from a import b`: module a.b, else a
        for name in names:
            if name.split(".")[0] in PACKAGES and name != module:
                edges.append(Edge(module, name, str(path.relative_to(root)), node.lineno))
    return edges


def layer_faults(edges: list[Edge]) -> list[str]:
    """One line per import from a lower layer to a higher one (or between gen and detectors, into oodforge from
    below, or into scripts)."""
    faults = []
    for e in edges:
        src, dst = e.source.split(".")[0], e.target.split(".")[0]
        if dst not in ALLOWED[src]:
            allowed = ", ".join(sorted(ALLOWED[src]))
            faults.append(f"{e.file}:{e.line}: {e.source} imports {e.target} ({src} may import only {allowed})")
    return faults


def harness_faults(edges: list[Edge]) -> list[str]:
    """One line per import of `detectors.harness` by a detector-method module (anything else under detectors/)."""
    def in_harness(name: str) -> bool:
        return name == HARNESS or name.startswith(HARNESS + ".")

    return [f"{e.file}:{e.line}: {e.source} imports {e.target} (the detector methods never import {HARNESS})"
            for e in edges if e.source.startswith("detectors.") and not in_harness(e.source) and in_harness(e.target)]


def circles(edges: list[Edge]) -> list[list[str]]:
    """The import circles: strongly connected groups of two or more modules (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    search = _Tarjan(graph)
    for node in sorted(graph):
        if node not in search.index:
            search.visit(node)
    return sorted(search.found)


class _Tarjan:
    """Tarjan's strongly connected components over `graph` (node -> successors), nodes visited in sorted order."""

    def __init__(self, graph: dict[str, set[str]]):
        self.graph = graph
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.on_stack: set[str] = set()
        self.found: list[list[str]] = []

    def visit(self, node: str) -> None:
        index, low = self.index, self.low
        index[node] = low[node] = len(index)
        self.stack.append(node)
        self.on_stack.add(node)
        for nxt in sorted(self.graph[node]):
            if nxt not in index:
                self.visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in self.on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = self._pop_component(node)
            if len(group) > 1:
                self.found.append(sorted(group))

    def _pop_component(self, root: str) -> list[str]:
        """The stack's nodes down to `root`: one strongly connected component."""
        group = []
        while True:
            member = self.stack.pop()
            self.on_stack.discard(member)
            group.append(member)
            if member == root:
                return group


def circle_faults(edges: list[Edge]) -> list[str]:
    """One line per import circle, naming each import inside it."""
    faults = []
    for group in circles(edges):
        members = set(group)
        inside = [f"{e.source} -> {e.target} ({e.file}:{e.line})" for e in edges
                  if e.source in members and e.target in members]
        faults.append(f"import circle between {', '.join(group)}: " + "; ".join(inside))
    return faults


def map_folders(text: str) -> list[str]:
    """The folders of the map: the first table's first column (`` `pkg/sub/` ``), in order."""
    folders, started = [], False
    for line in text.splitlines():
        match = re.match(r"\|\s*`([^`]+)/`\s*\|", line)
        if match:
            folders.append(match.group(1))
            started = True
        elif started and not line.startswith("|"):
            break
    return folders


def map_faults(root: Path) -> list[str]:
    """One line per package folder missing from the map of docs/architecture.md and per mapped folder not on disk."""
    path = root / MAP
    if not path.is_file():
        return []
    mapped = map_folders(path.read_text(encoding="utf-8"))
    packages = {p.parent.relative_to(root).as_posix() for top in PACKAGES if (root / top).is_dir()
                for p in (root / top).rglob("__init__.py")}
    return ([f"{MAP}: package folder {f}/ is not in the map" for f in sorted(packages - set(mapped))]
            + [f"{MAP}: {f}/ is in the map but not on disk" for f in mapped if not (root / f).is_dir()])


def readme_faults(root: Path) -> list[str]:
    """The README keeps no folder map of its own (a map there went stale: ZeST in pipelines/, no oodforge/): it links
    the one in docs/architecture.md."""
    path = root / "README.md"
    if not path.is_file() or not (root / MAP).is_file():
        return []
    text = path.read_text(encoding="utf-8")
    faults = [] if f"]({MAP})" in text else [f"README.md: no link to {MAP}, the folder map"]
    return faults + (["README.md: a '## Layout' section (a second folder map): link docs/architecture.md instead"]
                     if re.search(r"^## Layout\b", text, flags=re.M) else [])


def check(root: Path) -> list[str]:
    """Every layer fault and import circle of the repository at `root`, every fault of its architecture map, and a
    README that keeps a map of its own instead of linking it."""
    known = find_modules(root)
    edges = [e for name, path in known.items() for e in imports(path, name, known, root)]
    return layer_faults(edges) + harness_faults(edges) + circle_faults(edges) + map_faults(root) + readme_faults(root)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="repository folder")
    args = p.parse_args(argv)
    faults = check(args.root)
    for line in faults:
        print(line)
    print(f"layers: {len(faults)} fault(s)" if faults else "layers: ok (no upward import, no import circle)")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(run_main(main, doc=README_SECTIONS["scripts"]))
