"""A task that needs memory across context windows (issue 61; docs/summarization.md).

The agent opens drawers one per turn with the ``open_drawer`` tool, in order. Drawer 1 holds
a key (``the key is 4821``), the middle drawers hold nothing useful, the last one says what to
answer (``answer the key plus 37``). Every drawer's text is padded with filler words, so with
a small ``rollout.context.max_tokens`` the episode does not fit one window: by the time the
last drawer speaks, drawer 1's result has been summarized away (``summarize``) or dropped
(``truncate``). Carrying one ``key=value`` fact into the summary is enough to answer.
"""

from __future__ import annotations

import random
import re
from typing import Any

from composer_replication.envs.base import StepResult, Task, ToolEnvironment, unit_hash

SYSTEM_PROMPT = (
    "You search drawers with the open_drawer tool, one drawer per turn, from drawer 1 to the "
    "last. When the last drawer tells you what to answer, reply with only that number."
)
PROMPT = (
    "There are {n} drawers. Open them in order, starting with drawer 1; the last one says what "
    "to answer."
)
WORDS = ("dust", "paper", "string", "button", "coin", "ribbon", "thread", "pencil", "stamp",
         "marble", "shell", "feather", "pin", "cork", "bead", "clip")  # fmt: skip


def _shot() -> list[dict[str, Any]]:
    """One worked exchange (3 drawers, no filler; key 512 is no task's: keys are 1000-9999):
    the base 135M model calls no tool from the tool schema alone (docs/summarization.md)."""
    data = {"key": 512, "offset": 7, "drawers": 3, "filler_words": 0}
    out: list[dict[str, Any]] = [{"role": "user", "content": PROMPT.format(n=3)}]
    for k in (1, 2, 3):
        call = {"type": "function", "function": {"name": "open_drawer", "arguments": {"number": k}}}
        out += [{"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "open_drawer",
                 "content": drawer_text(data, k).replace(" Also in it: .", "")}]  # fmt: skip
    return [*out, {"role": "assistant", "content": "519"}]


def drawer_text(data: dict[str, Any], number: int) -> str:
    """What drawer ``number`` of a task holds (its fact, then its filler)."""
    n = data["drawers"]
    if not 1 <= number <= n:
        return f"There is no drawer {number}: the drawers are 1 to {n}."
    if number == 1:
        fact = f"the key is {data['key']}."
    elif number == n:
        fact = f"answer the key plus {data['offset']}."
    else:
        fact = "nothing useful."
    rng = random.Random(f"{data['key']}:{number}")
    filler = " ".join(rng.choice(WORDS) for _ in range(data["filler_words"]))
    after = f" Open drawer {number + 1} next." if number < n else ""
    return f"Drawer {number}: {fact}{after} Also in it: {filler}."


FEW_SHOT = _shot()
"""The worked exchange ``few_shot`` puts before each task."""


class MemoryEnv(ToolEnvironment):
    """Drawers: the answer needs a fact from the first tool result and one from the last."""

    name = "memory"

    def __init__(self, n_tasks: int = 2000, drawers: int = 6, filler_words: int = 40,
                 heldout_fraction: float = 0.2, few_shot: bool = False):  # fmt: skip
        super().__init__()
        self.few_shot = few_shot
        if drawers < 2:
            raise ValueError(f"drawers={drawers}: the key and the question need 2 drawers")
        rng = random.Random("memory")
        seen: set[tuple[int, int]] = set()
        while len(seen) < n_tasks:
            seen.add((rng.randint(1000, 9999), rng.randint(11, 99)))
        for key, offset in sorted(seen, key=lambda p: unit_hash(f"memory-order:{p}")):
            task_id = f"memory:{key}+{offset}"
            split = "heldout" if unit_hash(task_id) < heldout_fraction else "train"
            data = {"key": key, "offset": offset, "drawers": drawers,
                    "filler_words": filler_words, "answer": key + offset}  # fmt: skip
            self._splits[split].append(Task(task_id, PROMPT.format(n=drawers), split, data))

    def tools_class(self) -> type:
        return DrawerTools

    def row(self, task: Task) -> dict[str, Any]:
        return {
            "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                       *(FEW_SHOT if self.few_shot else []),
                       {"role": "user", "content": task.prompt}],
            "answer": task.data["answer"], "task_id": task.task_id, "memory": task.data,
        }  # fmt: skip

    def grade(self, task: Task, completion: str | list[dict[str, Any]]) -> StepResult:
        """Right when the last assistant turn (without a tool call) is the key plus the offset;
        the failed turn is that last turn."""
        messages = completion if isinstance(completion, list) else [
            {"role": "assistant", "content": completion}]  # fmt: skip
        assistant = [m for m in messages if m.get("role") == "assistant"]
        final = assistant[-1] if assistant else {"content": ""}
        numbers = re.findall(r"-?\d+", str(final.get("content") or ""))
        got = None if final.get("tool_calls") or not numbers else int(numbers[-1])
        want = int(task.data["answer"])
        opened = sum(1 for m in messages if m.get("role") == "tool")
        info = {"expected": want, "got": got, "opened": opened,
                "failed_turn": max(len(assistant) - 1, 0)}  # fmt: skip
        if got == want:
            return StepResult(str(final.get("content")), 1.0, True, True, "correct", info)
        why = "no final answer" if got is None else f"answered {got}"
        feedback = f"turn {info['failed_turn']}: {why} after opening {opened} drawers"
        return StepResult(str(final.get("content")), 0.0, True, False, feedback, info)


class DrawerTools:
    """TRL ``environment_factory`` class: ``open_drawer`` is the tool."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.opened: list[int] = []

    def reset(self, **row: Any) -> None:
        """Start a rollout on a dataset row (its ``memory`` column)."""
        self.data, self.opened = dict(row["memory"]), []

    def open_drawer(self, number: int) -> str:
        """Open a drawer and read what is in it.

        Args:
            number: The drawer to open, from 1 to the number of drawers.
        """
        self.opened.append(int(number))
        return drawer_text(self.data, int(number))
