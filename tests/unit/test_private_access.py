"""No module touches another object's private members: an attribute ``x._y`` (``_y`` not a
dunder) is read, called or set only on ``self``, ``cls`` or ``super()``, read from the source
with ``ast``. The one exception is the adapter to TRL (``trainer/``, ``rollout.py``), which may use the
third-party private members listed in trainer/trl_private.py (each checked against the
installed TRL by tests/unit/trainer/test_trl_private.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from composer_replication.trainer.trl_private import NAMES

PKG = Path(__file__).resolve().parents[2] / "src" / "composer_replication"
ADAPTER = ("trainer", "rollout.py")
"""The adapter to TRL: trainer/, and rollout.py (``ToolLoop`` runs TRL's tool loop outside a
trainer, for the Ray engine's workers, which sit below trainer/ in the layers)."""
"""The folder of the adapter to TRL: only there may the listed third-party members be used."""


def _own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own members."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def private_accesses(source: str, where: str, allowed: frozenset[str] = frozenset()) -> list[str]:
    """``where:line: expression`` for every private member of another object that ``source``
    touches, but the names in ``allowed``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        if _own(node.value) or node.attr in allowed:
            continue
        out.append((node.lineno, f"{where}:{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(out)]


def package_accesses() -> list[str]:
    """:func:`private_accesses` over every module of the package."""
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        allowed = NAMES if rel.parts[0] in ADAPTER else frozenset()
        out += private_accesses(path.read_text(encoding="utf-8"), str(rel), allowed)
    return out


def test_a_planted_access_to_another_objects_private_member_is_found():
    source = (
        "class A:\n"
        "    def f(self, other):\n"
        "        self._mine = cls_ok = super()._g()\n"
        "        other._theirs.append(1)\n"
        "        return self._x._y, type(other).__name__\n"
    )
    assert private_accesses(source, "planted.py") == [
        "planted.py:4: other._theirs",
        "planted.py:5: self._x._y",
    ]


def test_a_listed_trl_member_is_allowed_only_where_allowed():
    source = "def f(trainer):\n    return trainer._metrics\n"
    assert private_accesses(source, "x.py") == ["x.py:2: trainer._metrics"]
    assert private_accesses(source, "x.py", NAMES) == []


def test_the_package_touches_no_private_member_of_another_object():
    found = package_accesses()
    assert found == [], "add a public method instead:\n" + "\n".join(found)
