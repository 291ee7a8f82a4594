"""Preference pairs from the ingested Claude Code fixture logs, replayed to two agreeing
scripted teachers (tests/support/scripted_openai.py): the pairs of a Claude Code harness."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.scripted_openai import Script, ServerThread, make_app

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def claude_code_pairs(out: Path, n_states: int = 6):
    """``(states, script, pairs, pairs_dir)``: up to ``n_states`` states whose agent called a
    tool, the server's script (its ``bodies`` are the requests), the `PairsResult` and the
    directory holding ``pairs.jsonl``."""
    from composer_replication.config import RemoteTeacherConfig
    from composer_replication.prefs.export import replay_and_normalize_trace
    from composer_replication.prefs.normalize import NormalizeConfig
    from composer_replication.traces.ingest import ingest

    states = [s for s in ingest([TRACES / "claude_code"]) if s.action.tool_calls][:n_states]
    script = Script()
    with ServerThread(make_app(script)) as srv:
        specs = [RemoteTeacherConfig(name=f"t{i}", base_url=srv.base_url, model="same", max_tokens=8,
                             price_in_per_mtok=1, price_out_per_mtok=1) for i in range(2)]  # fmt: skip
        _, pairs = asyncio.run(replay_and_normalize_trace(
            states, specs, journal=out / "r.db", budget_usd=1.0, out_dir=out / "pairs",
            normalize=NormalizeConfig(dedup=False, min_words=0),
        ))  # fmt: skip
    return states, script, pairs, out / "pairs"
