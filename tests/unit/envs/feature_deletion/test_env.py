"""The feature_deletion tool environment on the textkit fixture: an episode driven through the
tools (read, search, edit, run the tests, submit) is graded from its workspace; paths outside
the workspace and reads of bytecode are refused and flagged; the blamed turn is the one that
ran the tests."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.textkit import textkit_env

from composer_replication.envs.feature_deletion.candidates import STUB, original_body
from composer_replication.envs.feature_deletion.workspace import candidate_of

FIXTURE = Path(__file__).parents[3] / "fixtures" / "feature_deletion" / "textkit"


@pytest.fixture(scope="module")
def task_dir(textkit_tasks):
    return textkit_tasks


@pytest.fixture(scope="module")
def env(task_dir):
    return textkit_env(task_dir)


def _task(env, symbol):
    return next(t for s in ("train", "heldout") for t in env.tasks(s) if t.data["symbol"] == symbol)


def _call(name, **args):
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]}  # fmt: skip


def test_min_hidden_tests_keeps_only_tasks_with_a_hidden_target(env, task_dir):
    """``min_hidden_tests=1`` drops exactly the tasks whose every target test is visible in
    the workspace (a lookup table of those could pass them) and keeps the splits' tasks."""
    every = {t.task_id: t for s in ("train", "heldout") for t in env.tasks(s)}
    kept_env = textkit_env(task_dir, min_hidden_tests=1)
    kept = {t.task_id: t.split for s in ("train", "heldout") for t in kept_env.tasks(s)}
    with_hidden = {i for i, t in every.items() if t.data["hidden_tests"]}
    assert with_hidden and len(with_hidden) < len(every)  # the fixture has both kinds
    assert set(kept) == with_hidden
    assert all(every[i].split == split for i, split in kept.items())
    with pytest.raises(ValueError, match="with at least 1000 hidden tests"):
        textkit_env(task_dir, min_hidden_tests=1000)


def test_tasks_split_and_prompt(env):
    tasks = env.tasks("train") + env.tasks("heldout")
    assert len(tasks) == 9 and env.tasks("train") and env.tasks("heldout")
    row = env.row(_task(env, "slugify"))
    assert "`slugify` in `textkit/core.py`" in row["prompt"][-1]["content"]
    calls = [c["function"]["name"] for m in row["prompt"] for c in m.get("tool_calls", [])]
    assert calls == ["read_file", "replace_in_file", "run_tests", "submit"]  # the worked episode
    tools = env.tools_class()()
    assert set(calls) <= {n for n in dir(tools) if not n.startswith("_")}
    assert "tests/test_core.py::test_slugify" in row["prompt"][-1]["content"]


def test_an_episode_through_the_tools_is_graded_from_its_workspace(env):
    task = _task(env, "titlecase")
    tools = env.tools_class()()
    tools.reset(**env.row(task))
    assert STUB in tools.read_file("textkit/core.py")
    assert "textkit/core.py:" in tools.search("def titlecase")
    assert "tests/test_core.py" in tools.list_files("tests")
    first = tools.run_tests()
    assert first.startswith("0 passed, 1 not passed") and "NotImplementedError" in first
    body = original_body((FIXTURE / task.data["file"]).read_text(), candidate_of(task.data))
    assert tools.replace_in_file("textkit/core.py", task.data["indent"] + STUB, body).startswith(
        "edited"
    )
    assert tools.run_tests().startswith("1 passed, 0 not passed")
    assert tools.run_tests("tests/test_numbers.py").startswith("6 passed")
    tools.submit()
    messages = [_call("run_tests"), {"role": "tool", "content": first}, _call("submit")]
    [result] = env.grade_episodes([task], [messages], [tools])
    assert result.reward == 1.0 and result.passed and result.info["flags"] == []


def test_search_is_literal_so_no_pattern_can_hang_the_trainer(env):
    """``search`` runs in the trainer's process on files the agent wrote: a regex such as
    ``^((a+)+)+$`` would backtrack for days on ``a...a!``, so the pattern is plain text."""
    tools = env.tools_class()()
    tools.reset(**env.row(_task(env, "slugify")))
    tools.write_file("notes.txt", "a+b\naaa\n" + "a" * 30 + "!\n")
    assert tools.search("a+", "notes.txt") == "notes.txt:1: a+b"
    start = time.process_time()
    assert tools.search("^((a+)+)+$", "notes.txt") == "no match"
    assert time.process_time() - start < 1.0
    assert tools.search("", "notes.txt").startswith("error")
    assert "textkit/core.py:" in tools.search("def slugify(")
    tools.episode.close()


def test_read_file_refuses_line_numbers_that_are_not_numbers(env):
    """``start``/``end`` come from the model: text, or more digits than ``int()`` reads."""
    tools = env.tools_class()()
    tools.reset(**env.row(_task(env, "slugify")))
    for bad in ({"start": "9" * 5000}, {"end": "two"}, {"start": float("inf")}):
        assert tools.read_file("textkit/core.py", **bad).startswith("error: start and end")
    assert tools.read_file("textkit/core.py", start="2", end="2").startswith("    2  ")
    tools.episode.close()


def test_a_failed_episode_blames_the_turn_that_ran_the_tests(env):
    task = _task(env, "slugify")
    tools = env.tools_class()()
    tools.reset(**env.row(task))
    tools.write_file("textkit/core.py", tools.read_file("textkit/core.py"))  # garbage: numbered
    messages = [_call("read_file", path="textkit/core.py"), {"role": "tool", "content": "..."},
                _call("run_tests"), {"role": "tool", "content": "..."},
                {"role": "assistant", "content": "done"}]  # fmt: skip
    [result] = env.grade_episodes([task], [messages], [tools])
    assert result.reward == 0.0 and result.info["failed_turn"] == 1
    assert "target tests pass" in result.feedback or "did not finish" in result.feedback


def test_paths_outside_the_workspace_and_bytecode_are_refused_and_flagged(env):
    task = _task(env, "ordinal")
    tools = env.tools_class()()
    tools.reset(**env.row(task))
    for path in ("/etc/passwd", "../../etc", str(FIXTURE / "textkit/core.py"), ".git/config"):
        assert "outside the repository" in tools.read_file(path)
    (tools.workspace / "link.py").symlink_to("/etc/passwd")
    assert "outside the repository" in tools.read_file("link.py")
    (tools.workspace / "textkit" / "__pycache__").mkdir(exist_ok=True)  # the probe made it
    (tools.workspace / "textkit" / "__pycache__" / "numbers.cpython-311.pyc").write_bytes(b"x")
    assert "bytecode" in tools.read_file("textkit/__pycache__/numbers.cpython-311.pyc")
    tools.write_file("tests/conftest.py", "import pytest\n")
    [result] = env.grade_episodes([task], [[]], [tools])
    flags = result.info["flags"]
    assert sum(f.startswith("outside_workspace:") for f in flags) == 5
    assert "read_bytecode:textkit/__pycache__/numbers.cpython-311.pyc" in flags
    assert "wrote_config:tests/conftest.py" in flags and "edited_config:tests/conftest.py" in flags
    assert "symlink:link.py" in flags and result.reward == 0.0


def test_workspace_has_one_commit_and_no_original_body(env):
    import subprocess

    task = _task(env, "wrap_words")
    tools = env.tools_class()()
    tools.reset(**env.row(task))
    log = subprocess.run(["git", "log", "--oneline"], cwd=tools.workspace, capture_output=True,
                         text=True, check=True).stdout.splitlines()  # fmt: skip
    assert len(log) == 1
    body = original_body((FIXTURE / task.data["file"]).read_text(), candidate_of(task.data))
    grep = subprocess.run(["git", "grep", "-F", body.splitlines()[1].strip()],
                          cwd=tools.workspace, capture_output=True, text=True)  # fmt: skip
    assert grep.returncode == 1  # not in any tracked file
    # no bytecode but the planted cache probe, which holds only the episode's probe text
    assert [p.read_text() for p in tools.workspace.rglob("*.pyc")] == [tools.probe + "\n"]
