"""Every parse in the package goes through ``sandbox.pyast.parse`` (one lock: CPython 3.11
and 3.12 can fail concurrent ``ast.parse`` calls with a SystemError, which failed a Feature
Deletion grade in CI, and again a generation whose visibility scan parsed in a thread while the
grading wire parsed a sandbox's frame, sandbox/wire.py ``literal``), and that parse is correct
from many threads at once."""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import composer_replication as package
from composer_replication.sandbox import pyast


def _bare_parses(path: Path) -> list[int]:
    """Lines of ``path`` that call ``ast.parse`` directly, outside a ``with PARSE_LOCK:``
    block (sandbox/wire.py takes the lock itself: it runs in the sandbox too)."""
    tree = ast.parse(path.read_text())
    locked = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.With)
        and any(
            isinstance(i.context_expr, ast.Name) and i.context_expr.id == "PARSE_LOCK"
            for i in node.items
        )  # fmt: skip
        for inner in ast.walk(node)
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "parse"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "ast"
        and id(node) not in locked
    ]


def test_no_module_parses_without_the_lock():
    root = Path(package.__file__).parent
    found = {
        str(p.relative_to(root)): lines
        for p in sorted(root.rglob("*.py"))
        if p.name != "pyast.py" and (lines := _bare_parses(p))
    }
    assert found == {}, f"call sandbox.pyast.parse instead of ast.parse: {found}"


def test_parse_from_many_threads_gives_the_same_trees():
    source = "\n".join(
        f"def f{i}(x):\n    return [(a, {{b: (c, d)}}) for a in x for b in a if b or c]"
        for i in range(50)
    )
    want = ast.dump(ast.parse(source))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: ast.dump(pyast.parse(source)), range(64)))
    assert got == [want] * 64
    assert isinstance(pyast.parse("1 + 2", mode="eval"), ast.Expression)
