"""Arithmetic a 135M model cannot do in its head, with a ``calculate(expression)`` tool.

Problems are 3-digit x 2-digit products (``mul``) and ``a * b + c`` (``muladd``). The reward is
1.0 when the final assistant turn answers the right number (the last integer it writes), else
0.0. The tool evaluates arithmetic by walking a Python ``ast`` that may only hold numbers,
``+ - * / // % **`` and unary signs, with bounds on input length, node count, exponent and
result size: nothing the model writes is ever executed. Errors come back as the tool result.

Grading a multi-turn rollout (a list of chat messages) names the first turn that went wrong
and why, e.g. "turn 0: called `calc`, the tool is `calculate`", "turn 1: answered 1200, the
tool returned 1776", "turn 0: no tool call"; ``StepResult.info`` holds ``failed_turn`` (index
among the assistant turns), ``reason`` for the turn-level hint and ``reason_kind`` (the reason
without its numbers: ``no tool call``, ``answered``, ...). Splits are by a fixed hash
of the problem, like ``arithmetic``.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
from typing import Any

from composer_replication.envs.base import (
    FEEDBACK_FORMS,
    StepResult,
    Task,
    ToolEnvironment,
    answer_int,
    unit_hash,
)
from composer_replication.sandbox import pyast

TOOL_NAME = "calculate"
MAX_EXPRESSION_CHARS = 200
MAX_NODES = 64
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30
SYSTEM_PROMPT = (
    "You are a helpful assistant. You cannot multiply large numbers in your head: "
    "use the calculate tool, then reply with only the number."
)
PROMPT = "What is {expr}?"
# Worked exchanges shown before each task: the base 135M model never calls a tool from the tool
# schema alone (bench/calculator_base_rates.py); 12 * 34 and 56 * 78 + 9 are no task of any split.


def _shot(question: str, expression: str, result: str) -> list[dict[str, Any]]:
    call = {
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": {"expression": expression}},
    }
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": TOOL_NAME, "content": result},
        {"role": "assistant", "content": result},
    ]


FEW_SHOT: list[dict[str, Any]] = _shot("What is 12 * 34?", "12 * 34", "408") + _shot(
    "What is 56 * 78 + 9?", "56 * 78 + 9", "4377"
)
_INT = re.compile(r"-?\d+")

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """An expression the calculator refuses; its message is the tool result."""


def _check_pow(base: float, exp: float) -> None:
    if abs(exp) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exp} is too large (at most {MAX_EXPONENT})")
    if base not in (0, 1, -1) and exp > 0 and exp * math.log10(abs(base)) > 30:
        raise CalculatorError("result is too large")


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_pow(left, right)
        try:
            value = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError as err:
            raise CalculatorError("division by zero") from err
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise CalculatorError("result is too large or not a real number")
        return value
    raise CalculatorError(
        f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}"
    )


def safe_calculate(expression: str) -> str:
    """The value of an arithmetic ``expression`` as text, or ``error: ...``; never executes it."""
    if not isinstance(expression, str):
        return f"error: expression must be a string, got {type(expression).__name__}"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: expression longer than {MAX_EXPRESSION_CHARS} characters"
    text = expression.replace("×", "*").replace("^", "**").replace(",", "").strip()
    try:
        tree = pyast.parse(text, mode="eval")
        if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
            raise CalculatorError(f"expression has more than {MAX_NODES} parts")
        value = _eval(tree.body)
    except CalculatorError as err:
        return f"error: {err}"
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError, TypeError):
        return f"error: cannot parse {expression[:40]!r} as arithmetic"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _final_number(text: str) -> int | None:
    """The last integer of ``text`` (None if there is none or it is absurdly long)."""
    numbers = _INT.findall(text.replace(",", ""))
    return answer_int(numbers[-1]) if numbers else None


def _tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") or []
    return [c.get("function", c) for c in calls]


def _check_call(call: dict[str, Any]) -> tuple[str, str] | None:
    """(the kind of error, why the tool call is wrong), or None when it is right."""
    name = call.get("name")
    if name != TOOL_NAME:
        return "called another tool", f"called `{name}`, the tool is `{TOOL_NAME}`"
    args = call.get("arguments")
    if not isinstance(args, dict) or "expression" not in args:
        return (
            "call without an expression",
            f"called `{TOOL_NAME}` without an `expression` argument",
        )
    result = safe_calculate(args["expression"])
    if result.startswith("error"):
        return "calculate() failed", f"`{TOOL_NAME}({args['expression']!r})` failed: {result}"
    return None


def grade_conversation(messages: list[dict[str, Any]], expected: int) -> StepResult:
    """Grade a rollout's messages (assistant and tool turns); names the first failing turn."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    results = [str(m.get("content", "")) for m in messages if m.get("role") == "tool"]
    final = assistant[-1] if assistant else {"content": ""}
    got = None if _tool_calls(final) else _final_number(str(final.get("content", "")))
    info: dict[str, Any] = {"expected": expected, "got": got, "tool_calls": 0}
    first_error: tuple[int, str, str] | None = None
    for turn, message in enumerate(assistant):
        for call in _tool_calls(message):
            info["tool_calls"] += 1
            error = _check_call(call)
            if error and first_error is None:
                first_error = (turn, *error)
    if got == expected:
        return StepResult(str(final.get("content", "")), 1.0, True, True, "correct", info)
    last = len(assistant) - 1
    hidden = None  # the verdict without the expected number, where the verdict names it
    if info["tool_calls"] == 0:
        failed = (0, "no tool call", "no tool call")
    elif first_error is not None:
        failed = first_error
    elif got is None:
        failed = (last, "no final answer", f"no final answer after {info['tool_calls']} tool calls")
    elif str(expected) in results:
        failed = (last, "answered", f"answered {got}, the tool returned {expected}")
        hidden = f"answered {got}, which is not what the tool returned"
    else:
        failed = (
            last,
            "answered",
            f"answered {got}, expected {expected}; the tool returned {results[-1]}",
        )
        hidden = f"answered {got}, which is wrong; the tool returned {results[-1]}"
    info.update(failed_turn=failed[0], reason_kind=failed[1], reason=failed[2])
    feedback = f"turn {failed[0]}: {failed[2]}"
    info[FEEDBACK_FORMS] = {
        "verifier": feedback,
        # the same verdict and turn without the expected number (tool-use errors never name it)
        "process": f"turn {failed[0]}: {hidden or failed[2]}",
        "wrong": f"turn {failed[0]} went wrong",
    }
    return StepResult(str(final.get("content", "")), 0.0, True, False, feedback, info)


class CalculatorEnv(ToolEnvironment):
    """Multi-step arithmetic to be solved with the ``calculate`` tool."""

    name = "calculator"

    def __init__(
        self,
        kinds: tuple[str, ...] | list[str] = ("mul", "muladd"),
        per_kind: int = 2000,
        heldout_fraction: float = 0.2,
        few_shot: bool = True,
        system_prompt: str = SYSTEM_PROMPT,
        shots: int = 2,
    ):
        super().__init__()
        if not 0 <= shots <= len(FEW_SHOT) // 4:
            raise ValueError(
                f"shots={shots}: the calculator has {len(FEW_SHOT) // 4} worked exchanges"
            )
        self.few_shot, self.system_prompt, self.shots = few_shot, system_prompt, shots
        bad = [k for k in kinds if k not in ("mul", "muladd")]
        if bad:
            raise ValueError(f"unknown calculator kinds {bad}; known: mul, muladd")
        for kind in kinds:
            for expr in _problems(kind, per_kind):
                split = "heldout" if unit_hash(f"calc:{expr}") < heldout_fraction else "train"
                answer = int(safe_calculate(expr))
                data = {"answer": answer, "expression": expr}
                task = Task(f"calc:{expr}", PROMPT.format(expr=expr), split, data)
                self._splits[split].append(task)

    def privileged_context(self, task: Task) -> str:
        return f"The correct answer is {task.data['answer']}."

    def grade(self, task: Task, completion: str | list[dict[str, Any]]) -> StepResult:
        """Grade a final reply (text) or a whole multi-turn rollout (chat messages)."""
        messages = completion
        if isinstance(completion, str):
            messages = [{"role": "assistant", "content": completion}]
        return grade_conversation(messages, int(task.data["answer"]))

    def tools_class(self) -> type:
        return CalculatorTools

    def reference_turn(self, task: Task, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The right assistant turn after ``history`` (the rollout's messages so far): the
        answer once a tool result holds it, else the ``calculate`` call of the problem (the
        worked exchanges' form). Hint uplift measures its log-prob at the failed turn."""
        answer = str(task.data["answer"])
        if any(m.get("role") == "tool" and str(m.get("content", "")).strip() == answer
               for m in history):  # fmt: skip
            return {"role": "assistant", "content": answer}
        return _shot("", task.data["expression"], "")[1]

    def row(self, task: Task) -> dict[str, Any]:
        """TRL row (``prompt``, ``answer``, ``task_id``); with ``few_shot`` the prompt holds
        the first ``shots`` worked tool exchanges (:data:`FEW_SHOT`, no task of any split)
        before the task."""
        shots = FEW_SHOT[: 4 * self.shots] if self.few_shot else []
        return {
            "prompt": [
                {"role": "system", "content": self.system_prompt},
                *shots,
                {"role": "user", "content": self.user_message(task)},
            ],
            "answer": task.data["answer"],
            "task_id": task.task_id,
        }

    def rows(self, split: str) -> list[dict[str, Any]]:
        """:meth:`row` of every task of ``split``, in order."""
        return [self.row(t) for t in self.tasks(split)]


def _problems(kind: str, n: int) -> list[str]:
    rng = random.Random(f"calculator:{kind}")
    out: set[str] = set()
    while len(out) < n:
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        out.add(f"{a} * {b}" if kind == "mul" else f"{a} * {b} + {rng.randint(100, 999)}")
    return sorted(out, key=lambda e: unit_hash("order:" + e))


class CalculatorTools:
    """TRL ``environment_factory`` class: ``reset(**row)`` per rollout, ``calculate`` is the tool."""

    def __init__(self) -> None:
        self.answer: int | None = None
        self.calls: list[tuple[str, str]] = []

    def reset(self, **row: Any) -> None:
        """Start a rollout on a dataset row (its ``answer`` column); the prompt already poses it."""
        self.answer = row.get("answer")
        self.calls = []

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: The arithmetic expression, for example "123 * 45 + 6".
        """
        result = safe_calculate(expression)
        self.calls.append((expression, result))
        return result


def calculator_reward(
    completions: list[list[dict[str, Any]]], answer: list[int], **_: Any
) -> list[float]:
    """TRL reward function: 1.0 when a rollout's final turn answers ``answer``."""
    return [grade_conversation(c, int(a)).reward for c, a in zip(completions, answer, strict=True)]
