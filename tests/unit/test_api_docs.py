"""docs/api.md covers every public name (issue 59).

A public name is a name listed in an ``__all__`` of the package: the front door's
(``composer_replication.__all__``), a subpackage's ``__init__`` or a module's (the seam modules
declare one: ``channels.distill``, ``envs.workspace``, ``agents.episodes``...). A name in no
``__all__`` is internal to its subpackage, however it is spelled. A name is covered when it
stands as a whole word in a code span of docs/api.md (``Name``, ``Name(args)``; not as the tail
of a dotted name).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
API = SRC.parent / "docs" / "api.md"


def declared_names(src: Path = SRC) -> dict[str, list[str]]:
    """Module -> the names of its top-level ``__all__``. A literal is read from the source; a
    computed one (the lazy front door, ``diloco``) from the imported module."""
    out: dict[str, list[str]] = {}
    for path in sorted((src / "composer_replication").rglob("*.py")):
        module = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if not any(getattr(t, "id", None) == "__all__" for t in targets):
                continue
            try:
                out[module] = list(ast.literal_eval(node.value))
            except ValueError:
                out[module] = list(importlib.import_module(module).__all__)
    return out


def undocumented(names: dict[str, list[str]], api_text: str) -> list[str]:
    """``module.name`` for each declared name that no code span of ``api_text`` holds."""
    spans = "\n".join(re.findall(r"`([^`\n]+)`", api_text))
    return [
        f"{module}.{name}"
        for module, declared in names.items()
        for name in declared
        if not re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", spans)
    ]


def test_every_public_name_is_in_api_md() -> None:
    names = declared_names()
    assert len(names) >= 20 and sum(map(len, names.values())) >= 250  # the scan found them
    missing = undocumented(names, API.read_text(encoding="utf-8"))
    assert not missing, f"public names missing from docs/api.md: {missing}"


def test_a_planted_public_name_is_reported() -> None:
    """The check can fail: a name in an ``__all__`` but in no code span (only in prose, or as
    the tail of a dotted name) is reported with its module."""
    text = "| `Known`, `other.Planted` | Planted in prose |"
    names = {"pkg.mod": ["Known", "Planted"], "pkg": ["Known"]}
    assert undocumented(names, text) == ["pkg.mod.Planted"]
    assert undocumented(names, text + "\n`Planted(x)`") == []


def test_a_planted_module_all_is_found(tmp_path: Path) -> None:
    """A module that declares ``__all__`` anywhere in the package is scanned."""
    pkg = tmp_path / "composer_replication" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "seam.py").write_text('"""A seam."""\n\n__all__ = ["Seam", "seam"]\n')
    assert declared_names(tmp_path) == {"composer_replication.sub.seam": ["Seam", "seam"]}
