"""Harness profiles over Feature Deletion's workspace (envs/profiles.py): each profile's tools
rebuild the deleted function and the episode is graded from the workspace as with the native
tools (reward 1, no flag); its error texts and result formats are the harness's; paths outside
the workspace and reads of bytecode are refused and flagged by the environment's own check;
the prompt's worked episode speaks the profile's vocabulary."""

from __future__ import annotations

import json
import time

import pytest
from support.textkit import TEXTKIT, textkit_env

from composer_replication.config import load_config
from composer_replication.envs.feature_deletion.candidates import STUB, original_body
from composer_replication.envs.feature_deletion.workspace import candidate_of
from composer_replication.envs.profiles import (
    TOOL_PROFILES,
    command_flags,
    profile,
    profile_tools_class,
    tool_names,
    tool_schemas,
)
from composer_replication.envs.tools import tool_methods


@pytest.fixture(scope="module")
def task_dir(textkit_tasks):
    return textkit_tasks


@pytest.fixture(scope="module", params=[h for h in TOOL_PROFILES if h != "native"])
def env(request, task_dir):
    return textkit_env(task_dir, tool_profile=request.param)


def _episode(env, symbol="titlecase"):
    task = next(t for s in ("train", "heldout") for t in env.tasks(s) if t.data["symbol"] == symbol)
    tools = env.tools_class()()
    tools.reset(**env.row(task))
    body = original_body((TEXTKIT / task.data["file"]).read_text(), candidate_of(task.data))
    return task, tools, body


def _grade(env, task, tools):
    [result] = env.grade_episodes([task], [[]], [tools])
    return result


def test_only_the_profile_tools_are_offered_and_the_prompt_speaks_them(env):
    cls = env.tools_class()
    assert set(tool_methods(cls)) == tool_names(env.tool_profile.name)
    task = env.tasks("train")[0]
    row = env.row(task)
    assert "/repo" in row["prompt"][0]["content"] and "submit" not in row["prompt"][0]["content"]
    calls = {c["function"]["name"] for m in row["prompt"] for c in m.get("tool_calls", [])}
    assert calls and calls <= tool_names(env.tool_profile.name)
    names = {s["function"]["name"] for s in tool_schemas(env.tool_profile.name)}
    assert names == tool_names(env.tool_profile.name)


def test_restoring_the_body_with_the_profile_tools_scores_one(env):
    task, tools, body = _episode(env)
    path = f"/repo/{task.data['file']}"
    stub = task.data["indent"] + STUB
    name = env.tool_profile.name
    if name == "claude_code":
        assert "\tdef titlecase" in tools.Read(path)
        assert tools.Edit(path, stub, body) == f"The file {path} has been updated successfully."
        ran = tools.Bash("python -m pytest -q tests/test_core.py::test_titlecase")
    elif name == "codex":
        patch = "*** Begin Patch\n*** Update File: {}\n@@ def titlecase(text):\n".format(
            task.data["file"]
        )
        patch += "".join(f"-{ln}\n" for ln in stub.splitlines())
        patch += "".join(f"+{ln}\n" for ln in body.rstrip("\n").splitlines()) + "*** End Patch"
        assert tools.apply_patch(patch).startswith("Success. Updated the following files:\nM ")
        ran = json.loads(tools.shell(["python", "-m", "pytest", "-q", "tests/test_core.py"]))
        assert ran["metadata"]["exit_code"] == 0
        ran = ran["output"]
    else:
        fix = "import pathlib; p = pathlib.Path('textkit/core.py'); " \
              f"p.write_text(p.read_text().replace({stub!r}, {body.rstrip(chr(10))!r}))"  # fmt: skip
        assert tools.bash(f"python -c {json.dumps(fix)}").endswith("[exit code 0]")
        ran = tools.bash("python -m pytest -q tests/test_core.py::test_titlecase")
    assert "passed" in ran and "failed" not in ran
    result = _grade(env, task, tools)
    assert result.reward == 1.0 and result.passed and result.info["flags"] == []


def test_a_wrong_body_scores_zero_and_blames_the_command_turn(env):
    task, tools, _ = _episode(env)
    cmd = {"claude_code": "Bash", "codex": "shell", "bash": "bash"}[env.tool_profile.name]
    messages = [
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": cmd, "arguments": {}}}]},
        {"role": "tool", "name": cmd, "content": "1 failed"},
        {"role": "assistant", "content": "done"},
    ]  # fmt: skip
    [result] = env.grade_episodes([task], [messages], [tools])
    assert result.reward == 0.0 and result.info["failed_turn"] == 0


def test_paths_outside_and_bytecode_are_refused_and_flagged(env):
    task, tools, _ = _episode(env)
    name = env.tool_profile.name
    if name == "claude_code":
        out = tools.Read("/etc/passwd")
        assert out.startswith("<tool_use_error>") and "outside the repository" in out
        assert tools.Read("/repo/../../etc/passwd").startswith("<tool_use_error>")
        assert tools.Read("/repo/textkit/__pycache__/core.cpython-311.pyc").startswith("<tool")
        assert tools.Glob("../*").startswith("<tool_use_error>")
    elif name == "codex":
        out = tools.apply_patch("*** Begin Patch\n*** Add File: /etc/x\n+a\n*** End Patch")
        assert "outside the repository" in out
        assert "outside" in json.loads(tools.shell(["ls"], workdir="/etc"))["output"]
        tools.shell(["cat", "textkit/__pycache__/core.pyc"])
    else:
        tools.bash("cat /etc/hostname; cat textkit/__pycache__/x.pyc")
    flags = " ".join(tools.flags)
    assert "outside_workspace:" in flags and "read_bytecode:" in flags
    tools.episode.close()


def test_claude_code_error_texts_and_formats(task_dir):
    env = textkit_env(task_dir, tool_profile="claude_code")
    task, tools, _ = _episode(env)
    path = f"/repo/{task.data['file']}"
    assert tools.Edit(path, "def", "DEF") == (
        "<tool_use_error>File has not been read yet. Read it first before writing to it."
        "</tool_use_error>"
    )
    assert tools.Read("/repo/nope.py") == "<tool_use_error>File does not exist.</tool_use_error>"
    lines = tools.Read(path, offset=2, limit=2).splitlines()
    assert [ln.split("\t")[0] for ln in lines] == ["     2", "     3"]
    assert tools.Edit(path, "no such text", "x").startswith(
        "<tool_use_error>String to replace not found in file.\nString: no such text"
    )
    assert tools.Read(path).count("return") >= 2
    assert tools.Edit(path, "return", "yield").startswith(
        "<tool_use_error>Found "
    ) and "but replace_all is false" in tools.Edit(path, "return", "yield")
    assert tools.Edit(path, "x", "x") == (
        "<tool_use_error>No changes to make: old_string and new_string are exactly the same."
        "</tool_use_error>"
    )
    assert tools.Write("/repo/notes.txt", "hi") == "File created successfully at: /repo/notes.txt"
    assert tools.Grep("^def [a-z]+case", "", "*.py", "content").startswith("/repo/textkit/core.py:")
    assert tools.Grep("def titlecase").startswith("Found 1 files\n/repo/textkit/core.py")
    assert tools.Glob("tests/*.py").splitlines()[0] == "/repo/tests/test_core.py"
    assert tools.Bash("exit 3") == "Exit code 3"
    start = time.monotonic()  # a pattern that backtracks runs in the sandbox, bounded
    tools.Write("/repo/a.txt", "a" * 40 + "!")
    tools.Grep("^((a+)+)+$", "/repo/a.txt", "", "content")
    assert time.monotonic() - start < 30
    tools.episode.close()


def test_unknown_profile_and_profile_outside_feature_deletion_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown tool profile 'cursor'"):
        profile("cursor")
    with pytest.raises(ValueError, match="env.tool_profile: unknown key"):  # the calculator's
        load_config("agent_quickstart.yaml", ["env.tool_profile=bash"])
    with pytest.raises(ValueError, match="tool profiles wrap the tools of a workspace"):
        load_config(
            "feature_deletion.yaml", ["env.tool_profile=bash", "env.openenv_url=http://x:1"]
        )
    cfg = load_config("feature_deletion.yaml", ["env.tool_profile=codex"])
    assert cfg.env.tool_profile == "codex"
    assert profile_tools_class(dict, "native") is dict


def test_the_old_key_env_harness_still_loads_with_a_line_naming_the_new_key(caplog):
    """``env.harness`` (before issue 59) is ``env.tool_profile``: "harness" means the agent
    program only (``agent_proxy.harness``)."""
    import logging

    from composer_replication.config import run as run_config

    run_config._warned.discard("env.harness")
    with caplog.at_level(logging.WARNING):
        cfg = load_config("feature_deletion.yaml", ["env.harness=codex"])
    assert cfg.env.tool_profile == "codex"
    assert "env.harness is deprecated: use env.tool_profile" in caplog.text
    with pytest.raises(ValueError, match="set env.tool_profile only"):
        load_config("feature_deletion.yaml", ["env.harness=codex", "env.tool_profile=bash"])


def test_command_flags():
    assert command_flags("python -m pytest -q tests /repo/x /tmp/y > /dev/null") == []
    assert command_flags("cat /proc/1/environ") == ["outside_workspace:/proc/1/environ"]
    assert command_flags("cd .. && ls") == ["outside_workspace:cd .. && ls"]
    assert command_flags("find . -name '*.pyc'")[0].startswith("read_bytecode:")
    assert command_flags("sed -i 's/a/b/' x.py") == []
