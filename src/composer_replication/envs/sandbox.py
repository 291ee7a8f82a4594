"""Run untrusted Python (a model's completion plus its unit tests) in a constrained subprocess.

Layers, each enough to stop a different escape:

* a fresh temp working directory, removed afterwards; ``python -I`` (no env, no user site);
* resource limits: address space (memory), CPU seconds, file size (caps stdout/stderr, which
  go to files in the temp dir), open files, process count;
* a wall-clock timeout; the whole process group is SIGKILLed on expiry or after exit;
* a CPython audit hook installed before the code runs (``sys.addaudithook``, PEP 578) that
  refuses sockets, subprocesses, ``fork``, ``ctypes`` and any write/remove/rename outside the
  temp dir (hooks cannot be removed once added);
* when run as root: a private network namespace (no interfaces but a down loopback), and a
  drop to the ``nobody`` user when the interpreter is reachable by that user, so even native
  code cannot write outside the temp dir nor fork past the process limit (RLIMIT_NPROC does
  not bind root). Where the interpreter lives under a private home (pyenv in /root), the drop
  is skipped and the audit hook and limits above are what hold.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
NOBODY = 65534

_GUARD = r"""
import os, sys
_ROOT = os.path.realpath(sys.argv[1])
def _inside(p):
    try:
        p = os.fsdecode(p) if not isinstance(p, int) else None
    except Exception:
        return False
    if p is None:
        return True
    real = os.path.realpath(p)
    return real == _ROOT or real.startswith(_ROOT + os.sep)
_BLOCK = {"socket.__new__", "socket.connect", "socket.bind", "subprocess.Popen", "os.system",
          "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
          "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.kill", "os.killpg"}
_PATHS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
          "os.symlink", "os.link", "os.truncate", "shutil.rmtree", "os.utime", "shutil.copyfile"}
def _hook(event, args):
    if event in _BLOCK:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND))
        if writing and not _inside(path):
            raise PermissionError(f"sandbox: write outside the work dir: {path!r}")
    elif event in _PATHS:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError(f"sandbox: {event} outside the work dir: {a!r}")
sys.addaudithook(_hook)
_code_path = os.path.join(_ROOT, "main.py")
sys.argv = [_code_path]
_src = open(_code_path).read()
exec(compile(_src, _code_path, "exec"), {"__name__": "__main__", "__file__": _code_path})
"""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _nobody_can_run(path: str) -> bool:
    """Whether every directory on the way to ``path`` is world-searchable and it is world-executable."""
    p = Path(path).resolve()
    for parent in [*reversed(p.parents)]:
        if not os.stat(parent).st_mode & 0o001:
            return False
    return bool(os.stat(p).st_mode & 0o001)


def _limits(
    timeout_s: float, memory_mb: int, max_output_bytes: int, as_root: bool, drop: bool, workdir: str
):
    def apply() -> None:
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = int(timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_output_bytes, max_output_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if as_root:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.unshare(CLONE_NEWNET)  # best effort; the audit hook blocks sockets anyway
        if drop:
            os.chown(workdir, NOBODY, NOBODY)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        resource.setrlimit(resource.RLIMIT_NPROC, (32, 32))

    return apply


def _read_capped(path: Path, limit: int) -> tuple[str, bool]:
    data = path.read_bytes()[: limit + 1]
    return data[:limit].decode("utf-8", errors="replace"), len(data) >= limit


def run_python(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_bytes: int = 64 * 1024,
) -> SandboxResult:
    """Run ``code`` as a script in the sandbox and return its exit status and capped output."""
    workdir = tempfile.mkdtemp(prefix="cr-sandbox-")
    os.chmod(workdir, 0o700)
    as_root = os.geteuid() == 0
    drop = as_root and _nobody_can_run(sys.executable)
    try:
        wd = Path(workdir)
        (wd / "main.py").write_text(code)
        out_path, err_path = wd / ".stdout", wd / ".stderr"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            if drop:
                for p in (wd / "main.py", out_path, err_path):
                    os.chown(p, NOBODY, NOBODY)
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _GUARD, workdir],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
                start_new_session=True,
                preexec_fn=_limits(timeout_s, memory_mb, max_output_bytes, as_root, drop, workdir),
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)
                proc.wait()
        stdout, t1 = _read_capped(out_path, max_output_bytes)
        stderr, t2 = _read_capped(err_path, max_output_bytes)
        return SandboxResult(
            returncode=None if timed_out else proc.returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            output_truncated=t1 or t2 or proc.returncode == -signal.SIGXFSZ,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
