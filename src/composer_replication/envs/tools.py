"""Tool classes as TRL, evaluation and the OpenEnv server see them: the tools of an
``environment_factory`` class, a call budget per rollout, results made safe for the tokenizer,
and one call run the way TRL runs it. Every tool environment and the rollout loop use these."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from composer_replication.sandbox.wire import preview

BUDGET_EXHAUSTED = "error: the budget of {n} tool calls for this task is used up; answer now"
NOT_OFFERED = "_not_offered"
"""The one name under which :func:`tool_call_counts` counts calls of tools the environment does
not offer (a policy can invent any number of names; a metric per invented name would not end)."""


def tool_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The tools of an ``environment_factory`` class as TRL sees them: every public function
    except ``reset`` and ``get_reward``."""
    return {
        name: fn
        for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    }


AFTER_SUMMARY = "after_summary"
"""The attribute through which an environment instance asks the context loop
(``rollout.ContextLoop``, ``rollout.context.strategy: summarize``) to run one of its tools for
it, without arguments, right after each summary: the name of that tool, or None (the default:
the policy acts first in every window). The result is shown in the next window's first
message, after the summary (docs/summarization.md). An instance attribute, not a method:
TRL makes every public method of the class a tool."""


def after_summary_tool(instance: Any) -> str | None:
    """The tool ``instance`` asks the context loop to run after a summary
    (:data:`AFTER_SUMMARY`), or None. A name that is not one of its tools is an error."""
    name = getattr(instance, AFTER_SUMMARY, None)
    if name is None:
        return None
    if name not in tool_methods(type(instance)):
        raise ValueError(f"{type(instance).__name__}.{AFTER_SUMMARY}={name!r} is not one of "
                         f"its tools ({', '.join(tool_methods(type(instance)))})")  # fmt: skip
    return str(name)


def tool_call_counts(
    rollouts: list[list[dict[str, Any]]], offered: Iterable[str]
) -> dict[str, float]:
    """Calls per rollout of each tool the rollouts ran (the vocabulary the policy used):
    ``{name: calls / len(rollouts)}``, names not in ``offered`` summed under
    :data:`NOT_OFFERED`, sorted by name. A call counts when a tool result follows its turn:
    calls written in a last turn that was cut off are neither run (as in TRL) nor counted, as
    in ``rollout.RolloutStats``. Messages are OpenAI-style (``tool_calls`` entries with or
    without a ``function`` wrapper)."""
    known = set(offered)
    calls = [
        c.get("function", c)
        for messages in rollouts
        for m, after in itertools.pairwise([*messages, None])  # an empty one: no pair
        if isinstance(m, dict) and isinstance(after, dict) and after.get("role") == "tool"
        for c in m.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    names = Counter(
        fn.get("name") if isinstance(fn, dict) and fn.get("name") in known else NOT_OFFERED
        for fn in calls
    )
    n = max(len(rollouts), 1)
    return {name: names[name] / n for name in sorted(names)}


def tool_functions(instance: Any) -> list[Callable[..., Any]]:
    """The bound tool methods of an environment instance: what prompts are rendered with (the
    chat template turns them into tool schemas) and what replies are parsed against."""
    return [getattr(instance, name) for name in tool_methods(type(instance))]


def wire_safe(result: Any, limit: int | None = None) -> Any:
    """A tool's text result as the tokenizer can take it: characters UTF-8 cannot encode (a
    lone surrogate echoed from a policy-written argument) are written as backslash escapes.
    TRL tokenizes tool results outside its per-tool try, so one such result stopped training.

    With ``limit``, a longer text keeps its first ``limit`` characters and a last line saying
    it was cut. The text is cut before it is escaped (escaping only lengthens it), so a 95 MB
    server answer costs no more than its first ``limit`` characters (a 10 MB one cost TRL's
    tokenizer 13 s and 1.7 GB). Anything but a string is returned as it is."""
    if not isinstance(result, str):
        return result
    if limit is None:
        return result.encode("utf-8", "backslashreplace").decode("utf-8")
    text = wire_safe(result[: limit + 1])
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... (cut: {len(result)} characters in all)"


def encode_text(content: Any) -> bytes | str:
    """The UTF-8 bytes of a tool's file content, or an error result (``error: ...``) naming
    the first character UTF-8 cannot encode (a lone surrogate): checked before a file is
    touched, since an encoding error after ``open(..., "w")`` left the file truncated."""
    try:
        return str(content).encode("utf-8")
    except UnicodeEncodeError as e:
        return f"error: the content is not valid UTF-8 text (position {e.start})"


def wire_snippet(value: Any, limit: int = 120, show: Callable[[Any], str] = str) -> str:
    """``value`` quoted inside a message (a refused path, a server's bad reward): ``show(value)``
    cut to ``limit`` characters by ``sandbox.wire.preview`` (which never raises), then made
    UTF-8-safe (:func:`wire_safe`)."""
    return wire_safe(preview(value, limit, show))


def bounded_tools(cls: type, max_calls: int) -> type:
    """A subclass of ``cls`` whose tools answer ``BUDGET_EXHAUSTED`` after ``max_calls`` calls
    in one rollout (counted from ``reset``), without running, and whose results are
    :func:`wire_safe`. Every tool class reaches TRL, evaluation and the OpenEnv server
    through this. Signatures and docstrings are kept (``functools.wraps``), so the tool
    schemas TRL renders are unchanged."""

    def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def tool(self, *args: Any, **kwargs: Any) -> Any:
            self._cr_calls = getattr(self, "_cr_calls", 0) + 1
            if self._cr_calls > max_calls:
                return BUDGET_EXHAUSTED.format(n=max_calls)
            return wire_safe(fn(self, *args, **kwargs))

        return tool

    def reset(self, **row: Any) -> Any:
        self._cr_calls = 0
        return cls.reset(self, **row)

    namespace: dict[str, Any] = {name: guard(fn) for name, fn in tool_methods(cls).items()}
    namespace["reset"] = functools.wraps(cls.reset)(reset)
    namespace["__doc__"] = cls.__doc__
    return type(cls.__name__, (cls,), namespace)


def call_tool(instance: Any, call: dict[str, Any]) -> tuple[str, bool]:
    """Run one parsed tool call on an environment instance the way TRL does: an unknown name
    or an exception becomes an error result. Returns (content, failed)."""
    fn = call.get("function", call)
    name, args = fn.get("name"), fn.get("arguments")
    tools = tool_methods(type(instance))
    if name not in tools:
        return str({"error": f"Tool {name!r} not found."}), True
    try:
        result = getattr(instance, name)(**(args if isinstance(args, dict) else {}))
    except Exception as e:  # a tool's own failure is the model's feedback, as in TRL
        return wire_safe(str({"error": f"{type(e).__name__}: {e}"})), True
    text = wire_safe(str(result))
    return text, text.startswith("error")
