"""Feature Deletion's hostile episodes with the tool calls of a turn run at once
(``rollout.TurnCalls``, as the trainer runs them): each rollout gets the results, flags and
test-time budget it gets alone, and a workspace that hangs costs only its own episode."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from support.textkit import textkit_env

from composer_replication.envs.feature_deletion import env as fd_env
from composer_replication.envs.tools import bounded_tools, tool_methods
from composer_replication.rollout import TurnCalls
from composer_replication.sandbox.sandbox import SLOTS

HANG = "    while True:\n        pass"
FIX = "    return text"  # wrong but terminates: the tests run and fail
SCRIPTS = [  # one hostile episode per rollout, one call per turn
    [("read_file", {"path": "\udc80"}), ("run_tests", {})],
    [("read_file", {"path": "/etc/passwd"}), ("list_files", {"path": "../.."})],
    [("replace_in_file", {"path": "textkit/core.py", "old": fd_env.STUB_LINE, "new": HANG}),
     ("run_tests", {}), ("run_tests", {})],
    [("write_file", {"path": "conftest.py", "content": "import os"}),
     ("run_tests", {"target": "tests/test_\udc80.py"})],
    [("replace_in_file", {"path": "textkit/core.py", "old": fd_env.STUB_LINE, "new": FIX}),
     ("run_tests", {}), ("submit", {})],
    [("run_tests", {"target": "../../etc/passwd"}), ("nonexistent", {})],
]  # fmt: skip


@pytest.fixture(scope="module")
def env(textkit_tasks):
    return textkit_env(textkit_tasks)


def _episodes(env, concurrent: bool):
    """Run SCRIPTS turn by turn, calling the tools as TRL's loop does (an exception becomes
    an error result); concurrent: through TurnCalls' deferred tools."""
    task = next(
        t for s in ("train", "heldout") for t in env.tasks(s) if t.data["symbol"] == "slugify"
    )
    cls = bounded_tools(env.tools_class(), 1000)
    instances = [cls() for _ in SCRIPTS]
    for t in instances:
        t.reset(**env.row(task))
    tools = [{n: getattr(t, n) for n in tool_methods(cls)} for t in instances]
    convs: list[list[dict]] = [[] for _ in SCRIPTS]
    results: list[list[str]] = [[] for _ in SCRIPTS]
    with ThreadPoolExecutor(len(SCRIPTS)) as pool:
        run = TurnCalls(convs, tools, pool).deferred() if concurrent else tools
        for turn in range(max(len(s) for s in SCRIPTS)):
            for i, script in enumerate(SCRIPTS):
                if turn < len(script):
                    name, args = script[turn]
                    call = {"type": "function", "function": {"name": name, "arguments": args}}
                    convs[i].append({"role": "assistant", "tool_calls": [call]})
            for i, script in enumerate(SCRIPTS):
                if turn >= len(script):
                    continue
                name, args = script[turn]
                try:
                    if name not in run[i]:
                        raise ValueError(f"Tool {name} not found.")
                    out = run[i][name](**args)
                except Exception as e:
                    out = {"error": str(e)}
                results[i].append(str(out))
                convs[i].append({"role": "tool", "name": name, "content": str(out)})
    state = [(sorted(t.flags), t.episode.submitted, t.episode.spent_s) for t in instances]
    for t in instances:
        t.episode.close()
    return results, state


def test_hostile_episodes_at_once_get_what_they_get_alone(env, monkeypatch):
    monkeypatch.setattr(env, "tests_budget_s", 6.0)
    before = SLOTS.limit
    SLOTS.set_limit(2)  # this machine's cores: the runs queue for slots
    try:
        seq_results, seq_state = _episodes(env, concurrent=False)
        con_results, con_state = _episodes(env, concurrent=True)
    finally:
        SLOTS.set_limit(before)
    # the hanging run's output is the partial pytest log; compare its first line
    first = lambda rs: [[r.splitlines()[0] if r else r for r in rr] for rr in rs]  # noqa: E731
    assert first(con_results) == first(seq_results)
    assert [s[:2] for s in con_state] == [s[:2] for s in seq_state]
    hung = con_results[2]
    assert hung[1].startswith("the test run ") and "spent" in hung[2]  # the budget held
    hung_s = con_state[2][2]
    assert hung_s >= 5.0  # the hanging episode paid its own budget ...
    for i in (0, 4):  # ... the episodes that queued for a slot beside it were not charged it
        assert con_state[i][2] < hung_s, con_state
    assert "not passed" in con_results[4][1]  # its tests ran (and failed)
    assert any(f.startswith("outside_workspace") for f in con_state[1][0])
    assert any(f.startswith("wrote_config") for f in con_state[3][0])
    assert all(isinstance(r, str) and r.encode("utf-8") for rr in con_results for r in rr)
