"""Train on any OpenEnv environment through TRL's ``environment_factory``: its tools become the
methods TRL offers the model, each call a WebSocket step on the environment's server.

:func:`openenv_tools_class` asks the server once for its tools (OpenEnv's ``list_tools``
action: name, description, JSON schema) and builds a class with one method per tool whose
signature and Google-style docstring come from that schema (so TRL renders the same tool
schema the server published). Every instance holds its own session (``GenericEnvClient``,
no environment package needed): ``reset(**row)`` resets it with the row's scalar columns
(``task_id``, ``seed``, ...), a tool call sends ``call_tool`` and returns the result text or
the server's error. :class:`OpenEnvReward` grades each rollout on the server when it offers
our reserved ``_grade`` tool (envs/openenv_server.py: reward, pass flag, feedback and the
failed turn), else takes the last reward the environment reported during the episode.
"""

from __future__ import annotations

import inspect
import json
import math
from typing import Any

from composer_replication.envs.base import StepResult

GRADE_TOOL = "_grade"
_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool,
               "array": list, "object": dict}  # fmt: skip


class OpenEnvError(RuntimeError):
    """The OpenEnv server is unreachable or answered something unusable (message says which)."""


def _client(base_url: str):
    from openenv.core.generic_client import GenericEnvClient

    client = GenericEnvClient(base_url=base_url).sync()
    try:
        client.connect()
    except Exception as e:  # connection refused, DNS, handshake: one clear line
        raise OpenEnvError(f"cannot reach the OpenEnv server at {base_url}: {e}") from None
    return client


def list_tools(base_url: str) -> list[dict[str, Any]]:
    """The server's tools (``list_tools``), each ``{name, description, input_schema}``."""
    client = _client(base_url)
    try:
        client.reset()
        obs = client.step({"type": "list_tools"}).observation
    except Exception as e:
        raise OpenEnvError(
            f"{base_url}: list_tools failed ({e}); is it an OpenEnv tool env?"
        ) from None
    finally:
        client.close()
    tools = obs.get("tools") if isinstance(obs, dict) else None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("name") for t in tools):
        raise OpenEnvError(f"{base_url}: list_tools returned no usable tool list: {obs!r:.300}")
    return tools


class OpenEnvTools:
    """Base of the classes :func:`openenv_tools_class` builds (one session per instance).
    TRL offers every public method as a tool, so everything but the tools is private."""

    base_url: str = ""

    def __init__(self) -> None:
        self._session = _client(self.base_url)
        self.rewards: list[float] = []

    def reset(self, **row: Any) -> str | None:
        """Reset the server's episode with the row's scalar columns; returns the observation
        as text for TRL to append to the prompt, unless it carries the prompt itself."""
        params = {k: v for k, v in row.items() if isinstance(v, (str, int, float, bool))}
        result = self._session.reset(**params)
        self.rewards = []
        obs = result.observation if isinstance(result.observation, dict) else {}
        if "prompt" in obs:
            return None  # our servers: the dataset row already holds this prompt
        shown = {k: v for k, v in obs.items() if k not in ("metadata", "tools")}
        return json.dumps(shown, ensure_ascii=False) if shown else None

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        result = self._session.step(
            {"type": "call_tool", "tool_name": name, "arguments": arguments}
        )
        if result.reward is not None:
            self.rewards.append(float(result.reward))
        obs = result.observation if isinstance(result.observation, dict) else {}
        error = obs.get("error")
        if error:
            return f"error: {error.get('message', error) if isinstance(error, dict) else error}"
        value = obs.get("result")
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    def _verdict(self, messages: list[dict[str, Any]]) -> StepResult:
        """The server's verdict on the rollout (``_grade``), or the episode's last reward."""
        try:
            result = self._session.step({"type": "call_tool", "tool_name": GRADE_TOOL,
                                         "arguments": {"messages": messages}})  # fmt: skip
            verdict = result.observation.get("result") if result.observation else None
        except Exception:  # a third-party server without our grading tool
            verdict, result = None, None
        final = str(messages[-1].get("content", "")) if messages else ""
        if isinstance(verdict, dict) and result is not None and result.reward is not None:
            reward = float(result.reward)
            passed = bool(verdict.get("passed"))
            return StepResult(final, reward, True, passed, str(verdict.get("feedback", "")),
                              dict(verdict.get("info") or {}))  # fmt: skip
        reward = self.rewards[-1] if self.rewards else 0.0
        return StepResult(final, reward, True, reward > 0, "", {})

    def _close(self) -> None:
        self._session.close()


def _tool_method(spec: dict[str, Any]):
    """A method ``name(self, **arguments)`` with the signature and docstring of ``spec``."""
    name = spec["name"]
    schema = spec.get("input_schema") or {}
    props: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])

    def tool(self, **kwargs: Any) -> str:
        return self._call(name, kwargs)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    notes = {}
    for arg, p in props.items():
        kind = _JSON_TYPES.get(p.get("type"), str)
        default = inspect.Parameter.empty if arg in required else None
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY,
                                        default=default, annotation=kind))  # fmt: skip
        notes[arg] = p.get("description") or arg
    tool.__name__ = tool.__qualname__ = name
    tool.__signature__ = inspect.Signature(params, return_annotation=str)
    tool.__annotations__ = {p.name: p.annotation for p in params[1:]} | {"return": str}
    args_doc = "".join(f"    {a}: {d}\n" for a, d in notes.items())
    tool.__doc__ = (
        f"{spec.get('description') or name}\n\nArgs:\n{args_doc}"
        if notes
        else (spec.get("description") or name)
    )
    return tool


def openenv_tools_class(base_url: str) -> type:
    """An ``environment_factory`` class for the OpenEnv server at ``base_url`` (module
    docstring); raises ``OpenEnvError`` if the server is unreachable or lists no tools."""
    tools = list_tools(base_url)
    reserved = {"reset", "get_reward"}
    bad = [t["name"] for t in tools if t["name"] in reserved or not t["name"].isidentifier()]
    if bad:
        raise OpenEnvError(f"{base_url}: tool names {bad} cannot be methods (reserved or invalid)")
    namespace = {t["name"]: _tool_method(t) for t in tools}
    namespace["base_url"] = base_url
    return type("OpenEnvTools", (OpenEnvTools,), namespace)


class OpenEnvReward:
    """TRL reward function over OpenEnv sessions: each rollout graded by its environment
    instance (``OpenEnvTools._verdict``); verdicts kept for the channels (``last_results``)."""

    def __init__(self, name: str = "openenv"):
        self.__name__ = f"{name}_reward"
        self.last_results: list[StepResult] = []

    def __call__(self, prompts, completions, environments=None, log_metric=None, **_: Any):
        if environments is None or len(environments) != len(completions):
            raise ValueError("OpenEnvReward needs TRL's environments= (one per completion)")
        results = [env._verdict(list(c)) for env, c in zip(environments, completions, strict=True)]
        bad = [r.reward for r in results if not math.isfinite(r.reward)]
        if bad:
            raise OpenEnvError(f"the OpenEnv server reported a non-finite reward {bad[0]}")
        self.last_results = results
        if log_metric is not None and results:
            log_metric("env/pass_rate", sum(r.passed for r in results) / len(results))
        return [r.reward for r in results]
