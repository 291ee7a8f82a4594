"""Codex's patch format (envs/patch.py): add, update (with context, several hunks, end of
file, whitespace-tolerant matching), move and delete; a patch that fails anywhere changes
nothing and says why."""

from __future__ import annotations

import pytest

from composer_replication.envs.patch import PatchError, _find, apply_patch, summary

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


class _CountingLines(list):
    """A file's lines that count how many of them slices hand out."""

    taken = 0

    def __getitem__(self, key):
        out = super().__getitem__(key)
        if isinstance(key, slice):
            _CountingLines.taken += len(out)
        return out


def test_a_hunk_that_almost_matches_costs_the_file_plus_the_hunk_not_their_product():
    """Red-team pass 10: the search compared a hunk-sized window at every line (a 400-line
    hunk that almost matches a 500k-line file held the trainer's process ~25 s per call; a
    shell-made 32 MB file, minutes). Counted, not timed."""
    lines = _CountingLines(["x"] * 20_000)
    want = ["x"] * 199 + ["y"]
    _CountingLines.taken = 0
    assert _find(lines, want, 0) is None
    assert _CountingLines.taken <= 3 * (len(lines) + len(want))
    assert _find(lines, ["x", "x"], 5) == 5
    assert _find(["a", " b ", "c"], ["b", "c"], 0) == 1  # the third pass strips
