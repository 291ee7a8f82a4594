"""Issue 55, class 6: a hidden test that shares its data with a test the workspace keeps.

A hidden test parametrized over the same table as a visible test left the table in the
workspace: a lookup table copied from it scored 1.0 (48/48) with ``min_hidden_tests: 1``
(inflection's ``pluralize``/``singularize`` tests have this shape). Each variant below shares
the expected values another way (a module table, a class table, a fixture, a helper reading
a table, a data file both opened): the generator's split must count the hidden test as
visible. A control keeps a hidden test that shares only setup (an import, a client fixture)
hidden."""

from __future__ import annotations

import pytest

from composer_replication.envs.feature_deletion.generate import hidden_split
from composer_replication.envs.feature_deletion.testcode import TestCode

F = "tests/test_words.py"
HEAD = "import pytest\n\nfrom words import plural, singular\n\n"
SHAPES = {
    "module_table": HEAD
    + (
        "PAIRS = [('box', 'boxes'), ('mouse', 'mice'), ('ox', 'oxen')]\n\n\n"
        "@pytest.mark.parametrize('one, many', PAIRS)\n"
        "def test_plural(one, many):\n    assert plural(one) == many\n\n\n"
        "@pytest.mark.parametrize('one, many', PAIRS)\n"
        "def test_singular(one, many):\n    assert singular(many) == one\n"
    ),
    "class_table": HEAD
    + (
        "class TestWords:\n"
        "    PAIRS = {'box': 'boxes', 'mouse': 'mice'}\n\n"
        "    def test_plural(self):\n"
        "        for one, many in self.PAIRS.items():\n            assert plural(one) == many\n\n"
        "    def test_singular(self):\n"
        "        for one, many in self.PAIRS.items():\n            assert singular(many) == one\n"
    ),
    "fixture": HEAD
    + (
        "@pytest.fixture\ndef pairs():\n    return {'box': 'boxes', 'mouse': 'mice'}\n\n\n"
        "def test_plural(pairs):\n    assert all(plural(k) == v for k, v in pairs.items())\n\n\n"
        "def test_singular(pairs):\n    assert all(singular(v) == k for k, v in pairs.items())\n"
    ),
    "helper": HEAD
    + (
        "_TABLE = {'box': 'boxes', 'mouse': 'mice'}\n\n\n"
        "def _many(one):\n    return _TABLE[one]\n\n\n"
        "def test_plural():\n    assert plural('box') == _many('box')\n\n\n"
        "def test_singular():\n    assert singular(_many('mouse')) == 'mouse'\n"
    ),
    "data_file": HEAD
    + (
        "import json\n\n\n"
        "def test_plural():\n    t = json.load(open('tests/pairs.json'))\n"
        "    assert all(plural(k) == v for k, v in t.items())\n\n\n"
        "def test_singular():\n    t = json.load(open('tests/pairs.json'))\n"
        "    assert all(singular(v) == k for k, v in t.items())\n"
    ),
}
CONTROL = HEAD + (
    "json = pytest.importorskip('json')\n\n\n"
    "@pytest.fixture\ndef client():\n    return object()\n\n\n"
    "@pytest.mark.parametrize('one, many', [('box', 'boxes')])\n"
    "def test_plural(one, many, client):\n    assert plural(one) == many and json\n\n\n"
    "@pytest.mark.parametrize('one, many', [('mouse', 'mice')])\n"
    "def test_singular(one, many, client):\n    assert singular(many) == one and json\n"
)


def _ids(text: str) -> list[str]:
    prefix = f"{F}::TestWords::" if "class TestWords" in text else f"{F}::"
    params = "[box-boxes]" if "parametrize" in text else ""
    return [f"{prefix}test_plural{params}", f"{prefix}test_singular{params}"]


def _split(text: str, data_by_test: dict | None = None):
    failing = _ids(text)
    code = TestCode(test_files=[F], test_dirs=["tests"], helpers=[], test_data=[],
                    served=[], data_by_test=data_by_test or {})  # fmt: skip
    return failing, hidden_split(lambda rel: text, failing, 1, code)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_hidden_test_sharing_data_with_a_kept_one_is_visible(shape):
    text = SHAPES[shape]
    data = {"tests/pairs.json": _ids(text)} if shape == "data_file" else None
    failing, (visible, hidden, hidden_data) = _split(text, data)
    assert hidden == [] and visible == sorted(failing), (shape, hidden)
    assert hidden_data == []


def test_a_hidden_test_sharing_only_setup_stays_hidden():
    failing, (visible, hidden, _) = _split(CONTROL)
    assert len(visible) == 1 and len(hidden) == 1 and sorted(visible + hidden) == failing
