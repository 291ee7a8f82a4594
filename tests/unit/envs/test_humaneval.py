import gzip
import json

import pytest

from composer_replication.config import SandboxConfig
from composer_replication.envs.humaneval import HumanEvalEnv, build_program, humaneval_path
from composer_replication.sandbox import wire

M61 = (1 << 61) - 1  # ints that differ by a multiple of it share one hash


@pytest.fixture(scope="module")
def env():
    return HumanEvalEnv()


@pytest.fixture(scope="module")
def solutions():
    with gzip.open(humaneval_path(), "rt") as fh:
        return {r["task_id"]: r["canonical_solution"] for r in map(json.loads, fh)}


def test_all_164_problems_split_disjointly(env):
    train = {t.task_id for t in env.tasks("train")}
    held = {t.task_id for t in env.tasks("heldout")}
    assert len(train | held) == 164 and not train & held
    assert 15 <= len(held) <= 50


def test_canonical_solutions_pass(env, solutions):
    for task in env.tasks("heldout")[:6]:
        result = env.grade(task, solutions[task.task_id])
        assert result.passed, (task.task_id, result.feedback)
        assert result.reward == 1.0


def test_wrong_solution_fails_with_the_assertion(env):
    task = env.tasks("heldout")[0]
    result = env.grade(task, "    return None\n")
    assert not result.passed and result.reward == 0.0
    assert result.feedback.startswith("failing test: assert candidate(")


def test_fenced_whole_function_reply_is_used(env, solutions):
    task = env.tasks("heldout")[0]
    entry = task.data["entry_point"]
    signature = next(ln for ln in task.prompt.splitlines() if ln.startswith(f"def {entry}"))
    reply = f"Here you go:\n```python\n{signature}\n{solutions[task.task_id]}```\n"
    assert env.grade(task, reply).passed


def test_infinite_loop_completion_times_out():
    env = HumanEvalEnv(sandbox=SandboxConfig(wall_timeout_s=1.0))
    task = env.tasks("heldout")[0]
    result = env.grade(task, "    while True:\n        pass\n")
    assert not result.passed and "timed out" in result.feedback


def test_program_assembly():
    """A body continues the prompt; a whole-function reply keeps only the prompt's imports."""
    prompt = "from typing import List\n\ndef f(x):\n"
    assert build_program(prompt, "    return x\n", "f") == prompt + "    return x\n"
    whole = build_program(prompt, "```python\ndef f(x):\n    return 2 * x\n```", "f")
    assert whole == "from typing import List\ndef f(x):\n    return 2 * x\n"


PLAIN = [
    (None, True, -3, 2.5, -0.0, 1 + 2j, -1 - 2j, "é\n", b"\x00", (), [], {}, set()),
    ([1, [2, (3, {"k": {4, 5}})]], {(1, 2): {3: 4}}, {-1, -2}, (1 << 13_999) - 1),
    ({k * M61 for k in range(wire.MAX_EQUAL_HASHES)}, {1: 1.0, "1": b"1"}),
]


@pytest.mark.parametrize("value", PLAIN)
def test_wire_codec_round_trips_plain_data(value):
    frame = ("value", value)
    assert wire.decode_frame(wire.encode(frame).encode(), 1 << 20) == frame


@pytest.mark.parametrize(
    "text",
    [
        "{" + ",".join(str(k * M61) for k in range(1000)) + "}",
        "{" + ",".join(f"{-k * M61}: 0" for k in range(1000)) + "}",
        "{" + ",".join(f"({k * M61}, 'x'): 0" for k in range(1000)) + "}",
    ],
    ids=["set", "dict", "tuple_keys"],
)
def test_wire_refuses_sets_and_dicts_whose_keys_share_a_hash(text):
    """Building them is quadratic (a 1 MB frame cost the grader ~11 s): refused unbuilt."""
    with pytest.raises(ValueError, match="share one hash"):
        wire.decode_frame(f"('value', {text})".encode(), 1 << 20)


def test_wire_refuses_ints_whose_str_would_raise():
    """An int past CPython's 4300-digit limit (a hex literal parses) is refused by its width,
    on both sides of the wire, before anything prints it."""
    wide = "0x" + "f" * (wire.MAX_INT_BITS // 4 + 1)
    with pytest.raises(ValueError, match="bits exceeds"):
        wire.decode_frame(f"('value', [{wide}])".encode(), 1 << 20)
    with pytest.raises(wire.NotPlainData):
        wire.encode(("value", 1 << wire.MAX_INT_BITS))


def test_preview_is_bounded_and_never_raises():
    class Loud:
        def __repr__(self):
            raise RuntimeError("no")

    assert wire.preview(1 << 20_000) == "<unprintable int>"
    assert wire.preview(Loud()) == "<unprintable Loud>"
    assert wire.preview("x" * 10_000, 300, str) == "x" * 300 + "..."
    assert wire.preview([1, "a"]) == "[1, 'a']"
