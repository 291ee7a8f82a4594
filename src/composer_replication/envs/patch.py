"""Codex CLI's patch format (its ``apply_patch`` tool), parsed and applied to text in memory.

The format, as Codex's tool description states it::

    *** Begin Patch
    *** Add File: <path>          then every line of the new file prefixed with +
    *** Delete File: <path>
    *** Update File: <path>
    *** Move to: <new path>       optional, right after Update File
    @@ <optional context line>    one per hunk; then ' ' context, '-' removed, '+' added lines
    *** End of File               optional: the hunk ends at the end of the file
    *** End Patch

A hunk's context and removed lines must occur in the file (after the ``@@`` line's context,
if any, and after the previous hunk); they are matched exactly, then ignoring trailing
whitespace, then ignoring surrounding whitespace (as Codex does). Nothing is written until
every file of the patch applies: :func:`apply_patch` returns the new contents, or raises
:class:`PatchError` with the message the agent reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

BEGIN, END = "*** Begin Patch", "*** End Patch"
ADD, DELETE, UPDATE, MOVE = (
    "*** Add File: ",
    "*** Delete File: ",
    "*** Update File: ",
    "*** Move to: ",
)
EOF_MARK = "*** End of File"


class PatchError(ValueError):
    """A patch that does not parse or does not apply; the message is the tool's answer."""


@dataclass
class FileChange:
    """One file of a patch: ``op`` A (add), D (delete) or M (update, maybe moved)."""

    op: str
    path: str
    text: str | None = None
    """The new content (None for a delete)."""
    move_to: str | None = None


@dataclass
class _Hunk:
    context: str = ""
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    at_end: bool = False


def apply_patch(patch: str, read: Callable[[str], str | None]) -> list[FileChange]:
    """The changes ``patch`` makes, given ``read(path)`` (a file's text, None if absent)."""
    lines = str(patch).strip().splitlines()
    if not lines or lines[0].strip() != BEGIN:
        raise PatchError(f"Invalid patch: the first line of the patch must be '{BEGIN}'")
    if lines[-1].strip() != END:
        raise PatchError(f"Invalid patch: the last line of the patch must be '{END}'")
    changes, i = [], 1
    while i < len(lines) - 1:
        line = lines[i]
        if line.startswith(ADD):
            path, i = line[len(ADD) :].strip(), i + 1
            body = []
            while i < len(lines) - 1 and lines[i].startswith("+"):
                body.append(lines[i][1:])
                i += 1
            if read(path) is not None:
                raise PatchError(f"Invalid patch: {path} already exists (use Update File)")
            changes.append(FileChange("A", path, "\n".join(body) + "\n"))
        elif line.startswith(DELETE):
            path, i = line[len(DELETE) :].strip(), i + 1
            if read(path) is None:
                raise PatchError(f"Failed to delete {path}: no such file")
            changes.append(FileChange("D", path))
        elif line.startswith(UPDATE):
            path, i = line[len(UPDATE) :].strip(), i + 1
            move = None
            if i < len(lines) - 1 and lines[i].startswith(MOVE):
                move, i = lines[i][len(MOVE) :].strip(), i + 1
            hunks, i = _hunks(lines, i)
            text = read(path)
            if text is None:
                raise PatchError(f"Failed to update {path}: no such file")
            changes.append(FileChange("M", path, _apply_hunks(path, text, hunks), move))
        elif not line.strip():
            i += 1
        else:
            raise PatchError(f"Invalid patch: unexpected line {i + 1}: {line[:120]!r}")
    if not changes:
        raise PatchError("Invalid patch: no file to change")
    return changes


def summary(changes: list[FileChange]) -> str:
    """Codex's answer to a patch that applied."""
    rows = [f"{c.op} {c.move_to or c.path}" for c in changes]
    return "Success. Updated the following files:\n" + "\n".join(rows) + "\n"


def _hunks(lines: list[str], i: int) -> tuple[list[_Hunk], int]:
    hunks: list[_Hunk] = []
    while i < len(lines) - 1:
        line = lines[i]
        if line.startswith("*** ") and line.strip() != EOF_MARK:
            break
        if line.strip() == EOF_MARK:
            if hunks:
                hunks[-1].at_end = True
        elif line.startswith("@@"):
            hunks.append(_Hunk(context=line[2:].strip()))
        else:
            if not hunks:
                hunks.append(_Hunk())
            tag, text = (line[:1], line[1:]) if line else (" ", "")
            if tag not in " -+":
                raise PatchError(f"Invalid patch: unexpected line {i + 1}: {line[:120]!r}")
            if tag in " -":
                hunks[-1].old.append(text)
            if tag in " +":
                hunks[-1].new.append(text)
        i += 1
    if not hunks:
        raise PatchError("Invalid patch: an Update File section has no change")
    return hunks, i


def _apply_hunks(path: str, text: str, hunks: list[_Hunk]) -> str:
    lines = text.split("\n")
    trailing = lines[-1] == ""
    if trailing:
        lines = lines[:-1]
    cursor = 0
    for h in hunks:
        if h.context:
            at = _find(lines, [h.context], cursor)
            if at is None:
                raise PatchError(f"Failed to find context '{h.context[:120]}' in {path}")
            cursor = at + 1
        start = len(lines) - len(h.old) if h.at_end else _find(lines, h.old, cursor)
        if start is None or start < 0 or (h.at_end and _find(lines, h.old, start) != start):
            shown = "\n".join(h.old)[:400]
            raise PatchError(f"Failed to find expected lines in {path}:\n{shown}")
        lines[start : start + len(h.old)] = h.new
        cursor = start + len(h.new)
    return "\n".join(lines) + ("\n" if trailing or not lines else "")


def _find(lines: list[str], want: list[str], start: int) -> int | None:
    """First index >= start where ``want`` occurs: exactly, then ignoring trailing
    whitespace, then ignoring surrounding whitespace. Linear in the file and the hunk (a
    window compared at every line cost their product: a 400-line hunk that almost matches a
    file of 500k lines held the trainer's process for about 25 s per call)."""
    if not want:
        return start
    for norm in (lambda s: s, str.rstrip, str.strip):
        at = _sublist([norm(x) for x in lines[start:]], [norm(w) for w in want])
        if at is not None:
            return start + at
    return None


def _sublist(hay: list[str], needle: list[str]) -> int | None:
    """First index of ``needle`` in ``hay`` (Knuth-Morris-Pratt over lines), or None."""
    fail, k = [0] * len(needle), 0
    for i in range(1, len(needle)):
        while k and needle[i] != needle[k]:
            k = fail[k - 1]
        k += needle[i] == needle[k]
        fail[i] = k
    k = 0
    for i, line in enumerate(hay):
        while k and line != needle[k]:
            k = fail[k - 1]
        k += line == needle[k]
        if k == len(needle):
            return i - k + 1
    return None
