"""Serve any of our tool environments as an OpenEnv environment (``openenv`` 0.10).

The served environment speaks OpenEnv's own tool protocol, so any OpenEnv client and our
generic adapter (envs/openenv/adapter.py) can use it without our package:

* ``reset(task_id=..., split=...)`` (or ``index=``) starts an episode on one task; the
  observation holds the task's chat ``prompt`` and the tool schemas (``tools``).
* ``{"type": "list_tools"}`` -> ``ListToolsObservation`` (name, description, JSON schema);
  ``{"type": "call_tool", "tool_name", "arguments"}`` -> ``CallToolObservation`` with the tool's
  result (or an error naming the unknown tool / bad arguments). Tools are the methods of the
  environment's ``tools_class`` (bounded by ``max_tool_calls`` per episode).
* ``{"type": "call_tool", "tool_name": "_grade", "arguments": {"messages": [...]}}`` grades
  the episode's conversation with the environment's verifier: reward, ``done``, and as the
  result the pass flag, the feedback text and the verifier's info (``failed_turn``,
  ``reason``) that the turn-level hint of self-distillation uses. ``_grade`` is not listed by
  ``list_tools``, so an adapter never offers it to the model; it answers once per episode.
  (OpenEnv 0.10 routes the MCP action types only when the action class is the base
  ``Action``, so grading is a reserved tool rather than an action class of its own.)

Each WebSocket session gets its own instance; ``SUPPORTS_CONCURRENT_SESSIONS`` is declared
and ``max_concurrent_envs`` bounds them. ``python -m composer_replication.envs.openenv.server
--env calculator --port 8000`` serves one (uvicorn).
"""

from __future__ import annotations

import argparse
import uuid
from dataclasses import dataclass
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironment
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
    ToolErrorType,
)
from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, State
from pydantic import Field
from transformers.utils import get_json_schema

from composer_replication.envs.base import ToolEnvironment
from composer_replication.envs.openenv.adapter import GRADE_TOOL, plain_info
from composer_replication.envs.tools import bounded_tools, call_tool, tool_methods


class TaskObservation(Observation):
    """Reset and grading observations of a served tool environment."""

    task_id: str = ""
    prompt: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    passed: bool = False
    feedback: str = ""
    info: dict[str, Any] = Field(default_factory=dict)


def tool_specs(cls: type) -> list[Tool]:
    """OpenEnv ``Tool`` entries for the tools of an ``environment_factory`` class."""
    out = []
    for name, fn in tool_methods(cls).items():
        schema = get_json_schema(fn)["function"]
        out.append(Tool(name=name, description=schema.get("description", ""),
                        input_schema=schema.get("parameters", {})))  # fmt: skip
    return out


@dataclass(frozen=True)
class Served:
    """What every session of one served environment shares, built once per app: the
    environment, its bounded tool class, its tasks by id and the tools' OpenEnv specs."""

    env: ToolEnvironment
    tools_cls: type
    tasks: dict[str, Any]
    specs: list[Tool]

    @classmethod
    def of(cls, env: ToolEnvironment, max_tool_calls: int) -> Served:
        tools_cls = bounded_tools(env.tools_class(), max_tool_calls)
        tasks = {t.task_id: t for split in ("train", "heldout") for t in env.tasks(split)}
        return cls(env, tools_cls, tasks, tool_specs(tools_cls))


class ServedToolEnv(OpenEnvEnvironment):
    """One OpenEnv session over a ToolEnvironment (module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, served: Served):
        super().__init__()
        self.env, self.tools_cls, self._tasks = served.env, served.tools_cls, served.tasks
        self._specs = served.specs
        self._task = None
        self._tools: Any = None
        self._graded = False
        self._state = State()

    def reset(self, seed=None, episode_id=None, task_id=None, split="train", index=0, **_):
        if task_id is None:
            tasks = self.env.tasks(split)
            task = tasks[int(index) % len(tasks)]
        elif task_id in self._tasks:
            task = self._tasks[task_id]
        else:
            raise ValueError(f"unknown task_id {task_id!r} for environment {self.env.name!r}")
        row = self.env.row(task)
        self.close()  # the previous episode's workspace, if it was never graded
        self._task, self._tools, self._graded = task, self.tools_cls(), False
        self._tools.reset(**row)
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        specs = [t.model_dump() for t in self._specs]
        return TaskObservation(task_id=task.task_id, prompt=row["prompt"], tools=specs)

    def step(self, action: Action, timeout_s=None, **_) -> Observation:
        if self._task is None:
            raise RuntimeError("step() before reset(): start an episode with reset(task_id=...)")
        self._state.step_count += 1
        if isinstance(action, ListToolsAction):
            return ListToolsObservation(tools=self._specs)
        if isinstance(action, CallToolAction) and action.tool_name == GRADE_TOOL:
            return self._grade(action.arguments.get("messages"))
        if isinstance(action, CallToolAction):
            return self._call(action)
        raise ValueError(f"unsupported action {type(action).__name__}: use list_tools/call_tool")

    def _grade(self, messages: Any) -> CallToolObservation:
        if self._graded:
            raise ValueError("this episode was already graded; reset() to start another")
        if not isinstance(messages, list):
            raise ValueError(f"{GRADE_TOOL} needs arguments.messages, a list of chat messages")
        self._graded = True
        [r] = self.env.grade_episodes([self._task], [messages], [self._tools])
        info = {k: v for k, v in r.info.items() if plain_info(v)}
        verdict = {"passed": r.passed, "feedback": r.feedback, "info": info}
        return CallToolObservation(tool_name=GRADE_TOOL, result=verdict, reward=r.reward, done=True)

    def _call(self, action: CallToolAction) -> CallToolObservation:
        call = {"name": action.tool_name, "arguments": action.arguments}
        text, failed = call_tool(self._tools, call)
        error = None
        if failed and all(t.name != action.tool_name for t in self._specs):
            error = ToolError(error_type=ToolErrorType.TOOL_NOT_FOUND, message=text)
        return CallToolObservation(tool_name=action.tool_name, result=text, error=error)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        """Release the episode's resources (OpenEnv calls this when the session ends; reset
        calls it for the previous episode): a feature_deletion workspace per ungraded reset
        was left on disk, 80 of them from 80 resets of hostile clients."""
        episode = getattr(self._tools, "episode", None)  # the tools' own close (envs/workspace.py)
        if episode is not None:
            episode.close()


def create_env_app(
    env: ToolEnvironment,
    max_tool_calls: int = 4,
    max_concurrent_envs: int = 64,
    session_timeout_s: float | None = 300.0,
):
    """A FastAPI app serving ``env`` over OpenEnv (HTTP + WebSocket sessions). Sessions idle
    for ``session_timeout_s`` are closed (64 idle connections held every slot forever)."""
    served = Served.of(env, max_tool_calls)  # once, not per session
    return create_app(
        lambda: ServedToolEnv(served),
        Action,
        TaskObservation,
        env_name=env.name,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=max_concurrent_envs, session_timeout=session_timeout_s
        ),
        mode="simulation",
    )


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from composer_replication.envs import get_env

    ap = argparse.ArgumentParser(description="Serve a tool environment over OpenEnv.")
    ap.add_argument("--env", default="calculator")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-tool-calls", type=int, default=4)
    ap.add_argument("--max-sessions", type=int, default=64)
    ap.add_argument("--session-timeout", type=float, default=300.0,
                    help="close sessions idle this many seconds")  # fmt: skip
    ns = ap.parse_args(argv)
    env = get_env(ns.env)
    if not isinstance(env, ToolEnvironment):
        raise SystemExit(f"{ns.env} is not a tool environment")
    app = create_env_app(env, ns.max_tool_calls, ns.max_sessions, ns.session_timeout)
    uvicorn.run(app, host=ns.host, port=ns.port, log_level="warning")


if __name__ == "__main__":
    main()
