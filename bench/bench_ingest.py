"""Ingestion throughput vs orjson parse-only on the same bytes, and peak memory vs file size.

    PYTHONPATH=src python bench/bench_ingest.py [--mb 40] [--reps 5]

1. Generates a Claude Code session log of about ``--mb`` MB shaped like real ones: one record
   per assistant content block (thinking, text, tool_use), tool results of 0.2-6 KB, a compaction
   every 40 turns (real long sessions are compacted, which bounds the live prefix), a few
   planted secrets.
2. Times, interleaved ``--reps`` times: (a) orjson parse-only (read lines + ``orjson.loads``),
   (b) ``ingest()`` iterating all TraceStates (parse, convert, redact, hash), (c) the same plus
   ``to_json()`` of every state, (d) for reference, (b) with redaction switched off. Prints
   medians, MB/s and the ratios to (a), by wall clock and by process CPU time (on a shared
   machine a preempted rep inflates wall time; CPU time is steadier).
3. Peak RSS of ``ingest()`` over files of size S and 10*S, each in a fresh subprocess.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

WORDS = (
    "the of and to in is for on that with as this file test function return value error "
    "import class def self data list dict path config model token update change fix run"
).split()


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _rec(kind: str, uuid: str, parent: str | None, message: dict, **kw) -> bytes:
    base = {
        "parentUuid": parent,
        "isSidechain": False,
        "userType": "external",
        "cwd": "/repo",
        "sessionId": "bench-session",
        "version": "2.1.0",
        "type": kind,
        "uuid": uuid,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "message": message,
    }
    base.update(kw)
    return orjson.dumps(base) + b"\n"


def generate(path: Path, target_bytes: int, seed: int = 0) -> int:
    """Write a Claude Code JSONL log of at least ``target_bytes``; returns its size."""
    rng = random.Random(seed)
    size, turn, parent = 0, 0, None
    with open(path, "wb") as fh:
        while size < target_bytes:
            turn += 1
            lines = []
            if turn % 40 == 0:
                lines.append(
                    orjson.dumps(
                        {
                            "type": "system",
                            "subtype": "compact_boundary",
                            "sessionId": "bench-session",
                            "uuid": f"cb{turn}",
                            "parentUuid": None,
                            "logicalParentUuid": parent,
                            "content": "Conversation compacted",
                        }
                    )
                    + b"\n"
                )
                summary = {"role": "user", "content": "Summary: " + _words(rng, 300)}
                lines.append(_rec("user", f"s{turn}", f"cb{turn}", summary, isCompactSummary=True))
                parent = f"s{turn}"
            prompt = _words(rng, rng.randint(10, 60))
            if turn % 97 == 0:
                prompt += " my key is sk-proj-" + "".join(rng.choices("abcdefXYZ0123", k=48))
            lines.append(_rec("user", f"u{turn}", parent, {"role": "user", "content": prompt}))
            mid = f"msg_{turn}"
            blocks = [
                {
                    "type": "thinking",
                    "thinking": _words(rng, rng.randint(20, 120)),
                    "signature": "x",
                },
                {"type": "text", "text": _words(rng, rng.randint(5, 40))},
                {
                    "type": "tool_use",
                    "id": f"toolu_{turn}",
                    "name": rng.choice(["Bash", "Read", "Edit"]),
                    "input": {"command": _words(rng, 8), "file_path": f"/repo/f{turn}.py"},
                },
            ]
            prev = f"u{turn}"
            for j, block in enumerate(blocks):
                msg = {"id": mid, "role": "assistant", "model": "claude-x", "content": [block]}
                lines.append(_rec("assistant", f"a{turn}_{j}", prev, msg))
                prev = f"a{turn}_{j}"
            output = "\n".join(_words(rng, 12) for _ in range(rng.randint(3, 80)))
            result = {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": output}
                ],
            }
            lines.append(_rec("user", f"r{turn}", prev, result, toolUseResult={"stdout": output}))
            parent = f"r{turn}"
            data = b"".join(lines)
            fh.write(data)
            size += len(data)
    return size


def parse_only(path: Path) -> int:
    n = 0
    with open(path, "rb") as fh:
        for raw in fh:
            orjson.loads(raw)
            n += 1
    return n


def ingest_only(path: Path) -> int:
    from composer_replication.traces import ingest

    return sum(1 for _ in ingest([path], format="claude_code"))


def ingest_unredacted(path: Path) -> int:
    """Reference row, not a product path: the same ingest with redaction switched off, to show
    how the remaining time splits between redaction and parsing/conversion/hashing."""
    from composer_replication.traces import Redactor, ingest

    class _Off(Redactor):
        def redact(self, text: str) -> str:
            return text

    return sum(1 for _ in ingest([path], format="claude_code", redactor=_Off()))


def ingest_and_serialize(path: Path) -> int:
    from composer_replication.traces import ingest

    return sum(len(s.to_json()) for s in ingest([path], format="claude_code"))


CHILD = """
import resource, sys, tracemalloc
from composer_replication.traces import ingest
import composer_replication.traces.claude_code, detect_secrets.plugins.aws  # imports done first
tracemalloc.start()
n = sum(1 for _ in ingest([sys.argv[1]], format="claude_code"))
peak_py = tracemalloc.get_traced_memory()[1]
print(n, peak_py // 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_memory(path: Path) -> tuple[int, int, int]:
    """(states, peak Python heap KB during ingest, peak RSS KB of the process)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=40.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mem-mb", type=float, default=8.0, help="size S for the memory check")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        big = Path(d) / "bench.jsonl"
        size = generate(big, int(args.mb * 2**20))
        mb = size / 2**20
        ingest_only(big)  # warm imports / page cache
        variants = {"orjson parse-only": parse_only, "ingest()": ingest_only}
        variants["ingest() + to_json"] = ingest_and_serialize
        variants["(ingest(), no redaction)"] = ingest_unredacted
        times: dict[str, list[float]] = {k: [] for k in variants}
        cpu: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.reps):  # interleaved: machine load swings hit all variants alike
            for name, fn in variants.items():
                t0, c0 = time.perf_counter(), time.process_time()
                fn(big)
                cpu[name].append(time.process_time() - c0)
                times[name].append(time.perf_counter() - t0)
        print(f"file: {mb:.1f} MB Claude Code JSONL, {args.reps} interleaved reps (median)")
        ref = statistics.median(times["orjson parse-only"])
        ref_cpu = statistics.median(cpu["orjson parse-only"])
        print(
            f"{'variant':26s} {'median s':>9s} {'MB/s':>8s} {'vs parse-only':>14s} {'(CPU time)':>11s}"
        )
        for name, ts in times.items():
            med, med_cpu = statistics.median(ts), statistics.median(cpu[name])
            print(
                f"{name:26s} {med:9.3f} {mb / med:8.1f} {ref / med:13.0%} {ref_cpu / med_cpu:11.0%}"
            )
        print(f"states: {ingest_only(big)}")

        small, large = Path(d) / "s.jsonl", Path(d) / "l.jsonl"
        s1 = generate(small, int(args.mem_mb * 2**20), seed=1)
        s2 = generate(large, int(args.mem_mb * 10 * 2**20), seed=1)
        print("\nmemory of ingest() in a fresh process per file")
        rows = []
        for p, s in ((small, s1), (large, s2)):
            n, heap, rss = peak_memory(p)
            rows.append((heap, rss))
            print(
                f"  {s / 2**20:7.1f} MB file: {n:6d} states, peak heap {heap} KB, peak RSS {rss} KB"
            )
        (h1, r1), (h2, r2) = rows
        print(
            f"  10x the file -> peak heap x{h2 / max(h1, 1):.2f}, peak RSS x{r2 / max(r1, 1):.2f}"
        )


if __name__ == "__main__":
    main()
