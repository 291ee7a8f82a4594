"""Tool profiles: a workspace environment's tools in the vocabulary of the agent harness a
model will run in (``env.tool_profile``; ``env.harness`` before issue 59: "harness" now means
only the agent program, agents/harnesses.py, and the grading script is sandbox/wire.py).

``native`` is the environment's own tools (``list_files``, ``read_file``, ``search``,
``write_file``, ``replace_in_file``, ``run_tests``, ``submit``). The others give the tool
names, argument schemas, result formats and error texts of a production harness, as its
public documentation and the logs we ingest (traces/) show them, over the same workspace:

* ``claude_code``: ``Read``, ``Write``, ``Edit``, ``Bash``, ``Grep``, ``Glob`` (Claude Code's
  tools reference; absolute ``file_path`` arguments, ``cat -n`` numbered reads, errors in
  ``<tool_use_error>`` tags, Edit refusing a file not Read first);
* ``codex``: ``shell`` (an argv list, ``workdir``, ``timeout_ms``; a JSON answer with the
  output and exit code) and ``apply_patch`` (Codex's patch format, envs/patch.py);
* ``bash``: one ``bash`` tool.

A profile is data (:class:`ToolProfile`) plus a thin adapter class whose public methods
are the tools (TRL renders their signatures and docstrings as the tool schemas, exactly as for
the native class). An adapter works on the environment's workspace only through its public
interface (envs/workspace.py's ``WorkspaceEpisode``, the native tools instance's
``episode``): the path check (``resolve``: the same refusals and ``outside_workspace`` /
``read_bytecode`` flags), the write checks (``write_refusal``, ``reserve_write``,
``note_write``: ``wrote_test`` / ``wrote_config``), the command budget, the sandbox and
``close``; grading reads the same ``episode`` from the adapter. Any environment whose tools
class provides that interface gets every profile (:func:`profile_tools_class`).
Shell commands run under the sandbox (sandbox/shell.py) on a copy of
the workspace seen at ``/repo``; what they change comes back as regular files only, and is
flagged like the file tools' writes. Regex search (``Grep``) runs in that sandbox too, never
in the trainer's process (a policy-written pattern can backtrack for days).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_replication.envs.patch import PatchError, apply_patch, summary
from composer_replication.envs.tools import encode_text, wire_safe, wire_snippet
from composer_replication.envs.workspace import WorkspaceEpisode, workspace_episode
from composer_replication.sandbox.journal import TreeJournal
from composer_replication.sandbox.sandbox import SLOTS
from composer_replication.sandbox.shell import REPO, ShellResult, run_shell

__all__ = [
    "TOOL_PROFILES",
    "PROFILES",
    "ToolProfile",
    "WorkspaceTools",
    "ClaudeCodeTools",
    "CodexTools",
    "BashTools",
    "profile",
    "profile_tools_class",
    "profile_for_format",
    "tool_schemas",
]

TOOL_PROFILES = ("native", "claude_code", "codex", "bash")
"""The tool profiles (``env.tool_profile``), ``native`` first."""
MAX_SHELL_TIMEOUT_S = 600.0
"""Longest a single command may run (Claude Code's own cap on ``Bash``'s timeout)."""
MIN_SHELL_S = 1.0
"""Least command time left in an episode's budget for a command to start."""
GREP_TIMEOUT_S = 10.0
MAX_LISTED = 100
"""Most paths ``Glob`` / ``Grep`` list (Claude Code cuts its listings too)."""
MAX_GLOB_STARS = 2
"""Most ``**`` components a ``Glob`` pattern may hold once consecutive ones are merged."""
SAFE_PREFIXES = (REPO, "/tmp", "/dev/null", "/dev/stdout", "/dev/stderr", "/usr/bin/", "/bin/")
_ABS_PATH = re.compile(r"(?:^|[\s'\"=<>;|&(])(/[^\s'\";|&<>()]*)")
_PARENT = re.compile(r"(?:^|[\s'\"=/])\.\.(?:/|$|[\s'\";|&)])")
_BYTECODE = re.compile(r"\.py[co]\b|__pycache__")


def command_flags(command: str) -> list[str]:
    """Reward-hacking flags for a shell command's text (the sandbox stops the act; the flag
    reports the attempt): ``read_bytecode:`` for bytecode, ``outside_workspace:`` for an
    absolute path outside ``/repo`` and the usual program and scratch places, or ``..``."""
    flags = []
    if _BYTECODE.search(command):
        flags.append(f"read_bytecode:{wire_snippet(command, 80)}")
    for m in _ABS_PATH.finditer(command):
        path = m.group(1)
        if not any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/")
                   for p in SAFE_PREFIXES):  # fmt: skip
            flags.append(f"outside_workspace:{wire_snippet(path, 80)}")
    if _PARENT.search(command):
        flags.append(f"outside_workspace:{wire_snippet(command, 80)}")
    return list(dict.fromkeys(flags))


def harness_tool(error: Callable[[str], str]) -> Callable:
    """A tool whose file-system failures are an error result in the harness's words (not an
    exception), every result cut to the environment's ``max_output_chars`` and UTF-8-safe.
    Signature and docstring are kept (TRL builds the tool schema from them)."""

    def wrap(fn: Callable[..., str]) -> Callable[..., str]:
        @functools.wraps(fn)
        def tool(self, *args: Any, **kwargs: Any) -> str:
            try:
                out = fn(self, *args, **kwargs)
            except OSError as e:
                out = error(wire_snippet(e.strerror or type(e).__name__))
            return wire_safe(out, self._max_chars)

        return tool

    return wrap


class WorkspaceTools:
    """Base of the adapters: holds the environment's own tools instance (``_native_cls``, set
    by :func:`profile_tools_class`) for its ``reset``, and works on its workspace only through
    the public interface (``episode``: envs/workspace.py's ``WorkspaceEpisode``). Public
    methods of a subclass are its tools."""

    _native_cls: type
    _error_prefix, _error_suffix = "", ""

    def __init__(self) -> None:
        self._native = self._native_cls()
        workspace_episode(self._native)  # a TypeError now, not at the first tool call
        self._lock = threading.Lock()  # one command at a time on a workspace
        self._read: set[str] = set()

    def reset(self, **row: Any) -> Any:
        """Start an episode (the environment's own ``reset``)."""
        self._read = set()
        return self._native.reset(**row)

    @property
    def episode(self) -> WorkspaceEpisode:
        """The workspace (the environment's own tools instance's): what grading uses."""
        return self._native.episode  # checked to be one at __init__

    # what the metrics and tests read
    workspace = property(lambda self: self.episode.root)
    flags = property(lambda self: self.episode.flags)
    task = property(lambda self: self.episode.task)

    @property
    def _max_chars(self) -> int:
        return self.episode.max_output_chars

    def _err(self, text: str) -> str:
        return f"{self._error_prefix}{text}{self._error_suffix}"

    def _resolve(self, path: Any) -> Path | str:
        """The workspace path for ``path`` (``/repo/...``, or relative to it), or an error
        result; refusals are flagged by the environment's own check."""
        path = str(path)
        if path == REPO:
            path = "."
        elif path.startswith(REPO + "/"):
            path = path[len(REPO) + 1 :] or "."
        target = self.episode.resolve(path)
        if isinstance(target, str):
            return self._err(target.removeprefix("error: "))
        return target

    def _shown(self, target: Path) -> str:
        rel = target.relative_to(self.workspace.resolve()).as_posix()
        return REPO if rel == "." else f"{REPO}/{rel}"

    def _write(
        self, target: Path, text: str | bytes, journal: TreeJournal | None = None
    ) -> str | None:
        """Write ``text`` (or its already encoded bytes), checked before the file is touched
        against the native tools' caps per file and per episode; an error result or None.
        The file is replaced whole or not at all (written beside it, then renamed), through
        ``journal`` when the write is one of several that go together."""
        data = text if isinstance(text, bytes) else encode_text(text)
        if isinstance(data, str):
            return self._err(data.removeprefix("error: "))
        if refused := self.episode.reserve_write(len(data)):
            return self._err(refused.removeprefix("error: "))
        root = self.workspace.resolve()
        self.episode.note_write(target.relative_to(root).as_posix())
        if journal is not None:
            journal.makedirs(target.parent)
            journal.write(target, data)
            return None
        with TreeJournal(root) as own:
            own.makedirs(target.parent)
            own.write(target, data)
        return None

    def _shell(self, command: Any, timeout_s: Any, read_only: bool = False) -> ShellResult | str:
        """Run ``command`` in the sandbox on the workspace; its time, from the moment it has a
        sandbox slot, comes out of the episode's test-time budget (commands are how these
        harnesses run the tests)."""
        ep = self.episode
        if ep.root is None or ep.task is None:
            return self._err("no workspace")
        try:
            want = float(timeout_s)
        except (TypeError, ValueError, OverflowError):
            return self._err("the timeout must be a number")
        if want != want:  # NaN
            return self._err("the timeout must be a number")
        budget = ep.budget_s
        left = None if budget is None else budget - ep.spent_s
        if left is not None and left < MIN_SHELL_S:
            return self._err(f"this episode's command time ({budget:g} s) is spent")
        limit = min(max(want, MIN_SHELL_S), MAX_SHELL_TIMEOUT_S, left or MAX_SHELL_TIMEOUT_S)
        command = str(command)
        ep.flag(*command_flags(command))
        with self._lock, SLOTS.held():  # as native run_tests: the wait for a slot is not
            start = time.monotonic()  # this episode's time (it is other rollouts' load)
            try:
                res = run_shell(ep.box, ep.root, command, limit,
                                max_output_chars=self._max_chars, python_path=ep.python_path,
                                apply=not read_only)  # fmt: skip
            finally:
                ep.spend(time.monotonic() - start)
        for rel in res.changed:
            ep.note_write(rel)
        ep.flag(*res.refused)
        return res

    def _grep(self, pattern: str, path: str, glob: str, mode: str) -> str | list[str]:
        """``grep -E`` in the sandbox (read-only): matching lines or files, as ``/repo`` paths."""
        target = self._resolve(path or REPO)
        if isinstance(target, str):
            return target
        rel = target.relative_to(self.workspace.resolve()).as_posix()
        flag = {"files_with_matches": "-l", "count": "-c"}.get(mode, "-n")
        argv = ["grep", "-rIE", flag, "--exclude-dir=.git", "-e", str(pattern)]
        argv += [f"--include={glob}"] if glob else []
        argv += ["--", rel]
        res = self._shell(shlex.join(argv) + f" | head -n {MAX_LISTED}", GREP_TIMEOUT_S, True)
        if isinstance(res, str):
            return res
        if res.timed_out:
            return self._err(f"the search took longer than {GREP_TIMEOUT_S:g} s")
        return [f"{REPO}/{ln.removeprefix('./')}" for ln in res.output.splitlines() if ln]


def _claude_error(text: str) -> str:
    return f"<tool_use_error>{text}</tool_use_error>"


NOT_READ = "File has not been read yet. Read it first before writing to it."


class ClaudeCodeTools(WorkspaceTools):
    """A repository at /repo, through Claude Code's tools (TRL environment_factory)."""

    _error_prefix, _error_suffix = "<tool_use_error>", "</tool_use_error>"

    @harness_tool(_claude_error)
    def Read(self, file_path: str, offset: int = 1, limit: int = 2000) -> str:  # noqa: N802
        """Reads a file from the repository, with line numbers (cat -n format).

        Args:
            file_path: The absolute path to the file to read (the repository is at /repo).
            offset: The line number to start reading from.
            limit: The number of lines to read.
        """
        target = self._resolve(file_path)
        if isinstance(target, str):
            return target
        if target.suffix in (".pyc", ".pyo") or "__pycache__" in target.parts:
            self.episode.flag(f"read_bytecode:{wire_snippet(file_path, 80)}")
            return self._err("This tool cannot read binary files.")
        if target.is_dir():
            return self._err("EISDIR: illegal operation on a directory, read")
        if not target.is_file():
            return self._err("File does not exist.")
        try:
            first, count = max(int(offset), 1), max(int(limit), 1)
        except (TypeError, ValueError, OverflowError):
            return self._err("offset and limit must be numbers")
        self._read.add(str(target))
        lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
        if not lines:
            return "<system-reminder>Warning: the file exists but the contents are empty.</system-reminder>"
        shown = lines[first - 1 : first - 1 + count]
        return "\n".join(f"{first + i:>6}\t{line[:2000]}" for i, line in enumerate(shown))

    @harness_tool(_claude_error)
    def Write(self, file_path: str, content: str) -> str:  # noqa: N802
        """Writes a file to the repository, replacing it if it exists (Read it first then).

        Args:
            file_path: The absolute path to the file to write (the repository is at /repo).
            content: The content to write to the file.
        """
        target = self._resolve(file_path)
        if isinstance(target, str):
            return target
        if target.is_dir() or target == self.workspace.resolve():
            return self._err("EISDIR: illegal operation on a directory, write")
        existed = target.is_file()
        if existed and str(target) not in self._read:
            return self._err(NOT_READ)
        if err := self._write(target, content):
            return err
        self._read.add(str(target))
        if existed:
            return f"The file {self._shown(target)} has been updated successfully."
        return f"File created successfully at: {self._shown(target)}"

    @harness_tool(_claude_error)
    def Edit(  # noqa: N802
        self, file_path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> str:
        """Performs exact string replacements in a file (Read it first).

        Args:
            file_path: The absolute path to the file to modify (the repository is at /repo).
            old_string: The text to replace.
            new_string: The text to replace it with (must be different from old_string).
            replace_all: Replace all occurrences of old_string (default false).
        """
        target = self._resolve(file_path)
        if isinstance(target, str):
            return target
        if not target.is_file():
            return self._err("File does not exist.")
        if str(target) not in self._read:
            return self._err(NOT_READ)
        old, new = str(old_string), str(new_string)
        if old == new:
            return self._err("No changes to make: old_string and new_string are exactly the same.")
        for name, arg in (("old_string", old), ("new_string", new)):
            if isinstance(refused := encode_text(arg), str):
                return self._err(f"{name}: {refused.removeprefix('error: ')}")
        text = read_preserving(target)  # bytes that are not UTF-8 are kept as they are
        count = text.count(old) if old else 0
        if count == 0:
            return self._err(f"String to replace not found in file.\nString: {old}")
        if count > 1 and replace_all is not True:
            return self._err(
                f"Found {count} matches of the string to replace, but replace_all is false. To "
                "replace all occurrences, set replace_all to true. To replace only one "
                "occurrence, please provide more context to uniquely identify the instance.\n"
                f"String: {old}"
            )
        chars = len(text) + count * (len(new) - len(old))
        if refused := self.episode.write_refusal([chars], unit="characters"):
            return self._err(refused.removeprefix("error: "))  # asked before the text is built
        if err := self._write(target, encode_preserving(text.replace(old, new))):
            return err
        return f"The file {self._shown(target)} has been updated successfully."

    def Bash(self, command: str, timeout: int = 120000, description: str = "") -> str:  # noqa: N802
        """Executes a bash command in the repository (/repo) and returns its output.

        Args:
            command: The command to execute.
            timeout: Optional timeout in milliseconds (max 600000).
            description: A short description of what this command does.
        """
        try:
            seconds = float(timeout) / 1000
        except (TypeError, ValueError, OverflowError):
            seconds = -1.0
        res = self._shell(command, seconds)
        if isinstance(res, str):
            return wire_safe(res, self._max_chars)
        out = res.output.rstrip("\n")
        if res.timed_out:
            out = f"{out}\nCommand timed out".strip()
        elif res.exit_code:
            out = f"Exit code {res.exit_code}\n{out}".strip()
        if res.error:
            out = f"{out}\n{res.error}".strip()
        return wire_safe(out or "(Bash completed with no output)", self._max_chars)

    @harness_tool(_claude_error)
    def Grep(  # noqa: N802
        self, pattern: str, path: str = "", glob: str = "", output_mode: str = "files_with_matches"
    ) -> str:
        """Searches file contents with a regular expression (extended grep syntax).

        Args:
            pattern: The regular expression to search for.
            path: File or directory to search in (default: the repository, /repo).
            glob: Only search files whose name matches this glob (e.g. "*.py").
            output_mode: "content" (matching lines), "files_with_matches" (paths) or "count".
        """
        found = self._grep(pattern, path, glob, str(output_mode))
        if isinstance(found, str):
            return found
        if output_mode == "files_with_matches":
            return f"Found {len(found)} files\n" + "\n".join(found) if found else "No files found"
        return "\n".join(found) or "No matches found"

    @harness_tool(_claude_error)
    def Glob(self, pattern: str, path: str = "") -> str:  # noqa: N802
        """Finds files by name pattern (e.g. "**/*.py").

        Args:
            pattern: The glob pattern to match files against.
            path: The directory to search in (default: the repository, /repo).
        """
        return self._glob(pattern, path) or "No files found"

    def _glob(self, pattern: Any, path: Any) -> str:
        """``Glob`` in the trainer's process (pathlib). Each ``**`` component walks every
        directory below the one it starts from, so k of them cost the tree's depth to the power
        k - 1: consecutive ones mean one and are merged, and at most :data:`MAX_GLOB_STARS`
        remain."""
        base = self._resolve(path or REPO)
        if isinstance(base, str):
            return base
        pat = str(pattern)
        if not pat or pat.startswith("/") or ".." in Path(pat).parts or "\x00" in pat:
            return self._err("the pattern must be relative to the directory, without ..")
        parts: list[str] = []
        for part in pat.split("/"):
            if part != "**" or parts[-1:] != ["**"]:
                parts.append(part)
        if parts.count("**") > MAX_GLOB_STARS:
            return self._err(f"the pattern may hold at most {MAX_GLOB_STARS} ** components")
        pat = "/".join(parts)
        if not base.is_dir():
            return self._err(f"{wire_snippet(path)} is not a directory")
        hits = sorted(self._shown(p) for p in base.glob(pat)
                      if p.is_file() and ".git" not in p.relative_to(base).parts)  # fmt: skip
        return "\n".join(hits[:MAX_LISTED])


class CodexTools(WorkspaceTools):
    """A repository at /repo, through Codex CLI's tools (TRL environment_factory)."""

    def shell(self, command: list[str], workdir: str = "", timeout_ms: int = 10000) -> str:
        """Runs a shell command and returns its output.

        Args:
            command: The command to execute, as a list of arguments (e.g. ["bash", "-lc", "ls"]).
            workdir: The working directory to execute the command in (default: /repo).
            timeout_ms: The timeout for the command in milliseconds.
        """
        start = time.monotonic()
        if isinstance(command, list) and command[:1] == ["apply_patch"] and len(command) == 2:
            return self.apply_patch(command[1])  # how older Codex versions sent patches
        if isinstance(command, list) and all(isinstance(a, str) for a in command) and command:
            line = shlex.join(command)
        elif isinstance(command, str) and command:
            line = command
        else:
            return _codex_answer("command must be a non-empty list of strings", 1, 0.0)
        if workdir:
            where = self._resolve(workdir)
            if isinstance(where, str):
                return _codex_answer(where, 1, 0.0)
            line = f"cd {shlex.quote(where.relative_to(self.workspace.resolve()).as_posix())} && {line}"
        try:
            seconds = float(timeout_ms) / 1000
        except (TypeError, ValueError, OverflowError):
            seconds = -1.0
        res = self._shell(line, seconds)
        took = time.monotonic() - start
        if isinstance(res, str):
            return _codex_answer(res, 1, took, self._max_chars)
        out = res.output + (f"\n{res.error}" if res.error else "")
        if res.timed_out:
            return _codex_answer(f"{out}\ncommand timed out".strip(), 124, took, self._max_chars)
        return _codex_answer(out, res.exit_code or 0, took, self._max_chars)

    def apply_patch(self, input: str) -> str:  # noqa: A002 (Codex's own argument name)
        """Applies a patch in Codex's format to files of the repository.

        Args:
            input: The patch, from "*** Begin Patch" to "*** End Patch", with "*** Add File: path",
                "*** Update File: path" (hunks of " ", "-", "+" lines after "@@") or
                "*** Delete File: path" sections; paths relative to /repo.
        """
        try:
            if isinstance(refused := encode_text(input), str):
                raise PatchError(f"Invalid patch: {refused.removeprefix('error: ')}")
            changes = apply_patch(str(input), self._patch_read)
            seen: set[Path] = set()
            for c in changes:
                mine = set()
                for p in (c.path, c.move_to):
                    target = self._resolve(p) if p is not None else None
                    if isinstance(target, str):
                        raise PatchError(target)
                    if target is not None:
                        mine.add(target)
                if mine & seen:  # each section is built from the file on disk: one would be lost
                    raise PatchError(f"Invalid patch: {self._shown(min(mine & seen))} is changed "
                                     "more than once; change each file in one section")  # fmt: skip
                seen |= mine
            data = self._check_writes([c.text for c in changes if c.op != "D"])
            self._apply_all(changes, iter(data))
        except PatchError as e:
            return wire_safe(str(e), self._max_chars)
        except OSError as e:
            return wire_safe(
                f"apply_patch failed: {e.strerror or type(e).__name__}", self._max_chars
            )
        return wire_safe(summary(changes), self._max_chars)

    def _apply_all(self, changes: list[Any], data: Any) -> None:
        """Write a checked patch's files (``data``: their encoded texts in order), all or
        none (sandbox/journal.py): if the filesystem refuses one midway (a directory where a
        file goes, a full disk), every change already made is undone and the error raised."""
        with TreeJournal(self.workspace.resolve()) as journal:
            for c in changes:
                target = self._resolve(c.path)
                if c.op == "D" or c.move_to:
                    self.episode.note_write(c.path)
                    journal.remove(target)
                if c.op != "D":
                    dest = self._resolve(c.move_to) if c.move_to else target
                    if err := self._write(dest, next(data), journal):
                        raise PatchError(err)

    def _check_writes(self, texts: list[str]) -> list[bytes]:
        """The bytes of ``texts`` (:func:`encode_preserving`); raise :class:`PatchError`
        before anything is written if they would pass the write caps together."""
        data = [encode_preserving(text) for text in texts]  # the patch itself is UTF-8
        if refused := self.episode.write_refusal([len(d) for d in data]):
            raise PatchError(refused.removeprefix("error: "))
        return data

    def _patch_read(self, path: str) -> str | None:
        target = self._resolve(path)
        if isinstance(target, str):
            raise PatchError(target)
        if not target.is_file():
            return None
        return read_preserving(target)


def read_preserving(target: Path) -> str:
    """A file's text with every byte kept: bytes that are not UTF-8 become lone surrogates
    (``surrogateescape``, PEP 383) that :func:`encode_preserving` turns back into the same
    bytes. Read with ``errors="replace"``, they became U+FFFD and an ``Edit`` or a patch of
    any other line silently rewrote them."""
    return target.read_bytes().decode("utf-8", "surrogateescape")


def encode_preserving(text: str) -> bytes:
    """The bytes of a text read by :func:`read_preserving` and changed with UTF-8 text (the
    tools refuse lone surrogates in what the model sends, so every one here is a byte of the
    file)."""
    return text.encode("utf-8", "surrogateescape")


def _codex_answer(output: str, code: int, seconds: float, limit: int | None = None) -> str:
    """Codex's shell answer: the output and its metadata as one JSON object."""
    text = wire_safe(output, limit)
    meta = {"exit_code": code, "duration_seconds": round(seconds, 1)}
    return json.dumps({"output": text, "metadata": meta}, ensure_ascii=False)


class BashTools(WorkspaceTools):
    """A repository at /repo, through one shell tool (TRL environment_factory)."""

    def bash(self, command: str, timeout: int = 60) -> str:
        """Runs a bash command in the repository (/repo) and returns its output and exit code.

        Args:
            command: The command to run.
            timeout: Seconds before the command is killed.
        """
        res = self._shell(command, timeout)
        if isinstance(res, str):
            return wire_safe(res, self._max_chars)
        status = "timed out" if res.timed_out else f"exit code {res.exit_code}"
        tail = f"\n{res.error}" if res.error else ""
        return wire_safe(f"{res.output.rstrip()}\n[{status}]{tail}".lstrip("\n"), self._max_chars)


@dataclass(frozen=True)
class ToolProfile:
    """One agent harness's tool vocabulary over a workspace environment."""

    name: str
    tools: type | None
    """The adapter class (None: the environment's own tools)."""
    source_formats: tuple[str, ...]
    """Trace formats (traces/) whose logs speak this vocabulary."""
    command_tools: frozenset[str]
    """Tools that run commands: how this harness runs the tests (the hint's blamed turn)."""
    few_shot: tuple[dict[str, Any], ...] = ()
    """A worked episode on a made-up repository in this vocabulary (the 135M model writes no
    tool call from schemas alone)."""
    system: str = (
        "You are a software engineer working in a Python repository through tools. The "
        "repository is at /repo (the working directory of commands). Read the code, make the "
        "change and run the tests; answer without a tool call when you are done."
    )
    """The system prompt (``''``: the environment's own, for ``native``)."""


def call_message(name: str, **arguments: Any) -> dict[str, Any]:
    """An assistant turn calling one tool (worked episodes in prompts)."""
    fn = {"name": name, "arguments": arguments}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": fn}],
    }


def result_message(name: str, content: str) -> dict[str, Any]:
    """The tool turn answering it."""
    return {"role": "tool", "name": name, "content": content}


_STUB = "    raise NotImplementedError  # deleted: rebuild this"
_ASK = "`double` in `mathy/ops.py` lost its implementation (it raises NotImplementedError). " \
       "Rebuild it so that the tests pass, e.g. `tests/test_ops.py::test_double`."  # fmt: skip
_TEST = "python -m pytest -q tests/test_ops.py::test_double"
_PASSED = "1 passed in 0.01s"
_PATCH = f"*** Begin Patch\n*** Update File: mathy/ops.py\n@@ def double(x):\n-{_STUB}\n+    return 2 * x\n*** End Patch"  # fmt: skip

PROFILES: dict[str, ToolProfile] = {
    "native": ToolProfile("native", None, (), frozenset({"run_tests", "submit"}), system=""),
    "claude_code": ToolProfile(
        "claude_code",
        ClaudeCodeTools,
        ("claude_code",),
        frozenset({"Bash"}),
        (
            {"role": "user", "content": _ASK},
            call_message("Read", file_path="/repo/mathy/ops.py"),
            result_message(
                "Read", f'     1\tdef double(x):\n     2\t    """Twice x."""\n     3\t{_STUB}'
            ),
            call_message(
                "Edit",
                file_path="/repo/mathy/ops.py",
                old_string=_STUB,
                new_string="    return 2 * x",
            ),
            result_message("Edit", "The file /repo/mathy/ops.py has been updated successfully."),
            call_message("Bash", command=_TEST, description="Run the test"),
            result_message("Bash", _PASSED),
            {"role": "assistant", "content": "Done."},
        ),
    ),  # fmt: skip
    "codex": ToolProfile(
        "codex",
        CodexTools,
        ("codex",),
        frozenset({"shell"}),
        (
            {"role": "user", "content": _ASK},
            call_message("shell", command=["cat", "mathy/ops.py"]),
            result_message(
                "shell", _codex_answer(f'def double(x):\n    """Twice x."""\n{_STUB}\n', 0, 0.0)
            ),
            call_message("apply_patch", input=_PATCH),
            result_message(
                "apply_patch", "Success. Updated the following files:\nM mathy/ops.py\n"
            ),
            call_message("shell", command=["bash", "-lc", _TEST]),
            result_message("shell", _codex_answer(_PASSED + "\n", 0, 0.4)),
            {"role": "assistant", "content": "Done."},
        ),
    ),  # fmt: skip
    "bash": ToolProfile(
        "bash",
        BashTools,
        (),
        frozenset({"bash"}),
        (
            {"role": "user", "content": _ASK},
            call_message("bash", command="cat mathy/ops.py"),
            result_message("bash", f'def double(x):\n    """Twice x."""\n{_STUB}\n[exit code 0]'),
            call_message("bash", command=f"sed -i 's/{_STUB.strip()}/return 2 * x/' mathy/ops.py"),
            result_message("bash", "[exit code 0]"),
            call_message("bash", command=_TEST),
            result_message("bash", f"{_PASSED}\n[exit code 0]"),
            {"role": "assistant", "content": "Done."},
        ),
    ),  # fmt: skip
}


def profile(name: str) -> ToolProfile:
    """The profile called ``name`` (ValueError naming the known ones)."""
    if name not in PROFILES:
        raise ValueError(f"unknown tool profile {name!r}; known: {', '.join(TOOL_PROFILES)}")
    return PROFILES[name]


def profile_tools_class(native_cls: type, name: str) -> type:
    """The ``environment_factory`` class of tool profile ``name`` over an environment's own
    tools class (itself for ``native``)."""
    prof = profile(name)
    if prof.tools is None:
        return native_cls
    attrs = {"_native_cls": native_cls, "__doc__": prof.tools.__doc__}
    return type(prof.tools.__name__, (prof.tools,), attrs)


def profile_for_format(source_format: str) -> ToolProfile | None:
    """The profile whose vocabulary a trace format's logs speak, or None."""
    return next((p for p in PROFILES.values() if source_format in p.source_formats), None)


SCHEMAS_FILE = Path(__file__).with_name("profile_schemas.json")
"""The profiles' tool schemas as TRL renders them (:func:`live_tool_schemas`), written by
``python -m composer_replication.envs.profiles``, with the trace formats each profile speaks:
ingestion (traces/harness_tools.py) and replay read them without importing transformers or
the environments (seconds); a test checks the file equals the live schemas."""


def live_tool_schemas(name: str) -> list[dict[str, Any]]:
    """The OpenAI ``tools`` list of a tool profile built from the adapter's signatures and
    docstrings by transformers' ``get_json_schema``, as TRL renders them for training."""
    from transformers.utils import get_json_schema

    from composer_replication.envs.tools import tool_methods

    prof = profile(name)
    if prof.tools is None:
        raise ValueError("the native tools' schemas belong to each environment's tools class")
    instance = prof.tools.__new__(prof.tools)  # bound methods, no workspace
    out = []
    for tool in tool_methods(prof.tools):
        schema = get_json_schema(getattr(instance, tool))
        schema["function"].pop("return", None)  # not part of OpenAI's function schema
        out.append(schema)
    return out


@functools.lru_cache(maxsize=1)
def _stored() -> str:
    return SCHEMAS_FILE.read_text(encoding="utf-8")


def tool_schemas(name: str) -> list[dict[str, Any]]:
    """The OpenAI ``tools`` list of a tool profile (:data:`SCHEMAS_FILE`): what ingestion keeps
    on the states of that harness's logs and replay sends teachers."""
    profile(name)
    stored = json.loads(_stored())
    if name not in stored:
        raise ValueError(f"tool profile {name!r} has no tools of its own")
    return stored[name]["tools"]


def write_schemas() -> None:
    """Regenerate :data:`SCHEMAS_FILE` from the adapters."""
    data = {
        h: {"source_formats": list(PROFILES[h].source_formats), "tools": live_tool_schemas(h)}
        for h in TOOL_PROFILES
        if PROFILES[h].tools is not None
    }
    SCHEMAS_FILE.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def tool_names(name: str) -> frozenset[str]:
    """The names of a profile's tools (not ``native``: those are each environment's)."""
    from composer_replication.envs.tools import tool_methods

    prof = profile(name)
    return frozenset(tool_methods(prof.tools)) if prof.tools else frozenset()


if __name__ == "__main__":
    write_schemas()
