"""The workspace interface (envs/workspace.py): a second workspace environment
(tests/support/tiny_workspace.py) that implements only the public ``WorkspaceEpisode`` gets
every tool profile; each profile's tools read, write and run commands in its repository,
and report writes, refusals and command time through that interface alone."""

from __future__ import annotations

import json

import pytest
from support.tiny_workspace import TinyEpisode, TinyTools

from composer_replication.envs.profiles import TOOL_PROFILES, profile_tools_class, tool_names
from composer_replication.envs.tools import tool_methods
from composer_replication.envs.workspace import WorkspaceEpisode, workspace_episode

PATCH = "*** Begin Patch\n*** Update File: notes/a.txt\n@@\n-beta\n+gamma\n*** End Patch"
SCRIPTS = {
    "claude_code": [
        ("Read", {"file_path": "/repo/notes/a.txt"}, "alpha"),
        ("Edit", {"file_path": "/repo/notes/a.txt", "old_string": "beta", "new_string": "gamma"},
         "updated successfully"),
        ("Write", {"file_path": "/repo/tests/test_b.py", "content": "x = 1\n"}, ""),
        ("Grep", {"pattern": "gam+a", "output_mode": "content"}, "/repo/notes/a.txt"),
        ("Glob", {"pattern": "**/*.txt"}, "/repo/notes/a.txt"),
        ("Bash", {"command": "cat notes/a.txt && echo made > notes/c.txt"}, "gamma"),
        ("Read", {"file_path": "/etc/passwd"}, "outside the repository"),
    ],
    "codex": [
        ("shell", {"command": ["cat", "notes/a.txt"]}, "alpha"),
        ("apply_patch", {"input": PATCH}, "M notes/a.txt"),
        ("apply_patch", {"input": "*** Begin Patch\n*** Add File: tests/test_b.py\n+x = 1\n"
                                  "*** End Patch"}, "A tests/test_b.py"),
        ("shell", {"command": ["bash", "-lc", "cat notes/a.txt; echo made > notes/c.txt"]},
         "gamma"),
        ("shell", {"command": ["cat", "notes/a.txt"], "workdir": "/etc"}, "outside"),
    ],
    "bash": [
        ("bash", {"command": "sed -i s/beta/gamma/ notes/a.txt && cat notes/a.txt"}, "gamma"),
        ("bash", {"command": "echo x = 1 > tests/test_b.py && echo made > notes/c.txt"},
         "exit code 0"),
        ("bash", {"command": "cat /etc/hostname"}, ""),
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", [h for h in TOOL_PROFILES if h != "native"])
def test_a_second_workspace_environment_gets_every_tool_profile(name):
    cls = profile_tools_class(TinyTools, name)
    assert set(tool_methods(cls)) == tool_names(name)  # the profile's tools, nothing else
    tools = cls()
    tools.reset(task_id="tiny-1")
    episode = tools.episode
    assert isinstance(episode, TinyEpisode) and isinstance(episode, WorkspaceEpisode)
    try:
        for tool, args, expected in SCRIPTS[name]:
            out = getattr(tools, tool)(**args)
            assert expected in out, (tool, out)
        root = episode.root
        assert (root / "notes/a.txt").read_text() == "alpha\ngamma\n"
        assert (root / "tests/test_b.py").read_text().strip() == "x = 1"
        assert (root / "notes/c.txt").read_text() == "made\n"  # a command's change came back
        assert {"notes/a.txt", "tests/test_b.py", "notes/c.txt"} <= set(episode.writes)
        assert "wrote_test:tests/test_b.py" in episode.flags
        assert any(f.startswith("outside_workspace:") for f in episode.flags)
        assert 0 < episode.spent_s < episode.budget_s  # the commands' time was charged
        if name != "bash":  # file tools' writes count against the cap (a shell has its own)
            assert episode.written > 0
    finally:
        episode.close()
    assert not root.exists()


def test_the_native_profile_is_the_environments_own_tools():
    assert profile_tools_class(TinyTools, "native") is TinyTools


def test_the_interface_methods_are_never_offered_as_tools():
    """TRL offers every public function of the class: the workspace is an attribute."""
    for name in TOOL_PROFILES:
        offered = set(tool_methods(profile_tools_class(TinyTools, name)))
        assert not offered & {"episode", "close", "resolve", "note_write", "reserve_write"}


def test_a_spent_command_budget_refuses_the_next_command():
    tools = profile_tools_class(TinyTools, "codex")()
    tools.reset(task_id="tiny-2")
    try:
        tools.episode.spend(tools.episode.budget_s)
        out = json.loads(tools.shell(["true"]))
        assert out["metadata"]["exit_code"] == 1 and "is spent" in out["output"]
    finally:
        tools.episode.close()


def test_a_tools_class_without_the_interface_is_refused_naming_it():
    class Plain:
        def reset(self, **row):
            """Start."""

    with pytest.raises(TypeError, match="Plain keeps no workspace at `episode`"):
        profile_tools_class(Plain, "bash")()
    with pytest.raises(TypeError, match="Plain"):
        workspace_episode(Plain())
