"""Procedural arithmetic with difficulty levels and disjoint train / held-out splits.

Every problem of a level is enumerated; a fixed hash of the problem (not a seed) decides its
split, so the held-out problems never appear in training whatever the seed or sample size.

Grading reads the model's answer: the first number in the reply once any echo of the problem
itself ("64 + 4") is taken out, so "2 + 9 = 11", "64 + 4 equals 68" and "The answer is 68"
all answer with their result (small instruct models often restate the problem). Pass@1 is
that answer being right, and so is the training reward:

    1.0  the answer is right, however it is phrased ("19", "12 + 7 = 19", "12 + 7 equals 19.")
    0.0  a wrong answer, or no number

The feedback still asks for the bare number, but the reward does not: three shapings were
tried on the quickstart and each was gamed or hurt (docs/results.md). A 0.1 bonus for any bare
number let the policy collapse onto one bare wrong number (every group tied, GRPO's advantages
vanished; T=0.7, lr 2e-5); a closeness bonus 0.2 / (1 + |answer - expected|) made echoing the
first operand ("64" for 64 + 4) the best cheap policy; and 1.0 bare / 0.5 right-with-words
pulled the model away from restating the problem, which is how this model computes best, toward
bare guesses. Correctness alone lifted held-out pass@1 from 23% to 89%.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from composer_replication.config.env import ARITHMETIC_LEVELS
from composer_replication.envs.base import (
    FEEDBACK_FORMS,
    Environment,
    StepResult,
    Task,
    answer_int,
    unit_hash,
)

_NUMBER = re.compile(r"-?\d+")
_BARE_NUMBER = re.compile(r"^\s*-?\d+\s*\.?\s*$")


@dataclass(frozen=True)
class Level:
    """A family of problems: operand ranges, the operator and how to phrase it."""

    description: str
    a_range: range
    b_range: range
    op: str
    func: Callable[[int, int], int]
    valid: Callable[[int, int], bool] = lambda a, b: True

    def problems(self) -> list[tuple[int, int]]:
        return [(a, b) for a in self.a_range for b in self.b_range if self.valid(a, b)]


LEVELS: dict[int, Level] = {
    1: Level("1-digit + 1-digit", range(10), range(10), "+", lambda a, b: a + b),
    2: Level("2-digit + 1-digit", range(10, 100), range(10), "+", lambda a, b: a + b),
    3: Level("2-digit + 2-digit", range(10, 100), range(10, 100), "+", lambda a, b: a + b),
    4: Level(
        "1-digit - 1-digit (non-negative)",
        range(10),
        range(10),
        "-",
        lambda a, b: a - b,
        lambda a, b: a >= b,
    ),
    5: Level("1-digit * 1-digit", range(10), range(10), "*", lambda a, b: a * b),
    # sparse-reward levels (the embedded 135M model almost never solves them: docs/results.md)
    6: Level("2-digit * 1-digit", range(10, 100), range(2, 10), "*", lambda a, b: a * b),
    7: Level(
        "3-digit + 3-digit", range(100, 1000, 7), range(100, 1000, 7), "+", lambda a, b: a + b
    ),
}
if tuple(LEVELS) != ARITHMETIC_LEVELS:  # the config checks levels without importing envs
    raise RuntimeError(f"arithmetic levels {list(LEVELS)} != config's {ARITHMETIC_LEVELS}")

PROMPT = "What is {a} {op} {b}? Reply with only the number."


def extract_answer(text: str, problem: tuple[int, str, int] | None = None) -> int | None:
    """The first integer of ``text`` after echoes of ``problem`` (a, op, b) are removed; without
    a problem, the number after the first ``=`` if any, else the first integer; else None (also
    for a number longer than ``MAX_ANSWER_DIGITS``, which is no right answer)."""
    if problem is not None:
        a, op, b = problem
        text = re.sub(rf"(?<!\d){a}\s*{re.escape(op)}\s*{b}(?!\d)", " ", text)
    elif "=" in text:
        tail = _NUMBER.search(text.split("=", 1)[1])
        if tail:
            return answer_int(tail.group())
    m = _NUMBER.search(text)
    return answer_int(m.group()) if m else None


def grade_answer(
    completion: str, expected: int, problem: tuple[int, str, int] | None = None
) -> StepResult:
    """Shaped reward and feedback for an arithmetic reply (see module docstring)."""
    got = extract_answer(completion, problem)
    bare = bool(_BARE_NUMBER.match(completion))
    if got == expected:
        reward = 1.0
        feedback = "correct" if bare else f"{expected} is right, but reply with only the number"
        return StepResult(completion, reward, True, True, feedback, {"expected": expected})
    if got is None:
        feedback = f"expected {expected}, but the reply has no number"
    else:
        feedback = f"expected {expected}, got {got}"
    reward = 0.0
    forms = feedback_forms(expected, got, feedback)
    info = {"expected": expected, "got": got, FEEDBACK_FORMS: forms}
    return StepResult(completion, reward, True, False, feedback, info)


def _wrong_digits(expected: int, got: int) -> str:
    """Which digit places of ``got`` differ from ``expected`` (aligned from the right), without
    saying what they should be."""
    e, g = str(abs(expected))[::-1], str(abs(got))[::-1]
    if len(e) != len(g) or (expected < 0) != (got < 0):
        return f"{got} has the wrong number of digits or sign"
    places = ("ones", "tens", "hundreds", "thousands")
    bad = [places[i] if i < len(places) else f"10^{i}" for i in range(len(e)) if e[i] != g[i]]
    if len(bad) == 1:
        return f"the {bad[0]} digit of {got} is wrong"
    return f"the {' and '.join(reversed(bad))} digits of {got} are wrong"


def feedback_forms(expected: int, got: int | None, verifier: str) -> dict[str, str]:
    """Feedback on a wrong answer in several forms, from most to least informative; only
    ``verifier`` (the grader's message) contains the answer. Hint-uplift measurement
    (``run/uplift.py``) compares them; ``sdpo.feedback_form`` picks one for training.

    ``verifier``: the grader's own message (given); ``direction``: too large / too small; ``digits``: which digit places are wrong (a carry
    error shows as a wrong tens digit); ``wrong``: only that it is wrong (a placebo for the
    template)."""
    if got is None:
        direction = digits = "the reply has no number"
    else:
        direction = f"{got} is too {'large' if got > expected else 'small'}"
        digits = _wrong_digits(expected, got)
    return {
        "verifier": verifier,
        "direction": direction,
        "digits": digits,
        "wrong": "the answer is wrong",
    }


class ArithmeticEnv(Environment):
    """Arithmetic word-free problems mixed over ``levels``."""

    name = "arithmetic"

    def __init__(self, levels: list[int] | tuple[int, ...] = (1, 2), heldout_fraction: float = 0.2):
        super().__init__()
        bad = [lv for lv in levels if lv not in LEVELS]
        if bad:
            raise ValueError(f"unknown arithmetic levels {bad}; known: {sorted(LEVELS)}")
        self.levels = list(levels)
        self.heldout_fraction = heldout_fraction
        for lv in self.levels:
            level = LEVELS[lv]
            for a, b in level.problems():
                key = f"L{lv}:{a}{level.op}{b}"
                split = "heldout" if unit_hash(key) < heldout_fraction else "train"
                task = Task(
                    task_id=key,
                    prompt=PROMPT.format(a=a, op=level.op, b=b),
                    split=split,
                    data={"answer": level.func(a, b), "level": lv, "problem": (a, level.op, b)},
                )
                self._splits[split].append(task)
        # a fixed, level-interleaved order: sorting by hash mixes levels evenly
        for tasks in self._splits.values():
            tasks.sort(key=lambda t: unit_hash("order:" + t.task_id))

    def privileged_context(self, task: Task) -> str:
        return f"The correct answer is {task.data['answer']}."

    def grade(self, task: Task, completion: str) -> StepResult:
        return grade_answer(completion, int(task.data["answer"]), tuple(task.data["problem"]))
