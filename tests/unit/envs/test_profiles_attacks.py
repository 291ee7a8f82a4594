"""Red-team pass on the harness profiles' tools (envs/profiles.py) that run in the trainer's
process: a few policy tokens must not cost the host gigabytes or hours. Each test fails while
its attack works.

* ``Write``/``Edit`` (Claude Code) and ``apply_patch`` (Codex) wrote without the native tools'
  caps (``MAX_WRITE_BYTES`` per file, ``MAX_EPISODE_WRITE_BYTES`` per episode), and
  ``Edit(replace_all=True)`` multiplies a file: ``"x"`` -> 2000 ``"x"`` twice turns 1 kB into
  4 GB in the trainer's memory and on its disk (about 60 tokens).
* ``Glob`` runs pathlib's glob in the trainer's process, and each ``**`` component multiplies
  its walk by the tree's depth: ``**/`` twelve times over a 24-level directory (one ``Write``)
  lists about 10**9 directories, hours of the trainer's CPU for about 30 tokens.
"""

from __future__ import annotations

import os
import tracemalloc

import pytest
from support.textkit import textkit_env

from composer_replication.envs.feature_deletion import env as fd_env


@pytest.fixture(scope="module")
def claude(textkit_tasks):
    return textkit_env(textkit_tasks, tool_profile="claude_code")


@pytest.fixture(scope="module")
def codex(textkit_tasks):
    return textkit_env(textkit_tasks, tool_profile="codex")


def _tools(env):
    task = env.tasks("train")[0]
    tools = env.tools_class()()
    tools.reset(**env.row(task))
    return tools


@pytest.fixture
def tools_claude(claude):
    tools = _tools(claude)
    yield tools
    tools.episode.close()


@pytest.fixture
def tools_codex(codex):
    tools = _tools(codex)
    yield tools
    tools.episode.close()


def test_edit_replace_all_cannot_multiply_a_file_past_the_cap(tools_claude):
    tools = tools_claude
    assert tools.Write("/repo/notes.txt", "x" * 1000).startswith("File created")
    out = tools.Edit("/repo/notes.txt", "x", "x" * 2000, replace_all=True)
    assert out.startswith("<tool_use_error>") and "more than a file may hold" in out
    assert (tools.workspace / "notes.txt").stat().st_size == 1000  # untouched


def test_edit_refuses_a_multiplied_file_before_building_it(tools_claude):
    """The cap alone refused the result only after ``str.replace`` had built it: a 1 MiB file
    times a 5000-character ``new_string`` is 5 GB in the trainer's memory first."""
    tools = tools_claude
    assert tools.Write("/repo/notes.txt", "x" * 100_000).startswith("File created")
    tracemalloc.start()
    out = tools.Edit("/repo/notes.txt", "x", "x" * 1000, replace_all=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert out.startswith("<tool_use_error>") and "more than a file may hold" in out
    assert peak < 20 << 20, f"{peak >> 20} MB held to refuse the edit"


def test_claude_code_writes_share_the_episode_cap(tools_claude):
    tools = tools_claude
    big = "y" * fd_env.MAX_WRITE_BYTES
    assert "more than a file may hold" in tools.Write("/repo/big.txt", big + "y")
    answers = [tools.Write(f"/repo/chunk{i}.txt", big) for i in range(17)]
    assert all(a.startswith("File created") for a in answers[:16])
    assert answers[16].startswith("<tool_use_error>") and "wrote its" in answers[16]
    assert not (tools.workspace / "chunk16.txt").exists()


def test_apply_patch_writes_are_capped(tools_codex):
    tools = tools_codex
    line = "z" * 1000
    body = "".join(f"+{line}\n" for _ in range(fd_env.MAX_WRITE_BYTES // 1000 + 1))
    out = tools.apply_patch(f"*** Begin Patch\n*** Add File: big.txt\n{body}*** End Patch")
    assert "more than a file may hold" in out
    assert not (tools.workspace / "big.txt").exists()


def test_a_patch_over_the_caps_writes_none_of_its_files(tools_codex):
    """Checked file by file while writing, a patch over the caps left its first files written
    (and a move's source deleted) though it answered that it failed."""
    tools = tools_codex
    big = "+" + "w" * (fd_env.MAX_WRITE_BYTES + 10) + "\n"
    patch = f"*** Begin Patch\n*** Add File: small.txt\n+hi\n*** Add File: big.txt\n{big}"
    out = tools.apply_patch(patch + "*** End Patch")
    assert "more than a file may hold" in out
    assert not (tools.workspace / "small.txt").exists()
    assert tools.episode.written_bytes == 0


def test_glob_work_grows_with_the_tree_not_with_the_pattern(tools_claude, monkeypatch):
    """Counted, not timed: the directories the trainer's process lists for one Glob."""
    tools = tools_claude
    deep = "/".join(["d"] * fd_env.MAX_PATH_DEPTH)
    assert tools.Write(f"/repo/{deep}/f.py", "x = 1\n").startswith("File created")
    dirs = sum(1 for _ in os.walk(tools.workspace))
    listed = []
    real = os.scandir

    def counting(path="."):
        listed.append(path)
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    out = tools.Glob("**/" * 4 + "*.py")  # 20475 listings before the fix, 12 ** ~ 10**9
    assert len(listed) <= 4 * dirs, f"{len(listed)} listings for {dirs} directories"
    assert f"/repo/{deep}/f.py" in out
    many = tools.Glob("**/d/**/d/**/d/**/*.py")
    assert many.startswith("<tool_use_error>") and "**" in many
    assert len(listed) <= 8 * dirs
    assert "/repo/tests/test_core.py" in tools.Glob("**/test_*.py")


BLOCKED_TAIL = "*** Add File: blocker/inside.txt\n+x\n*** End Patch"
"""A last patch section the filesystem refuses once :func:`_plant_blocker` ran (a file where
its directory must go): the patch fails after its earlier sections were written."""


def _plant_blocker(ws) -> None:
    (ws / "blocker").write_text("a file, not a directory\n")


def test_a_patch_the_filesystem_refuses_midway_changes_nothing(tools_codex):
    """Written file by file, a patch whose later file the filesystem refused (a file where a
    directory must go) left its earlier files changed and a moved file's source deleted, though
    it answered that it failed."""
    tools = tools_codex
    ws = tools.workspace
    (ws / "keep.txt").write_text("one\n")
    _plant_blocker(ws)
    patch = (
        "*** Begin Patch\n*** Update File: keep.txt\n@@\n-one\n+two\n"
        "*** Add File: fresh.txt\n+new\n"
        "*** Update File: keep2.txt\n*** Move to: moved.txt\n@@\n-a\n+b\n" + BLOCKED_TAIL
    )
    (ws / "keep2.txt").write_text("a\n")
    out = tools.apply_patch(patch)
    assert out.startswith("apply_patch failed"), out
    assert (ws / "keep.txt").read_text() == "one\n"
    assert (ws / "keep2.txt").read_text() == "a\n"
    assert not (ws / "fresh.txt").exists() and not (ws / "moved.txt").exists()
    assert (ws / "blocker").read_text() == "a file, not a directory\n"
    ok = "*** Begin Patch\n*** Update File: keep.txt\n@@\n-one\n+two\n*** End Patch"
    assert tools.apply_patch(ok).startswith("Success.")
    assert (ws / "keep.txt").read_text() == "two\n"


def test_a_patch_with_text_utf8_cannot_encode_writes_nothing(tools_codex):
    tools = tools_codex
    patch = "*** Begin Patch\n*** Add File: a.txt\n+ok\n*** Add File: b.txt\n+\ud800\n*** End Patch"
    out = tools.apply_patch(patch)
    assert "not valid UTF-8 text" in out
    assert not (tools.workspace / "a.txt").exists()


def test_edit_is_refused_before_building_when_the_episode_cap_would_pass(tools_claude):
    """Under the per-file cap but over what the episode may still write: refused (the
    character count is asked before the text is built) and the file is untouched."""
    tools = tools_claude
    big = "y" * fd_env.MAX_WRITE_BYTES
    for i in range(15):
        assert tools.Write(f"/repo/chunk{i}.txt", big).startswith("File created")
    assert tools.Write("/repo/half.txt", "y" * 500_000).startswith("File created")
    assert tools.Write("/repo/notes.txt", "x" * 1000).startswith("File created")
    out = tools.Edit("/repo/notes.txt", "x", "x" * 1000, replace_all=True)
    assert out.startswith("<tool_use_error>") and "wrote its" in out
    assert (tools.workspace / "notes.txt").stat().st_size == 1000


def test_a_failed_patch_that_put_a_directory_where_a_file_was_gets_the_file_back(tools_codex):
    """Review 22: a patch that deletes ``notes.txt`` and adds ``notes.txt/x.py`` (allowed: the
    parser reads the files as they are) and then fails left a directory where the file was:
    the rollback wrote the old bytes onto that directory, which failed silently, so the file
    was lost though the patch answered that it changed nothing."""
    tools = tools_codex
    ws = tools.workspace
    (ws / "notes.txt").write_text("keep me\n")
    _plant_blocker(ws)
    patch = (
        "*** Begin Patch\n*** Delete File: notes.txt\n*** Add File: notes.txt/x.py\n+x = 1\n"
        + BLOCKED_TAIL
    )
    out = tools.apply_patch(patch)
    assert out.startswith("apply_patch failed"), out
    assert (ws / "notes.txt").is_file() and (ws / "notes.txt").read_text() == "keep me\n"


def test_a_failed_patch_leaves_no_directory_it_made(tools_codex):
    tools = tools_codex
    ws = tools.workspace
    _plant_blocker(ws)
    patch = "*** Begin Patch\n*** Add File: fresh/deep/a.py\n+a = 1\n" + BLOCKED_TAIL
    assert tools.apply_patch(patch).startswith("apply_patch failed")
    assert not (ws / "fresh").exists()


def test_a_failed_patch_keeps_a_moved_files_mode(tools_codex):
    tools = tools_codex
    ws = tools.workspace
    (ws / "run.sh").write_text("echo a\n")
    (ws / "run.sh").chmod(0o755)
    _plant_blocker(ws)
    patch = (
        "*** Begin Patch\n*** Update File: run.sh\n*** Move to: go.sh\n@@\n-echo a\n+echo b\n"
        + BLOCKED_TAIL
    )
    assert tools.apply_patch(patch).startswith("apply_patch failed")
    assert (ws / "run.sh").read_text() == "echo a\n" and not (ws / "go.sh").exists()
    assert (ws / "run.sh").stat().st_mode & 0o777 == 0o755


def test_a_patch_changing_one_file_twice_does_not_drop_a_change(tools_codex):
    """Review 22: each section is parsed against the files on disk, so a second ``Update
    File`` of the same file (or of it under another name, ``/repo/x`` or ``./x``) was built
    from the old text and wrote over the first: ``Success.`` though the first change was
    lost. A patch that changes a file twice is now refused, and nothing is written."""
    tools = tools_codex
    ws = tools.workspace
    (ws / "two.txt").write_text("a\nb\n")
    for second in ("two.txt", "/repo/two.txt", "./two.txt"):
        patch = (
            "*** Begin Patch\n*** Update File: two.txt\n@@\n-a\n+A\n"
            f"*** Update File: {second}\n@@\n-b\n+B\n*** End Patch"
        )
        out = tools.apply_patch(patch)
        text = (ws / "two.txt").read_text()
        assert text == "A\nB\n" or (text == "a\nb\n" and "more than once" in out), (out, text)


PATCH_OF_EVERY_KIND = (
    "*** Begin Patch\n*** Update File: keep.txt\n@@\n-one\n+two\n"
    "*** Add File: fresh/deep/a.py\n+a = 1\n"
    "*** Update File: run.sh\n*** Move to: bin/go.sh\n@@\n-echo a\n+echo b\n"
    "*** Delete File: notes.txt\n*** Add File: notes.txt/x.py\n+x = 1\n"
    "*** Delete File: old.txt\n*** End Patch"
)


def _patch_tree(ws) -> None:
    (ws / "keep.txt").write_text("one\n")
    (ws / "run.sh").write_text("echo a\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "notes.txt").write_text("keep me\n")
    (ws / "old.txt").write_text("old\n")


def test_every_patch_survives_a_failure_at_its_kth_change(tools_codex, monkeypatch):
    """Issue 55: for every k, a failure of the k-th write, unlink, rename or mkdir of a patch,
    alone or followed by a failure of any later call (the rollback's own steps), leaves the
    workspace exactly as it was and answers that the patch failed; or, past the commit,
    leaves the patched tree. The old rollback wrote old bytes back with its errors
    suppressed: a second failure lost the file."""
    from support.faults import every_fault, restore, snapshot

    tools, ws = tools_codex, tools_codex.workspace
    _patch_tree(ws)
    before = snapshot(ws, skip=(".git",))
    assert tools.apply_patch(PATCH_OF_EVERY_KIND).startswith("Success.")
    after = snapshot(ws, skip=(".git",))
    assert after["bin/go.sh"][1] == b"echo b\n" and "old.txt" not in after
    runs = rolled_back = 0
    for failing, faults, out in every_fault(lambda: restore(ws, before, skip=(".git",)),
                                            lambda: tools.apply_patch(PATCH_OF_EVERY_KIND),
                                            monkeypatch):  # fmt: skip
        runs += 1
        assert faults.failed
        if out.startswith("apply_patch failed"):
            assert snapshot(ws, skip=(".git",)) == before, f"failures at {failing}: {out}"
            rolled_back += 1
        else:
            assert snapshot(ws, skip=(".git",)) == after, f"failures at {failing}: {out}"
        assert not [p for p in ws.parent.iterdir() if "cr-journal" in p.name], failing
    assert runs > 100 and rolled_back > runs // 2


def test_a_command_is_not_charged_the_wait_for_a_sandbox_slot(tools_claude, monkeypatch):
    """Issue 55 (class 7): a harness command's clock started before it had a sandbox slot,
    so another rollout's load was charged to this episode's command budget (a no-op was
    charged 10 s). As native ``run_tests``, the clock starts once the slot is held. The
    clock here is a fake that only the slot's holder moves, by 10 s, while it holds it."""
    import threading
    from types import SimpleNamespace

    from composer_replication.envs import profiles
    from composer_replication.sandbox.sandbox import SLOTS
    from composer_replication.sandbox.shell import ShellResult

    clock = [1000.0]
    monkeypatch.setattr(profiles, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    def run_shell(*args, **kwargs):
        with SLOTS.held():  # as the real one: its sandbox takes a slot
            return ShellResult("", 0)

    monkeypatch.setattr(profiles, "run_shell", run_shell)
    held, go = threading.Event(), threading.Event()

    def other_rollout():
        with SLOTS.held():
            held.set()
            go.wait(30)
            clock[0] += 10.0  # the load of another rollout, while this one waits

    limit = SLOTS.limit
    SLOTS.set_limit(1)
    try:
        holder = threading.Thread(target=other_rollout)
        holder.start()
        held.wait(30)
        threading.Timer(0.3, go.set).start()
        assert tools_claude.Bash("true") == "(Bash completed with no output)"
        holder.join(30)
    finally:
        SLOTS.set_limit(limit)
    assert tools_claude.episode.spent_s == 0.0


LATIN1 = b"# caf\xe9 \xff\xfe\nx = 2\ny = 3\n"
"""A file that is not UTF-8 (Latin-1 bytes and two bytes no encoding maps)."""


def test_edit_keeps_the_bytes_that_are_not_utf8(tools_claude):
    """Issue 55 (class 9): ``Edit`` read the file with ``errors="replace"``, so changing one
    line rewrote every byte that is not UTF-8 elsewhere in the file as U+FFFD, silently. Now
    they are kept as they are; a lone surrogate in the model's own strings is refused."""
    tools, ws = tools_claude, tools_claude.workspace
    (ws / "legacy.py").write_bytes(LATIN1)
    tools.Read("/repo/legacy.py")
    assert "updated successfully" in tools.Edit("/repo/legacy.py", "x = 2", "x = 20")
    assert (ws / "legacy.py").read_bytes() == LATIN1.replace(b"x = 2", b"x = 20")
    out = tools.Edit("/repo/legacy.py", "y = 3", "y = \udcff")
    assert out.startswith("<tool_use_error>new_string: the content is not valid UTF-8")
    assert (ws / "legacy.py").read_bytes() == LATIN1.replace(b"x = 2", b"x = 20")


def test_apply_patch_keeps_the_bytes_that_are_not_utf8(tools_codex):
    """Issue 55 (class 9): the same for Codex's ``apply_patch``; and a patch holding a lone
    surrogate (which would otherwise become a raw byte) is refused before anything is read."""
    tools, ws = tools_codex, tools_codex.workspace
    (ws / "legacy.py").write_bytes(LATIN1)
    patch = "*** Begin Patch\n*** Update File: legacy.py\n@@\n-y = 3\n+y = 30\n*** End Patch"
    assert tools.apply_patch(patch).startswith("Success.")
    assert (ws / "legacy.py").read_bytes() == LATIN1.replace(b"y = 3", b"y = 30")
    bad = "*** Begin Patch\n*** Update File: legacy.py\n@@\n-x = 2\n+x = \udcff\n*** End Patch"
    assert "not valid UTF-8 text" in tools.apply_patch(bad)
    assert (ws / "legacy.py").read_bytes() == LATIN1.replace(b"y = 3", b"y = 30")
