"""The workspace interface: one episode's repository as every tool profile
(envs/profiles.py), grading and the agent episodes (agents/episodes.py) use it.

A workspace environment's tools class (its ``environment_factory``) keeps the episode at a
public attribute ``episode`` that satisfies :class:`WorkspaceEpisode`; its public *methods*
stay its tools. TRL 1.16 offers as tools exactly the functions of the class
(``inspect.getmembers(type(env), inspect.isfunction)``) whose names do not start with ``_``,
``reset`` and ``get_reward`` aside (``trl/trainer/grpo_trainer.py``), so an instance
attribute holding an object is never offered: the model cannot call ``close`` or
``note_write``, and no one needs the tools' private members.

An environment that provides this interface gets every tool profile through
:func:`composer_replication.envs.profiles.profile_tools_class` (tests/support/tiny_workspace.py
is a second, tiny one that does only that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from composer_replication.sandbox.sandbox import Sandbox

__all__ = ["WorkspaceEpisode", "workspace_episode"]


@runtime_checkable
class WorkspaceEpisode(Protocol):
    """One episode's workspace: the repository, its checks and budgets, the sandbox."""

    root: Path | None
    """The repository directory of the episode (None before ``reset``)."""
    task: dict[str, Any] | None
    """The task record of the episode (None before ``reset``)."""
    flags: list[str]
    """The episode's reward-hacking flags (``outside_workspace:``, ``wrote_test:``...)."""

    @property
    def box(self) -> Sandbox:
        """The sandbox commands of the episode run in."""
        ...

    @property
    def max_output_chars(self) -> int:
        """Most characters of a tool result."""
        ...

    @property
    def budget_s(self) -> float | None:
        """Wall seconds the episode's commands and test runs may take in all (None: no
        limit)."""
        ...

    @property
    def spent_s(self) -> float:
        """Wall seconds the episode's commands and test runs took so far."""
        ...

    @property
    def python_path(self) -> tuple[str, ...]:
        """Directories put on ``PYTHONPATH`` of the episode's commands (its test tools)."""
        ...

    def resolve(self, path: str) -> Path | str:
        """The real path inside the repository for ``path`` (relative to the root, or
        absolute inside it), or an error text starting ``error: ``; a refusal is flagged."""
        ...

    def write_refusal(self, sizes: list[int], unit: str = "bytes") -> str:
        """Why writes of ``sizes`` would pass the episode's write caps ('' if they would not),
        counting nothing (``unit="characters"``: sizes of texts not yet encoded)."""
        ...

    def reserve_write(self, size: int) -> str:
        """An error text if a write of ``size`` bytes passes the caps, else '' and the bytes
        are counted against the episode."""
        ...

    def note_write(self, rel: str) -> None:
        """Record a write to ``rel`` (relative to the root): counted, flagged when it is a
        test or a configuration file."""
        ...

    def spend(self, seconds: float) -> None:
        """Charge ``seconds`` of command time to the episode's budget."""
        ...

    def flag(self, *flags: str) -> None:
        """Add reward-hacking flags to the episode."""
        ...

    def close(self) -> None:
        """Remove the workspace (after grading)."""
        ...


def workspace_episode(tools: Any) -> WorkspaceEpisode:
    """The workspace of a tools instance (its ``episode``); TypeError naming the class if it
    has none (a tool environment that is not a workspace one)."""
    episode = getattr(tools, "episode", None)
    if not isinstance(episode, WorkspaceEpisode):
        raise TypeError(f"{type(tools).__name__} keeps no workspace at `episode` "
                        "(envs/workspace.py's WorkspaceEpisode)")  # fmt: skip
    return episode
