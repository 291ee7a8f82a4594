"""The calculator env: safe evaluation, hand-worked grading, turn-level feedback, splits."""

from __future__ import annotations

import time

import pytest

from composer_replication.envs import get_env
from composer_replication.envs.calculator import (
    CalculatorEnv,
    CalculatorTools,
    calculator_reward,
    grade_conversation,
    safe_calculate,
)


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("347 * 29", "10063"),
        ("347 * 29 + 512", "10575"),
        ("-3 + 4 * 2", "5"),
        ("7 / 2", "3.5"),
        ("17 // 5", "3"),
        ("17 % 5", "2"),
        ("2 ** 10", "1024"),
        ("1,200 * 3", "3600"),
        ("6 / 3", "2"),
        ("2^3", "8"),
        ("(((4)))", "4"),
    ],
)
def test_calculate_hand_worked(expr, want):
    assert safe_calculate(expr) == want


@pytest.mark.parametrize(
    "hostile",
    [
        "2 ** 100000",
        "9 ** 9 ** 9",
        "10 ** 20 * 10 ** 20",
        "__import__('os').system('id')",
        "().__class__.__bases__",
        "x",
        "open('/etc/passwd')",
        "lambda: 1",
        "[1] * 10",
        "'a' * 9",
        "1 / 0",
        "1" * 10_000,
        "(" * 100 + "1" + ")" * 100,
        "+".join(["1"] * 90),
        "1 if 1 else 2",
        "1e308 * 1e308",
        "",
        "3 +",
        "True + True",
        "1j * 1j",
    ],
)
def test_calculate_hostile_returns_error_quickly(hostile):
    start = time.perf_counter()
    out = safe_calculate(hostile)
    assert out.startswith("error"), out
    assert time.perf_counter() - start < 0.1


def test_calculate_rejects_non_string():
    assert safe_calculate(12).startswith("error")  # type: ignore[arg-type]


def _call(name, expression=None, content=""):
    args = {} if expression is None else {"expression": expression}
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}],
    }


def test_grade_right_answer_after_tool_call():
    msgs = [
        _call("calculate", "347 * 29"),
        {"role": "tool", "name": "calculate", "content": "10063"},
        {"role": "assistant", "content": "10063"},
    ]
    r = grade_conversation(msgs, 10063)
    assert (r.reward, r.passed, r.info["tool_calls"]) == (1.0, True, 1)


@pytest.mark.parametrize("digits", [4301, 20000])
def test_grade_an_absurdly_long_final_number_scores_0(digits):
    """``int()`` of more than 4300 digits raises ValueError: the reply is simply wrong."""
    msgs = [
        _call("calculate", "347 * 29"),
        {"role": "tool", "name": "calculate", "content": "10063"},
        {"role": "assistant", "content": "The answer is " + "9" * digits},
    ]
    r = grade_conversation(msgs, 10063)
    assert (r.reward, r.passed, r.info["got"]) == (0.0, False, None)
    env = CalculatorEnv(per_kind=5)
    assert env.grade(env.tasks("train")[0], "9" * digits).reward == 0.0


def test_grade_no_tool_call_names_turn_0():
    r = grade_conversation([{"role": "assistant", "content": "The answer is 1200."}], 1776)
    assert (r.reward, r.info["failed_turn"], r.info["reason"]) == (0.0, 0, "no tool call")
    assert r.info["reason_kind"] == "no tool call"
    assert r.feedback == "turn 0: no tool call"


def test_grade_wrong_tool_name():
    msgs = [
        _call("calc", "24 * 74"),
        {"role": "tool", "name": "calc", "content": "{'error': ..}"},
        {"role": "assistant", "content": "1700"},
    ]
    r = grade_conversation(msgs, 1776)
    assert r.info["failed_turn"] == 0
    assert r.info["reason"] == "called `calc`, the tool is `calculate`"
    assert r.info["reason_kind"] == "called another tool"


def test_grade_ignores_tool_result_answers_otherwise():
    msgs = [
        _call("calculate", "24 * 74"),
        {"role": "tool", "name": "calculate", "content": "1776"},
        {"role": "assistant", "content": "So it is 1200."},
    ]
    r = grade_conversation(msgs, 1776)
    assert (r.info["failed_turn"], r.info["reason"]) == (1, "answered 1200, the tool returned 1776")
    assert r.info["reason_kind"] == "answered"


def test_grade_wrong_expression_and_bad_call_and_no_final():
    msgs = [
        _call("calculate", "24 * 75"),
        {"role": "tool", "name": "calculate", "content": "1800"},
        {"role": "assistant", "content": "1800"},
    ]
    r = grade_conversation(msgs, 1776)
    assert r.info["reason"] == "answered 1800, expected 1776; the tool returned 1800"
    assert r.info["reason_kind"] == "answered"
    r = grade_conversation([_call("calculate"), {"role": "assistant", "content": "3"}], 1776)
    assert r.info["reason"] == "called `calculate` without an `expression` argument"
    assert r.info["reason_kind"] == "call without an expression"
    r = grade_conversation([_call("calculate", "2 ** 999")], 1776)
    assert r.info["failed_turn"] == 0 and "failed: error" in r.info["reason"]
    assert r.info["reason_kind"] == "calculate() failed"
    r = grade_conversation(
        [
            _call("calculate", "24 * 74"),
            {"role": "tool", "name": "calculate", "content": "1776"},
            _call("calculate", "1776"),
        ],
        1776,
    )
    assert (r.info["failed_turn"], r.info["reason"]) == (1, "no final answer after 2 tool calls")
    assert r.info["reason_kind"] == "no final answer"


def test_splits_disjoint_fixed_and_registered():
    env = get_env("calculator")
    train, held = env.tasks("train"), env.tasks("heldout")
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    assert 0.15 < len(held) / (len(train) + len(held)) < 0.25
    again = CalculatorEnv()
    assert [t.task_id for t in again.tasks("heldout")] == [t.task_id for t in held]
    task = train[0]
    right = env.grade(task, f"It is {task.data['answer']}.")  # the reward is the right answer
    assert (right.reward, right.passed) == (1.0, True)


def test_trl_environment_protocol_and_reward():
    tools = CalculatorTools()
    row = CalculatorEnv().rows("train")[0]
    assert tools.reset(**row) is None
    assert tools.calculate("12 * 12") == "144" and tools.calls == [("12 * 12", "144")]
    done = [
        [{"role": "assistant", "content": str(row["answer"])}],
        [{"role": "assistant", "content": "1"}],
    ]
    assert calculator_reward(done, [row["answer"]] * 2) == [1.0, 0.0]


def test_feedback_forms_hide_the_expected_number():
    """``process`` keeps the verdict and the turn but never the expected number; tool-use
    errors are the same in both forms (they never name it)."""
    cases = [
        ([_call("calculate", "24 * 74"), {"role": "tool", "content": "1776"},
          {"role": "assistant", "content": "So it is 1200."}],
         "turn 1: answered 1200, which is not what the tool returned"),
        ([_call("calculate", "24 * 75"), {"role": "tool", "content": "1800"},
          {"role": "assistant", "content": "1800"}],
         "turn 1: answered 1800, which is wrong; the tool returned 1800"),
        ([{"role": "assistant", "content": "1200"}], "turn 0: no tool call"),
    ]  # fmt: skip
    for msgs, process in cases:
        r = grade_conversation(msgs, 1776)
        forms = r.info["feedback_forms"]
        assert forms["verifier"] == r.feedback and forms["process"] == process
        assert "1776" not in forms["process"] and "1776" not in forms["wrong"]
    assert "1776" in grade_conversation(cases[1][0], 1776).info["feedback_forms"]["verifier"]
