"""The triviality screen's per-test limit (``TaskGenConfig.screen_test_timeout_s``, generator
version 8): a trivial body that makes a test loop fails that test at the limit and the screen
goes on, so the deletion is judged on its other bodies instead of being lost to the suite's
timeout (``screen_failed``; in the suite run of 2026-12-03 four jmespath lexer methods, each
holding a slot for 240 s).

``lexkit.advance`` moves past one token; under ``return True``, ``return False`` or ``return 0``
the caller's ``while`` never ends. ``test_tokens`` is a strong target (no trivial body passes it);
``test_tokens_swallowing`` catches every ``Exception``: the limit's interruption is not one,
so the looping bodies still fail it, and every other body passes it."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion.candidates import delete_body, find_candidates
from composer_replication.envs.feature_deletion.generate import generate_tasks, suite_sandbox
from composer_replication.envs.feature_deletion.screen import run_screen
from composer_replication.envs.feature_deletion.source import resolve_source, staged_copy
from composer_replication.sandbox.pytest_suite import run_suite
from composer_replication.sandbox.sandbox import Sandbox

LEX = '''
def advance(text, i):
    """The index after the token that starts at ``i`` (tokens end at a space)."""
    while i < len(text) and text[i] != " ":
        i += 1
    return i + 1


def tokens(text):
    out, i = [], 0
    while i < len(text):
        j = advance(text, i)
        out.append(text[i:j].strip())
        i = j
    return out
'''
TESTS = """
from lexkit.lex import tokens


def test_tokens():
    assert tokens("ab cd") == ["ab", "cd"]


def test_tokens_swallowing():
    try:
        tokens("ab cd")
    except Exception:
        pass
"""
LOOPING = ("return True", "return False", "return 0")  # i stays at 1 or 0
STRONG, SWALLOWING = "tests/test_lex.py::test_tokens", "tests/test_lex.py::test_tokens_swallowing"


@pytest.fixture(scope="module")
def lexkit(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("src") / "lexkit"
    (root / "lexkit").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "lexkit" / "__init__.py").write_text("")
    (root / "lexkit" / "lex.py").write_text(textwrap.dedent(LEX).lstrip())
    (root / "tests" / "test_lex.py").write_text(textwrap.dedent(TESTS).lstrip())
    return root


def _screen(root: Path, screen_test_s: float, suite_timeout_s: float) -> dict | None:
    cand = next(c for c in find_candidates(root) if c.symbol == "advance")
    deleted = delete_body((root / cand.file).read_text(), cand)
    box = Sandbox(suite_sandbox(TaskGenConfig(suite_timeout_s=suite_timeout_s)))

    def passes(text: str, tests: list[str], n: int) -> dict[str, str] | None:
        repo = staged_copy(root, {cand.file: text})
        try:
            res = run_suite(box, str(repo), tests, screen=n, screen_test_s=screen_test_s)
        finally:
            shutil.rmtree(repo, ignore_errors=True)
        return res.screened if res.ok else None

    return run_screen(passes, deleted, cand, [STRONG, SWALLOWING])


def test_a_looping_body_fails_its_test_at_the_limit_and_the_screen_goes_on(lexkit):
    got = _screen(lexkit, screen_test_s=1.0, suite_timeout_s=60)
    assert got is not None, "the screen finished"
    assert got["strong"] == [STRONG]
    for body, passed in got["bodies"].items():
        assert STRONG not in passed
        assert (SWALLOWING in passed) == (body not in LOOPING), body


def test_without_the_limit_the_suite_timeout_loses_the_candidate(lexkit):
    """The control: a limit above the run's own timeout is the screen before version 8."""
    assert _screen(lexkit, screen_test_s=3600.0, suite_timeout_s=8) is None


def test_the_generator_passes_its_limit_to_the_screen(lexkit, tmp_path):
    summary = generate_tasks(resolve_source(str(lexkit)), tmp_path,
                             TaskGenConfig(workers=1, suite_timeout_s=60, max_candidates=1,
                                           screen_test_timeout_s=1.0))  # fmt: skip
    runs = {r["key"]: r for r in map(json.loads, (summary.out_dir / "runs.jsonl").open())}
    advance = runs["lexkit/lex.py::advance"]
    assert advance["status"] == "task" and advance["screen"]["strong"] == [STRONG]
