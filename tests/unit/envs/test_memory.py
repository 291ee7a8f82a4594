"""The memory task (envs/memory.py): its tools and grading, and the property that makes it a
memory task under ``rollout.context`` (docs/summarization.md): the first drawer's key never
appears in the window that answers unless the summary carried it."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from support.memory_policy import Reader

from composer_replication.config import load_config
from composer_replication.envs import build_env
from composer_replication.envs.base import Task
from composer_replication.envs.memory import FEW_SHOT, DrawerTools, MemoryEnv
from composer_replication.envs.tools import tool_functions
from composer_replication.rollout import ContextLoop, ToolLoop, parse_turn, render_ids


def test_drawers_hold_the_key_first_and_the_question_last():
    env = MemoryEnv(n_tasks=20, drawers=4, filler_words=3)
    task = env.tasks("train")[0]
    tools = DrawerTools()
    tools.reset(**env.row(task))
    key, offset = task.data["key"], task.data["offset"]
    assert f"the key is {key}." in tools.open_drawer(1)
    assert "nothing useful" in tools.open_drawer(2)
    assert f"plus {offset}." in tools.open_drawer(4) and "no drawer" in tools.open_drawer(5)
    assert tools.opened == [1, 2, 4, 5]
    right = [{"role": "assistant", "content": str(key + offset)}]
    assert env.grade(task, right).passed and not env.grade(task, "12").passed


def test_the_config_builds_it():
    cfg = load_config(None, ["env.name=memory", "env.drawers=5", "env.filler_words=7"])
    env = build_env(cfg.env)
    assert isinstance(env, MemoryEnv) and env.tasks("train")[0].data["drawers"] == 5


def test_the_worked_exchange_precedes_the_task_and_is_right():
    env = build_env(load_config(None, ["env.name=memory", "env.few_shot=true"]).env)
    task = env.tasks("train")[0]
    prompt = env.row(task)["prompt"]
    assert prompt[1:-1] == FEW_SHOT and prompt[-1]["content"] == task.prompt
    tool_results = " ".join(m["content"] for m in FEW_SHOT if m["role"] == "tool")
    key = int(re.search(r"the key is (\d+)", tool_results).group(1))
    offset = int(re.search(r"plus (\d+)", tool_results).group(1))
    shot_task = Task("shot", "", "train", {"answer": key + offset})
    assert env.grade(shot_task, FEW_SHOT[1:]).passed  # its answer is what its drawers say
    assert all(t.data["key"] != key for s in ("train", "heldout") for t in env.tasks(s))


def run(tok, strategy: str, carry: bool):
    env = MemoryEnv(n_tasks=4, drawers=5, filler_words=30)
    task = env.tasks("train")[0]
    row = env.row(task)
    cfg = SimpleNamespace(strategy=strategy, max_tokens=420, max_summaries=6,
                          summary_prompt="Summarize.", summary_header="Summary:\n",
                          summary_max_tokens=24)  # fmt: skip
    reader = Reader(tok, 5, carry)
    tools = tool_functions(DrawerTools())
    suffix = ToolLoop(tok, None, None, 2, 64)._get_tool_suffix_ids
    loop = ContextLoop(tok, cfg, 40, 12, reader, suffix, tools)
    reader.instruction = loop.instruction_ids
    prompt = render_ids(tok, row["prompt"], tools)
    first, _, _ = reader([prompt], 40)
    instance = DrawerTools()
    instance.reset(**row)
    msgs = [[parse_turn(tok, first[0], prompt, tools)]]
    out = loop.run([row["prompt"]], [prompt], first, msgs, None,
                   [{"open_drawer": instance.open_drawer}])  # fmt: skip
    return env, task, loop.episodes[0], out[1][0], reader, instance


@pytest.mark.parametrize("strategy, carry, passes", [
    ("summarize", True, True), ("summarize", False, False), ("truncate", False, False)])  # fmt: skip
def test_the_key_reaches_the_answering_window_only_through_the_summary(
    tool_tok, strategy, carry, passes
):
    env, task, ep, msgs, reader, instance = run(tool_tok, strategy, carry)
    key = str(task.data["key"])
    assert instance.opened == [1, 2, 3, 4, 5] and len(ep.windows) >= 2
    (answering,) = reader.answer_windows
    assert "the key is" not in answering  # drawer 1's result is not in the answering window
    assert (key in answering) == (strategy == "summarize" and carry)
    if key in answering:  # and then only inside the summary message
        assert f"Summary:\\nkey={key}" in json.dumps(answering)
    assert env.grade(task, msgs).passed == passes
