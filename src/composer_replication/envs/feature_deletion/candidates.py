"""Which functions of a source tree can be deleted, and the deletion itself.

A candidate is a top-level function or a method of a top-level class, outside test code,
whose body holds at least one statement besides its docstring and starts on a line of its
own. Deleting it keeps the decorators, the signature and the docstring and replaces the rest
of the body with ``raise NotImplementedError`` (SWE-smith calls this transform "function
removal"; Composer's Feature Deletion deletes a feature the tests exercise). Whether a
deletion is a task (some test fails, the suite still collects, not too much breaks) is
decided by running the tests (``generate.py``).
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from composer_replication.sandbox import pyast

STUB = "raise NotImplementedError  # deleted: rebuild this"
SKIP_DIRS = {"tests", "test", "testing", "docs", "doc", "examples", "benchmarks", "build", "dist"}
SKIP_DECORATORS = {"overload", "abstractmethod", "abstractproperty"}


@dataclass(frozen=True)
class Candidate:
    """A deletable function: ``file`` (relative, posix), ``symbol`` (``f`` or ``Class.f``),
    the 1-based lines of its body after the docstring (``body_start``..``end``), the body's
    indentation and the sha256 of the deleted lines. ``variant``: what tells apart defs of one
    symbol in one file (a property's ``setter``/``deleter``, else ``L<line>`` of a repeated
    def), '' for the first or only one."""

    file: str
    symbol: str
    body_start: int
    end: int
    indent: str
    body_sha256: str
    variant: str = ""

    @property
    def key(self) -> str:
        """``file::symbol``, with ``@variant`` for a second def of the symbol (``runs.jsonl``
        and task ids are keyed by it: a property's setter shared its getter's key, was never
        run and took the getter's status, generator version 6)."""
        return f"{self.file}::{self.symbol}" + (f"@{self.variant}" if self.variant else "")

    def to_dict(self) -> dict:
        return asdict(self)


def is_test_path(rel: str) -> bool:
    """Test code, test helpers and build/doc trees: never a candidate."""
    parts = Path(rel).parts
    if not parts:
        return False
    name = parts[-1]
    if any(p in SKIP_DIRS or p.startswith(".") for p in parts[:-1]):
        return True
    return (
        name.startswith("test_")
        or name.endswith("_test.py")
        or name in ("conftest.py", "setup.py", "noxfile.py", "_version.py")
    )


def source_files(root: Path, testcode=None) -> list[str]:
    """Relative posix paths of the non-test ``.py`` files under ``root``, sorted;
    ``testcode`` (a ``testcode.TestCode``): also leave out what the suite's run showed to be
    test code."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if not is_test_path(rel) and not (testcode is not None and testcode.is_test_file(rel)):
            out.append(rel)
    return out


def find_candidates(root: Path, testcode=None) -> list[Candidate]:
    """Every candidate of the tree under ``root`` (module docstring), in file order;
    ``testcode``: the test files and helpers the baseline run found (``testcode.classify``)
    are never candidates."""
    out: list[Candidate] = []
    helpers = set(testcode.helpers) if testcode is not None else set()
    for rel in source_files(root, testcode):
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        try:
            tree = pyast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        seen: set[str] = set()
        for node, qual in _functions(tree):
            cand = _candidate(rel, node, qual, lines)
            if cand is not None and cand.key not in helpers:
                if qual in seen:  # a setter, or a def repeated under one name
                    role = _decorator_names(node) & {"setter", "deleter", "getter"}
                    variant = min(role) if role else f"L{node.lineno}"
                    cand = replace(cand, variant=variant)
                    if cand.key in {c.key for c in out}:
                        cand = replace(cand, variant=f"{variant}-L{node.lineno}")
                seen.add(qual)
                out.append(cand)
    return out


def _functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, node.name
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield item, f"{node.name}.{item.name}"


def _decorator_names(node) -> set[str]:
    names = set()
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        names.add(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", ""))
    return names


def _candidate(rel: str, node, qual: str, lines: list[str]) -> Candidate | None:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            body = body[1:]
    if not body or _decorator_names(node) & SKIP_DECORATORS:
        return None
    first = body[0]
    start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    if start <= node.lineno or start <= (node.body[0].end_lineno if body is not node.body else 0):
        return None  # a one-line def, or statements sharing the docstring's line
    if _is_trivial(body):
        return None
    head = lines[start - 1]
    indent = head[: len(head) - len(head.lstrip())]
    deleted = "\n".join(lines[start - 1 : node.end_lineno])
    digest = hashlib.sha256(deleted.encode()).hexdigest()
    return Candidate(rel, qual, start, node.end_lineno, indent, digest)


def _is_trivial(body: list[ast.stmt]) -> bool:
    """``pass``, ``...`` or a lone ``raise NotImplementedError``: nothing to rebuild."""
    if len(body) != 1:
        return False
    stmt = body[0]
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return getattr(exc, "id", "") == "NotImplementedError"
    return False


def delete_body(text: str, cand: Candidate) -> str:
    """``text`` with the candidate's body (after the docstring) replaced by :data:`STUB`.
    Raises ``ValueError`` if the lines no longer hash to the recorded body (the file changed)."""
    lines = text.splitlines()
    deleted = "\n".join(lines[cand.body_start - 1 : cand.end])
    if hashlib.sha256(deleted.encode()).hexdigest() != cand.body_sha256:
        raise ValueError(f"{cand.key}: the file does not hold the recorded body any more")
    out = lines[: cand.body_start - 1] + [cand.indent + STUB] + lines[cand.end :]
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def original_body(text: str, cand: Candidate) -> str:
    """The candidate's deleted lines (for tests and reference solutions)."""
    return "\n".join(text.splitlines()[cand.body_start - 1 : cand.end])
