"""The verifier of an exported Feature Deletion task (harbor.py writes it to
``tests/grade.py``; ``tests/test.sh`` runs ``python3 -I -S -B /tests/grade.py /tests /app
/logs/verifier``). Standard library only: it runs inside the task's verifier container (or
under our sandbox in the export's tests), never in the trainer's process.

What it does, with ``/tests/grade.json`` (written at export) as its only input:

1. ``reward.txt`` is 0 from the start: a crash or a timeout leaves 0.
2. Tests or configuration edited: every test file and configuration file of the task's
   workspace (``protected``: path -> sha256 at the task's state) must be in ``/app`` with the
   same bytes, reached through no link, else the reward is 0. Files the agent added (a ``conftest.py`` anywhere) are
   listed in ``grade.json`` and never reach the run below.
3. Only the target file is taken from ``/app`` (a regular file reached through no link,
   UTF-8, at most ``max_chars`` characters), written into a fresh copy of the pristine repository (``/tests/pristine``).
4. pytest comes from the pinned wheels in ``/tests/wheels`` (sha256 checked, unpacked to a
   temporary directory), runs with ``python -I -S -B`` (no site-packages, no environment
   variables, no bytecode written), entry-point plugins off and the pinned command line
   (``pytest_args``), on the task's tests: the targets (failing with the feature deleted)
   and the tests that passed then (``tests``). A small plugin records each test's final
   outcome (passed only if its call passed and neither setup nor teardown failed; skipped,
   xfail, errors and missing tests count as failed).
5. ``reward.txt``: 1 iff every listed test passed and nothing was edited; ``grade.json``:
   the reason, the failing tests, the edited and added files.

The submission runs in the same process as pytest here (our split grading and signed report
do not survive the export: docs/feature_deletion.md says what does).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

RUNNER = r"""
import json, os, sys
tools, repo, out = sys.argv[1:4]
src = os.path.join(repo, "src")  # a src layout imports as if installed (pytest_suite.import_roots)
layout = os.path.isdir(src) and not os.path.exists(os.path.join(src, "__init__.py"))
sys.path[:0] = [tools, repo, src] if layout else [tools, repo]
import pytest


class Outcomes:
    def __init__(self):
        self.state = {}

    def pytest_runtest_logreport(self, report):
        outcome = report.outcome
        if report.when == "call" and hasattr(report, "wasxfail"):
            outcome = "xfail"
        elif report.when != "call" and report.failed:
            outcome = "error"
        elif report.when == "setup" and report.skipped:
            outcome = "skipped"
        elif report.when != "call":
            return
        if self.state.get(report.nodeid, "passed") == "passed":
            self.state[report.nodeid] = outcome

    def pytest_sessionfinish(self, session, exitstatus):
        with open(out, "w", encoding="utf-8") as f:
            json.dump(self.state, f)


pytest.main(sys.argv[4:], plugins=[Outcomes()])
"""
OUTPUT_CHARS = 20_000
"""Tail of pytest's output kept in ``pytest.txt`` next to the reward."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def linked(app: Path, rel: str) -> bool:
    """True if ``app/rel`` or any directory between ``app`` and it is a link: ``/app`` crosses
    to the verifier's container links included, where a link may resolve into
    ``/tests/pristine`` (the original target file) or anywhere else."""
    path = app
    for part in Path(rel).parts:
        path = path / part
        if path.is_symlink():
            return True
    return False


def edited_files(app: Path, protected: dict[str, str]) -> list[str]:
    """Protected files (tests, configuration) missing from ``app``, reached through a link, or
    with other bytes than at the task's state."""
    out = []
    for rel, digest in sorted(protected.items()):
        path = app / rel
        if linked(app, rel) or not path.is_file() or sha256(path) != digest:
            out.append(rel)
    return out


def added_files(app: Path, protected: dict[str, str], names: list[str]) -> list[str]:
    """Files named like configuration (``conftest.py``, ``*.pth``...) that the task's
    workspace did not have: reported, never graded."""
    out = []
    for dirpath, dirs, files in os.walk(app):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            rel = (Path(dirpath) / name).relative_to(app).as_posix()
            if (name in names or name.endswith(".pth")) and rel not in protected:
                out.append(rel)
    return sorted(out)[:50]


def read_target(app: Path, rel: str, max_chars: int) -> str | None:
    """The submitted target file's text; None if it is no regular UTF-8 file of at most
    ``max_chars`` characters, or is reached through a link (:func:`linked`)."""
    path = app / rel
    if linked(app, rel) or not path.is_file() or path.stat().st_size > 4 * max_chars:
        return None
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if len(text) <= max_chars else None


def unpack_wheels(wheels: Path, digests: dict[str, str], dest: Path) -> Path:
    """The pinned wheels unpacked into ``dest`` (an importable directory), after their sha256
    are checked; members outside ``dest`` are refused."""
    dest.mkdir(parents=True)
    for name, digest in sorted(digests.items()):
        path = wheels / name
        if sha256(path) != digest:
            raise RuntimeError(f"{path}: sha256 differs from the export's")
        with zipfile.ZipFile(path) as zf:
            for member in zf.namelist():
                target = (dest / member).resolve()
                if not target.is_relative_to(dest.resolve()):
                    raise RuntimeError(f"{path}: member {member!r} lands outside {dest}")
            zf.extractall(dest)
    return dest


def run_pytest(tools: Path, repo: Path, spec: dict, tmp: Path) -> tuple[dict, str]:
    """Per-test outcomes of the pinned pytest on ``repo`` ({} if it did not finish), and the
    tail of its output. The whole process group is killed when the run ends."""
    out = tmp / "outcomes.json"
    argv = [sys.executable, "-I", "-S", "-B", "-c", RUNNER, str(tools), str(repo), str(out),
            *spec["pytest_args"], *spec["tests"]]  # fmt: skip
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "LANG": "C.UTF-8",
           "TMPDIR": str(tmp), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # fmt: skip
    proc = subprocess.Popen(argv, cwd=repo, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=spec["timeout_s"])
    except subprocess.TimeoutExpired:
        output = b"the test run timed out"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    text = output.decode("utf-8", "replace")[-OUTPUT_CHARS:]
    try:
        outcomes = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, text
    return (outcomes if isinstance(outcomes, dict) else {}), text


def grade(tests_dir: Path, app: Path, spec: dict) -> dict:
    """The verdict (``reward`` and why) of the workspace ``app`` (module docstring)."""
    verdict = {"reward": 0.0, "edited": edited_files(app, spec["protected"]),
               "added": added_files(app, spec["protected"], spec["config_names"])}  # fmt: skip
    if verdict["edited"]:
        return verdict | {"reason": "tests or configuration were edited"}
    text = read_target(app, spec["target"], spec["max_chars"])
    if text is None:
        return verdict | {"reason": f"{spec['target']} is missing, a link, not UTF-8 or too long"}
    with tempfile.TemporaryDirectory(prefix="fd-grade-") as name:
        tmp = Path(name)
        tools = unpack_wheels(tests_dir / "wheels", spec["wheels"], tmp / "tools")
        repo = tmp / "repo"
        shutil.copytree(tests_dir / "pristine", repo, symlinks=False)
        (repo / spec["target"]).write_text(text, encoding="utf-8")
        start = time.monotonic()
        outcomes, output = run_pytest(tools, repo, spec, tmp)
        seconds = round(time.monotonic() - start, 3)
    failed = [t for t in spec["tests"] if outcomes.get(t) != "passed"]
    verdict |= {"failed": failed[:50], "n_failed": len(failed), "output": output,
                "pytest_seconds": seconds}  # fmt: skip
    if failed:
        return verdict | {"reason": f"{len(failed)} of {len(spec['tests'])} tests did not pass"}
    return verdict | {"reward": 1.0, "reason": "every test passed"}


def main(tests_dir: str, app: str, logs: str) -> None:
    logs_dir = Path(logs)
    logs_dir.mkdir(parents=True, exist_ok=True)
    (logs_dir / "reward.txt").write_text("0\n")
    spec = json.loads((Path(tests_dir) / "grade.json").read_text(encoding="utf-8"))
    verdict = grade(Path(tests_dir), Path(app), spec)
    (logs_dir / "pytest.txt").write_text(verdict.pop("output", ""), encoding="utf-8")
    (logs_dir / "grade.json").write_text(json.dumps(verdict, indent=1) + "\n")
    (logs_dir / "reward.txt").write_text(f"{verdict['reward']:g}\n")
    print(f"reward {verdict['reward']:g}: {verdict['reason']}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
