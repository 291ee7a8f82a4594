"""`replay` and `pairs` commands through typer's CliRunner on a small app of our own."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer
import yaml
from support.scripted_openai import synthetic_states as make_states
from typer.testing import CliRunner

from composer_replication.cli.common import BUDGET_EXHAUSTED
from composer_replication.cli.replay import pairs_command, replay_command, serve_command

app = typer.Typer()
app.command("replay")(replay_command)
app.command("pairs")(pairs_command)
app.command("serve")(serve_command)
runner = CliRunner()


def _flat(out: str) -> str:
    return " ".join(out.split())


def _files(tmp_path, url: str, n: int = 5):
    sfile = tmp_path / "states.jsonl"
    sfile.write_bytes(b"".join(s.to_json() + b"\n" for s in make_states(n)))
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({"teachers": [
        {"name": f"t{i}", "base_url": url, "model": "same", "max_tokens": 8,
         "price_in_per_mtok": 1.0, "price_out_per_mtok": 2.0} for i in range(2)
    ]}))  # fmt: skip
    return sfile, pool


def test_replay_then_pairs(scripted, tmp_path):
    _, url = scripted
    sfile, pool = _files(tmp_path, url)
    db = tmp_path / "r.db"
    args = ["replay", str(sfile), "--teachers", str(pool), "--budget-usd", "1", "--out", str(db)]
    r = runner.invoke(app, [*args, "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "states: 5 total, 5 completed" in _flat(r.output)
    r = runner.invoke(app, [*args, "--no-progress"])
    assert "calls: 0 sent" in _flat(r.output) and "10 from journal" in _flat(r.output)
    r = runner.invoke(app, ["pairs", str(db), "--out", str(tmp_path / "p"), "--no-embeddings"])
    assert r.exit_code == 0, r.output
    assert "5 pairs ->" in _flat(r.output)
    assert len((tmp_path / "p" / "pairs.jsonl").read_text().splitlines()) == 5


def test_budget_stop_is_clean_and_says_what_remains(scripted, tmp_path):
    _, url = scripted
    sfile, pool = _files(tmp_path, url, n=20)
    r = runner.invoke(app, ["replay", str(sfile), "--teachers", str(pool), "--budget-usd",
                            "0.002", "--out", str(tmp_path / "r.db"), "--no-progress"])  # fmt: skip
    out = _flat(r.output)
    assert r.exit_code == BUDGET_EXHAUSTED == 3, r.output
    assert "budget exhausted: stopped cleanly" in out and "states remain" in out


def test_bad_inputs_name_the_file_and_field(tmp_path):
    sfile, pool = _files(tmp_path, "http://127.0.0.1:9/v1")
    bad_pool = tmp_path / "bad.yaml"
    bad_pool.write_text(
        "teachers:\n  - {name: a, base_url: http://x/v1, model: m, max_tokens: 0}\n"
    )
    r = runner.invoke(app, ["replay", str(sfile), "--teachers", str(bad_pool), "--budget-usd",
                            "1", "--out", str(tmp_path / "r.db")])  # fmt: skip
    assert r.exit_code == 2 and "teachers.0.max_tokens" in _flat(r.output)
    bad_states = tmp_path / "bad.jsonl"
    bad_states.write_bytes(sfile.read_bytes() + b'{"state_id": "x"}\n')
    r = runner.invoke(app, ["replay", str(bad_states), "--teachers", str(pool), "--budget-usd",
                            "1", "--out", str(tmp_path / "r.db")])  # fmt: skip
    assert r.exit_code == 2 and "bad.jsonl:6: not a TraceState" in r.output.replace("\n", "")
    r = runner.invoke(app, ["pairs", str(tmp_path / "nope.db"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "replay journal not found" in _flat(r.output)
    r = runner.invoke(app, ["serve", "--model", str(tmp_path / "nomodel.gguf"), "--port", "1"])
    assert r.exit_code == 2 and "GGUF file not found" in _flat(r.output)


def test_badly_typed_state_is_bad_input_before_anything_is_journaled(tmp_path):
    sfile, pool = _files(tmp_path, "http://127.0.0.1:9/v1", n=3)
    lines = sfile.read_bytes().splitlines()
    bad = orjson.loads(lines[1])
    bad["prefix"][1] = 5
    sfile.write_bytes(b"\n".join([lines[0], orjson.dumps(bad), lines[2]]) + b"\n")
    db = tmp_path / "r.db"
    r = runner.invoke(app, ["replay", str(sfile), "--teachers", str(pool), "--budget-usd", "1",
                            "--out", str(db), "--no-progress"])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert f"{sfile}:2: not a TraceState: field prefix[1]: expected an object" in _flat(r.output)
    assert not db.exists()


def test_journal_that_is_not_a_database_or_is_damaged_is_bad_input(scripted, tmp_path):
    """--out naming a text file, and `pairs` on a torn journal: exit 2 naming the file (they
    were tracebacks: file is not a database / database disk image is malformed)."""
    _, url = scripted
    sfile, pool = _files(tmp_path, url, n=40)
    r = runner.invoke(app, ["replay", str(sfile), "--teachers", str(pool), "--budget-usd", "1",
                            "--out", str(sfile), "--no-progress"])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert f"{sfile}: not a replay journal, or a damaged one" in _flat(r.output)
    db = tmp_path / "r.db"
    r = runner.invoke(app, ["replay", str(sfile), "--teachers", str(pool), "--budget-usd", "1",
                            "--out", str(db), "--no-progress"])  # fmt: skip
    assert r.exit_code == 0, r.output
    torn = tmp_path / "torn.db"
    data = db.read_bytes()
    torn.write_bytes(data[: len(data) // 2])  # a copy cut short (no -wal: checkpointed on close)
    r = runner.invoke(app, ["pairs", str(torn), "--out", str(tmp_path / "p"), "--no-embeddings"])
    assert r.exit_code == 2, r.output
    assert str(torn) in _flat(r.output) and "journal" in r.output


def test_serve_on_a_port_in_use_is_one_line_before_the_model_loads(monkeypatch):
    """Before, serve loaded the model, printed the pool entry as if it were up, then uvicorn
    logged 'address already in use' and exited 3 (the replay's budget code). The port is now
    bound first; an unknown host is refused the same way."""
    import socket

    import composer_replication.teachers.local_model as local_model

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the port was bound")

    monkeypatch.setattr(local_model.LocalChatModel, "__init__", loaded)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = runner.invoke(app, ["serve", "--model", "embedded:smollm2-135m-instruct",
                                "--port", str(port)])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert _flat(r.output).startswith(f"error: --host 127.0.0.1 --port {port}: cannot listen")
    assert "teacher pool entry" not in r.output
    r = runner.invoke(app, ["serve", "--model", "embedded:smollm2-135m-instruct",
                            "--host", "no-such-host.invalid"])  # fmt: skip
    assert r.exit_code == 2 and "--host no-such-host.invalid --port 8000" in _flat(r.output)


def test_a_states_path_that_is_a_directory_or_fifo_is_named_as_such(tmp_path):
    """Both were reported as 'states file not found', though the path exists."""
    import os

    _, pool = _files(tmp_path, "http://127.0.0.1:9/v1", n=1)
    os.mkfifo(tmp_path / "fifo.jsonl")
    for path, what in (
        (tmp_path, "is a directory"),
        (tmp_path / "fifo.jsonl", "not a regular file"),
    ):
        r = runner.invoke(app, ["replay", str(path), "--teachers", str(pool), "--budget-usd", "1",
                                "--out", str(tmp_path / "r.db")])  # fmt: skip
        assert r.exit_code == 2 and _flat(r.output) == f"error: states file {path}: {what}"
        assert not (tmp_path / "r.db").exists()


def _replayed_once(scripted, tmp_path: Path) -> tuple[Path, Path, list[str], int]:
    """Three states replayed into a journal: (states file, journal, the command's args, the
    number of calls journaled)."""
    from composer_replication.replay.journal import Journal

    _, url = scripted
    sfile, pool = _files(tmp_path, url, n=3)
    db = tmp_path / "r.db"
    args = ["replay", str(sfile), "--teachers", str(pool), "--budget-usd", "1", "--out", str(db),
            "--no-progress"]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    with Journal(db) as jr:
        return sfile, db, args, len(list(jr.calls()))


def test_a_state_changed_since_it_was_journaled_is_refused(scripted, tmp_path):
    """The states file was re-ingested (its agent's action, or a redaction, changed) and
    replayed into the same journal: the journal kept the old state (INSERT OR IGNORE) while new
    answers were asked for the new one, so ``pairs`` paired them with the old prompt and
    action. Now the replay stops before any call, naming the state."""
    from composer_replication.replay.journal import Journal

    sfile, db, args, calls_before = _replayed_once(scripted, tmp_path)
    lines = sfile.read_bytes().splitlines()
    changed = orjson.loads(lines[1])
    changed["action"]["text"] = "something else the agent did"
    sfile.write_bytes(b"\n".join([lines[0], orjson.dumps(changed), lines[2]]) + b"\n")
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert _flat(r.output).startswith(
        f"error: {db.resolve()}: already holds state {changed['state_id']!r} with other content"
    )
    with Journal(db) as jr:
        assert len(list(jr.calls())) == calls_before


def test_the_same_states_ingested_from_another_path_go_on_paying_nothing_twice(scripted, tmp_path):
    """``ingest logs`` then ``ingest /abs/logs`` (or the logs moved): the same states, the same
    ids, only ``meta.file`` (where they were read) differs. Replaying the new file into the
    journal goes on and asks nothing again, as before the re-made-states check."""
    from composer_replication.replay.journal import Journal

    sfile, db, args, calls_before = _replayed_once(scripted, tmp_path)
    moved = [orjson.loads(line) for line in sfile.read_bytes().splitlines()]
    for state in moved:
        state["meta"]["file"] = "/elsewhere/" + state["meta"]["file"]
    sfile.write_bytes(b"".join(orjson.dumps(s) + b"\n" for s in moved))
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    with Journal(db) as jr:
        assert len(list(jr.calls())) == calls_before


def test_serve_help_names_the_distillation_endpoints():
    """A user looking for a remote distillation teacher finds it in ``serve --help``: the
    scoring endpoint (vLLM's ``prompt_logprobs``) and the tokenizer fingerprint."""
    out = " ".join(CliRunner().invoke(app, ["serve", "--help"]).output.split())
    assert "/v1/completions with vLLM's prompt_logprobs (distill)" in out
    assert "/v1/tokenizer" in out


def test_replay_skips_incomplete_states_unless_asked() -> None:
    """Issue 57: states whose context the log could not give back are not replayed by
    default."""
    from support.scripted_openai import synthetic_states

    from composer_replication.cli.replay import complete_states

    states = synthetic_states(3)
    states[0].meta.context_complete = False
    assert [s.state_id for s in complete_states(states, False)] == [s.state_id for s in states[1:]]
    assert complete_states(states, True) == states
