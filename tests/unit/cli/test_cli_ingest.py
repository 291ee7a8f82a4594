from __future__ import annotations

from pathlib import Path

import orjson
import typer
from typer.testing import CliRunner

from composer_replication.cli.ingest import ingest_command
from composer_replication.traces import TraceState

app = typer.Typer()
app.command("ingest")(ingest_command)


@app.command("noop")
def _noop() -> None:  # a second command keeps typer in sub-command mode, as in the real CLI
    pass


def test_cli_ingests_fixture_tree_and_accounts_for_every_line(fixtures_dir: Path, tmp_path: Path):
    out = tmp_path / "states.jsonl"
    res = CliRunner().invoke(app, ["ingest", str(fixtures_dir), "--out", str(out)])
    # the check fails on the files meant to be broken or empty of decisions (issue 57's rules:
    # fewer than half the records understood; 20 records or more and no state), and only there
    assert res.exit_code == 1, res.output
    failed = [ln for ln in res.output.splitlines() if ln.startswith("check failed: ")]
    allowed = ("malformed.jsonl", "zen-mcp-server/.aider.chat.history.md")
    assert failed and all(any(a in ln for a in allowed) for ln in failed), failed
    assert "(ok)" in res.output and "redactions by type" in res.output
    lines = out.read_bytes().splitlines()
    total = next(ln for ln in res.output.splitlines() if ln.startswith("lines: total"))
    assert len(lines) > 60  # 73 on the vendored subset, 300+ on ../shared/fixtures
    states = [TraceState.from_json(ln) for ln in lines]
    assert len({s.state_id for s in states}) == len(states)
    nums = [int(w) for w in total.replace("(", " ").split() if w.isdigit()]
    assert nums[0] == nums[1] + nums[2]  # total = parsed + skipped


def test_cli_unknown_format_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"a": 1}')
    out = tmp_path / "o.jsonl"
    res = CliRunner().invoke(app, ["ingest", str(bad), "--out", str(out)])
    assert res.exit_code == 2
    assert "x.json" in res.output and not out.exists()


def test_cli_forced_format(tmp_path: Path) -> None:
    log = tmp_path / "chat.jsonl"
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    log.write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    out = tmp_path / "o.jsonl"
    res = CliRunner().invoke(
        app, ["ingest", str(log), "--out", str(out), "--format", "openai_messages"]
    )
    assert res.exit_code == 0, res.output
    (state,) = [TraceState.from_json(x) for x in out.read_bytes().splitlines()]
    assert state.prefix == [msgs[0]] and state.action.text == "4"


CASES = Path(__file__).parents[2] / "fixtures" / "trace_cases"


def test_cli_exits_1_on_a_file_not_understood_and_keeps_the_others(tmp_path: Path) -> None:
    """Issue 57, class 9: an event export read as chat messages gave 0 states and "(ok)"."""
    out = tmp_path / "o.jsonl"
    good = CASES / "codex" / "rollback.jsonl"
    bad = CASES / "other" / "agent_sessions_export.jsonl"
    res = CliRunner().invoke(app, ["ingest", str(good), str(bad), "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert "check failed" in res.output and "agent_sessions_export.jsonl" in res.output
    assert "0 of 24 records understood" in res.output
    assert len(out.read_bytes().splitlines()) == 3  # the understood file's states are written


def test_cli_reports_format_records_and_states_per_file(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    res = CliRunner().invoke(
        app, ["ingest", str(CASES / "gemini_cli" / "stream.jsonl"), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "stream.jsonl: gemini_cli, 19/19 records understood, 4 states" in res.output


def test_cli_exits_1_on_a_directory_with_nothing_readable(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    out = tmp_path / "o.jsonl"
    res = CliRunner().invoke(app, ["ingest", str(tmp_path / "in"), "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert out.exists()


def test_cli_names_the_session_that_wrote_the_most(tmp_path: Path) -> None:
    """Each state repeats its conversation so far: the summary says how much was written and
    which session wrote the most of it (the size grows as the square of a session's length)."""
    logs = []
    for name, turns in (("short", 3), ("long", 60)):
        recs = [{"sessionId": name, "projectHash": "h", "startTime": "2026-01-01T00:00:00Z"}]
        for i in range(turns):
            recs += [{"id": f"u{i}", "type": "user", "content": [{"text": f"q{i}"}]},
                     {"id": f"g{i}", "type": "gemini", "content": "x"}]  # fmt: skip
        logs.append(tmp_path / f"{name}.jsonl")
        logs[-1].write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    out = tmp_path / "o.jsonl"
    res = CliRunner().invoke(app, ["ingest", *map(str, logs), "--out", str(out)])
    assert res.exit_code == 0, res.output
    lines = out.read_bytes().splitlines(keepends=True)
    long = sum(len(ln) for ln in lines if TraceState.from_json(ln).session_id == "long")
    size = " ".join(res.output.split())  # rich may wrap the line
    assert f"wrote {len(b''.join(lines)) / 2**20:.1f} MB" in size
    assert f"the largest session, long ({logs[1]}), {long / 2**20:.1f} MB in 60 states" in size
