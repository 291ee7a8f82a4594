"""`composer-replication tasks generate` through the installed console script (the way users
run it: sys.path[0] is then the interpreter's bin directory), on the vendored fixture."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

FIXTURE = Path(__file__).parents[2] / "fixtures" / "feature_deletion" / "textkit"


def test_tasks_generate_console_script(tmp_path):
    exe = shutil.which("composer-replication")
    assert exe, "the package's console script is not installed"
    cmd = [exe, "tasks", "generate", str(FIXTURE), "--out", str(tmp_path), "--workers", "2",
           "--suite-timeout-s", "30"]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    tasks = (tmp_path / "textkit-local" / "tasks.jsonl").read_text().splitlines()
    assert len(tasks) == 9 and json.loads(tasks[0])["failing_tests"]
    assert "task 9" in first.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "task 9" in again.stdout
    bad = subprocess.run([exe, "tasks", "generate", "toolz>=1", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "neither a directory nor a pinned package" in bad.stderr


def test_ctrl_c_stops_generation_and_keeps_the_candidates_tried(tmp_path):
    """SIGINT after the first candidate: the queued candidates are dropped (the pool used to
    run them all before Ctrl-C took effect), exit 130 with one line naming runs.jsonl, which
    keeps what finished; a re-run continues from it."""
    from support.cli_process import group_alive, interrupt, read_until, start_cli

    proc = start_cli(["tasks", "generate", str(FIXTURE), "--out", str(tmp_path), "--workers",
                      "1", "--suite-timeout-s", "60"])  # fmt: skip
    # plain progress lines off a terminal, at most about one a second: two candidates done
    # within one interval print as one line (0/9, then 2/9), so wait for the first past 0
    started = re.compile(r"\s[1-8]/9\s")
    said = read_until(proc, lambda lines: bool(started.search(lines[-1])))
    assert started.search(said[-1]), "\n".join(said)
    rest, seconds = interrupt(proc, timeout_s=120)
    runs = tmp_path / "textkit-local" / "runs.jsonl"
    assert proc.returncode == 130 and f"interrupted: the candidates tried so far are in {runs}" in (
        " ".join(rest.split())
    ), rest
    assert not group_alive(proc.pid)
    assert 1 <= len(runs.read_text().splitlines()) < 9
    print(f"tasks generate exited {seconds:.1f} s after SIGINT")
