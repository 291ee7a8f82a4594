"""Codex's patch format (envs/patch.py): add, update (with context, several hunks, end of
file, whitespace-tolerant matching), move and delete; a patch that fails anywhere changes
nothing and says why."""

from __future__ import annotations

import pytest

from composer_replication.envs.patch import PatchError, apply_patch, summary

FILES = {"a.py": "def f():\n    raise NotImplementedError\n\n\ndef g():\n    return 1\n"}


def test_update_add_move_and_delete():
    patch = (
        "*** Begin Patch\n*** Update File: a.py\n*** Move to: b.py\n@@ def f():\n"
        "-    raise NotImplementedError\n+    return 2\n@@ def g():\n-    return 1  \n+    return 3\n"
        "*** End of File\n*** Add File: c.txt\n+hello\n+world\n*** Delete File: d.txt\n"
        "*** End Patch"
    )
    files = {**FILES, "d.txt": "x"}
    changes = apply_patch(patch, files.get)
    assert [(c.op, c.path, c.move_to) for c in changes] == [
        ("M", "a.py", "b.py"), ("A", "c.txt", None), ("D", "d.txt", None)]  # fmt: skip
    assert changes[0].text == "def f():\n    return 2\n\n\ndef g():\n    return 3\n"
    assert changes[1].text == "hello\nworld\n"
    assert summary(changes) == "Success. Updated the following files:\nM b.py\nA c.txt\nD d.txt\n"


@pytest.mark.parametrize(
    "patch, message",
    [
        ("garbage", "the first line of the patch must be '*** Begin Patch'"),
        ("*** Begin Patch\n*** Update File: a.py\n-nope\n+x\n*** End Patch",
         "Failed to find expected lines in a.py"),
        ("*** Begin Patch\n*** Update File: zz.py\n-a\n*** End Patch", "no such file"),
        ("*** Begin Patch\n*** Add File: a.py\n+x\n*** End Patch", "already exists"),
        ("*** Begin Patch\n*** Update File: a.py\n@@ nowhere\n-x\n*** End Patch",
         "Failed to find context"),
        ("*** Begin Patch\n*** Frobnicate: a.py\n*** End Patch", "unexpected line"),
        ("*** Begin Patch\n*** End Patch", "no file to change"),
    ],
)  # fmt: skip
def test_bad_patches_say_why(patch, message):
    with pytest.raises(PatchError, match=message.replace("*", r"\*")):
        apply_patch(patch, FILES.get)
