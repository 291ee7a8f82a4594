"""Process entry for a replica in a cloud job: ``python -m
composer_replication.diloco.serverless.entry ENTRYPOINT ARGS_JSON``. Calls the entrypoint with
the JSON arguments (rank from ``$REPLICA_RANK``) and prints ``CR_RESULT <json>`` as its last
line so an executor can read the result back from the job's logs."""

from __future__ import annotations

import json
import sys

RESULT_PREFIX = "CR_RESULT "


def main(argv: list[str] | None = None) -> int:
    from composer_replication.diloco.serverless.executor import resolve_entrypoint

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: entry ENTRYPOINT ARGS_JSON", file=sys.stderr)
        return 2
    result = resolve_entrypoint(argv[0])(**json.loads(argv[1]))
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)
    return 0


def parse_result(log_lines: list[str]):
    """The entrypoint's result from a job's log lines (``LookupError`` if it printed none)."""
    for line in reversed(log_lines):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise LookupError(f"no {RESULT_PREFIX.strip()} line in the job's log")


if __name__ == "__main__":
    sys.exit(main())
