"""The package's import graph, read from the source with ``ast``: imports only go down the
layers (:data:`LAYERS`), no import cycle between our modules (function-level imports count
too), and no module importing a private name (``_x``, or a path through a private
``_module``) from another of our packages."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = "composer_replication"
LAYERS = (
    "config", "progress", "lm", "losses", "teachers", "sandbox", "envs", "traces", "replay", "prefs",
    "rollout", "agents", "evaluation", "channels", "rollout_engine", "trainer", "diloco", "run", "recipes", "cli",
)  # fmt: skip
"""The package's folders (and top-level modules), bottom to top: a module imports only from
its own layer or a lower one. The package root (the lazy front door) and data folders are
outside the order."""


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


class ImportGraph:
    """Modules of ``src/`` and the imports between them."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.files = {self._name(p, src): p for p in sorted(src.rglob("*.py"))}
        self.edges: dict[str, set[str]] = {m: set() for m in self.files}
        self.private: list[str] = []
        self.lines: dict[tuple[str, str], int] = {}
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
                    self._edge(module, alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(module, node)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    self._edge(module, full if full in self.files else base, node.lineno)
                    self._check_private(module, base, alias.name, node.lineno)

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        parts = self._package(module).split(".")
        parts = parts[: len(parts) - node.level + 1]
        return ".".join(parts + ([node.module] if node.module else []))

    def _edge(self, module: str, target: str, line: int) -> None:
        owner = self._owner(target) if target.startswith(PKG) else None
        if owner and owner != module:
            self.edges[module].add(owner)
            self.lines.setdefault((module, owner), line)

    @staticmethod
    def layer(module: str) -> int | None:
        """Index of the module's layer in :data:`LAYERS` (None: outside the order)."""
        parts = module.split(".")
        return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None

    def upward(self) -> list[str]:
        """``file:line: a (layer) imports b (layer)`` for every import from a lower layer up to
        a higher one, or from a layered module into one outside the order."""
        found = []
        for module, targets in self.edges.items():
            here = self.layer(module)
            for target in sorted(targets):
                there = self.layer(target)
                if here is not None and (there is None or there > here):
                    where = (
                        f"{self.files[module].relative_to(self.src)}:{self.lines[module, target]}"
                    )
                    up = LAYERS[there] if there is not None else "outside the layers"
                    found.append(f"{where}: {module} ({LAYERS[here]}) imports {target} ({up})")
        return found

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


def test_imports_only_go_down_the_layers():
    graph = ImportGraph(SRC)
    folders = {p.name for p in (SRC / PKG).iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in (SRC / PKG).glob("*.py") if p.name != "__init__.py"}
    assert folders | modules == set(LAYERS)  # every folder has its place in the order
    assert graph.upward() == []


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """A control: the same check on a copy of the package with one upward import planted (a
    function-level import in config of a module of the trainer) fails, naming it."""
    import shutil

    shutil.copytree(SRC / PKG, tmp_path / PKG, ignore=shutil.ignore_patterns("__pycache__"))
    assert ImportGraph(tmp_path).upward() == []
    planted = tmp_path / PKG / "config" / "env.py"
    planted.write_text(
        planted.read_text() + f"\n\ndef _late():\n    from {PKG}.trainer.trainer import x\n"
    )
    [found] = ImportGraph(tmp_path).upward()
    assert found.startswith("composer_replication/config/env.py:") and found.endswith(
        f"{PKG}.config.env (config) imports {PKG}.trainer.trainer (trainer)"
    )


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
    assert not {"diloco/toy.py", "replay/testing.py"} & names
    for init in (SRC / PKG).rglob("__init__.py"):  # every package holds a module of its own
        assert [p for p in init.parent.iterdir() if p.name != "__init__.py"], init
