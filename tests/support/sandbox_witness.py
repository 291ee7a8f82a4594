"""Witnesses for sandbox tests: listeners that count connections, a scan for processes left
behind, a sentinel process an attack may try to kill, and files that must stay untouched."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path


class Listener:
    """Accepts connections on a TCP port of 127.0.0.1 and on an abstract unix socket of the
    host's network namespace; ``connections`` counts them. Stops itself after ``ttl_s``."""

    def __init__(self, ttl_s: float = 600.0):
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.abstract = f"cr-witness-{uuid.uuid4().hex}"
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind("\0" + self.abstract)
        self.connections = 0
        self._stop = time.monotonic() + ttl_s
        self._threads = [
            threading.Thread(target=self._serve, args=(s,), daemon=True)
            for s in (self.tcp, self.unix)
        ]
        for s, t in zip((self.tcp, self.unix), self._threads, strict=True):
            s.listen(16)
            s.settimeout(0.2)
            t.start()

    def _serve(self, sock: socket.socket) -> None:
        while time.monotonic() < self._stop:
            try:
                conn, _ = sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = 0.0
        for t in self._threads:
            t.join(timeout=2)
        self.tcp.close()
        self.unix.close()


def cmdline(pid: int | str) -> str | None:
    """Process ``pid``'s command line, arguments joined by spaces; None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


def processes_matching(needle: str) -> list[int]:
    """Pids whose command line contains ``needle`` (any user, any namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        line = cmdline(entry)
        if line is not None and needle in line:
            found.append(int(entry))
    return found


def sandbox_processes() -> set[int]:
    """Pids of sandboxed interpreters and bwrap processes alive now."""
    return set(processes_matching("pycache_prefix=")) | set(processes_matching("--unshare-pid"))


def uptime_s() -> float:
    """Seconds since boot (the clock of :func:`started_s`)."""
    return float(Path("/proc/uptime").read_text().split()[0])


def started_s(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since boot; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")


class SandboxWatch:
    """Sandboxed processes started while the ``with`` block ran that are still alive after it
    (``left``): a grading's own processes, told apart from those another test process starts
    meanwhile (pytest-xdist) by their start time; ones that are only tearing down get
    ``grace_s`` to go."""

    def __init__(self, grace_s: float = 30.0):
        self.grace_s = grace_s

    def __enter__(self) -> SandboxWatch:
        self.since = uptime_s() - 0.02  # both clocks tick in 10 ms
        return self

    def __exit__(self, *exc: object) -> None:
        self.until = uptime_s() + 0.02

    def left(self) -> set[int]:
        deadline = time.monotonic() + self.grace_s
        while True:
            alive = {p for p in sandbox_processes()
                     if self.since <= (started_s(p) or -1.0) <= self.until}  # fmt: skip
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


SECRET_NAME = "CR_TEST_API_KEY"
"""The trainer-side environment variable holding :attr:`Arena.secret` during an attack test
(the ``arena`` fixture in tests/conftest.py sets it)."""


@dataclass
class Arena:
    """Everything an attack may try to reach, and the checks that it did not."""

    root: Path
    marker: str = field(default_factory=lambda: f"crmark{uuid.uuid4().hex[:12]}")
    secret: str = field(default_factory=lambda: f"crsecret{uuid.uuid4().hex}")
    listener: Listener = field(default_factory=Listener)
    sentinel: subprocess.Popen | None = None
    guarded: dict[Path, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sentinel = subprocess.Popen(["sleep", "600"])
        self.victim = self.root / "victim.txt"
        self.victim.write_text("keep me")
        self.guarded[self.victim] = file_digest(self.victim)

    def guard(self, path: Path) -> None:
        """Record a host file that must be unchanged after every attack."""
        self.guarded[path] = file_digest(path)

    def fill(self, text: str, **more: str) -> str:
        """``text`` with the arena's placeholders filled: MARK, ROOT, PORT and ABSTRACT (the
        listeners), SENTINEL, then each of ``more`` (name -> value), in that order."""
        out = (
            text.replace("MARK", self.marker)
            .replace("ROOT", str(self.root))
            .replace("PORT", str(self.listener.port))
            .replace("ABSTRACT", self.listener.abstract)
            .replace("SENTINEL", str(self.sentinel.pid))
        )
        for name, value in more.items():
            out = out.replace(name, value)
        return out

    def escape_path(self, name: str) -> Path:
        """A host path an attack tries to create; it must never exist."""
        return self.root / f"{self.marker}-{name}"

    def breaches(self) -> list[str]:
        """What the attacks achieved (empty when contained)."""
        out = [f"created {p}" for p in self._created()]
        out += [
            f"changed {p}" for p, d in self.guarded.items() if not p.exists() or file_digest(p) != d
        ]
        if self.listener.connections:
            out.append(f"{self.listener.connections} connection(s) reached the host")
        if self.sentinel is None or self.sentinel.poll() is not None:
            out.append("the sentinel process was killed")
        left = processes_matching(self.marker)
        if left:
            out.append(f"processes left behind: {left}")
        return out

    def _created(self) -> list[Path]:
        """Marker files on the host, in the arena and in the host's temporary directory."""
        places = (self.root, Path(tempfile.gettempdir()))
        return [p for place in places for p in place.glob(f"{self.marker}-*")]

    def close(self) -> None:
        for path in self._created():  # the unsandboxed control's landings
            path.unlink()
        self.listener.close()
        if self.sentinel is not None:
            self.sentinel.kill()
            self.sentinel.wait()
