"""The forwarding stub the grading suite runs instead of the deleted body: every parameter
kind reaches the other sandbox as the signature declares it."""

from __future__ import annotations

import ast
import sys
import types

import pytest

from composer_replication.envs.feature_deletion.candidates import STUB, Candidate
from composer_replication.envs.feature_deletion.forward import forwarding_line, forwarding_text

SOURCE = f'''
class Box:
    def put(self, a, /, b, *rest, key=None, **extra):
        """Doc."""
        {STUB}

    @property
    def size(self):
        {STUB}
'''


def _cand(symbol: str, line: int) -> Candidate:
    return Candidate("m.py", symbol, line, line, "        ", "0" * 64)


def _line_of(text: str, start: int) -> int:
    return text.splitlines().index("        " + STUB, start) + 1


def test_the_stub_line_becomes_a_call_with_every_parameter_kind():
    text = forwarding_text(SOURCE, _cand("Box.put", _line_of(SOURCE, 0)))
    put = next(n for n in ast.walk(ast.parse(text)) if getattr(n, "name", "") == "put")
    assert ast.unparse(put.body[-1]) == (
        "return __import__('_cr_forward').call('Box.put', __name__, (self, a, b, *rest), "
        "{'key': key, **extra})"
    )
    assert ast.get_docstring(put) == "Doc."  # the docstring and signature stay


def test_the_call_receives_what_the_caller_passed(monkeypatch):
    seen = []
    fake = types.ModuleType("_cr_forward")
    fake.call = lambda *a: seen.append(a) or "ok"
    monkeypatch.setitem(sys.modules, "_cr_forward", fake)
    text = forwarding_text(SOURCE, _cand("Box.put", _line_of(SOURCE, 0)))
    namespace: dict = {"__name__": "pkg.m"}
    exec(text, namespace)
    box = namespace["Box"]()
    assert box.put(1, 2, 3, 4, key=5, other=6) == "ok"
    assert seen == [("Box.put", "pkg.m", (box, 1, 2, 3, 4), {"key": 5, "other": 6})]
    box.put(1, b=2)
    assert seen[-1][2:] == ((box, 1, 2), {"key": None})  # defaults applied here, once


def test_a_property_getter_is_found_by_the_stub_line():
    line = _line_of(SOURCE, _line_of(SOURCE, 0))
    text = forwarding_text(SOURCE, _cand("Box.size", line))
    assert "call('Box.size', __name__, (self, ), {})" in text.splitlines()[line - 1]


def test_a_file_without_the_stub_is_refused():
    with pytest.raises(ValueError, match="no deletion stub"):
        forwarding_text(SOURCE.replace(STUB, "return 1"), _cand("Box.put", 5))


def test_forwarding_line_without_parameters():
    args = ast.parse("def f(): pass").body[0].args
    assert (
        forwarding_line(args, "f") == "return __import__('_cr_forward').call('f', __name__, (), {})"
    )
