"""Pick N short, spread-out states from ingested traces (for a small replay demo dataset).

python examples/pick_states.py ../shared/fixtures 24 4000 states.jsonl
"""

import sys

import orjson

from composer_replication.traces import ingest


def main(src: str, n: int, max_prefix_bytes: int, out: str) -> None:
    states = [
        s
        for s in ingest([src])
        if s.prefix
        and len(orjson.dumps(s.prefix)) <= max_prefix_bytes
        and (s.action.text or s.action.tool_calls)
    ]
    states.sort(key=lambda s: (len(orjson.dumps(s.prefix)), s.state_id))
    picked = states[:: max(1, len(states) // n)][:n]
    with open(out, "wb") as fh:
        fh.writelines(s.to_json() + b"\n" for s in picked)
    print(
        f"{len(states)} candidates, {len(picked)} picked: "
        f"{sorted({s.meta.source_format for s in picked})}"
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
