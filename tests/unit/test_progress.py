"""Progress off a terminal: plain lines with counts, elapsed time and ETA."""

import io

from rich.console import Console

from composer_replication.progress import duration, eta, plain_progress, progress_bar


def test_duration_and_eta_read_as_a_person_reads_them():
    assert [duration(s) for s in (0.4, 42, 425, 7380)] == ["0 s", "42 s", "7m 05s", "2h 03m"]
    assert eta(10.0, 2, 10) == "ETA 40 s"  # 5 s per unit, 8 to go
    assert eta(10.0, 0, 10) == eta(10.0, 3, None) == ""  # no pace yet / no total


def test_plain_progress_prints_each_chunk_and_always_the_last():
    lines: list[str] = []
    advance = plain_progress(lines.append, "eval base", 8, every_s=0)
    advance(4)
    advance(4)
    assert [line.split("  ")[:2] for line in lines] == [["eval base", "4/8"], ["eval base", "8/8"]]
    assert lines[0].split("  ")[3].startswith("ETA ")

    lines.clear()
    advance = plain_progress(lines.append, "replay", 100, every_s=3600)
    for _ in range(100):
        advance()
    assert [line.split("  ")[1] for line in lines] == ["1/100", "100/100"]  # rate-limited


def test_progress_bar_off_a_terminal_writes_lines_not_a_live_bar():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=30)  # lines longer: never wrapped
    with progress_bar(console, "eval trained", 2) as advance:
        advance(1, description="eval trained (level 2)")
        advance(1)
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[:2] for line in lines] == [
        ["eval trained (level 2)", "1/2"],
        ["eval trained (level 2)", "2/2"],
    ]
