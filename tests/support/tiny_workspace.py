"""A second workspace environment, as small as one can be: a repository of two files per
episode, one native tool, and the public workspace interface (envs/workspace.py's
``WorkspaceEpisode``) and nothing else. It gets every tool profile through
``profile_tools_class`` (tests/unit/envs/test_workspace.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from composer_replication.config import SandboxConfig
from composer_replication.sandbox.sandbox import Sandbox

FILES = {"notes/a.txt": "alpha\nbeta\n", "tests/test_a.py": "def test_a():\n    pass\n"}
MAX_BYTES = 10_000
"""Most bytes a tiny episode may write in all."""
BOX = Sandbox(SandboxConfig(wall_timeout_s=30, cpu_time_s=30, memory_mb=512, max_processes=64))


class TinyEpisode:
    """The interface's members, written plainly: no Feature Deletion code below."""

    box = BOX
    max_output_chars = 500
    budget_s = 60.0
    python_path: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.root: Path | None = None
        self.task: dict[str, Any] | None = None
        self.flags: list[str] = []
        self.spent_s = 0.0
        self.written = 0
        self.writes: list[str] = []
        """Every write noted, in order (what the test checks the adapters report)."""

    def start(self, task_id: str) -> None:
        self.close()
        self.root = Path(tempfile.mkdtemp(prefix="cr-tiny-ws-")) / "repo"
        for rel, text in FILES.items():
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / rel).write_text(text)
        self.task, self.flags, self.spent_s, self.written, self.writes = (
            {"task_id": task_id}, [], 0.0, 0, [])  # fmt: skip

    def resolve(self, path: str) -> Path | str:
        if self.root is None:
            return "error: no workspace"
        root = self.root.resolve()
        real = (root / str(path)).resolve()
        if real != root and root not in real.parents:
            self.flags.append(f"outside_workspace:{path}")
            return f"error: {path} is outside the repository"
        return real

    def write_refusal(self, sizes: list[int], unit: str = "bytes") -> str:
        if self.written + sum(sizes) > MAX_BYTES:
            return f"error: {sum(sizes)} {unit} would pass the tiny cap"
        return ""

    def reserve_write(self, size: int) -> str:
        if refused := self.write_refusal([size]):
            return refused
        self.written += size
        return ""

    def note_write(self, rel: str) -> None:
        self.writes.append(rel)
        if rel.startswith("tests/"):
            self.flags.append(f"wrote_test:{rel}")

    def spend(self, seconds: float) -> None:
        self.spent_s += seconds

    def flag(self, *flags: str) -> None:
        self.flags.extend(flags)

    def close(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root.parent, ignore_errors=True)


class TinyTools:
    """Two files to look at (TRL environment_factory)."""

    def __init__(self) -> None:
        self.episode = TinyEpisode()

    def reset(self, **row: Any) -> None:
        """Start an episode."""
        self.episode.start(row["task_id"])

    def look(self, path: str) -> str:
        """Show a file.

        Args:
            path: A file relative to the repository root.
        """
        target = self.episode.resolve(path)
        return target if isinstance(target, str) else target.read_text()
