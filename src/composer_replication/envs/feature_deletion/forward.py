"""The target file the grading suite runs against: the task's state, with the deleted body's
stub replaced by one line that forwards the call to the sandbox holding the submission
(sandbox/forward_client.py explains the split and why).

The forwarding line passes every parameter as the signature declares it (positional-only and
ordinary ones positionally, ``*args`` spread, keyword-only ones and ``**kwargs`` by name), so
defaults are applied once, in the suite's process, by the signature the task kept.
"""

from __future__ import annotations

import ast

from composer_replication.envs.feature_deletion.candidates import STUB, Candidate
from composer_replication.sandbox import pyast


def forwarding_text(deleted_text: str, cand: Candidate) -> str:
    """``deleted_text`` (the target file at the task's state) with the candidate's stub line
    replaced by a call of ``_cr_forward.call``. Raises ``ValueError`` if the stub is not where
    the candidate says."""
    lines = deleted_text.splitlines()
    line = cand.body_start - 1
    if line >= len(lines) or lines[line] != cand.indent + STUB:
        raise ValueError(f"{cand.key}: no deletion stub at line {cand.body_start}")
    node = function_at(pyast.parse(deleted_text), cand)
    lines[line] = cand.indent + forwarding_line(node.args, cand.symbol)
    return "\n".join(lines) + ("\n" if deleted_text.endswith("\n") else "")


def forwarding_line(args: ast.arguments, symbol: str) -> str:
    """``return __import__('_cr_forward').call(symbol, __name__, (...), {...})``."""
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    if args.vararg is not None:
        positional.append("*" + args.vararg.arg)
    keywords = [f"{a.arg!r}: {a.arg}" for a in args.kwonlyargs]
    if args.kwarg is not None:
        keywords.append("**" + args.kwarg.arg)
    packed = "(" + "".join(p + ", " for p in positional) + ")"
    return (
        f"return __import__('_cr_forward').call({symbol!r}, __name__, {packed}, "
        f"{{{', '.join(keywords)}}})"
    )


def function_at(tree: ast.Module, cand: Candidate) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The def named by ``cand.symbol`` whose body holds the stub's line (a property's getter
    and setter share a name)."""
    scope: list[ast.stmt] = tree.body
    *owners, name = cand.symbol.split(".")
    for owner in owners:
        scope = next(n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == owner)
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            if node.lineno < cand.body_start <= (node.end_lineno or 0):
                return node
    raise ValueError(f"{cand.key}: no function holds line {cand.body_start}")
