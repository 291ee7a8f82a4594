"""bench/bench_packed_windows.py's table: medians, ratios packed / prefix, and a variant the
kernel killed (the packed forward runs out of memory first) named as such, without a ratio."""

import sys
from argparse import Namespace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import bench_packed_windows  # noqa: E402 - bench/bench_packed_windows.py

ARGS = Namespace(rows=8, summarized=3, threads=2)


def run(variant, times, peak):
    return {"variant": variant, "times": times, "tokens": 100, "peak_mb": peak}


def test_ratios_are_of_the_medians():
    results = {
        "packed": [run("packed", [4.0, 6.0], 900.0), run("packed", [5.0, 9.0], 1100.0)],
        "prefix": [run("prefix", [1.0, 2.0], 500.0), run("prefix", [1.0, 3.0], 500.0)],
        "prefix_checkpointed": [run("prefix_checkpointed", [2.5, 2.5], 400.0)],
    }
    text = bench_packed_windows.table(ARGS, results, {})
    assert "| packed | 5.50 | 1000 |" in text  # median of 4, 6, 5, 9; of 900, 1100
    assert "| **ratio packed / prefix** | **3.67x** | **2.00x** |" in text  # 5.5 / 1.5
    assert "| **ratio packed / prefix_checkpointed** | **2.20x** | **2.50x** |" in text


def test_a_killed_variant_is_named_and_has_no_ratio():
    results = {"packed": [], "prefix": [run("prefix", [1.0], 500.0)], "prefix_checkpointed": []}
    text = bench_packed_windows.table(ARGS, results, {"packed": 9, "prefix_checkpointed": 9})
    assert "| packed | killed by signal 9 (SIGKILL: out of memory, as a rule) | - |" in text
    assert "| prefix | 1.00 | 500 |" in text and "ratio" not in text
