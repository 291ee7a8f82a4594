"""Gemini CLI ``--output-format stream-json`` (issue 57, class 6)."""

from __future__ import annotations

from pathlib import Path

from composer_replication.traces import ingest
from composer_replication.traces.detect import sniff

STREAM = Path(__file__).parents[2] / "fixtures" / "trace_cases" / "gemini_cli" / "stream.jsonl"


def test_stream_json_is_detected_as_gemini_cli() -> None:
    assert sniff(STREAM) == "gemini_cli"


def test_stream_json_deltas_tools_and_runs() -> None:
    run = ingest([STREAM])
    states = list(run)
    rep = run.report.files[0]
    assert rep.format == "gemini_cli"
    assert [s.session_id for s in states] == [
        "5b9e0c1e-0000-4000-8000-000000000001"
    ] * 3 + ["5b9e0c1e-0000-4000-8000-000000000002"]  # fmt: skip
    first, edit, final, hi = states
    assert first.action.text == "I'll look at the test first."  # deltas joined as streamed
    assert [c["id"] for c in first.action.tool_calls] == ["read_file-1-a", "read_file-1-b"]
    assert first.meta.model == "gemini-2.5-pro"
    assert [c["function"]["name"] for c in edit.action.tool_calls] == ["replace"]
    assert [m["role"] for m in edit.prefix] == ["user", "assistant", "tool", "tool"]
    assert final.prefix[-1]["content"].startswith("[error]")
    assert final.action.text == "The edit failed; please check a.py."
    assert hi.action.text == "Hi!" and hi.prefix == [{"role": "user", "content": "Say hi"}]
    assert rep.parsed == rep.total_lines and not rep.orphans


def test_stream_json_saved_as_json_is_read_as_a_stream(tmp_path: Path) -> None:
    saved = tmp_path / "run.json"
    saved.write_bytes(STREAM.read_bytes())
    run = ingest([saved])
    assert len(list(run)) == 4 and run.report.files[0].format == "gemini_cli"
