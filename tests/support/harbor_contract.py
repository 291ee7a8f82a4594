"""Harbor's trial contract for an exported task, run under our bubblewrap sandbox instead of
Docker (no daemon here): the agent phase in one sandbox, the verifier in another, as Harbor
runs a task whose verifier is ``separate``.

* Agent phase: the image's workspace (``environment/app``) is at ``/app`` (the Dockerfile's
  ``WORKDIR``), ``solution/`` at ``/solution`` (read-only); ``bash /solution/solve.sh`` (the
  oracle) and/or an agent's shell command run there, and the resulting ``/app`` comes back.
* Verifier phase: that ``/app`` (Harbor collects it as the ``/app`` artifact and restores it
  at the same path), ``tests/`` at ``/tests`` (read-only: the verifier image's ``COPY . /tests/``),
  ``/logs/verifier`` writable; ``bash /tests/test.sh`` must leave ``reward.txt`` there.

Both phases use the sandbox's shell tool (sandbox/shell.py): ``python3`` is the trainer's
interpreter with its site-packages hidden (the image's would be a clean ``python:3.x-slim``).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from composer_replication.envs.feature_deletion.harbor import APP
from composer_replication.sandbox.sandbox import Sandbox, bindable_dir, world_readable
from composer_replication.sandbox.shell import REPO, ShellExtras, run_shell, shell_sandbox

TIMEOUT_S = 120.0


def _staged(src: Path) -> str:
    dest = bindable_dir("cr-harbor-")
    shutil.copytree(src, dest, dirs_exist_ok=True, symlinks=True)
    world_readable(dest)
    return dest


def workdir(task_dir: Path) -> str:
    """The agent image's ``WORKDIR`` (where Harbor's agent and oracle work)."""
    text = (Path(task_dir) / "environment" / "Dockerfile").read_text()
    (found,) = re.findall(r"^WORKDIR\s+(\S+)", text, re.M)
    return found


def agent_phase(task_dir: Path, app: Path, command: str, python_path: tuple[str, ...] = ()) -> str:
    """Run ``command`` at ``/app`` (``app`` on the host, changed in place) with the task's
    ``solution/`` at ``/solution``; its output. ``python_path``: read-only trees on the
    command's ``PYTHONPATH`` (our copy of pytest, for a witness run)."""
    assert workdir(task_dir) == APP
    solution = _staged(Path(task_dir) / "solution")
    try:
        extra = ShellExtras(mounts=("--symlink", REPO, APP, "--ro-bind", solution, "/solution"))
        res = run_shell(Sandbox(shell_sandbox(TIMEOUT_S)), app, f"cd {APP} && {command}",
                        TIMEOUT_S, python_path=python_path, extra=extra)  # fmt: skip
    finally:
        shutil.rmtree(solution, ignore_errors=True)
    assert not res.error, (res.output, res.error)
    return res.output


def verifier_phase(task_dir: Path, app: Path) -> tuple[float, dict, str]:
    """``bash /tests/test.sh`` with ``app`` at ``/app``: the reward, ``grade.json`` and the
    script's output."""
    stage_app, stage_tests = _staged(app), _staged(Path(task_dir) / "tests")
    logs = Path(tempfile.mkdtemp(prefix="cr-harbor-logs-"))
    try:
        mounts = ("--ro-bind", stage_app, APP, "--ro-bind", stage_tests, "/tests",
                  "--dir", "/logs", "--symlink", REPO, "/logs/verifier")  # fmt: skip
        res = run_shell(Sandbox(shell_sandbox(TIMEOUT_S)), logs, "bash /tests/test.sh",
                        TIMEOUT_S, extra=ShellExtras(mounts=mounts))  # fmt: skip
        assert not res.error, (res.output, res.error)
        reward = float((logs / "reward.txt").read_text())
        verdict = json.loads((logs / "grade.json").read_text())
        return reward, verdict, res.output
    finally:
        for d in (stage_app, stage_tests, logs):
            shutil.rmtree(d, ignore_errors=True)


def trial(task_dir: Path, command: str = "", python_path: tuple[str, ...] = ()) -> Trial:
    """One trial: a fresh copy of the image's workspace, the agent-phase ``command`` ('': the
    do-nothing submission, no agent phase), then the verifier."""
    with tempfile.TemporaryDirectory(prefix="cr-harbor-app-") as tmp:
        app = Path(tmp) / "app"
        shutil.copytree(Path(task_dir) / "environment" / "app", app)
        said = agent_phase(task_dir, app, command, python_path) if command else ""
        reward, verdict, _ = verifier_phase(task_dir, app)
        return Trial(reward, verdict, said)


@dataclass
class Trial:
    reward: float
    verdict: dict
    """The verifier's ``grade.json``."""
    agent_output: str
