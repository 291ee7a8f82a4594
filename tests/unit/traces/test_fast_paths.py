"""The speed-ups must not change a single output byte.

- ``Redactor.any_trigger`` (two regex scans) must agree with the per-trigger scan it replaces on
  every string: hypothesis builds strings from trigger fragments, case variants and Unicode
  characters whose lowercase is ASCII-like (Kelvin sign, dotted capital I).
- End to end: every fixture log and the planted-secrets corpus ingest to identical states,
  report accounting and redaction counts with the fast path and with a redactor that runs the
  full per-trigger scan on every string.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_replication.traces import Redactor, ingest

from .test_redact import CORPUS, _claude_lines, _codex_lines

_RED = Redactor()
_TRIGGERS = [t for t, _ in _RED._case_triggers] + [t for t, _ in _RED._lower_triggers]
_FRAGMENTS = (
    _TRIGGERS
    + [t.upper() for t in _TRIGGERS]
    + [t[: len(t) // 2] for t in _TRIGGERS]
    + [t[len(t) // 2 :] for t in _TRIGGERS]
    + ["\u212a", "\u0130", "\u017f", " ", "\n", "-", "_", "=", "x", "é"]
)


class _ScanEveryTrigger(Redactor):
    """Reference: skips the any-trigger regexes and scans for each trigger separately."""

    def any_trigger(self, text: str) -> bool:
        return True


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=3), max_size=8).map("".join))
def test_any_trigger_agrees_with_per_trigger_scan(text: str) -> None:
    assert _RED.any_trigger(text) == bool(_RED._triggered(text))


def test_every_trigger_alone_and_embedded_is_found() -> None:
    for t in _TRIGGERS:
        for text in (t, f"abc {t} xyz", f"{t}{t}", t.upper(), t.lower()):
            assert _RED.any_trigger(text) == bool(_RED._triggered(text)), text


def _outcome(paths: list[Path], red: Redactor) -> tuple[list[bytes], list, dict]:
    run = ingest(paths, redactor=red)
    states = [s.to_json() for s in run]
    files = [
        (
            f.path,
            f.format,
            f.total_lines,
            f.parsed,
            f.skipped,
            dict(f.skipped_by_reason),
            f.skipped_examples,
            dict(f.skipped_items),
            dict(f.unknown_record_types),
            dict(f.orphans),
            f.orphan_examples,
            sorted(f.sessions),
            f.states,
            f.bytes,
        )
        for f in run.report.files
    ]
    return states, files, dict(red.counts)


def _planted_dir(d: Path) -> Path:
    texts = [t for _, _, t in CORPUS]
    (d / "session.jsonl").write_bytes(b"\n".join(_claude_lines(texts)) + b"\n")
    (d / "rollout-planted.jsonl").write_bytes(b"\n".join(_codex_lines(texts)) + b"\n")
    return d


@pytest.mark.parametrize("which", ["fixtures", "planted"])
def test_fast_and_full_scan_give_identical_output(which: str, request, tmp_path: Path) -> None:
    if which == "fixtures":
        paths = [request.getfixturevalue("fixtures_dir")]
    else:
        paths = [_planted_dir(tmp_path)]
    fast = _outcome(paths, Redactor())
    full = _outcome(paths, _ScanEveryTrigger())
    assert fast[0], "no states: the comparison would be vacuous"
    assert fast == full
    if which == "planted":
        assert sum(fast[2].values()) > 0
