import pytest

from composer_replication.envs import get_env
from composer_replication.envs.arithmetic import LEVELS, ArithmeticEnv, extract_answer, grade_answer
from composer_replication.envs.base import MAX_ANSWER_DIGITS, answer_int


def test_splits_are_disjoint_and_cover_every_problem():
    env = ArithmeticEnv(levels=[1, 2, 3])
    train = {t.task_id for t in env.tasks("train")}
    held = {t.task_id for t in env.tasks("heldout")}
    assert not train & held
    assert len(train) + len(held) == sum(len(LEVELS[lv].problems()) for lv in (1, 2, 3))
    # roughly the requested fraction (8,100 + 900 + 100 problems)
    assert 0.15 < len(held) / (len(train) + len(held)) < 0.25


def test_split_does_not_depend_on_which_levels_are_mixed():
    a = {t.task_id for t in ArithmeticEnv(levels=[1]).tasks("heldout")}
    b = {
        t.task_id
        for t in ArithmeticEnv(levels=[1, 2]).tasks("heldout")
        if t.task_id.startswith("L1")
    }
    assert a == b


def test_answers_are_right():
    import operator
    import re

    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul}
    env = ArithmeticEnv(levels=[1, 2, 3, 4, 5])
    for task in env.tasks("train")[:500]:
        a, op, b = re.match(r"What is (\d+) ([-+*]) (\d+)\?", task.prompt).groups()
        assert task.data["answer"] == ops[op](int(a), int(b))
        assert task.data["answer"] >= 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("19", 19),
        ("12 + 7 = 19", 19),
        ("12 + 7 = 9\n\n3 + 4 = 7", 9),
        ("The answer is 19.", 19),
        ("no digits", None),
        ("-3", -3),
        ("2+3=", 2),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text", ["9" * 4301, "12 + 7 = " + "9" * 4301, "19 = " + "1" * 601])
def test_an_absurdly_long_number_is_no_answer(text):
    """``int()`` of more than 4300 digits raises ValueError: such a reply must grade 0, not crash
    the grader."""
    assert extract_answer(text) is None
    env = ArithmeticEnv(levels=[1])
    result = env.grade(env.tasks("train")[0], text)
    assert result.reward == 0.0 and not result.passed


def test_answer_int_reads_up_to_max_answer_digits():
    assert answer_int("7" * MAX_ANSWER_DIGITS) == int("7" * MAX_ANSWER_DIGITS)
    assert answer_int("7" * (MAX_ANSWER_DIGITS + 1)) is None


@pytest.mark.parametrize(
    "reply, reward, passed",
    [
        ("19", 1.0, True),
        (" 19. ", 1.0, True),
        ("12 + 7 = 19", 1.0, True),
        ("8", 0.0, False),
        ("18", 0.0, False),
        ("12 + 7 = 8", 0.0, False),
        ("I don't know", 0.0, False),
    ],
)
def test_correctness_reward(reply, reward, passed):
    """1.0 for the right answer however it is phrased, 0.0 for any wrong answer (even "18" for
    19, and a bare one): every partial credit tried was gamed, see the module."""
    r = grade_answer(reply, 19)
    assert r.reward == pytest.approx(reward) and r.passed == passed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("64 + 4 equals 68. So, 64 +", 68),
        ("64+4 = 68", 68),
        ("The sum of 64 + 4 is 68.", 68),
        ("68", 68),
        ("64 + 4 equals 78", 78),
        ("64 + 4", None),
        ("164 + 45 is 209", 164),
    ],
)
def test_extract_answer_skips_echoes_of_the_problem(text, expected):
    assert extract_answer(text, (64, "+", 4)) == expected


def test_env_grades_restated_problems_by_their_result():
    env = ArithmeticEnv(levels=[2])
    task = next(t for t in env.tasks("train") + env.tasks("heldout") if t.task_id == "L2:64+4")
    assert env.grade(task, "64 + 4 equals 68.").passed
    assert not env.grade(task, "64 + 4 equals 78.").passed


def test_feedback_says_what_was_wrong():
    assert grade_answer("12 + 7 = 8", 19).feedback == "expected 19, got 8"
    assert "no number" in grade_answer("hmm", 19).feedback
    assert "only the number" in grade_answer("it is 19", 19).feedback


def test_openenv_shaped_episode():
    env = get_env("arithmetic", levels=[1])
    task = env.tasks("heldout")[0]
    assert env.reset(task) == task.prompt
    result = env.step(str(task.data["answer"]))
    assert result.done and result.passed and result.reward == 1.0
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("1")


def test_unknown_level_and_split():
    with pytest.raises(ValueError, match="levels"):
        ArithmeticEnv(levels=[42])
    with pytest.raises(ValueError, match="split"):
        ArithmeticEnv().tasks("test")
    with pytest.raises(ValueError, match="unknown environment"):
        get_env("chess")
