"""Every parse in the environments goes through ``envs.pyast.parse`` (one lock: CPython 3.11
and 3.12 can fail concurrent ``ast.parse`` calls with a SystemError, which once failed a
Feature Deletion grade in CI), and that parse is correct from many threads at once."""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import composer_replication.envs as envs_pkg
from composer_replication.envs import pyast


def _bare_parses(path: Path) -> list[int]:
    """Lines of ``path`` that call ``ast.parse`` directly."""
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "parse"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "ast"
    ]


def test_no_environment_module_parses_without_the_lock():
    root = Path(envs_pkg.__file__).parent
    found = {
        str(p.relative_to(root)): lines
        for p in sorted(root.rglob("*.py"))
        if p.name != "pyast.py" and (lines := _bare_parses(p))
    }
    assert found == {}, f"call envs.pyast.parse instead of ast.parse: {found}"


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
