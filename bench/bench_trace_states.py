"""Reading long agent sessions: states that copy their prefix (before) against states that share
their session's messages (`traces.schema.PrefixView`, now), in the same run.

    PYTHONPATH=src python bench/bench_trace_states.py [--sizes 2000,5000,10000,20000]
        [--formats claude_code,codex,gemini_cli] [--modes stream,keep,json,ser] [--json-max 5000]
        [--old-keep-max 10000] [--reps 1]

One synthetic session per format and size (``--sizes``: turns), made of the record shapes of
tests/support/hostile_logs.py: Claude Code (user text, an answer with one tool call, its
result), Codex (user message, function call, its output, assistant message), Gemini CLI JSONL
(user message, a ``gemini`` message with one tool call and its result). Each cell runs in a
fresh subprocess, the two variants interleaved (old first, then new first, ...):

- ``stream``: iterate every state and drop it (``for s in ingest(...)``);
- ``keep``: ``list(ingest(...))``: every state held at once (the old variant only up to
  ``--old-keep-max`` turns: a Codex session of 20,000 turns would hold about 13 GB of copies);
- ``json``: ``s.to_json()`` of every state (what ``composer-replication ingest --out`` does;
  its output is O(n^2) bytes by design, so only up to ``--json-max`` turns);
- ``ser``: ``s.to_json()`` of every state of ``list(ingest(...))``, timed alone (serialization
  from a view against serialization of a held copy; up to ``--json-max`` turns too).

Printed per cell: process CPU seconds of the read, peak RSS growth over the subprocess's RSS
before the read (``VmHWM`` of /proc/self/status, Linux: unlike ``ru_maxrss`` it starts afresh
at exec, not at the parent's size), and old/new ratios. "old" is the product with
``_base.PrefixView`` replaced by a copy (``messages[:n]``, what ``SessionBuilder.flush`` did
before); it exists only inside this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]  # the package; tests/support shapes

from support.hostile_logs import _cx, _cx_call, _cx_msg, _cx_out, _gm, cc_answer, cc_result, cc_user  # noqa: E402, I001


def claude_code(turns: int) -> list[dict]:
    recs, parent = [], None
    for i in range(turns):
        recs += [cc_user(f"u{i}", parent, f"question {i}"),
                 cc_answer(f"a{i}", f"u{i}", f"m{i}", (f"toolu_{i}",)),
                 cc_result(f"r{i}", f"a{i}", f"toolu_{i}")]  # fmt: skip
        parent = f"r{i}"
    return recs


def codex(turns: int) -> list[dict]:
    recs = [_cx("session_meta", {"id": "S"})]
    for i in range(turns):
        recs += [_cx_msg("user", f"question {i}"), _cx_call(f"c{i}"), _cx_out(f"c{i}"),
                 _cx_msg("assistant", "done")]  # fmt: skip
    return recs


def gemini_cli(turns: int) -> list[dict]:
    recs = [{"sessionId": "G", "projectHash": "h", "startTime": "2026-01-01T00:00:00Z"}]
    for i in range(turns):
        recs += [{"id": f"u{i}", "type": "user", "content": [{"text": f"question {i}"}]},
                 _gm(i, (f"c{i}",))]  # fmt: skip
    return recs


SESSIONS = {"claude_code": claude_code, "codex": codex, "gemini_cli": gemini_cli}


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def child(path: str, fmt: str, mode: str, variant: str) -> None:
    """One cell, in its own process: print a JSON line."""
    from composer_replication.traces import _base, ingest

    if variant == "old":  # every state copies its prefix, as SessionBuilder.flush did
        _base.PrefixView = lambda messages, n: messages[:n]  # type: ignore[assignment]
    before = peak_rss_mb()
    start = time.process_time()
    states = out_bytes = 0
    if mode in ("keep", "ser"):
        kept = list(ingest([path], fmt))
        states = len(kept)
        if mode == "ser":
            start = time.process_time()
            out_bytes = sum(len(s.to_json()) for s in kept)
    else:
        for s in ingest([path], fmt):
            states += 1
            if mode == "json":
                out_bytes += len(s.to_json())
    cpu = time.process_time() - start
    print(json.dumps({"cpu_s": cpu, "peak_mb": peak_rss_mb() - before, "states": states,
                      "out_mb": out_bytes / 2**20}))  # fmt: skip


def run_cell(path: Path, fmt: str, mode: str, variant: str) -> dict:
    cmd = [sys.executable, __file__, "--child", str(path), fmt, mode, variant]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2000,5000,10000,20000")
    ap.add_argument("--formats", default=",".join(SESSIONS))
    ap.add_argument("--modes", default="stream,keep,json,ser")
    ap.add_argument("--json-max", type=int, default=5000)
    ap.add_argument("--old-keep-max", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--child", nargs=4, metavar=("PATH", "FORMAT", "MODE", "VARIANT"))
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"{'format':<12} {'turns':>6} {'mode':<6} {'states':>7} {'cpu old':>8} {'cpu new':>8} "
          f"{'ratio':>6} {'MB old':>8} {'MB new':>8} {'ratio':>6} {'json MB':>8}")  # fmt: skip
    flip = False
    with tempfile.TemporaryDirectory() as tmp:
        for turns in sizes:
            for fmt in args.formats.split(","):
                path = Path(tmp) / f"{fmt}-{turns}.jsonl"
                path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in SESSIONS[fmt](turns)))
                for mode in args.modes.split(","):
                    if mode in ("json", "ser") and turns > args.json_max:
                        continue
                    variants = ["old", "new"]
                    if mode == "keep" and turns > args.old_keep_max:
                        variants = ["new"]
                    got: dict[str, list[dict]] = {v: [] for v in variants}
                    for _ in range(args.reps):
                        flip = not flip
                        for variant in variants[::-1] if flip else variants:
                            got[variant].append(run_cell(path, fmt, mode, variant))
                    med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                           for v, rs in got.items()}  # fmt: skip
                    n = med["new"]
                    o = med.get("old", {k: float("nan") for k in n})
                    if "old" in med:
                        assert o["states"] == n["states"] and o["out_mb"] == n["out_mb"]
                    print(f"{fmt:<12} {turns:>6} {mode:<6} {int(n['states']):>7} "
                          f"{o['cpu_s']:>8.2f} {n['cpu_s']:>8.2f} "
                          f"{o['cpu_s'] / max(n['cpu_s'], 1e-3):>6.1f} "
                          f"{o['peak_mb']:>8.1f} {n['peak_mb']:>8.1f} "
                          f"{o['peak_mb'] / max(n['peak_mb'], 0.1):>6.1f} "
                          f"{n['out_mb']:>8.0f}", flush=True)  # fmt: skip
                path.unlink()


if __name__ == "__main__":
    main()
