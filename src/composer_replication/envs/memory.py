"""A task that needs memory across context windows (issue 61; docs/summarization.md).

The agent opens drawers one per turn with the ``open_drawer`` tool, in order. Drawer 1 holds
a key (``the key is 4821``), the middle drawers hold nothing useful, the last one holds a code
(``the code is 37``). With ``answer: copy`` (the default) the answer copies both facts, the key,
a dash, the code (``4821-37``); with ``answer: sum`` it is the key plus the code (``4858``).
Every drawer's text is padded with filler words, so with a small
``rollout.context.max_tokens`` the episode does not fit one window: by the time the last drawer
speaks, drawer 1's result has been summarized away (``summarize``) or dropped (``truncate``).
Carrying one ``key=value`` fact into the summary is enough to answer.

With ``opens_after_summary`` (``sequential`` only) the environment, not the policy, opens the
next drawer right after each summary: the window a summary opens shows the summary, then that
drawer's text (``rollout.ContextLoop`` runs the tool the instance names in ``after_summary``).
The policy then has three things to do: open drawer 1, carry the key into its summary, answer.
"""

from __future__ import annotations

import random
import re
from typing import Any

from composer_replication.config.env import DEFAULT_SUMMARY_HEADER, DEFAULT_SUMMARY_PROMPT
from composer_replication.envs.base import StepResult, Task, ToolEnvironment, unit_hash

ANSWERS = ("copy", "sum")
"""``copy``: answer ``KEY-CODE``; ``sum``: answer the key plus the code."""
SYSTEM_PROMPT = (
    "You search drawers with the {tool} tool, one drawer per turn, from drawer 1 to the last. {how}"
)
HOW = {
    "copy": "Keep opening drawers until the last one tells you what to answer.",
    "sum": "When the last drawer tells you what to answer, reply with only that number.",
}
PROMPT = (
    "There are {n} drawers. Open them in order, starting with drawer 1; the last one says what "
    "to answer."
)
WORDS = ("dust", "paper", "string", "button", "coin", "ribbon", "thread", "pencil", "stamp",
         "marble", "shell", "feather", "pin", "cork", "bead", "clip")  # fmt: skip
SHOT_KEY, SHOT_CODE = 512, 64
"""The worked exchange's facts: no task's (keys are 1000-9999, codes 11-99)."""
NEXT_CALL = '<tool_call>{"name": "open_next_drawer", "arguments": {}}</tool_call>'
"""How a ``sequential`` drawer ends: the call that opens the next one, as the template writes it."""
PAIR = re.compile(r"(\d+)\s*-\s*(\d+)")


def task_prompt(drawers: int) -> str:
    """The task's user message."""
    return PROMPT.format(n=drawers)


def answer_of(answer: str, key: int, code: int) -> str:
    """The right final answer for a key and a code."""
    return f"{key}-{code:02d}" if answer == "copy" else str(key + code)


def drawer_text(data: dict[str, Any], number: int) -> str:
    """What drawer ``number`` of a task holds (its filler, if any, then its fact)."""
    n = data["drawers"]
    if not 1 <= number <= n:
        return f"There is no drawer {number}: the drawers are 1 to {n}."
    code, facts = data["offset"], []
    if number == 1:
        facts.append(f"the key is {data['key']}.")
    if number == n and data.get("answer_kind", "sum") == "copy":
        facts.append(f"the code is {code:02d}. Now answer: the key, a dash, the code.")
    elif number == n:
        facts.append(f"answer the key plus {code}.")
    fact = " ".join(facts) or "nothing useful."
    after = ("" if number == n else f" To open drawer {number + 1}, write {NEXT_CALL}"
             if data.get("sequential") else f" Open drawer {number + 1} next.")  # fmt: skip
    rng = random.Random(f"{data['key']}:{number}")
    # no filler in the last drawer: its turn must fit beside the summary (docs/summarization.md)
    filler = " ".join(rng.choice(WORDS) for _ in range(data["filler_words"] * (number < n)))
    # the filler first: every result ends as the worked exchange's do (its fact, the next drawer)
    return f"Drawer {number}: " + (f"{filler}; " if filler else "") + f"{fact}{after}"


def _call(k: int, sequential: bool) -> dict[str, Any]:
    fn = ({"name": "open_next_drawer", "arguments": {}} if sequential
          else {"name": "open_drawer", "arguments": {"number": k}})  # fmt: skip
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": fn}],
    }


def worked_exchange(answer: str = "copy", drawers: int = 3, summary_after: int = 0,
                    sequential: bool = False, summary_prompt: str = DEFAULT_SUMMARY_PROMPT,
                    summary_header: str = DEFAULT_SUMMARY_HEADER) -> list[dict[str, Any]]:  # fmt: skip
    """A worked episode (``drawers`` drawers without filler, the key ``SHOT_KEY``): with
    ``summary_after`` k (1 <= k < drawers) it is summarized after drawer k as
    ``rollout.ContextLoop`` renders a summary turn (``summary_prompt`` as a user turn after
    the tool result, the summary, which carries the key, then the summary as a user message
    after ``summary_header``; the ``rollout.context`` defaults), and goes on to the answer;
    0: no summary turn. (The later window is shown after the summary as a continuation, not
    as the loop's window, which repeats the task first: the base 135M model stopped calling
    the tool when the worked exchange showed the task followed by a summary,
    docs/summarization.md.) With ``opens_after_summary`` the exchange is the same (the policy
    opens drawer k + 1 after the summary there): an exchange showing the environment open it
    made the base 135M model write a summary as its first turn (0/10, docs/summarization.md)."""
    data = {"key": SHOT_KEY, "offset": SHOT_CODE, "drawers": drawers, "filler_words": 0,
            "answer_kind": answer, "sequential": sequential}  # fmt: skip
    name = "open_next_drawer" if sequential else "open_drawer"

    def drawers_from(first: int, last: int) -> list[dict[str, Any]]:
        return [m for k in range(first, last + 1) for m in (
            _call(k, sequential), {"role": "tool", "name": name, "content": drawer_text(data, k)})]  # fmt: skip

    task = {"role": "user", "content": task_prompt(drawers)}
    final = {"role": "assistant", "content": answer_of(answer, SHOT_KEY, SHOT_CODE)}
    if not summary_after:
        return [task, *drawers_from(1, drawers), final]
    if not 1 <= summary_after < drawers:
        raise ValueError(
            f"summary_after={summary_after}: between 1 and drawers - 1 = {drawers - 1}"
        )
    step = "call open_next_drawer" if sequential else f"open drawer {summary_after + 1}"
    summary = f"The key is {SHOT_KEY}. I opened {summary_after} of {drawers} drawers. Next: {step}."
    return [task, *drawers_from(1, summary_after), {"role": "user", "content": summary_prompt},
            {"role": "assistant", "content": summary},
            {"role": "user", "content": summary_header + summary},
            *drawers_from(summary_after + 1, drawers), final]  # fmt: skip


FEW_SHOT = worked_exchange("sum")
"""The first worked exchange (3 drawers, no summary turn, ``answer: sum``)."""


class MemoryEnv(ToolEnvironment):
    """Drawers: the answer needs a fact from the first tool result and one from the last."""

    name = "memory"

    def __init__(self, n_tasks: int = 2000, drawers: int = 6, filler_words: int = 40,
                 heldout_fraction: float = 0.2, few_shot: bool = False, answer: str = "copy",
                 shot_summary: bool = False, sequential: bool = False,
                 opens_after_summary: bool = False) -> None:  # fmt: skip
        super().__init__()
        if drawers < 2:
            raise ValueError(f"drawers={drawers}: the key and the code need 2 drawers")
        if answer not in ANSWERS:
            raise ValueError(f"answer={answer!r}: one of {', '.join(ANSWERS)}")
        if opens_after_summary and not sequential:
            raise ValueError("opens_after_summary=True needs sequential=True (open_next_drawer)")
        self.answer, self.sequential = answer, sequential
        shot = {"drawers": 2, "summary_after": 1} if shot_summary else {}
        self.shot = worked_exchange(answer, sequential=sequential, **shot) if few_shot else []
        rng = random.Random("memory")
        seen: set[tuple[int, int]] = set()
        while len(seen) < n_tasks:
            seen.add((rng.randint(1000, 9999), rng.randint(11, 99)))
        for key, offset in sorted(seen, key=lambda p: unit_hash(f"memory-order:{p}")):
            task_id = f"memory:{key}+{offset}"
            split = "heldout" if unit_hash(task_id) < heldout_fraction else "train"
            data = {"key": key, "offset": offset, "drawers": drawers, "answer_kind": answer,
                    "sequential": sequential, "opens_after_summary": opens_after_summary,
                    "filler_words": filler_words, "answer": answer_of(answer, key, offset)}  # fmt: skip
            self._splits[split].append(Task(task_id, task_prompt(drawers), split, data))

    def tools_class(self) -> type:
        return NextDrawerTools if self.sequential else DrawerTools

    def row(self, task: Task) -> dict[str, Any]:
        tool = "open_next_drawer" if self.sequential else "open_drawer"
        system = SYSTEM_PROMPT.format(tool=tool, how=HOW[self.answer])
        return {
            "prompt": [{"role": "system", "content": system}, *self.shot,
                       {"role": "user", "content": task.prompt}],
            "answer": task.data["answer"], "task_id": task.task_id, "memory": task.data,
        }  # fmt: skip

    def grade(self, task: Task, completion: str | list[dict[str, Any]]) -> StepResult:
        """Right when the last assistant turn (without a tool call) is the answer: with
        ``answer: copy`` its first ``A-B`` pair is the key and the code (only the first counts:
        a list of guesses gets one), with ``sum`` its last number is the key plus the code.
        The failed turn is that last turn."""
        messages = completion if isinstance(completion, list) else [
            {"role": "assistant", "content": completion}]  # fmt: skip
        assistant = [m for m in messages if m.get("role") == "assistant"]
        final = assistant[-1] if assistant else {"content": ""}
        text = str(final.get("content") or "")
        if task.data.get("answer_kind", "sum") == "copy":
            pair = PAIR.search(text)
            got: Any = f"{pair[1]}-{pair[2]}" if pair else None
            right = pair is not None and (int(pair[1]), int(pair[2])) == (
                int(task.data["key"]), int(task.data["offset"]))  # fmt: skip
        else:
            numbers = re.findall(r"-?\d+", text)
            got = int(numbers[-1]) if numbers else None
            right = got == int(task.data["answer"])
        if final.get("tool_calls"):
            got, right = None, False
        want = task.data["answer"]
        opened = sum(1 for m in messages if m.get("role") == "tool")
        info = {"expected": want, "got": got, "opened": opened,
                "failed_turn": max(len(assistant) - 1, 0)}  # fmt: skip
        if right:
            return StepResult(text, 1.0, True, True, "correct", info)
        why = "no final answer" if got is None else f"answered {got}"
        feedback = f"turn {info['failed_turn']}: {why} after opening {opened} drawers"
        return StepResult(text, 0.0, True, False, feedback, info)


class _Drawers:
    """What both tool classes share: the task's drawers and the ones opened so far."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.opened: list[int] = []
        self.after_summary: str | None = None
        """The tool the context loop runs for this rollout after each summary (envs/tools.py
        ``AFTER_SUMMARY``): ``open_next_drawer`` with ``opens_after_summary``, else None."""

    def reset(self, **row: Any) -> None:
        """Start a rollout on a dataset row (its ``memory`` column)."""
        self.data, self.opened = dict(row["memory"]), []
        opens = self.data.get("opens_after_summary")  # MemoryEnv: only with open_next_drawer
        self.after_summary = "open_next_drawer" if opens else None

    def _open(self, number: int) -> str:
        self.opened.append(number)
        return drawer_text(self.data, number)


class DrawerTools(_Drawers):
    """TRL ``environment_factory`` class: ``open_drawer(number)`` is the tool."""

    def open_drawer(self, number: int) -> str:
        """Open a drawer and read what is in it.

        Args:
            number: The drawer to open, from 1 to the number of drawers.
        """
        return self._open(int(number))


class NextDrawerTools(_Drawers):
    """TRL ``environment_factory`` class (``sequential``): ``open_next_drawer()`` opens drawer
    1, then 2, and so on, so the order cannot go wrong."""

    def open_next_drawer(self) -> str:
        """Open the next drawer (drawer 1 first) and read what is in it."""
        return self._open(len(self.opened) + 1)
