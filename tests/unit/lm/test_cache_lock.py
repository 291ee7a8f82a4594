"""Cache entries are filled by one process at a time (``lm.models.cache_entry_lock``): two
trainings, two ``ablate --arm`` processes or two test workers that need the same converted
model, unpacked sdist or task set never build or replace it at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from composer_replication.lm.models import cache_entry_lock

FILLER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from composer_replication.lm.models import cache_entry_lock
    entry = Path(sys.argv[1])
    with cache_entry_lock(entry):
        print("held", flush=True)
        time.sleep(1.0)
        entry.mkdir()
        (entry / "done").write_text("1")
    """
)


def test_a_second_process_waits_for_the_first_to_fill_the_entry(tmp_path: Path):
    entry = tmp_path / "cache" / "entry"
    filler = subprocess.Popen(
        [sys.executable, "-c", FILLER, str(entry)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert filler.stdout.readline().strip() == "held"
        assert not entry.exists()
        with cache_entry_lock(entry):
            # entered only once the other process had filled the entry and let go
            assert (entry / "done").read_text() == "1"
    finally:
        filler.wait(timeout=60)
    assert filler.returncode == 0


def test_the_lock_is_a_file_beside_the_entry_and_the_entry_itself_is_untouched(tmp_path: Path):
    entry = tmp_path / "a" / "b"
    with cache_entry_lock(entry):
        assert (tmp_path / "a" / ".b.lock").exists()
    assert not entry.exists()


def test_fill_once_fills_a_missing_entry_once_and_never_a_complete_one(tmp_path: Path):
    from composer_replication.lm.models import fill_once

    entry, calls = tmp_path / "entry", []

    def fill() -> None:
        calls.append(1)
        entry.mkdir()
        (entry / ".complete").write_text("x")

    fill_once(entry, entry / ".complete", fill)
    fill_once(entry, entry / ".complete", fill)
    assert calls == [1] and (entry / ".complete").read_text() == "x"
