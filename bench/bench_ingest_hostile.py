"""Ingestion time of hostile log shapes at n and 4n records: the ratio shows the growth
(about 4 when linear, about 16 when quadratic), each shape against itself in the same run.

    PYTHONPATH=src python bench/bench_ingest_hostile.py [--n 4000] [--reps 3]

Shapes (issue 57 review): a Codex rollout of 10n ``web_search_begin`` events whose call never
comes; a Claude Code response of n parallel tool calls, each result written after its call;
the same with every call under one repeated id; Claude Code records whose parent never comes
(each waits in the 64-record window).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from composer_replication.traces import ingest


def _dump(recs: list[dict]) -> bytes:
    return b"\n".join(orjson.dumps(r) for r in recs) + b"\n"


def codex_searches(n: int) -> tuple[str, bytes]:
    recs = [{"type": "session_meta", "payload": {"id": "s"}}]
    recs += [{"type": "event_msg", "payload": {"type": "web_search_begin", "call_id": f"ws_{i}"}}
             for i in range(10 * n)]  # fmt: skip
    return "codex", _dump(recs)


def claude_parallel(n: int, same_id: bool = False) -> tuple[str, bytes]:
    recs = [{"type": "user", "sessionId": "s", "uuid": "u", "message": {"content": "go"}}]
    prev = "u"
    for i in range(n):
        cid = "T" if same_id else f"T{i}"
        block = {"type": "tool_use", "id": cid, "name": "Bash", "input": {}}
        result = {"type": "tool_result", "tool_use_id": cid, "content": "ok"}
        recs += [{"type": "assistant", "sessionId": "s", "uuid": f"a{i}", "parentUuid": prev,
                  "message": {"id": "m1", "content": [block]}},
                 {"type": "user", "sessionId": "s", "uuid": f"r{i}", "parentUuid": f"a{i}",
                  "message": {"content": [result]}}]  # fmt: skip
        prev = f"r{i}"
    return "claude_code", _dump(recs)


def claude_orphans(n: int) -> tuple[str, bytes]:
    recs = [{"type": "user", "sessionId": "s", "uuid": f"u{i}", "parentUuid": f"gone{i}",
             "message": {"content": "q"}} for i in range(n)]  # fmt: skip
    return "claude_code", _dump(recs)


SHAPES = {
    "codex web_search ids never called": codex_searches,
    "claude parallel calls": claude_parallel,
    "claude parallel calls, one repeated id": lambda n: claude_parallel(n, same_id=True),
    "claude orphans": claude_orphans,
}


def _time(path: Path, fmt: str) -> float:
    start = time.perf_counter()
    for _ in ingest([path], fmt):
        pass
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in SHAPES.items():
            paths = {}
            for n in (args.n, 4 * args.n):
                fmt, data = make(n)
                paths[n] = (Path(tmp) / f"{n}.jsonl", fmt)
                paths[n][0].write_bytes(data)
            times = {n: [] for n in paths}
            for _ in range(args.reps):  # interleaved rounds
                for n, (path, fmt) in paths.items():
                    times[n].append(_time(path, fmt))
            small, big = (statistics.median(times[n]) for n in paths)
            print(
                f"{name:42s} n={args.n}: {small:6.3f} s  4n: {big:6.3f} s  ratio {big / small:5.1f}"
            )


if __name__ == "__main__":
    main()
