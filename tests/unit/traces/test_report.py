"""How sure ingestion is: per file, the format, the records understood out of the total and
the states; the checks that make ``ingest`` exit 1 (issue 57, class 9)."""

from __future__ import annotations

from pathlib import Path

from composer_replication.traces import ingest

CASES = Path(__file__).parents[2] / "fixtures" / "trace_cases"
EXPORT = CASES / "other" / "agent_sessions_export.jsonl"


def test_file_not_understood_fails_the_check() -> None:
    run = ingest([EXPORT])
    assert list(run) == []
    rep = run.report.files[0]
    assert rep.records == 24
    failures = run.report.check_failures()
    assert len(failures) == 1 and str(EXPORT) in failures[0]


def test_understood_files_pass_and_report_records() -> None:
    run = ingest([CASES / "codex" / "rollback.jsonl"])
    list(run)
    rep = run.report.files[0]
    assert (rep.records_understood, rep.records, rep.states) == (10, 10, 3)
    assert run.report.check_failures() == []


def test_few_records_understood_fails_even_with_states(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    good = (CASES / "claude_code" / "result_before_call.jsonl").read_text()
    log.write_text(good + "not json\n" * 6)
    run = ingest([log], "claude_code")
    assert len(list(run)) == 2
    (failure,) = run.report.check_failures()
    assert "5 of 11 records understood" in failure


def test_directory_with_nothing_readable_fails(tmp_path: Path) -> None:
    (tmp_path / "notes.json").write_text('{"a": 1}')
    run = ingest([tmp_path])
    list(run)
    assert run.report.check_failures() == [f"nothing readable in {tmp_path}"]
