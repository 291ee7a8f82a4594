"""The speed-ups must not change a single output byte.

- ``Redactor.any_trigger`` (one regex scan) must be true whenever the per-trigger scan it
  short-cuts finds a trigger, and equal to it on ASCII text: hypothesis builds strings from
  trigger fragments, case variants and Unicode characters whose lowercase is ASCII (Kelvin sign,
  dotted capital I); the table of such characters is checked against all of Unicode.
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
from composer_replication.traces.redact import _LOWERS_TO_ASCII

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
def test_any_trigger_never_misses_and_is_exact_on_ascii(text: str) -> None:
    found = bool(_RED._triggered(text))
    assert _RED.any_trigger(text) >= found
    if text.isascii():
        assert _RED.any_trigger(text) == found


def test_every_trigger_alone_and_embedded_is_found() -> None:
    for t in _TRIGGERS:
        for text in (t, f"abc {t} xyz", f"{t}{t}", t.upper(), t.lower(), t.replace("k", "\u212a")):
            assert _RED.any_trigger(text) >= bool(_RED._triggered(text)), text
            assert _RED.any_trigger(text) == bool(_RED._triggered(text)) or not text.isascii()


def test_lowercase_table_covers_all_of_unicode() -> None:
    """Only the characters in ``_LOWERS_TO_ASCII`` lowercase to something containing ASCII (and
    then as its first character, followed by non-ASCII only): the premise of the single-scan
    match of case-insensitive triggers."""
    found = {}
    for cp in range(128, 0x110000):
        low = chr(cp).lower()
        if any(c.isascii() for c in low):
            assert low[0].isascii() and not any(c.isascii() for c in low[1:]), hex(cp)
            found[chr(cp)] = low[0]
    assert found == _LOWERS_TO_ASCII
    assert all(len(chr(cp).lower()) == 1 and chr(cp).lower().isascii() for cp in range(128))


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
