"""``ast.parse`` for code that may run in several threads at once (graders and tools run in
thread pools).

CPython 3.11 and 3.12 keep the recursion depth of the converter from the C parse tree to
Python ``ast`` objects in per-interpreter state, shared by all threads, so two threads parsing
at once can fail with ``SystemError: AST constructor recursion depth mismatch``
(python/cpython#106905, python/cpython#106906). A Feature Deletion grade failed that way in
CI, and a generation whose visibility scan (a thread) parsed while the grading wire read a
sandbox's frame (sandbox/wire.py ``literal``). One lock around every parse in the package
avoids it (tests/unit/sandbox/test_pyast.py finds any other ``ast.parse``); parsing is a small
part of a grade."""

from __future__ import annotations

import ast

from composer_replication.sandbox.wire import PARSE_LOCK as _PARSE


def parse(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, one thread at a time (module docstring)."""
    with _PARSE:
        return ast.parse(source, mode=mode)
