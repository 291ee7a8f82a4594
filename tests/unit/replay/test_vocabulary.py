"""One tool vocabulary from logs to RL: ingested Claude Code and Codex states keep their
harness's tool schemas (the profiles', envs/profiles.py); replay sends teachers those schemas
(checked in the request bodies a scripted OpenAI server received); the pairs carry them; and
channel 3's vocabulary check passes for a run on the matching profile and warns otherwise."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from support.harness_pairs import claude_code_pairs

from composer_replication.envs.feature_deletion.env import FeatureDeletionTools
from composer_replication.envs.profiles import profile_tools_class, tool_names, tool_schemas
from composer_replication.traces.ingest import ingest
from composer_replication.traces.schema import TraceState

TRACES = Path(__file__).parents[2] / "fixtures" / "traces"
SHARED = Path("/work/shared/fixtures")  # more public logs on the project's machines


def _states(*paths: Path) -> list[TraceState]:
    return list(ingest([p for p in paths if p.exists()]))


def test_ingested_states_keep_their_harness_tool_schemas():
    claude = _states(TRACES / "claude_code", SHARED / "claude_code")
    codex = _states(TRACES / "codex")
    other = _states(TRACES / "swe_agent", TRACES / "openhands")
    assert claude and codex and other
    assert all(s.tools == tool_schemas("claude_code") for s in claude)
    assert all(s.tools == tool_schemas("codex") for s in codex)
    assert all(s.tools is None for s in other)
    again = TraceState.from_json(claude[0].to_json())
    assert again.tools == claude[0].tools and again.state_id == claude[0].state_id


def test_stored_schemas_are_what_trl_renders_from_the_adapters():
    """``profile_schemas.json`` is regenerated, not edited: it must equal the live schemas
    (``python -m composer_replication.envs.profiles`` rewrites it)."""
    from composer_replication.envs.profiles import live_tool_schemas

    for harness in ("claude_code", "codex", "bash"):
        assert tool_schemas(harness) == live_tool_schemas(harness)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Claude Code states replayed to two agreeing scripted teachers; the pairs exported."""
    return claude_code_pairs(tmp_path_factory.mktemp("replay"))


def test_replay_sends_teachers_the_claude_code_schemas(replayed):
    states, script, _, _ = replayed
    bodies = [orjson.loads(b) for b in script.bodies]
    assert len(bodies) >= len(states)  # every state was sent (teachers may share a call)
    profile = tool_schemas("claude_code")
    for body in bodies:
        assert body["tools"][: len(profile)] == profile  # the harness's own, first
        names = [t["function"]["name"] for t in body["tools"]]
        assert len(names) == len(set(names))  # other tools the session called, once each


def test_pairs_carry_the_schemas_and_match_the_claude_code_profile(replayed):
    from composer_replication.channels.replay import (
        load_pairs,
        pair_vocabulary,
        vocabulary_mismatch,
    )

    _, _, pairs, out = replayed
    assert pairs.pairs and all(p.tools == tool_schemas("claude_code") for p in pairs.pairs)
    rows = load_pairs(out, 100)
    assert all(orjson.loads(r["tools_json"]) == tool_schemas("claude_code") for r in rows)
    assert pair_vocabulary(rows) == tool_names("claude_code")
    claude = profile_tools_class(FeatureDeletionTools, "claude_code")
    assert vocabulary_mismatch(rows, set(tool_names("claude_code"))) is None
    from composer_replication.envs.tools import tool_methods

    assert vocabulary_mismatch(rows, set(tool_methods(claude))) is None
    native = vocabulary_mismatch(rows, set(tool_methods(FeatureDeletionTools)))
    assert native and "Bash" in native and "env.tool_profile=claude_code" in native
    codex = vocabulary_mismatch(rows, set(tool_names("codex")))
    assert codex and "Read" in codex


def test_pairs_without_schemas_are_judged_by_their_calls():
    from composer_replication.channels.replay import pair_vocabulary

    rows = [
        {"prompt": [], "chosen": '<tool_call>{"name": "Read", "arguments": {}}</tool_call>',
         "rejected": [{"role": "assistant", "content": "",
                       "tool_calls": [{"function": {"name": "shell", "arguments": "{}"}}]}]},
        {"prompt": [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "TodoWrite", "arguments": "{}"}}]}], "chosen": "a", "rejected": "b"},
    ]  # fmt: skip
    assert pair_vocabulary(rows) == {"Read", "shell"}  # the prompt's history is not trained on
