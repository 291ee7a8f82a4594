"""Train on any OpenEnv environment through TRL's ``environment_factory``: its tools become the
methods TRL offers the model, each call a WebSocket step on the environment's server.

:func:`openenv_tools_class` asks the server once for its tools (OpenEnv's ``list_tools``
action: name, description, JSON schema) and builds a class with one method per tool whose
signature and Google-style docstring come from that schema (so TRL renders the same tool
schema the server published). Every instance holds its own session (``GenericEnvClient``,
no environment package needed): ``reset(**row)`` resets it with the row's scalar columns
(``task_id``, ``seed``, ...), a tool call sends ``call_tool`` and returns the result text or
the server's error. Calls and gradings of concurrent rollouts hold one of ``CONNECTIONS``.
:class:`OpenEnvReward` grades each rollout on the server when it offers
our reserved ``_grade`` tool (envs/openenv/server.py: reward, pass flag, feedback and the
failed turn), else takes the last reward the environment reported during the episode.
"""

from __future__ import annotations

import inspect
import json
import keyword
import logging
import math
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from composer_replication.config.base import UserError
from composer_replication.envs.base import (
    FEEDBACK_FORMS,
    INFRA_FAILURE,
    StepResult,
    infra_kind,
    log_infra_metrics,
    machine_failed,
)
from composer_replication.envs.tools import wire_safe, wire_snippet
from composer_replication.sandbox.infra import KINDS, SERVER_ERROR, InfraFailure
from composer_replication.sandbox.sandbox import Slots

__all__ = ["OpenEnvError", "OpenEnvSession", "OpenEnvTools", "OpenEnvReward", "openenv_tools_class"]

log = logging.getLogger(__name__)
FLOAT32_MAX = 3.4028234663852886e38
"""TRL holds rewards in float32: a reward finite in Python but past this became ``inf`` there
(a lying server's 1e39 made every loss 0, or NaN weights with ``scale_rewards=none``)."""
MAX_REWARD = 1e6
"""Largest reward magnitude accepted from a server (1e20 with ``scale_rewards=none`` still
gave gradient norms of 1e12): rewards are bounded scores, not arbitrary numbers."""

CONNECTIONS = Slots(32)
"""OpenEnv steps (tool calls, gradings) in flight at once from this process
(``rollout.max_remote_calls``): concurrent rollouts wait here, not on the server."""

GRADE_TOOL = "_grade"
_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool,
               "array": list, "object": dict}  # fmt: skip


class OpenEnvError(UserError, RuntimeError):
    """The OpenEnv server is unreachable or answered something unusable (message says which)."""


def server_reward(value: Any, where: str) -> float:
    """A reward a server reported, checked: a real number (not a string, bool or list) of
    magnitude at most ``MAX_REWARD``; ``OpenEnvError`` naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OpenEnvError(
            f"{where}: the reward must be a number, got {wire_snippet(value, 80, repr)}"
        )
    try:
        reward = float(value)
    except OverflowError:
        reward = float("inf")
    if not abs(reward) <= MAX_REWARD:  # also NaN
        shown = wire_snippet(value, 80, repr)
        raise OpenEnvError(
            f"{where}: reward {shown} is not a finite number within +-{MAX_REWARD:g}"
        )
    return reward


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
    TRL offers every public method as a tool, so the tools are the only public methods: the
    session (a call, the verdict, closing it) is :attr:`episode`, an
    :class:`OpenEnvSession`."""

    _base_url: str = ""
    _max_output_chars: int = 8000

    def __init__(self) -> None:
        self.episode = OpenEnvSession(self._base_url, self._max_output_chars)

    def reset(self, **row: Any) -> str | None:
        """Reset the server's episode with the row's scalar columns; returns the observation
        as text for TRL to append to the prompt, unless it carries the prompt itself."""
        return self.episode.reset(row)


class OpenEnvSession:
    """One tools instance's session with an OpenEnv server: reset, tool calls, the verdict.

    A call that fails in transport (timeout, closed connection) ends the session for this
    episode: openenv reconnects silently on the next call, to a NEW session that was never
    reset, and grading that session scored another episode."""

    def __init__(self, base_url: str, max_output_chars: int) -> None:
        self.base_url, self.max_output_chars = base_url, max_output_chars
        self._session = _client(base_url)
        self._rewards: list[float] = []
        self._rejected = ""  # a call reward refused as a lie, in this episode
        self.lost = ""
        """Why the session was lost this episode ('' while it holds)."""
        self._no_start: InfraFailure | None = None  # the server could not reset the episode

    def reset(self, row: dict[str, Any]) -> str | None:
        """Reset the server's episode with the row's scalar columns (:meth:`OpenEnvTools.reset`)."""
        params = {k: v for k, v in row.items() if isinstance(v, (str, int, float, bool))}
        if self.lost:  # a new episode on a fresh session
            self._session.close()
            self._session, self.lost = _client(self.base_url), ""
        self._rewards, self._rejected, self._no_start = [], "", None
        try:
            result = self._session.reset(**params)
        except Exception as e:  # before the policy's first action: the machine's (masked)
            why = f"reset failed: {type(e).__name__}: {wire_snippet(str(e), 200)}"
            self._no_start, self.lost = InfraFailure(SERVER_ERROR, why), why
            return f"error: the environment server could not start the episode ({why})"
        obs = result.observation if isinstance(result.observation, dict) else {}
        if "prompt" in obs:
            return None  # our servers: the dataset row already holds this prompt
        shown = {k: v for k, v in obs.items() if k not in ("metadata", "tools")}
        return (
            wire_safe(json.dumps(shown, ensure_ascii=False), self.max_output_chars)
            if shown
            else None
        )

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run tool ``name`` on the server: its result text, or the server's error."""
        if self.lost:
            return f"error: the session with the environment server was lost ({self.lost})"
        try:
            with CONNECTIONS.held():
                result = self._session.step(
                    {"type": "call_tool", "tool_name": name, "arguments": arguments}
                )
        except Exception as e:
            self.lost = f"{type(e).__name__} in {name}"
            raise OpenEnvError(f"{self.base_url}: {name} failed: {type(e).__name__}: {e}") from None
        if result.reward is not None:
            try:
                self._rewards.append(server_reward(result.reward, f"{self.base_url}: {name}"))
            except OpenEnvError as e:  # TRL shows a tool's error to the model and goes on:
                self._rejected = str(e)  # the episode must not be graded on an earlier reward
                raise
        obs = result.observation if isinstance(result.observation, dict) else {}
        error = obs.get("error")
        if error:
            msg = error.get("message", error) if isinstance(error, dict) else error
            return wire_safe(f"error: {msg}", self.max_output_chars)
        value = obs.get("result")
        return wire_safe(
            value if isinstance(value, str) else json.dumps(value, ensure_ascii=False),
            self.max_output_chars,
        )

    def verdict(self, messages: list[dict[str, Any]]) -> StepResult:
        """The server's verdict on the rollout (``_grade``); on a server without that tool,
        the episode's last reward. A grading that fails (lost session, no answer, an
        unusable verdict) is a reward of 0 flagged ``grading_failed:<why>`` and logged, never
        a silent fallback; a lying reward is an ``OpenEnvError``."""
        final = str(messages[-1].get("content", "")) if messages else ""
        where = f"{self.base_url}: {GRADE_TOOL}"
        if self._no_start is not None:
            return machine_failed(final, self._no_start)
        if self.lost:
            return _failed(final, where, f"session lost ({self.lost})")
        try:
            with CONNECTIONS.held():
                result = self._session.step({"type": "call_tool", "tool_name": GRADE_TOOL,
                                             "arguments": {"messages": messages}})  # fmt: skip
        except Exception as e:
            self.lost = f"{type(e).__name__} in {GRADE_TOOL}"
            return _failed(final, where, f"{type(e).__name__}: {e}")
        obs = result.observation if isinstance(result.observation, dict) else {}
        error = obs.get("error")
        if error and _not_found(error):  # a third-party server without our grading tool
            if self._rejected:
                raise OpenEnvError(self._rejected)
            reward = self._rewards[-1] if self._rewards else 0.0
            return StepResult(final, reward, True, reward > 0, "", {})
        verdict = obs.get("result")
        if error or not isinstance(verdict, dict):
            return _failed(final, where, f"no verdict: {wire_snippet(error or verdict, 80, repr)}")
        reward = server_reward(result.reward, where)
        passed, info = verdict.get("passed"), verdict.get("info") or {}
        if not isinstance(passed, bool) or not isinstance(info, dict):
            got = f"{wire_snippet(passed, 80, repr)} and {wire_snippet(info, 80, repr)}"
            raise OpenEnvError(
                f"{where}: the verdict's passed must be a bool and info a dict, got {got}"
            )
        feedback = wire_safe(str(verdict.get("feedback", "")), self.max_output_chars)
        return StepResult(final, reward, True, passed, feedback, verdict_info(info, where))

    def close(self) -> None:
        """Close the session (after grading)."""
        self._session.close()


MAX_TURN = 2**31 - 1
"""Largest ``failed_turn`` a verdict may name (it becomes a torch int64 index)."""


def verdict_info(info: dict[Any, Any], where: str) -> dict[str, Any]:
    """A server verdict's ``info``, checked: the fields the trainer reads must have their
    type (``flags`` a list of strings, ``failed_turn`` an int in ``[0, MAX_TURN]``,
    ``infra_failure`` a machine failure kind of sandbox/infra.py,
    ``reason``/``reason_kind`` strings, ``feedback_forms`` a mapping of strings to strings;
    ``OpenEnvError`` naming the field otherwise, as for a lying reward); any other field is
    kept only as plain data (a finite number, a string, None, a list of strings)."""
    checks = {
        "flags": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "failed_turn": lambda v: type(v) is int and 0 <= v <= MAX_TURN,
        "reason": lambda v: isinstance(v, str),
        "reason_kind": lambda v: isinstance(v, str),
        INFRA_FAILURE: lambda v: v in KINDS,  # the grader says the machine failed: masked
        FEEDBACK_FORMS: lambda v: (
            isinstance(v, dict)
            and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())
        ),
    }
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key in checks:
            if not checks[key](value):
                raise OpenEnvError(
                    f"{where}: the verdict's info[{key!r}] is not what the trainer reads, got "
                    f"{wire_snippet(value, 80, repr)}"
                )
            out[key] = value
        elif isinstance(key, str) and plain_info(value):
            out[key] = value
    return out


def plain_info(value: Any) -> bool:
    """Verdict details that travel between server and client: finite numbers, strings, None
    and lists of strings (flags)."""
    if isinstance(value, list):
        return all(isinstance(v, str) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (int, str, type(None)))


def _not_found(error: Any) -> bool:
    """An error answer saying the server has no ``_grade`` tool (OpenEnv's TOOL_NOT_FOUND)."""
    kind = error.get("error_type", "") if isinstance(error, dict) else ""
    text = str(error.get("message", "") if isinstance(error, dict) else error).lower()
    return "not_found" in str(kind).lower() or ("not found" in text and GRADE_TOOL in text)


def _failed(final: str, where: str, why: str) -> StepResult:
    log.warning("%s: grading failed, reward 0 (%s)", where, why)
    flag = f"grading_failed:{why[:80]}"
    return StepResult(final, 0.0, True, False, f"grading failed: {why}", {"flags": [flag]})


def _tool_method(spec: dict[str, Any], where: str):
    """A method ``name(self, **arguments)`` with the signature and docstring of ``spec``;
    ``OpenEnvError`` naming the tool and field for a schema that cannot be one."""
    name = spec["name"]
    schema = spec.get("input_schema") or {}
    props = schema.get("properties") or {} if isinstance(schema, dict) else None
    required = schema.get("required") or [] if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not isinstance(required, list):
        raise OpenEnvError(f"{where}: tool {name!r}: input_schema needs a properties object "
                           "and a required list")  # fmt: skip

    def tool(self, **kwargs: Any) -> str:
        return self.episode.call(name, kwargs)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    notes = {}
    for arg, p in props.items():
        if not _usable_name(arg) or arg == "self" or not isinstance(p, dict):
            raise OpenEnvError(
                f"{where}: tool {name!r}: parameter {wire_snippet(arg, 80, repr)} cannot be a "
                "Python keyword argument (or its schema is not an object)"
            )
        kind = p.get("type")
        kind = _JSON_TYPES.get(kind, str) if isinstance(kind, str) else str
        default = inspect.Parameter.empty if arg in required else None
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY,
                                        default=default, annotation=kind))  # fmt: skip
        notes[arg] = _doc_text(p.get("description") or arg)
    tool.__name__ = tool.__qualname__ = name
    tool.__signature__ = inspect.Signature(params, return_annotation=str)
    tool.__annotations__ = {p.name: p.annotation for p in params[1:]} | {"return": str}
    args_doc = "".join(f"    {a}: {d}\n" for a, d in notes.items())
    summary = _doc_text(spec.get("description") or name)
    tool.__doc__ = f"{summary}\n\nArgs:\n{args_doc}" if notes else summary
    return tool


def _usable_name(name: Any) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def _doc_text(text: Any) -> str:
    """Server text placed in a docstring: a line of its own reading ``Args:`` (or Returns,
    Raises) would start a section of TRL's docstring parser, which then raised."""
    return re.sub(r"(?m)^(\s*)(Args|Arguments|Returns|Raises)(\s*):", r"\1\2\3 -", str(text))


def openenv_tools_class(base_url: str, max_output_chars: int = 8000) -> type:
    """An ``environment_factory`` class for the OpenEnv server at ``base_url`` (module
    docstring); raises ``OpenEnvError`` if the server is unreachable, lists no tools, or
    names a tool so that it cannot be a public method of its own (a keyword, a private or
    dunder name, a name of the class's machinery such as ``reset``, or a duplicate).
    Results and reset observations are cut to ``max_output_chars``."""
    tools = list_tools(base_url)
    names = [t["name"] for t in tools]
    taken = {"reset", "get_reward", "episode"} | set(dir(OpenEnvTools))
    bad = [n for n in names
           if not _usable_name(n) or n.startswith("_") or n in taken or names.count(n) > 1]  # fmt: skip
    if bad:
        shown = [wire_snippet(n, 40, repr) for n in bad[:10]]
        raise OpenEnvError(f"{base_url}: tool names {shown} cannot be methods (reserved, "
                           "private, duplicated or not identifiers)")  # fmt: skip
    namespace: dict[str, Any] = {t["name"]: _tool_method(t, base_url) for t in tools}
    namespace["_base_url"] = base_url
    namespace["_max_output_chars"] = max_output_chars
    return type("OpenEnvTools", (OpenEnvTools,), namespace)


class OpenEnvReward:
    """TRL reward function over OpenEnv sessions: each rollout graded by its environment
    instance (``OpenEnvSession.verdict``); verdicts kept for the channels (``last_results``)."""

    def __init__(self, name: str = "openenv"):
        self.__name__ = f"{name}_reward"
        self.last_results: list[StepResult] = []

    def __call__(self, prompts, completions, environments=None, log_metric=None, **_: Any):
        if environments is None or len(environments) != len(completions):
            raise ValueError("OpenEnvReward needs TRL's environments= (one per completion)")
        threads = max(1, min(len(completions), CONNECTIONS.limit))
        with ThreadPoolExecutor(threads) as pool:  # each session graded on its own connection
            results = list(
                pool.map(lambda e, c: e.episode.verdict(list(c)), environments, completions)
            )
        self.last_results = results
        kinds = self.last_infra_kinds
        if log_metric is not None and results:
            graded = [r for r, k in zip(results, kinds, strict=True) if k is None]
            if graded:
                log_metric("env/pass_rate", sum(r.passed for r in graded) / len(graded))
            failed = sum(any(f.startswith("grading_failed:") for f in r.info.get("flags", []))
                         for r in results)  # fmt: skip
            log_metric("env/grading_failed_frac", failed / len(results))
            log_infra_metrics(kinds, log_metric)
        return [None if k is not None else r.reward for r, k in zip(results, kinds, strict=True)]

    @property
    def last_infra_kinds(self) -> list[str | None]:
        """Per rollout of the last batch: the machine failure kind, or None if graded."""
        return [infra_kind(r) for r in self.last_results]
