"""No input crashes a reader: fuzzing with hypothesis, plus malformed / empty / unknown files."""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from composer_replication.traces import UnknownFormatError, ingest
from composer_replication.traces._base import ReaderContext
from composer_replication.traces.detect import sniff
from composer_replication.traces.ingest import READERS
from composer_replication.traces.redact import Redactor
from composer_replication.traces.report import FileReport

SUFFIX = {
    "claude_code": ".jsonl",
    "codex": ".jsonl",
    "swe_agent": ".traj",
    "openhands": ".json",
    "gemini_cli": ".json",
    "openai_messages": ".jsonl",
    "aider": ".md",
}
KEYS = [
    "type", "message", "content", "role", "payload", "uuid", "parentUuid", "sessionId",
    "isSidechain", "agentId", "tool_use_id", "id", "call_id", "name", "input", "arguments",
    "output", "history", "messages", "action", "observation", "args", "tool_call_metadata",
    "cause", "source", "toolCalls", "thoughts", "subtype", "tool_calls", "tool_call_id",
    "replacement_history", "summary", "text", "thinking", "result", "functionResponse",
]  # fmt: skip
VALUES = [
    "user", "assistant", "system", "tool", "tool_use", "tool_result", "text", "thinking",
    "image", "compact_boundary", "session_meta", "response_item", "event_msg", "compacted",
    "message", "function_call", "function_call_output", "reasoning", "custom_tool_call",
    "user_message", "agent_message", "gemini", "run", "edit", "finish", "developer",
]  # fmt: skip

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False)
    | st.sampled_from(VALUES)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), children, max_size=6)
    ),
    max_leaves=25,
)
records = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=8)
raw_lines = st.one_of(
    records.map(orjson.dumps),
    json_values.map(orjson.dumps),
    st.binary(max_size=40),
    st.just(b""),
    records.map(lambda r: orjson.dumps(r)[:-3]),  # truncated
    st.just(b'{"type":"user","message":{"role":"user","content":"\\ud800 lone surrogate"}}'),
)


def _run(fmt: str, data: bytes) -> FileReport:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"fuzz{SUFFIX[fmt]}"
        path.write_bytes(data)
        rep = FileReport(path=str(path), format=fmt)
        ctx = ReaderContext(path, fmt, rep, Redactor())
        for state in READERS[fmt](ctx):
            orjson.loads(state.to_json())  # every state serializes
        return rep


# CI runs `pytest --hypothesis-profile=ci` (tests/conftest.py): derandomized, so a landing sees
# the same examples every time; a developer's default run stays random and finds new cases,
# which are then pinned below with @example.
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GEMINI_NULL_TYPES = {"type": None, "message": None, "messages": [{"type": []}]}  # issue 18


@pytest.mark.parametrize("fmt", sorted(READERS))
@FUZZ
@given(lines=st.lists(raw_lines, max_size=12))
def test_jsonl_shaped_input_never_crashes(fmt: str, lines: list[bytes]) -> None:
    rep = _run(fmt, b"\n".join(lines))
    assert rep.parsed + rep.skipped == rep.total_lines
    errors = [r for r in [*rep.skipped_by_reason, *rep.skipped_items] if "reader_error" in r]
    assert errors == []


@pytest.mark.parametrize("fmt", sorted(READERS))
@FUZZ
@given(doc=st.one_of(json_values, records, st.lists(records, max_size=8)))
@example(doc=GEMINI_NULL_TYPES)
def test_document_shaped_input_never_crashes(fmt: str, doc) -> None:
    data = orjson.dumps(doc)
    if fmt in ("claude_code",):
        data = orjson.dumps({"loglines": doc})
    rep = _run(fmt, data)
    assert rep.parsed + rep.skipped == rep.total_lines
    errors = [r for r in [*rep.skipped_by_reason, *rep.skipped_items] if "reader_error" in r]
    assert errors == []


@pytest.mark.parametrize("fmt", sorted(READERS))
def test_empty_file_is_fine(fmt: str) -> None:
    rep = _run(fmt, b"")
    assert rep.total_lines == 0 and rep.states == 0 and rep.balanced


def test_unknown_format_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "notes.json"
    p.write_text('{"hello": "world"}')
    with pytest.raises(UnknownFormatError, match="notes.json"):
        list(ingest([p]))
    # found under a directory, it is listed instead of failing the run
    run = ingest([tmp_path])
    assert list(run) == [] and run.report.not_traces == [str(p)]


def test_missing_path_and_bad_format_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        list(ingest([tmp_path / "nope.jsonl"]))
    with pytest.raises(ValueError, match="unknown format 'bogus'"):
        ingest([tmp_path], format="bogus")


def test_malformed_lines_reported_with_file_and_line(tmp_path: Path) -> None:
    good = {"type": "user", "sessionId": "s", "message": {"role": "user", "content": "hi"}}
    reply = {
        "type": "assistant",
        "sessionId": "s",
        "message": {"role": "assistant", "content": [{"type": "text", "text": "yo"}]},
    }
    lines = [orjson.dumps(good), b"{not json", b"", b"[1, 2]", orjson.dumps(reply), b'{"type": "us']
    p = tmp_path / "s.jsonl"
    p.write_bytes(b"\n".join(lines))  # last line truncated, no newline
    run = ingest([p], format="claude_code")
    states = list(run)
    (rep,) = run.report.files
    assert rep.skipped_by_reason == {
        "invalid_json": 1,
        "blank_line": 1,
        "not_an_object": 1,
        "truncated_json": 1,
    }
    assert rep.skipped_examples["truncated_json"] == [f"{p}:6"]
    assert rep.parsed == 2 and rep.total_lines == 6
    assert len(states) == 1 and states[0].action.text == "yo"


def test_codex_non_string_record_type_is_unknown_not_a_crash() -> None:
    """Found by the fuzzer above: an unhashable ``type`` next to an object payload."""
    rep = _run("codex", b'{"payload":{},"type":[]}\n')
    assert rep.skipped_by_reason == {"unknown_record_type": 1} and rep.balanced


ODD_TYPES = [{"type": {"x": 1}}, {"type": ["user"]}, {"type": {"x": 1}, "payload": {}}]


@FUZZ
@given(
    lines=st.lists(st.one_of(records, json_values).map(orjson.dumps), min_size=1, max_size=6),
    suffix=st.sampled_from([".jsonl", ".json", ".traj", ".ndjson"]),
)
@example(lines=[orjson.dumps(r) for r in ODD_TYPES], suffix=".jsonl")
@example(lines=[orjson.dumps({"type": {"x": 1}}), b'{"type":"user"}'], suffix=".jsonl")
@example(lines=[orjson.dumps([{"type": {"x": 1}, "message": {}}])], suffix=".json")
@example(lines=[orjson.dumps({"messages": [{"type": ["user"]}]})], suffix=".json")
def test_format_detection_is_total_over_any_json(lines: list[bytes], suffix: str) -> None:
    """`sniff` answers a format or None for any JSON value: a record whose ``type`` is an object
    or a list used to raise ``TypeError: unhashable type`` and end the whole ingest."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"x{suffix}"
        path.write_bytes(b"\n".join(lines))
        assert sniff(path) in (None, *READERS)


def test_odd_record_type_does_not_end_the_run(tmp_path: Path) -> None:
    """A file that used to crash detection sits next to a good log: both are accounted for and
    the good log's states are kept."""
    logs = tmp_path / "logs"
    logs.mkdir()
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    (logs / "good.jsonl").write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    (logs / "zz_bad.jsonl").write_bytes(b'{"type": {"x": 1}}\n{"type":"user"}\n')
    run = ingest([logs])
    states = list(run)
    assert [s.action.text for s in states] == ["4"]
    seen = [f.path for f in run.report.files] + run.report.not_traces
    assert str(logs / "zz_bad.jsonl") in seen + list(run.report.unreadable)


def test_reader_crash_on_one_file_is_reported_and_the_run_goes_on(tmp_path: Path, monkeypatch):
    """A bug in detection (or a reader) on one file lists that file as unreadable, with the
    error, instead of losing every other file's states."""
    ingest_mod = importlib.import_module("composer_replication.traces.ingest")
    logs = tmp_path / "logs"
    logs.mkdir()
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    (logs / "a.jsonl").write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    (logs / "b.jsonl").write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    real = ingest_mod.sniff

    def flaky(path: Path):
        if path.name == "a.jsonl":
            raise TypeError("boom")
        return real(path)

    monkeypatch.setattr(ingest_mod, "sniff", flaky)
    run = ingest([logs])
    assert len(list(run)) == 1
    assert "TypeError: boom" in run.report.unreadable[str(logs / "a.jsonl")]


def test_a_reader_failing_part_way_keeps_its_states_and_accounts_for_every_line(
    tmp_path: Path, monkeypatch
):
    """A reader that fails after its second state of a three-line file: the two states it gave
    are kept and said to be kept ("partially read", not "skipped"), and the line it never
    reached is counted as skipped (reader_failed), so the line balance holds."""
    ingest_mod = importlib.import_module("composer_replication.traces.ingest")
    real = ingest_mod.READERS["openai_messages"]

    def flaky(ctx):
        inner = real(ctx)
        try:
            for i, state in enumerate(inner):
                yield state
                if i == 1:
                    raise KeyError("boom")  # a bug in the reader on some odd record
        finally:
            inner.close()

    monkeypatch.setitem(ingest_mod.READERS, "openai_messages", flaky)
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    log = tmp_path / "a.jsonl"
    log.write_bytes(b"".join(orjson.dumps({"messages": msgs}) + b"\n" for _ in range(3)))
    run = ingest([log], format="openai_messages")
    assert len(list(run)) == 2
    rep = run.report.files[0]
    assert rep.balanced and rep.total_lines == 3 and rep.skipped_by_reason["reader_failed"] == 1
    assert run.report.unreadable[str(log)].startswith("partially read: 2 states kept, then")


def test_an_earlier_states_file_in_an_input_directory_is_not_read_as_a_log(tmp_path: Path):
    """Ingest output under another name than this run's --out was read as an OpenAI-messages
    log (every line skipped as not a message); it is listed as not an agent log."""
    logs = tmp_path / "logs"
    logs.mkdir()
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}] * 2
    (logs / "a.jsonl").write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    states = list(ingest([logs]))
    (logs / "old_states.jsonl").write_bytes(b"".join(s.to_json() + b"\n" for s in states))
    run = ingest([logs])
    assert len(list(run)) == len(states) == 2
    assert run.report.not_traces == [str(logs / "old_states.jsonl")]
    assert [f.path for f in run.report.files] == [str(logs / "a.jsonl")]


def _calls_answered_in_order(prefix: list[dict]) -> bool:
    """Every assistant tool call is followed by exactly one tool message for its id."""
    for i, m in enumerate(prefix):
        ids = [c["id"] for c in m.get("tool_calls") or []]
        after = [x.get("tool_call_id") for x in prefix[i + 1 : i + 1 + len(ids)]]
        if ids and (len(set(ids)) != len(ids) or after != ids):
            return False
    return True


def test_repeated_tool_call_ids_in_one_action_keep_the_prefix_valid(tmp_path: Path) -> None:
    """Two calls ``T1`` in one assistant message (then two ``T1`` results) used to give a prefix
    with two ``T1`` calls and one tool message; the copy is renamed ``T1#2``, gets the second
    result, and is reported."""
    call = {"type": "function", "function": {"name": "bash", "arguments": "{}"}}
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "T1", **call}] * 2},
        {"role": "tool", "tool_call_id": "T1", "content": "one"},
        {"role": "tool", "tool_call_id": "T1", "content": "two"},
        {"role": "assistant", "content": "done"},
    ]
    log = tmp_path / "chat.jsonl"
    log.write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    run = ingest([log])
    last = list(run)[-1]
    assert _calls_answered_in_order(last.prefix)
    assert [m.get("content") for m in last.prefix[2:4]] == ["one", "two"]
    assert run.report.orphans() == {"duplicate_tool_call_id": 1}
