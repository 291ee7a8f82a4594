"""The sandbox must contain hostile code: none of these may hang, escape or write outside."""

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from composer_replication.config import SandboxConfig
from composer_replication.sandbox.sandbox import run_python


def test_normal_code_runs_and_can_use_its_workdir():
    r = run_python("open('f.txt','w').write('ok'); print(open('f.txt').read())")
    assert r.ok and r.stdout.strip() == "ok"


@pytest.mark.parametrize("code", ["while True: pass", "import time; time.sleep(60)"])
def test_infinite_loop_is_killed_at_the_timeout(code):
    t0 = time.monotonic()
    r = run_python(code, SandboxConfig(wall_timeout_s=1.0))
    assert r.timed_out and not r.ok
    assert time.monotonic() - t0 < 10


def test_a_run_can_be_given_a_shorter_limit_but_never_a_longer_one():
    """``Sandbox.run_python(wall_timeout_s=...)``: what is left of an episode's test time."""
    from composer_replication.sandbox.sandbox import Sandbox

    box = Sandbox(SandboxConfig(wall_timeout_s=60.0, cpu_time_s=60))
    t0 = time.monotonic()
    r = box.run_python("import time; time.sleep(60)", wall_timeout_s=1.0)
    assert r.timed_out and time.monotonic() - t0 < 30  # not the sandbox's 60 s
    assert box.cfg.wall_timeout_s == 60.0  # the sandbox itself is unchanged
    short = Sandbox(SandboxConfig(wall_timeout_s=1.0))
    t0 = time.monotonic()
    assert short.run_python("import time; time.sleep(60)", wall_timeout_s=120.0).timed_out
    assert time.monotonic() - t0 < 30  # 120 s did not lengthen its 1 s limit
    with pytest.raises(ValueError, match="wall_timeout_s"):
        box.run_python("pass", wall_timeout_s=0.0)


def test_a_process_that_exits_while_its_tasks_are_listed_is_no_error(monkeypatch):
    """``/proc/<pid>/task`` vanished between opening and reading it (the sandbox's process
    exited while ``close`` looked for its children): FileNotFoundError out of grading."""
    from composer_replication.sandbox import sandbox

    child = subprocess.Popen(["sleep", "30"])
    try:
        gone = f"/proc/{child.pid}/task"
        real_scandir, real_listdir = os.scandir, os.listdir

        def vanishing(real):
            def listing(path="."):
                if os.fspath(path).rstrip("/") == gone:
                    raise FileNotFoundError(2, "No such file or directory", gone)
                return real(path)

            return listing

        monkeypatch.setattr(os, "scandir", vanishing(real_scandir))
        monkeypatch.setattr(os, "listdir", vanishing(real_listdir))
        assert sandbox._descendants(child.pid) == []
        monkeypatch.undo()
        grand = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
        try:
            time.sleep(0.3)
            assert len(sandbox._descendants(grand.pid)) == 1  # still finds what is there
        finally:
            grand.kill()
            grand.wait()
    finally:
        child.kill()
        child.wait()


def test_fork_bomb_does_not_spread():
    before = len(os.listdir("/proc"))
    r = run_python("import os\nwhile True:\n    os.fork()", SandboxConfig(wall_timeout_s=2.0))
    assert not r.ok
    time.sleep(0.2)
    assert len(os.listdir("/proc")) < before + 20  # no lingering children


def test_write_outside_the_workdir_is_refused(tmp_path):
    target = tmp_path / f"escape-{uuid.uuid4().hex}.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('x')")
    assert not r.ok
    assert not target.exists()
    # under bwrap the host path is not even visible; in unsafe mode the audit hook refuses it
    assert "No such file or directory" in r.stderr or "outside the work dir" in r.stderr


def test_os_level_escapes_are_refused(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    for code in [
        f"import os; os.remove({str(target)!r})",
        f"import shutil; shutil.rmtree({str(tmp_path)!r})",
        f"import os; os.rename({str(target)!r}, 'stolen')",
        f"import subprocess; subprocess.run(['rm', {str(target)!r}])",
        f"import os; os.system('rm {target}')",
        f"import ctypes; ctypes.CDLL(None).unlink({str(target).encode()!r})",
    ]:
        r = run_python(code)
        assert not r.ok, code
        assert target.read_text() == "keep me", code


def test_network_is_refused():
    r = run_python("import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)")
    assert not r.ok
    assert "not allowed" in r.stderr or "unreachable" in r.stderr.lower()


def test_memory_limit():
    r = run_python("x = bytearray(4 * 1024**3)", SandboxConfig(memory_mb=256))
    assert not r.ok and "MemoryError" in r.stderr


def test_output_is_capped():
    r = run_python(
        "while True: print('x' * 1000)", SandboxConfig(wall_timeout_s=3.0, max_output_kb=10)
    )
    assert not r.ok
    assert r.output_truncated
    assert len(r.stdout) <= 10 * 1024


def test_workdir_is_private_and_gone_after_the_run():
    name = f"private-{uuid.uuid4().hex}.txt"
    r = run_python(f"import os; open({name!r}, 'w').write('x'); print(os.path.abspath({name!r}))")
    assert r.ok
    assert not os.path.exists(r.stdout.strip())  # the file lived on the sandbox's own tmpfs


def test_pycache_holds_only_stdlib_bytecode_and_is_read_only():
    """The warm bytecode bound at /pycache is the standard library's, nothing of any code under
    test or any installed package, and the candidate cannot add to it."""
    import sysconfig

    stdlib = os.path.realpath(sysconfig.get_path("stdlib"))
    code = (
        "import os\n"
        "paths = [os.path.join(r, f) for r, _, fs in os.walk('/pycache') for f in fs]\n"
        "print(len(paths)); print('\\n'.join(paths))\n"
        "try:\n    open('/pycache/poison.pyc', 'wb').write(b'x'); print('WROTE')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"
    )
    r = run_python(code)
    assert r.ok, r.stderr
    lines = r.stdout.split("\n")
    n, paths = int(lines[0]), [p for p in lines[1 : 1 + int(lines[0])]]
    assert n > 10 and "typing" in " ".join(paths)  # warmed
    # besides the standard library: only pytest's private copy (sandbox/pytest_suite.py), compiled
    # by the trusted interpreter when a Feature Deletion suite ran earlier in this process
    trusted = (stdlib + "/", "/var/tmp/cr-pytest-tools-")
    outside = [p for p in paths if not p[len("/pycache") :].startswith(trusted)]
    assert not outside, outside[:3]
    assert all("site-packages" not in p and "composer_replication" not in p for p in paths)
    assert "WROTE" not in r.stdout and "refused" in r.stdout


GUARD_PROBE = (
    "import os\n"
    "seen = [r for top in ('/usr', '/lib', '/opt', '/srv', '/home', '/root', '/etc')\n"
    "        for r, _, fs in os.walk(top) if '__init__.py' in fs]\n"
    "print(len(seen)); print('\\n'.join(seen))\n"
)


@pytest.mark.parametrize("trainer", ["host", "venv"])
def test_no_python_package_of_the_host_is_visible_outside_the_standard_library(trainer):
    """Other software's Python sources under /usr (a system Python's dist-packages, an SDK's
    vendored copies of libraries) are not in the sandbox: a submission found the original of
    the function it had to rebuild in one and ran it. Every package directory (one holding
    an ``__init__.py``) the sandbox can see lies in this interpreter's standard library,
    also when the trainer runs in an isolated virtual environment over this interpreter
    (``venv``: the base interpreter's site-packages is not in the venv's ``site``; issue 55)."""
    import sysconfig

    stdlib = os.path.realpath(sysconfig.get_path("stdlib"))
    from support.venv_trainer import sandboxed_stdout

    out = sandboxed_stdout(GUARD_PROBE, SandboxConfig(wall_timeout_s=60, cpu_time_s=60), trainer)
    lines = out.split("\n")
    seen = lines[1 : 1 + int(lines[0])]
    assert any(p.startswith(stdlib + "/") for p in seen) or not stdlib.startswith("/usr")
    outside = [p for p in seen if not p.startswith(stdlib + "/")]
    assert not outside, outside[:5]


def test_console_script_directory_on_sys_path_is_not_hidden(monkeypatch):
    """A console script puts the interpreter's bin directory first on sys.path; hiding it
    would hide the interpreter itself (bwrap: execvp ... No such file or directory)."""
    import os
    import sys

    from composer_replication.sandbox import sandbox

    bindir = os.path.dirname(os.path.realpath(sys.executable))
    monkeypatch.setattr(sys, "path", [bindir, *sys.path])
    roots = [os.path.realpath(sys.base_prefix), "/usr"]
    hidden = sandbox._hidden_dirs(roots)
    assert not any(bindir == h or bindir.startswith(h + "/") for h in hidden)


def test_a_bwrap_that_hangs_is_reported_as_slow_not_as_broken(monkeypatch):
    """On a loaded machine the start-up check may be slow; the error must say so instead of
    telling the user to install bubblewrap."""
    from composer_replication.sandbox import sandbox as sb

    home = Path(sb.bindable_dir("cr-fake-bwrap-"))  # the grader may run it as nobody
    fake = home / "bwrap"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sb, "PROBE_TIMEOUT_S", 0.5)
    try:
        with pytest.raises(sb.SandboxUnavailableError, match="did not start .* within 0.5 s"):
            sb._probe.__wrapped__(str(fake))
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_sandbox_slots_are_handed_out_first_come_first_served():
    """Issue 55 (class 7): slots went to whichever thread the scheduler woke first; a thread
    that released its slot and asked again at once took it back before the threads already
    waiting. Now every ask queues behind the earlier ones."""
    import threading

    from composer_replication.sandbox.sandbox import Slots

    slots, order = Slots(1), []

    def worker(i):
        slots.acquire()
        order.append(i)
        slots.release()

    slots.acquire()
    threads = []
    for i in range(4):
        threads.append(threading.Thread(target=worker, args=(i,)))
        threads[-1].start()
        while slots.waiting < i + 1:  # each is queued before the next starts
            threading.Event().wait(0.005)
    slots.release()
    slots.acquire()  # asked again at once: behind the four
    order.append("again")
    slots.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3, "again"]
