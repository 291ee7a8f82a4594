"""Normalization backends side by side: pairs dropped per filter and time, native vs data-juicer.

    PYTHONPATH=src python bench/bench_normalize.py [--fixtures ../shared/fixtures] [--reps 3]
        [--copies 1]

Pairs: every state ingested from the public agent logs in ``--fixtures`` with the logged action
as ``chosen`` (text and tool calls; real near-duplicates, code, paths, digits), plus the 24 pairs
shipped in ``data/fixture_replay_pairs.jsonl``. Both backends run the default `NormalizeConfig`
(and one stricter recipe), interleaved ``--reps`` times in one process; times are medians of
wall and of CPU seconds (``time.process_time``: both backends run in this one process, and CPU
time is what a shared, loaded machine does not distort). The data-juicer import and operator
construction are timed once, apart. ``--copies N`` repeats the
pair list N times (for timing at a larger size; the copies are exact duplicates, so MinHash drops
them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from composer_replication.prefs.agreement import DPOPair  # noqa: E402
from composer_replication.prefs.normalize import NormalizeConfig, normalize_pairs  # noqa: E402

RECIPES = {
    "default": NormalizeConfig(),
    "strict": NormalizeConfig(min_chars=20, min_words=5, max_special_char_ratio=0.25),
}


def fixture_pairs(fixtures: Path) -> list[DPOPair]:
    from composer_replication.traces.ingest import ingest

    reject = {"role": "assistant", "content": "(logged)"}
    pairs = [DPOPair(f"log{i}:{s.state_id}", s.prefix, s.action.as_message(), reject, 2, ["log"])
             for i, s in enumerate(ingest(fixtures))]  # fmt: skip
    shipped = ROOT / "src/composer_replication/data/fixture_replay_pairs.jsonl"
    for line in shipped.read_bytes().splitlines():
        r = orjson.loads(line)
        pairs.append(DPOPair(f"shipped:{r['state_id']}", r["prompt"], orjson.loads(r["chosen_json"]),
                             orjson.loads(r["rejected_json"]), 2, r["teachers"]))  # fmt: skip
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", type=Path, default=ROOT.parent / "shared" / "fixtures")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--copies", type=int, default=1)
    args = ap.parse_args()
    pairs = fixture_pairs(args.fixtures) * args.copies
    print(f"{len(pairs)} pairs")

    t0, c0 = time.perf_counter(), time.process_time()
    from composer_replication.prefs.normalize_dj import DJNormalizer

    dj = {name: DJNormalizer(cfg) for name, cfg in RECIPES.items()}
    print(
        f"data-juicer import + operator construction: {time.perf_counter() - t0:.2f} s wall, "
        f"{time.process_time() - c0:.2f} s CPU"
    )

    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    reports = {}
    for _ in range(args.reps):
        for name, cfg in RECIPES.items():
            for backend, run in (("native", lambda c=cfg: normalize_pairs(pairs, c)),
                                 ("datajuicer", dj[name].__call__)):  # fmt: skip
                t, c = time.perf_counter(), time.process_time()
                kept, rep = run() if backend == "native" else run(pairs)
                spent = (time.perf_counter() - t, time.process_time() - c)
                times.setdefault((name, backend), []).append(spent)
                reports[(name, backend)] = (kept, rep)

    print("| recipe | backend | text_length | word_count | special_char_ratio | "
          "minhash_near_dup | kept | median wall s | median CPU s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (name, backend), (_, rep) in reports.items():
        d = rep.dropped
        wall = statistics.median(w for w, _ in times[(name, backend)])
        cpu = statistics.median(c for _, c in times[(name, backend)])
        print(
            f"| {name} | {backend} | {d['text_length']} | {d['word_count']} | "
            f"{d['special_char_ratio']} | {d['minhash_near_dup']} | {rep.kept} | "
            f"{wall:.3f} | {cpu:.3f} |"
        )
    for name in RECIPES:
        a = {p.state_id for p in reports[(name, "native")][0]}
        b = {p.state_id for p in reports[(name, "datajuicer")][0]}
        print(
            f"{name}: kept by both {len(a & b)}, only native {len(a - b)}, "
            f"only data-juicer {len(b - a)}"
        )


if __name__ == "__main__":
    main()
