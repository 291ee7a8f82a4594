"""Agreement -> DPO pairs: normalization, exact and embedding grouping, plurality and weighted
consensus, thresholds, and no pair when the agent already agrees."""

from __future__ import annotations

import pytest

from composer_replication.prefs.agreement import (
    MiniLMEmbedder,
    action_key,
    extract_dpo_pairs,
    extract_pairs,
)
from composer_replication.traces.schema import Action, StateMeta, TraceState


def _state(sid: str, action: Action) -> TraceState:
    return TraceState(
        state_id=sid, session_id="s", step=0, prefix=[{"role": "user", "content": f"q {sid}"}],
        action=action, meta=StateMeta(source_format="openai_messages", file="f", line=1),
    )  # fmt: skip


def _call(name: str, args: str, cid: str = "x") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def _tool_msg(*calls) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


def _text(t: str) -> dict:
    return {"role": "assistant", "content": t}


def test_action_key_normalizes_whitespace_case_and_json():
    assert action_key(_text("  Hello\n  World ")) == action_key(_text("hello world"))
    a = _tool_msg(_call("bash", '{"cmd": "ls", "cwd": "/"}', "id1"))
    b = _tool_msg(_call("bash", '{"cwd":"/","cmd":"ls"}', "id2"))  # other order, other id
    assert action_key(a) == action_key(b)
    assert action_key(a) != action_key(_tool_msg(_call("bash", '{"cmd": "ls -l", "cwd": "/"}')))
    assert action_key(Action(text="Hi")) == action_key(_text("hi"))


def test_plurality_pair_when_agent_disagrees():
    st = _state("1", Action(text="rm -rf /"))
    answers = {"1": {"a": _text("Run the tests"), "b": _text("run  the TESTS"), "c": _text("no")}}
    pairs = extract_dpo_pairs([st], answers, agreement_threshold=2, costs={"1": 0.25})
    assert len(pairs) == 1
    p = pairs[0]
    assert p.chosen["content"] == "Run the tests" and p.rejected == st.action.as_message()
    assert (p.n_teachers_agreeing, p.teachers, p.cost, p.n_teachers) == (2, ["a", "b"], 0.25, 3)
    assert p.state_messages == st.prefix


def test_no_pair_below_threshold_on_tie_or_when_agent_agrees():
    s1, s2, s3 = _state("1", Action(text="x")), _state("2", Action(text="x")), _state("3", Action(
        tool_calls=[_call("bash", '{"cmd":"ls"}')]))  # fmt: skip
    answers = {
        "1": {"a": _text("y"), "b": _text("z")},  # tie 1-1
        "2": {"a": _text("y"), "b": _text("y"), "c": _text("z")},  # 2 agree, threshold 3
        "3": {"a": _tool_msg(_call("bash", '{ "cmd" : "ls" }')), "b": _tool_msg(_call("bash", '{"cmd": "ls"}'))},
    }  # fmt: skip
    pairs, stats = extract_pairs([s1, s2, s3], answers, agreement_threshold=3)
    assert pairs == [] and stats.no_consensus == 3 and stats.agent_agrees == 0
    pairs, stats = extract_pairs([s1, s2, s3], answers, agreement_threshold=2)
    assert [p.state_id for p in pairs] == ["2"] and stats.agent_agrees == 1
    assert stats.no_consensus == 1
    pairs, stats = extract_pairs([_state("4", Action(text="x"))], answers)
    assert stats.no_answers == 1


def test_weighted_strategy_uses_teacher_weights():
    st = _state("1", Action(text="agent"))
    answers = {"1": {"big": _text("B"), "s1": _text("S"), "s2": _text("S")}}
    plural = extract_dpo_pairs([st], answers, 1)
    assert plural[0].chosen["content"] == "S"
    weighted = extract_dpo_pairs([st], answers, 1, strategy="weighted",
                                 weights={"big": 3.0, "s1": 1.0, "s2": 1.0})  # fmt: skip
    assert weighted[0].chosen["content"] == "B" and weighted[0].teachers == ["big"]
    with pytest.raises(ValueError, match="strategy"):
        extract_dpo_pairs([st], answers, 1, strategy="median")


@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()


def test_embedding_grouping_merges_paraphrases(embedder):
    """Exact keys differ, meaning is the same: only with embeddings do 2 teachers agree."""
    st = _state("1", Action(text="I will delete the database."))
    answers = {"1": {
        "a": _text("Let me run the unit tests first to see what fails."),
        "b": _text("Let me run the unit tests first to see which ones fail."),
        "c": _text("The weather in Paris is sunny today."),
    }}  # fmt: skip
    assert extract_dpo_pairs([st], answers, 2) == []
    pairs, stats = extract_pairs([st], answers, 2, embedder=embedder, similarity_threshold=0.85)
    assert len(pairs) == 1 and pairs[0].teachers == ["a", "b"] and stats.merged_by_embedding == 1
    # the agent said the same thing in other words: no pair
    st2 = _state("1", Action(text="First I'll run the unit tests to see what fails."))
    pairs, stats = extract_pairs([st2], answers, 2, embedder=embedder, similarity_threshold=0.85)
    assert pairs == [] and stats.agent_agrees == 1


def test_embeddings_never_merge_different_tools(embedder):
    st = _state("1", Action(text="x"))
    answers = {"1": {
        "a": _tool_msg(_call("read_file", '{"path": "a.py"}')),
        "b": _tool_msg(_call("write_file", '{"path": "a.py"}')),
    }}  # fmt: skip
    pairs, stats = extract_pairs([st], answers, 1, embedder=embedder, similarity_threshold=0.1)
    assert pairs == [] and stats.no_consensus == 1 and stats.merged_by_embedding == 0
