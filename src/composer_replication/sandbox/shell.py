"""A shell command run on an episode's workspace under the sandbox: the ``Bash`` / ``shell``
tool of the harness profiles (envs/profiles.py). Knows no task.

The workspace never enters the sandbox writable. Per call:

1. the trusted side copies the workspace (``.git`` included) to a world-readable staging
   directory, bound read-only at ``/cr-in``;
2. inside, ``sh`` copies it into ``/repo``, a tmpfs capped at ``repo_mb`` (a command cannot
   fill the host's disk), runs the command there under ``timeout -s KILL`` (and, for a
   command whose waits on the host are credited, an own-time watchdog: :class:`WaitCredit`)
   with stdin from ``/dev/null`` and its output in a file, then writes the exit status and the output's first
   ``max_output_chars`` bytes to stderr and ``/repo`` as a base64 tar to stdout;
3. the trusted side reads the tar as untrusted data (:func:`apply_tree`): only regular files
   and directories at clean relative paths come back; symlinks, hard links, devices, FIFOs
   and sparse members (whose holes would be read as zeros the stream never carried) are
   refused and reported; a stream that is cut, malformed or over the caps changes
   nothing. Files are rewritten only when their bytes changed, and files the command removed
   are removed, all or nothing: every name, path length (the host's ``PATH_MAX`` with the
   workspace's real prefix), and the bytes against the free disk are checked first, then the
   changes go through a rollback journal (sandbox/journal.py), so a failure midway leaves
   the workspace as it was and is reported in ``error``, never raised.

Everything else is the sandbox's (envs/sandbox.py): no network, a private PID namespace
killed when the call ends (nothing the command starts outlives it), ``max_processes``,
address-space, CPU-time and file-size limits, ``nobody`` when the trainer is root, no
site-packages or project sources, no host path but the system's programs and libraries.
``python`` on the command's PATH is the trainer's interpreter (its site-packages hidden);
``python_path`` adds read-only trees to its ``PYTHONPATH`` (Feature Deletion binds its pinned
copy of pytest, so ``python -m pytest`` works).

What a command says about itself (its exit status, its output) is feedback, never a verdict:
a process it leaves in the background can write to the same streams until the call ends.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from composer_replication.config import SandboxConfig
from composer_replication.sandbox.journal import TreeJournal
from composer_replication.sandbox.sandbox import (
    Sandbox,
    bindable_dir,
    sandbox_interpreter,
    world_readable,
)

REPO = "/repo"
"""Where the command sees the workspace (its working directory)."""
STAGE = "/cr-in"
MAX_COMMAND_CHARS = 32_000
"""Longest command accepted (it travels in the environment: Linux caps one string at 128 KiB)."""
MAX_MEMBERS = 20_000
"""Most files and directories a workspace may hold after a command (more: nothing applied)."""
COPY_MARGIN_S = 30.0
"""Wall seconds allowed beyond the command's own timeout for the copies in and out."""

CLOCK = "/cr-clock"
"""Where a :class:`WaitCredit`'s directory is bound read-only inside the sandbox."""

_SCRIPT = r"""
cp -R /cr-in/. /repo/ || { echo "cr-exit=copy-failed" >&2; exit 97; }
cd /repo || exit 97
if [ -z "$CR_OWN_CS" ]; then
  timeout -s KILL "$CR_TIMEOUT" /bin/sh -c "$CR_COMMAND" </dev/null >/tmp/.cr-out 2>&1 3>&- 4>&-
  status=$?
else
  read up _ </proc/uptime
  timeout -s KILL "$CR_TIMEOUT" /bin/sh -c "$CR_COMMAND" </dev/null >/tmp/.cr-out 2>&1 3>&- 4>&- &
  job=$!
  (/bin/sh -c "$CR_WATCHDOG" cr-watchdog "$job" "${up%.*}${up#*.}" </dev/null >/dev/null 2>&1 3>&- 4>&- &)
  { wait "$job"; status=$?; } 2>/dev/null
fi
echo "cr-exit=$status cr-size=$(wc -c </tmp/.cr-out)" >&2
head -c "$CR_OUTPUT" /tmp/.cr-out >&2
rm -f /tmp/.cr-out
tar -C /repo -cf - . | base64 -w 0
"""

_WATCHDOG = r"""
job=$1 start=$2
while sleep 0.25 && kill -0 "$job" 2>/dev/null; do
  read credit waiting <"$CR_CLOCK" || continue
  read up _ </proc/uptime
  if [ "$waiting" = 0 ] && [ $((${up%.*}${up#*.} - start - credit)) -gt "$CR_OWN_CS" ]; then
    kill -s KILL -- "-$job"
    exit 0
  fi
done
"""
"""The own-time watchdog (:class:`WaitCredit`): every 0.25 s, the command's wall time less the
credit the host published (centiseconds of ``/proc/uptime``); past the limit, and no wait in
progress, ``timeout``'s process group (the command's) is killed. Started in a subshell that
exits at once, so the script never reaps it (dash would report its death on the script's
stderr, the result channel); it ends by itself when the command has."""


@dataclass
class ShellResult:
    """One command's outcome. ``exit_code`` is None when the time limit killed it."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    output_chars: int = 0
    """Characters the command wrote in all (``output`` holds at most the cap)."""
    changed: list[str] = field(default_factory=list)
    """Relative paths the command created, changed or removed (brought back to the host)."""
    refused: list[str] = field(default_factory=list)
    """``kind:path`` of what was not brought back (``symlink:``, ``hardlink:``, ``sparse:``,
    ``special:``, ``path:``)."""
    error: str = ""
    """Why the workspace was left unchanged (cut or malformed stream, limits), or ''."""


class WaitCredit:
    """Time a command spends waiting on the host, not counted against its time limit: an
    agent's requests to the policy (agents/sandboxed.py), which wait for other episodes'
    batches. ``waited()`` says (seconds waited so far, a wait in progress included; whether
    one is in progress); at most ``max_s`` seconds are credited.

    The command's limit is then its own time: its wall time less the credit. Two clocks
    enforce it, both fed by the host (the command cannot change either):

    * inside the sandbox, the own-time watchdog (:data:`_WATCHDOG`) kills the command's
      process group with ``SIGKILL`` once its own time passes the limit while no wait is in
      progress (the script then copies ``/repo`` out, as after ``timeout``); it reads the
      credit from a file the host rewrites (atomically) whenever it changes, in a directory
      bound read-only at :data:`CLOCK`. ``timeout -s KILL`` still bounds the command at the
      limit plus ``max_s``;
    * on the host, the sandbox's wall deadline (the limit and ``COPY_MARGIN_S``) moves by the
      credit (``Sandbox.run_python``'s ``deadline_extension``): a command that stops the
      watchdog (same user) is still killed, with its whole PID namespace, from outside.

    :meth:`seconds` is that extension: each call publishes the credit if it changed."""

    def __init__(self, waited: Callable[[], tuple[float, bool]], max_s: float):
        self.waited, self.max_s = waited, max_s
        self.dir = bindable_dir("cr-clock-")
        self._shown: tuple[int, bool] | None = None
        self.seconds()

    def seconds(self) -> float:
        """Seconds credited so far (at most ``max_s``); publishes the credit to the sandbox
        when it changed (a wait in progress is published once, as such)."""
        waited, waiting = self.waited()
        credit = min(max(waited, 0.0), self.max_s)
        shown = (0 if waiting else round(credit * 100), waiting)
        if shown != self._shown:
            tmp = os.path.join(self.dir, ".credit")
            with open(tmp, "w") as f:
                f.write(f"{shown[0]} {int(waiting)}\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, os.path.join(self.dir, "credit"))
            self._shown = shown
        return credit

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def shell_sandbox(
    timeout_s: float, memory_mb: int = 512, max_processes: int = 64, repo_mb: int = 32
) -> SandboxConfig:
    """Limits of one command's sandbox: its wall clock covers the copies too; the read-back
    cap covers the base64 tar of a full ``/repo``."""
    wall = timeout_s + COPY_MARGIN_S
    return SandboxConfig(wall_timeout_s=wall, cpu_time_s=max(1, int(wall)), memory_mb=memory_mb,
                         max_processes=max_processes, work_dir_mb=64, audit_hook=False,
                         max_output_kb=min(repo_mb * 1024 * 4 // 3 + 64, 65536), file_size_mb=repo_mb)  # fmt: skip


def run_shell(
    box: Sandbox,
    workspace: Path,
    command: str,
    timeout_s: float,
    max_output_chars: int = 30_000,
    repo_mb: int = 32,
    python_path: tuple[str, ...] = (),
    max_depth: int = 64,
    max_processes: int = 64,
    apply: bool = True,
    extra: ShellExtras | None = None,
    credit: WaitCredit | None = None,
) -> ShellResult:
    """Run ``command`` with ``sh -c`` in a sandboxed copy of ``workspace`` (seen at ``/repo``)
    and bring the resulting tree back (module docstring). ``box`` must not be in unsafe mode:
    without isolation a command would run on the host. Memory per process is ``box``'s;
    ``max_processes`` bounds the command's processes and threads together. ``apply=False``
    leaves the workspace as it was (a search). ``extra``: more environment variables, read-only
    trees and bwrap mounts for a trusted caller (an agent run, agents/sandboxed.py).
    ``credit``: time the command waits on the host, not counted against ``timeout_s``
    (:class:`WaitCredit`: ``timeout_s`` is then the command's own time)."""
    if box.bwrap is None:
        raise RuntimeError("the shell tool needs the bubblewrap sandbox (unsafe mode is refused)")
    if "\x00" in command or len(command) > MAX_COMMAND_CHARS:
        return ShellResult("", 1, error=f"the command must be text without NUL, at most "
                           f"{MAX_COMMAND_CHARS} characters")  # fmt: skip
    stage = _stage(workspace)
    try:
        res = _run(box, stage, command, timeout_s, max_output_chars, repo_mb, python_path,
                   max_processes, extra or ShellExtras(), credit)  # fmt: skip
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    exit_code, output, size = _parse_stderr(res.stderr)
    timed_out = res.timed_out or exit_code == 137
    out = ShellResult(output, None if timed_out else exit_code, timed_out, size)
    if not apply:
        return out
    if res.timed_out or res.output_truncated or not res.ok:
        out.error = "the sandbox ended before the workspace was copied back; nothing changed"
        return out
    try:
        data = base64.b64decode(res.stdout.strip(), validate=True)
    except (binascii.Error, ValueError):
        out.error = "the workspace came back malformed; nothing changed"
        return out
    out.changed, out.refused, out.error = apply_tree(data, workspace, max_depth)
    return out


def _stage(workspace: Path) -> str:
    dest = bindable_dir("cr-shell-in-")
    try:
        shutil.copytree(workspace, dest, dirs_exist_ok=True, symlinks=True)
        world_readable(dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


@dataclass(frozen=True)
class ShellExtras:
    """What a trusted caller adds to a command's sandbox: environment variables (replacing the
    defaults but not the script's own ``CR_`` ones), read-only trees bound at their own path
    (staged for ``nobody`` when the trainer is root), and bwrap mount options."""

    env: tuple[tuple[str, str], ...] = ()
    binds: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()


def _run(box, stage, command, timeout_s, max_output_chars, repo_mb, python_path, nproc, extra,
         credit: WaitCredit | None):  # fmt: skip
    cfg = shell_sandbox(timeout_s, box.cfg.memory_mb, nproc, repo_mb)
    hard_s = timeout_s + (credit.max_s if credit is not None else 0.0)
    interp = sandbox_interpreter()
    env = {"PATH": "/cr-bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/pycache", "PYTHONPATH": ":".join(python_path),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": "-p no:cacheprovider", "CR_COMMAND": command,
           "CR_TIMEOUT": str(max(1, int(hard_s))), "CR_OUTPUT": str(max_output_chars)}  # fmt: skip
    if credit is not None:  # the own-time watchdog (WaitCredit)
        env |= {"CR_OWN_CS": str(max(1, round(timeout_s * 100))), "CR_WATCHDOG": _WATCHDOG,
                "CR_CLOCK": f"{CLOCK}/credit"}  # fmt: skip
    env |= {k: v for k, v in extra.env if not k.startswith("CR_")}
    code = f"import os\nos.execve('/bin/sh', ['sh', '-c', {_SCRIPT!r}], {env!r})\n"
    mounts = ("--size", str(repo_mb * 2**20), "--tmpfs", REPO, "--ro-bind", stage, STAGE,
              "--symlink", interp, "/cr-bin/python", "--symlink", interp, "/cr-bin/python3")  # fmt: skip
    if credit is not None:
        mounts += ("--ro-bind", credit.dir, CLOCK)
    binds = tuple(dict.fromkeys((*python_path, *extra.binds)))
    return Sandbox(cfg).run_python(code, binds=binds, mounts=mounts + extra.mounts,
                                   deadline_extension=credit.seconds if credit else None)  # fmt: skip


def _parse_stderr(stderr: str) -> tuple[int | None, str, int]:
    """(exit status, output, output size) from the script's stderr (feedback only)."""
    head, _, body = stderr.partition("\n")
    fields = dict(f.partition("=")[::2] for f in head.split() if f.startswith("cr-"))
    code, size = fields.get("cr-exit", ""), fields.get("cr-size", "")
    if not head.startswith("cr-exit="):  # the script did not get that far: its own errors
        body = stderr
    return (int(code) if code.isdigit() else None, body,
            int(size) if size.isdigit() else len(body))  # fmt: skip


def apply_tree(data: bytes, workspace: Path, max_depth: int) -> tuple[list[str], list[str], str]:
    """Make ``workspace`` hold exactly the regular files and directories of the tar ``data``
    (untrusted). Returns (changed paths, refused members, error); on an error nothing is
    changed."""
    wanted: dict[str, bytes | None] = {}  # path -> bytes (file) or None (directory)
    refused: list[str] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for n, member in enumerate(tar):
                if n >= MAX_MEMBERS:
                    return [], [], f"more than {MAX_MEMBERS} files; nothing changed"
                rel = _clean(member.name, max_depth)
                if rel is None:
                    refused.append(f"path:{member.name[:120]}")
                elif member.issym() or member.islnk():
                    refused.append(f"{'symlink' if member.issym() else 'hardlink'}:{rel}")
                elif member.issparse():  # its size is claimed, not stored: 2 kB read as 64 MB
                    refused.append(f"sparse:{rel}")
                elif member.isdir():
                    wanted.setdefault(rel, None) if rel else None
                elif member.isfile():
                    wanted[rel] = tar.extractfile(member).read()
                else:
                    refused.append(f"special:{rel}")
    except (tarfile.TarError, EOFError, OSError) as e:
        return [], [], f"the workspace came back malformed ({type(e).__name__}); nothing changed"
    for rel in list(wanted):  # the parents of every file are directories
        for parent in PurePosixPath(rel).parents:
            if str(parent) != ".":
                if wanted.get(str(parent)) is not None:
                    return [], [], f"{parent} is both a file and a directory; nothing changed"
                wanted.setdefault(str(parent), None)
    if why := unfit_tree(workspace, wanted):
        return [], [], f"{why}; nothing changed"
    try:
        return _sync(workspace, wanted), refused, ""
    except OSError as e:
        what = e.strerror or type(e).__name__
        return [], [], f"the workspace could not be updated ({what}); nothing changed"


def _clean(name: str, max_depth: int) -> str | None:
    """The member's path relative to the root ('' for the root), or None if it is absolute,
    climbs out, or is too deep."""
    if "\x00" in name or name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts) or len(parts) > max_depth + 1:
        return None
    return "/".join(parts)


def unfit_tree(root: Path, wanted: dict[str, bytes | None]) -> str:
    """Why the host cannot hold ``wanted`` (relative path -> bytes, or None for a directory)
    under ``root`` ('' if it can), asked before anything is changed: a name longer than the
    file system's ``NAME_MAX``, a path longer than the host's ``PATH_MAX`` (the sandbox's
    ``/repo`` is shorter than the workspace's real path: a tree that fits there may not fit
    here), or more bytes than the file system has free."""
    name_max = os.pathconf(root, "PC_NAME_MAX")
    path_max = os.pathconf(root, "PC_PATH_MAX")
    base = len(os.fsencode(str(root))) + 1
    for rel in wanted:
        encoded = os.fsencode(rel)
        if base + len(encoded) + 1 > path_max:
            return f"a path is longer than this host allows ({path_max} bytes): {rel[:80]}..."
        if any(len(part) > name_max for part in encoded.split(b"/")):
            return f"a name is longer than this host allows ({name_max} bytes): {rel[:80]}..."
    size = sum(len(data) for data in wanted.values() if data is not None)
    if size > shutil.disk_usage(root).free:
        return f"the files ({size} bytes) do not fit on the host's disk"
    return ""


def _have(root: Path) -> dict[str, str]:
    """Every entry under ``root``: relative path -> ``dir``, ``file`` or ``other`` (a link,
    a FIFO...). Links are not followed."""
    have: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root):
        base = Path(dirpath).relative_to(root).as_posix()
        for name in dirs + files:
            rel = name if base == "." else f"{base}/{name}"
            mode = os.lstat(os.path.join(dirpath, name)).st_mode
            have[rel] = "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"
    return have


def _sync(root: Path, wanted: dict[str, bytes | None]) -> list[str]:
    """Make ``root`` hold exactly ``wanted``, all or nothing (sandbox/journal.py): entries
    that go or change kind are removed (the topmost of each removed subtree), then
    directories are made, then changed files written; a failure undoes every step."""
    have = _have(root)
    kind = {rel: "dir" if data is None else "file" for rel, data in wanted.items()}
    gone = {rel for rel, k in have.items() if kind.get(rel) != k}
    changed = {rel for rel in gone if have[rel] != "dir"}
    writes = []
    for rel, data in sorted(wanted.items()):
        if data is not None and (rel in gone or rel not in have
                                 or (root / rel).read_bytes() != data):  # fmt: skip
            writes.append(rel)
            changed.add(rel)
    with TreeJournal(root) as journal:
        for rel in sorted(gone):
            if not any(str(p) in gone for p in PurePosixPath(rel).parents):
                journal.remove(root / rel)
        for rel in sorted(wanted, key=lambda r: r.count("/")):
            if wanted[rel] is None and (rel in gone or rel not in have):
                journal.mkdir(root / rel)
        for rel in writes:
            journal.write(root / rel, wanted[rel])
    return sorted(changed)
