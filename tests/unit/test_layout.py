"""The package's import graph, read from the source with ``ast``: no import cycle between our
modules (function-level imports count too), and no module importing a private name (``_x``, or
a path through a private ``_module``) from another of our packages."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = "composer_replication"


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


class ImportGraph:
    """Modules of ``src/`` and the imports between them."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.files = {self._name(p, src): p for p in sorted(src.rglob("*.py"))}
        self.edges: dict[str, set[str]] = {m: set() for m in self.files}
        self.private: list[str] = []
        for module in self.files:
            self._scan(module)

    @staticmethod
    def _name(path: Path, src: Path) -> str:
        parts = path.relative_to(src).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def _is_pkg(self, module: str) -> bool:
        return self.files[module].name == "__init__.py"

    def _owner(self, name: str) -> str | None:
        """The module of ours that defines ``name`` (longest known prefix)."""
        while name and name not in self.files:
            name = name.rpartition(".")[0]
        return name or None

    def _package(self, module: str) -> str:
        return module if self._is_pkg(module) else module.rpartition(".")[0]

    def _scan(self, module: str) -> None:
        for node in ast.walk(ast.parse(self.files[module].read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._edge(module, alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(module, node)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    self._edge(module, full if full in self.files else base)
                    self._check_private(module, base, alias.name, node.lineno)

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        parts = self._package(module).split(".")
        parts = parts[: len(parts) - node.level + 1]
        return ".".join(parts + ([node.module] if node.module else []))

    def _edge(self, module: str, target: str) -> None:
        owner = self._owner(target) if target.startswith(PKG) else None
        if owner and owner != module:
            self.edges[module].add(owner)

    def _check_private(self, module: str, base: str, name: str, line: int) -> None:
        if not base.startswith(PKG):
            return
        where = f"{self.files[module].relative_to(self.src)}:{line}: {base}.{name}"
        if _private(name):
            self.private.append(where)
        elif any(_private(p) for p in base.split(".")):
            inside = self._package(module)
            source_pkg = base.rpartition(".")[0]
            if not (inside == source_pkg or inside.startswith(source_pkg + ".")):
                self.private.append(where)

    def cycles(self) -> list[list[str]]:
        """Strongly connected components with more than one module (Tarjan)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        found: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            for w in self.edges[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while not component or component[-1] != v:
                    component.append(stack.pop())
                if len(component) > 1:
                    found.append(sorted(component))

        for v in self.edges:
            if v not in index:
                visit(v)
        return found


def test_no_import_cycle_in_the_package():
    graph = ImportGraph(SRC)
    assert len(graph.files) > 50 and graph.edges[f"{PKG}.cli"]  # the scan saw the package
    assert graph.cycles() == []


def test_no_private_name_imported_across_modules():
    assert ImportGraph(SRC).private == []


def test_the_checks_catch_a_cycle_and_a_private_import(tmp_path):
    pkg = tmp_path / PKG
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "_impl.py").write_text("def helper(): ...\n")
    (pkg / "a" / "x.py").write_text("from ._impl import helper\n\ndef f():\n    from . import y\n")
    (pkg / "a" / "y.py").write_text(f"from {PKG}.a.x import f\n")
    (pkg / "b.py").write_text(f"from {PKG}.a.x import _hidden\nfrom {PKG}.a._impl import helper\n")
    graph = ImportGraph(tmp_path)
    assert graph.cycles() == [[f"{PKG}.a.x", f"{PKG}.a.y"]]
    assert [p.rsplit(": ", 1)[1] for p in graph.private] == [
        f"{PKG}.a.x._hidden",
        f"{PKG}.a._impl.helper",
    ]


def test_no_test_harness_or_empty_package_in_the_library():
    names = {p.relative_to(SRC / PKG).as_posix() for p in (SRC / PKG).rglob("*.py")}
    assert not {"diloco/toy.py", "replay/testing.py", "recipes/__init__.py"} & names
