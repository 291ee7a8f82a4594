"""`ingest` on directories that hold nothing or hostile entries (issue 18)."""

from __future__ import annotations

import os

import orjson
import typer
from typer.testing import CliRunner

from composer_replication.cli.ingest import ingest_command

app = typer.Typer()
app.command("ingest")(ingest_command)
app.command("other")(lambda: None)  # two commands: typer keeps the "ingest" subcommand name
runner = CliRunner()


def test_empty_directory_says_nothing_found_and_where(tmp_path):
    empty = tmp_path / "projects"
    empty.mkdir()
    out = tmp_path / "states.jsonl"
    r = runner.invoke(app, ["ingest", str(empty), "--out", str(out)])
    assert r.exit_code == 1, r.output  # issue 57: a directory with nothing readable fails
    assert "nothing found" in r.output and str(empty.resolve()) in r.output
    assert out.exists() and out.read_bytes() == b""


def test_fifo_symlink_loop_dangling_and_unreadable_are_skipped_and_reported(tmp_path):
    """A FIFO (would block forever if opened), a symlink loop, a dangling symlink, a file that
    fails while read and a mode-000 file (unreadable unless root) sit next to a real log: ingest
    finishes, reports each path, ingests the log."""
    src = tmp_path / "logs"
    src.mkdir()
    good = src / "good.jsonl"
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    good.write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    os.mkfifo(src / "fifo.jsonl")
    (src / "loop.jsonl").symlink_to(src / "loop.jsonl")
    (src / "dangling.jsonl").symlink_to(src / "missing.jsonl")
    locked = src / "locked.jsonl"
    locked.write_bytes(good.read_bytes())
    locked.chmod(0)
    # unreadable even for root: a regular file whose read fails (EIO at offset 0 of our own
    # address space), so the read-error path runs on every machine, as root or not
    (src / "mem.jsonl").symlink_to("/proc/self/mem")
    out = tmp_path / "states.jsonl"
    try:
        r = runner.invoke(
            app, ["ingest", str(src), "--out", str(out), "--format", "openai_messages"]
        )
    finally:
        locked.chmod(0o600)
    assert r.exit_code == 0, r.output
    for name in ["fifo.jsonl", "loop.jsonl", "dangling.jsonl", "mem.jsonl"] + (
        ["locked.jsonl"] if os.geteuid() != 0 else []
    ):
        assert f"skipped {src / name}:" in r.output, (name, r.output)
    assert b'"2+2?"' in out.read_bytes()  # the real log was ingested


def _log(path):
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    path.write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    return path.read_bytes()


def test_out_that_is_the_input_is_refused_and_the_log_kept(tmp_path):
    """``ingest X --out X`` (also through a symlink) used to overwrite the user's log."""
    log = tmp_path / "session.jsonl"
    before = _log(log)
    (tmp_path / "alias.jsonl").symlink_to(log)
    for out in (log, tmp_path / "alias.jsonl"):
        r = runner.invoke(app, ["ingest", str(log), "--out", str(out)])
        assert r.exit_code == 2, r.output
        assert "would overwrite the log it reads" in r.output
        assert log.read_bytes() == before


def test_out_naming_a_log_inside_an_input_directory_is_refused(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    before = _log(logs / "session.jsonl")
    r = runner.invoke(app, ["ingest", str(logs), "--out", str(logs / "session.jsonl")])
    assert r.exit_code == 2, r.output
    assert "inside the input directory" in r.output
    assert (logs / "session.jsonl").read_bytes() == before


def test_out_that_is_a_directory_is_a_clear_error(tmp_path):
    log = tmp_path / "session.jsonl"
    _log(log)
    (tmp_path / "outdir").mkdir()
    r = runner.invoke(app, ["ingest", str(log), "--out", str(tmp_path / "outdir")])
    assert r.exit_code == 2, r.output
    assert "is a directory" in r.output
    assert not (tmp_path / "outdir.partial").exists()


def test_rerun_with_out_inside_the_input_directory_does_not_read_its_own_output(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    _log(logs / "session.jsonl")
    out = logs / "states.jsonl"
    for _ in range(2):
        r = runner.invoke(app, ["ingest", str(logs), "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert len(out.read_bytes().splitlines()) == 1
        assert str(out) not in r.output.replace("\n", "")


def test_a_file_reached_twice_is_read_once(tmp_path):
    """A file named directly and found in its directory, a symlink to it and a directory
    given twice: its states are written once (twice, they would be replayed and paid twice)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _log(logs / "session.jsonl")
    (logs / "alias.jsonl").symlink_to(logs / "session.jsonl")
    out = tmp_path / "states.jsonl"
    args = ["ingest", str(logs), str(logs / "session.jsonl"), str(logs), "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert len(out.read_bytes().splitlines()) == 1
    assert "read once (given more than once)" in r.output


def test_bom_utf16_gzip_and_gz_files_are_read_or_reported(tmp_path):
    """A UTF-8 BOM no longer costs line 1 (nor rejects a .json document); UTF-16 or gzip bytes
    in a .jsonl file and a .jsonl.gz file in a directory are listed as unreadable, with why,
    instead of being skipped line by line (or ignored) with exit 0."""
    import gzip

    logs = tmp_path / "logs"
    logs.mkdir()
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    line = orjson.dumps({"messages": msgs}) + b"\n"
    (logs / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + line)
    (logs / "bom.json").write_bytes(b"\xef\xbb\xbf" + orjson.dumps(msgs))
    (logs / "utf16.jsonl").write_bytes(line.decode().encode("utf-16"))
    (logs / "zipped.jsonl").write_bytes(gzip.compress(line))
    (logs / "old.jsonl.gz").write_bytes(gzip.compress(line))
    out = tmp_path / "states.jsonl"
    r = runner.invoke(app, ["ingest", str(logs), "--out", str(out)])
    flat = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert len(out.read_bytes().splitlines()) == 2  # one state from each BOM file
    assert "skipped lines by reason: none" in flat
    assert f"skipped {logs / 'utf16.jsonl'}: UTF-16/32 text" in flat
    assert f"skipped {logs / 'zipped.jsonl'}: gzip-compressed" in flat
    assert f"skipped {logs / 'old.jsonl.gz'}: gzip-compressed" in flat
