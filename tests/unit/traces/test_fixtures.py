"""Every public third-party log under ../shared/fixtures ingests, with structural checks."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
from support.chat import assert_valid_openai_prefix

from composer_replication.traces import TraceState, ingest
from composer_replication.traces._base import NO_RESULT

ORPHAN_EXAMPLE = re.compile(
    r" (tool_call_without_result|tool_result_without_call|duplicate_tool_call_id) (.*)$"
)
ORPHAN_MARK = re.compile(r"^\[tool result for unknown call (.*?)\]")


@pytest.fixture(scope="module")
def run(fixtures_dir: Path):
    r = ingest([fixtures_dir])
    states = list(r)
    return states, r.report


def _by_file(states: list[TraceState]) -> dict[str, list[TraceState]]:
    out: dict[str, list[TraceState]] = defaultdict(list)
    for s in states:
        out[s.meta.file].append(s)
    return out


def test_every_fixture_file_is_read_and_every_line_accounted(run, fixtures_dir: Path) -> None:
    states, report = run
    manifest = (fixtures_dir / "MANIFEST.tsv").read_text().splitlines()[1:]
    expected = {fixtures_dir / row.split("\t")[-1] for row in manifest if row.strip()}
    read = {Path(f.path) for f in report.files}
    assert read == expected
    for f in report.files:
        assert f.parsed + f.skipped == f.total_lines, f.path
        assert sum(f.skipped_by_reason.values()) == f.skipped
        assert not any(r.startswith("reader_error") for r in f.skipped_by_reason), f.path
        assert not any(r.startswith("reader_error") for r in f.skipped_items), f.path
    manifest_lines = {fixtures_dir / r.split("\t")[-1]: int(r.split("\t")[6]) for r in manifest}
    for f in report.files:  # our line count matches the manifest's (wc -l style, +1 if no \n)
        assert abs(f.total_lines - manifest_lines[Path(f.path)]) <= 1, f.path
    assert report.states == len(states) > 60  # 73 vendored, 300+ shared
    assert set(report.by_format()) == {
        "claude_code", "codex", "swe_agent", "openhands", "gemini_cli", "aider"
    }  # fmt: skip


def test_expected_skips_are_reported_with_location(run) -> None:
    _, report = run
    files = {Path(f.path).name: f for f in report.files}
    edge = files["test__test_data__edge_cases.jsonl"]
    assert edge.skipped_by_reason["not_an_object"] == 3  # "massive error", 42, [1]
    assert edge.skipped_by_reason["missing_type"] == 1  # {"silly": "this"}
    assert any(x.endswith("edge_cases.jsonl:13") for x in edge.skipped_examples["not_an_object"])
    bad = files["internal__adapter__claudecode__testdata__malformed.jsonl"]
    assert bad.skipped_by_reason["invalid_json"] == 2 and bad.parsed == 1
    empty = files["internal__adapter__claudecode__testdata__empty.jsonl"]
    assert empty.total_lines == 0 and empty.states == 0
    codex_zoo = files[
        "test__test_data__codex__sessions__2026__01__02__rollout-2026-01-02T03-04-05-"
        "11111111-1111-4111-8111-111111111111.jsonl"
    ]
    assert codex_zoo.unknown_record_types == {"future_synthetic_record": 1}


def test_prefixes_are_valid_openai_chat(run) -> None:
    states, _ = run
    for s in states:
        assert_valid_openai_prefix(s.prefix)
        for tc in s.action.tool_calls:
            assert tc["type"] == "function" and isinstance(tc["function"]["arguments"], str)


def test_prefix_grows_monotonically_within_a_segment(run) -> None:
    states, _ = run
    sessions: dict[tuple[str, str], list[TraceState]] = defaultdict(list)
    for s in states:  # a session lives in one file; native ids may repeat across files
        sessions[s.meta.file, s.session_id].append(s)
    checked = 0
    for seq in sessions.values():
        assert [s.step for s in seq] == list(range(len(seq)))
        for prev, cur in zip(seq, seq[1:], strict=False):
            assert cur.meta.segment >= prev.meta.segment
            if cur.meta.segment != prev.meta.segment:
                continue
            grown = prev.prefix + (
                [prev.action.as_message()] if prev.action.text or prev.action.tool_calls else []
            )
            assert cur.prefix[: len(grown)] == grown, (cur.meta.file, cur.step)
            checked += 1
    assert checked > 40  # 49 vendored


def test_thinking_never_in_a_prefix(run) -> None:
    states, _ = run
    thoughts = {
        s.action.thinking
        for s in states
        if len(s.action.thinking) > 20 and "[trimmed for fixture]" not in s.action.thinking
    }
    assert len(thoughts) >= 4  # 4 distinct on the vendored subset
    for s in states:
        for m in s.prefix:
            for t in thoughts:
                assert t not in m["content"], (s.meta.file, t)


def test_tool_results_linked_or_reported_orphaned(run) -> None:
    states, report = run
    reported = defaultdict(set)
    for f in report.files:
        for ex in f.orphan_examples:
            m = ORPHAN_EXAMPLE.search(ex)
            reported[m.group(1)].add(m.group(2))
    linked = 0
    for s in states:
        for m in s.prefix:
            if m["role"] == "tool":
                if m["content"] == NO_RESULT:
                    assert m["tool_call_id"] in reported["tool_call_without_result"]
                else:
                    linked += 1
            mark = ORPHAN_MARK.match(m["content"]) if m["role"] == "user" else None
            if mark:
                assert mark.group(1) in reported["tool_result_without_call"]
    assert linked > 100
    assert report.orphans()["tool_result_without_call"] >= 1


def test_sidechains_and_subagents_are_separate_sessions(run) -> None:
    states, _ = run
    files = _by_file(states)
    side = next(v for k, v in files.items() if k.endswith("sidechain_integrated.jsonl"))
    main_ids = {s.session_id for s in side if not s.meta.is_sidechain}
    side_ids = {s.session_id for s in side if s.meta.is_sidechain}
    assert main_ids and side_ids and not main_ids & side_ids
    sub = next(v for k, v in files.items() if k.endswith("agent-showcol1.jsonl"))
    assert sub and all(s.meta.is_sidechain and s.meta.subagent_id == "showcol1" for s in sub)
    assert all(s.session_id.endswith("/agent-showcol1") for s in sub)


def test_state_ids_unique_and_stable(run, fixtures_dir: Path) -> None:
    states, _ = run
    ids = [s.state_id for s in states]
    assert len(set(ids)) == len(ids)
    again = [s.state_id for s in ingest([fixtures_dir])]
    assert again == ids


def test_claude_rewind_and_compaction(run) -> None:
    states, _ = run
    dag = next(
        v for k, v in _by_file(states).items() if k.endswith("dag_compact_after_rewind.jsonl")
    )
    texts = [[m["content"] for m in s.prefix] for s in dag]
    second = next(i for i, t in enumerate(texts) if "Second attempt" in t)
    assert "First attempt" not in texts[second]  # the rewound branch is gone
    assert dag[second].meta.segment == 1
    last = dag[-1]
    assert last.meta.after_compaction and last.meta.segment == 2
    assert last.prefix[0]["content"].startswith("This session is being continued")
    assert last.action.text == "Final answer"


def test_claude_thinking_tool_linking_and_images(run) -> None:
    states, _ = run
    files = _by_file(states)
    (think,) = next(v for k, v in files.items() if k.endswith("thinking_content.jsonl"))
    assert think.action.thinking and think.action.text
    sample = next(v for k, v in files.items() if k.endswith("tests__sample_session.json"))
    first = sample[0]
    assert first.action.tool_calls[0]["function"]["name"] == "Write"
    assert "addition function" in first.action.thinking
    assert sample[1].prefix[-1] == {
        "role": "tool",
        "tool_call_id": "toolu_write_001",
        "content": "File written successfully",
    }


def test_codex_items_reasoning_and_tools(run) -> None:
    states, _ = run
    files = _by_file(states)
    full = next(v for k, v in files.items() if "11111111-1111-4111-8111-111111111111" in k)
    calls = [tc["function"]["name"] for s in full for tc in s.action.tool_calls]
    assert calls == ["exec_command", "apply_patch", "mcp__synthetic__lookup"]
    assert full[0].action.thinking == "I will inspect the synthetic directory."
    assert full[-1].action.text == "The synthetic files are alpha.txt and beta.txt."
    assert full[-1].meta.model == "synthetic-model"
    assert [m["role"] for m in full[-1].prefix].count("user") == 1  # event copy deduplicated
    legacy = next(v for k, v in files.items() if "44444444-4444" in k)
    assert legacy[0].action.text == "The synthetic legacy session is open."
    child = next(v for k, v in files.items() if "33333333-3333" in k)
    assert all(s.meta.is_sidechain for s in child)
    zoo = next(v for k, v in files.items() if k.endswith("stage0__agents__codex__small.jsonl"))
    assert any(s.meta.after_compaction for s in zoo)


def test_swe_agent_openhands_gemini_aider(run) -> None:
    states, report = run
    files = _by_file(states)
    fc = next(v for k, v in files.items() if k.endswith("function_calling_simple.traj"))
    assert fc[0].prefix[0]["role"] == "system" and all(s.action.tool_calls for s in fc)
    mini = next(v for k, v in files.items() if k.endswith("github_issue.traj.json"))
    assert len(mini) == 10 and "```" in mini[0].action.text
    oh = next(v for k, v in files.items() if k.endswith("trajs__basic.json"))
    assert oh[0].action.tool_calls[0]["id"] == "toolu_017nBp7UfiGqyrA7j77HgtFP"
    assert oh[0].meta.model == "claude-3-5-sonnet-20241022"
    gem = next(v for k, v in files.items() if k.endswith("jsonl_v040.jsonl"))
    assert gem[1].prefix[-1]["role"] == "tool" and "README.md" in gem[1].prefix[-1]["content"]
    flask = next(v for k, v in files.items() if k.endswith("hello-world-flask.md"))
    assert flask[0].prefix == [
        {
            "role": "user",
            "content": "make a flask app with a /hello endpoint that returns hello world",
        }
    ]
    assert "<<<<<<< ORIGINAL" in flask[0].action.text
    assert not any("Applied edit" in m["content"] for s in flask for m in s.prefix)
