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
    assert res.exit_code == 0, res.output
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
