"""trainer/trl_private.py: every third-party private member the adapter to TRL uses is
listed, and each listed one still has, in the installed TRL, the parameters recorded (a
method) or is still assigned by its class (an attribute). A TRL release that changes one
fails here, naming it."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from composer_replication.trainer.trl_private import (
    NAMES,
    TRL_PRIVATE,
    PrivateMember,
    drift,
    owner_class,
)

TRAINER = Path(__file__).resolve().parents[3] / "src" / "composer_replication" / "trainer"


@pytest.mark.parametrize("member", TRL_PRIVATE, ids=lambda m: m.name)
def test_the_installed_trl_has_the_recorded_member(member):
    assert drift(member) == ""


def test_a_changed_signature_or_a_vanished_attribute_is_caught():
    method = next(m for m in TRL_PRIVATE if m.name == "_compute_loss")
    renamed = dataclasses.replace(method, params=("self", "model", "batch"))
    assert "takes ('self', 'model', 'inputs')" in drift(renamed)
    gone = PrivateMember(method.owner, "_no_such_attribute_anywhere", None, "planted")
    assert "no longer assigns self._no_such_attribute_anywhere" in drift(gone)
    assert "no longer a method" in drift(dataclasses.replace(gone, params=("self",)))


def _third_party_private_names() -> set[str]:
    """Private names the TRL/transformers classes under our trainer define or assign."""
    cls = owner_class(TRL_PRIVATE[0])
    names = {n for klass in cls.__mro__ for n in vars(klass) if n.startswith("_")}
    for klass in cls.__mro__:
        try:
            names |= set(re.findall(r"self\.(_\w+)\s*(?::[^=\n]*)?=", inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def test_every_third_party_private_member_the_adapter_uses_is_listed():
    """Overridden, called or read on ``self``, ``super()`` or another object in trainer/ and
    rollout.py."""
    theirs = _third_party_private_names()
    used = set()
    for path in [*TRAINER.glob("*.py"), TRAINER.parent / "rollout.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                used.add(node.name)
    assert sorted((used & theirs) - NAMES) == []
