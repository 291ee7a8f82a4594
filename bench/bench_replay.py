"""Replay throughput vs concurrency, the framework's own overhead per call, and the cached re-run.

    PYTHONPATH=src python bench/bench_replay.py [--reps 3] [--local-states 8] [--no-local]

Servers run in their own processes on 127.0.0.1:
- *scripted*: `support.scripted_openai` answering after a fixed 50 ms (a remote API's
  latency without its variance); shows how concurrency hides latency.
- *local*: `composer-replication serve` over the embedded SmolLM2-135M (max_tokens 8); one CPU
  model generates one request at a time, so concurrency mostly queues.

1. states/s for concurrency 1, 4, 16, 64 (scripted, 64 states) and 1, 2, 4 (local), one teacher,
   fresh journal each time; variants interleaved ``--reps`` times, medians.
2. Overhead per call: the same N requests through (a) a raw ``AsyncOpenAI`` client, sequential,
   and (b) `replay_trace` with concurrency 1 (journal, budget ledger, retries wrapper, progress
   off), against the 0 ms scripted server; (b - a) / N, interleaved, medians.
3. Cached re-run of a finished replay: wall time and requests the server saw (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]  # the package; tests/support harnesses
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")]),
    "HF_HUB_OFFLINE": "1",
}

from support.scripted_openai import synthetic_states  # noqa: E402

from composer_replication.config import RemoteTeacherConfig  # noqa: E402
from composer_replication.replay.journal import Journal  # noqa: E402
from composer_replication.replay.replay import replay_trace  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], ready_url: str, timeout: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(ready_url, timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"{cmd} did not become ready")


def stats(port: int) -> dict:
    return orjson.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats").read())


def spec(url: str, model: str, conc: int, max_tokens: int = 8) -> RemoteTeacherConfig:
    return RemoteTeacherConfig(name="t", base_url=url, model=model, max_tokens=max_tokens,
                       max_concurrency=conc, price_in_per_mtok=1.0, price_out_per_mtok=4.0,
                       timeout_s=300)  # fmt: skip


def timed_replay(states, sp: RemoteTeacherConfig, db: str | None = None) -> tuple[float, object]:
    t0 = time.perf_counter()
    with Journal(db or ":memory:") as jr:
        r = asyncio.run(replay_trace(states, [sp], journal=jr, budget_usd=100.0))
    return time.perf_counter() - t0, r


def raw_calls(url: str, model: str, states, max_tokens: int = 8) -> float:
    import openai

    async def go() -> None:
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        for s in states:
            await client.chat.completions.create(
                model=model, messages=s.prefix, max_tokens=max_tokens, temperature=0.0
            )
        await client.close()

    t0 = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - t0


def throughput(url: str, model: str, states, concs: list[int], reps: int) -> dict:
    """states/s per concurrency, and (key "raw") a raw sequential openai client, interleaved."""
    times: dict = {c: [] for c in [*concs, "raw"]}
    for _ in range(reps):
        for c in concs:
            dt, r = timed_replay(states, spec(url, model, c))
            assert r.states_completed == len(states), r.summary()
            times[c].append(dt)
        times["raw"].append(raw_calls(url, model, states))
    return {c: len(states) / statistics.median(v) for c, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--local-states", type=int, default=8)
    ap.add_argument("--no-local", action="store_true")
    a = ap.parse_args()
    procs = []
    try:
        p_slow, p_fast = free_port(), free_port()
        for port, delay in ((p_slow, 0.05), (p_fast, 0.0)):
            procs.append(start([sys.executable, "-m", "support.scripted_openai",
                                "--port", str(port), "--delay-s", str(delay)],
                               f"http://127.0.0.1:{port}/stats"))  # fmt: skip
        slow, fast = (f"http://127.0.0.1:{p}/v1" for p in (p_slow, p_fast))
        print(f"# bench_replay (reps={a.reps}, medians; machine load {os.getloadavg()[0]:.1f})\n")

        states = synthetic_states(64)
        tp = throughput(slow, "scripted", states, [1, 4, 16, 64], a.reps)
        print("## states/s vs concurrency, scripted server (50 ms per answer), 64 states\n")
        print("| concurrency | states/s | vs concurrency 1 |\n| --- | --- | --- |")
        for c, v in tp.items():
            label = "raw AsyncOpenAI, sequential" if c == "raw" else c
            print(f"| {label} | {v:.1f} | x{v / tp[1]:.2f} |")

        n = 100
        ov_states = synthetic_states(n, session="ov")
        raw, ours = [], []
        for i in range(a.reps):
            raw.append(raw_calls(fast, "scripted", ov_states))
            with tempfile.TemporaryDirectory() as tmp:  # a file journal, as in real use
                db = str(Path(tmp) / f"ov{i}.db")
                ours.append(timed_replay(ov_states, spec(fast, "scripted", 1), db)[0])
        r_ms, o_ms = statistics.median(raw) / n * 1e3, statistics.median(ours) / n * 1e3
        print(f"\n## overhead per call ({n} sequential calls, 0 ms scripted server)\n")
        print("| client | ms/call | ratio |\n| --- | --- | --- |")
        print(f"| raw AsyncOpenAI | {r_ms:.2f} | x1.00 |")
        print(
            f"| replay_trace (SQLite file journal, ledger, retry wrapper) | {o_ms:.2f} | x{o_ms / r_ms:.2f} |"
        )
        print(f"\nframework overhead: {o_ms - r_ms:.2f} ms per call")

        with tempfile.TemporaryDirectory() as tmp:
            db = str(Path(tmp) / "r.db")
            first, _ = timed_replay(states, spec(slow, "scripted", 16), db)
            before = stats(p_slow)["requests"]
            again, r = timed_replay(states, spec(slow, "scripted", 16), db)
            sent = stats(p_slow)["requests"] - before
        print("\n## cached re-run (64 states, concurrency 16)\n")
        print(f"first run {first:.2f} s; re-run {again:.3f} s, {sent} requests "
              f"({r.calls_cached} calls from the journal)")  # fmt: skip

        if not a.no_local:
            from composer_replication.lm.models import DEFAULT_MODEL, resolve_model_path

            port = free_port()
            procs.append(start([sys.executable, "-m", "composer_replication.cli", "serve",
                                "--model", resolve_model_path(DEFAULT_MODEL), "--port", str(port),
                                "--served-model-name", "smol", "--max-prompt-tokens", "256"],
                               f"http://127.0.0.1:{port}/v1/models"))  # fmt: skip
            url = f"http://127.0.0.1:{port}/v1"
            ls = synthetic_states(a.local_states, session="local")
            tp = throughput(url, "smol", ls, [1, 2, 4], a.reps)
            print(f"\n## states/s vs concurrency, local `serve` (SmolLM2-135M, max_tokens 8), "
                  f"{a.local_states} states\n")  # fmt: skip
            print("| concurrency | states/s | vs concurrency 1 |\n| --- | --- | --- |")
            for c, v in tp.items():
                label = "raw AsyncOpenAI, sequential" if c == "raw" else c
                print(f"| {label} | {v:.2f} | x{v / tp[1]:.2f} |")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
