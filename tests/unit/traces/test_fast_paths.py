"""The speed-ups must not change a single output byte.

- ``Redactor.any_trigger`` (one regex scan) must be true whenever the per-trigger scan it
  short-cuts finds a trigger, and equal to it on ASCII text: hypothesis builds strings from
  trigger fragments, case variants and Unicode characters whose lowercase is ASCII (Kelvin sign,
  dotted capital I); the table of such characters is checked against all of Unicode.
- ``Redactor.raw_scanner`` (Hyperscan over raw JSONL lines) must mark every line from which a
  string with a trigger decodes, whatever the JSON encoder escaped (``\\uXXXX``, ``\\/``).
- End to end: every fixture log and the planted-secrets corpus ingest to identical states,
  report accounting and redaction counts with the fast paths and with a redactor that runs the
  full per-trigger scan on every string (no raw scan), also with tiny read blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_replication.traces import Redactor, _base, ingest
from composer_replication.traces._base import ReaderContext, SessionBuilder
from composer_replication.traces.redact import _LOWERS_TO_ASCII
from composer_replication.traces.report import FileReport

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


_texts = st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=3), max_size=8).map("".join)


class _ScanEveryTrigger(Redactor):
    """Reference: no raw-line scan, no any-trigger regex: each trigger is looked for separately
    in every string."""

    def any_trigger(self, text: str) -> bool:
        return True

    def raw_scanner(self) -> None:
        return None


@settings(max_examples=3000, deadline=None)
@given(_texts)
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


@pytest.mark.parametrize("block", [None, 97])
@pytest.mark.parametrize("which", ["fixtures", "planted"])
def test_fast_and_full_scan_give_identical_output(
    which: str, block: int | None, request, tmp_path: Path, monkeypatch
) -> None:
    """``block``: read blocks of 97 bytes, so that lines and secrets straddle block ends."""
    if which == "fixtures":
        paths = [request.getfixturevalue("fixtures_dir")]
    else:
        paths = [_planted_dir(tmp_path)]
    if block:
        monkeypatch.setattr(_base, "READ_BLOCK", block)
    fast_red = Redactor()
    assert fast_red.raw_scanner() is not None, "hyperscan missing: the raw scan is not tested"
    fast = _outcome(paths, fast_red)
    full = _outcome(paths, _ScanEveryTrigger())
    assert fast[0], "no states: the comparison would be vacuous"
    assert fast == full
    if which == "planted":
        assert sum(fast[2].values()) > 0


def test_triggers_have_no_json_escaped_characters() -> None:
    """Premise of `Redactor.json_text_is_clean`: only ``\\uXXXX`` and ``\\/`` escapes can hide a trigger."""
    for t in _TRIGGERS:
        assert not any(c in t for c in '"\\') and all(c >= " " for c in t), t


def _builder(red: Redactor) -> SessionBuilder:
    ctx = ReaderContext(Path("x.jsonl"), "claude_code", FileReport("x.jsonl", "claude_code"), red)
    return SessionBuilder(ctx, "s")


_json_values = st.recursive(
    _texts | st.integers(-(2**63), 2**63 - 1),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=1500, deadline=None)
@given(_json_values, st.sampled_from(["orjson", "ascii", "slashes", "raw"]))
def test_tool_arguments_fast_path_matches_full_redaction(value, encoding: str) -> None:
    text = json.dumps(value, ensure_ascii=encoding == "ascii")
    if encoding == "slashes":
        text = text.replace("/", "\\/")
    elif encoding == "orjson":
        text = orjson.dumps(value).decode()
    elif encoding == "raw":  # not JSON at all: redacted as plain text
        text = "".join(map(str, value)) if isinstance(value, list) else str(value)
    fast, full = Redactor(), _ScanEveryTrigger()
    assert _builder(fast)._redact_arguments(text) == _builder(full)._redact_arguments(text)
    assert fast.counts == full.counts


@pytest.mark.parametrize(
    "arguments",
    [
        '{"cmd": "curl -H \\"Authorization: s\\u006b-proj-abcdefghijklmnopqrstuvwxyz0123\\""}',
        '{"url": "postgres:\\/\\/admin:hunter2pass@db.internal\\/app"}',
        '{"env": "MY_API_\\u0054OKEN=abcdefgh12345"}',
    ],
)
def test_escaped_trigger_in_tool_arguments_is_still_redacted(arguments: str) -> None:
    """A trigger hidden by a JSON escape is not visible in the text: the fast path must not skip."""
    red = Redactor()
    assert red.any_trigger(arguments) is False  # the escape hides it from the text-level scan
    out = _builder(red)._redact_arguments(arguments)
    assert "<REDACTED:" in out and sum(red.counts.values()) == 1


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _escape_some(text: str, rng_bits: list[bool]) -> str:
    """JSON string literal of ``text`` with some characters written as ``\\uXXXX`` and every
    ``/`` as ``\\/`` where the bit says so: spellings other encoders use."""
    out = []
    for i, ch in enumerate(text):
        bit = rng_bits[i % len(rng_bits)] if rng_bits else False
        if bit and ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04X}" if i % 2 else f"\\u{ord(ch):04x}")
        elif bit and ch == "/":
            out.append("\\/")
        else:
            out.append(json.dumps(ch, ensure_ascii=False)[1:-1])
    return '"' + "".join(out) + '"'


def _encode(value, how: str, bits: list[bool]) -> bytes:
    if how == "orjson":
        return orjson.dumps(value)
    if how == "ascii":
        return json.dumps(value, ensure_ascii=True).encode()
    if isinstance(value, str):
        return _escape_some(value, bits).encode()
    if isinstance(value, dict):
        items = [
            _escape_some(k, bits) + ":" + _encode(v, how, bits).decode() for k, v in value.items()
        ]
        return ("{" + ",".join(items) + "}").encode()
    if isinstance(value, list):
        return ("[" + ",".join(_encode(v, how, bits).decode() for v in value) + "]").encode()
    return orjson.dumps(value)


@settings(max_examples=2000, deadline=None)
@given(
    st.dictionaries(st.text(max_size=4), _json_values, max_size=4),
    st.sampled_from(["orjson", "ascii", "escaped"]),
    st.lists(st.booleans(), min_size=1, max_size=7),
)
def test_raw_scan_marks_every_line_a_trigger_decodes_from(record, how, bits) -> None:
    """Premise of skipping redaction on unmarked lines: no string decoded from an unmarked line
    holds a trigger (`Redactor._triggered` empty), so `redact` would return it unchanged."""
    scanner = _RED.raw_scanner()
    assert scanner is not None
    line = _encode(record, how, bits) + b"\n"
    assert orjson.loads(line) == record
    marked = bool(scanner.match_ends(line))
    if not marked:
        for text in _strings(orjson.loads(line)):
            assert not _RED._triggered(text), (line, text)
            assert _RED.redact(text) == text


def test_raw_scan_sees_escaped_and_folded_triggers() -> None:
    scanner = _RED.raw_scanner()
    for line in [
        b'{"a": "s\\u006b-proj-abc"}',  # escaped ASCII letter
        b'{"a": "postgres:\\/\\/u:p@h"}',  # escaped slash
        b'{"a": "API_\\u212aEY=1"}',  # escaped Kelvin sign: lowercases to "api_key"
        '{"a": "api_\u212aey"}'.encode(),  # raw Kelvin sign
        b'{"a": "my PASSWORD is"}',  # case-insensitive trigger, upper case
    ]:
        assert scanner.match_ends(line), line
    assert not scanner.match_ends(b'{"type": "user", "message": {"content": "hello world"}}')
