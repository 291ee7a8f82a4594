"""The memory task (envs/memory.py): its tools and grading, and the property that makes it a
memory task under ``rollout.context`` (docs/summarization.md): the first drawer's key never
appears in the window that answers unless the summary carried it."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from support.memory_policy import Reader

from composer_replication.config import ConfigError, configs_dir, load_config
from composer_replication.envs import build_env
from composer_replication.envs.base import Task
from composer_replication.envs.memory import (
    FEW_SHOT,
    DrawerTools,
    MemoryEnv,
    NextDrawerTools,
    answer_of,
    worked_exchange,
)
from composer_replication.envs.tools import after_summary_tool, tool_functions
from composer_replication.rollout import ContextLoop, ToolLoop, parse_turn, render_ids


def test_drawers_hold_the_key_first_and_the_question_last():
    env = MemoryEnv(n_tasks=20, drawers=4, filler_words=3, answer="sum")
    task = env.tasks("train")[0]
    tools = DrawerTools()
    tools.reset(**env.row(task))
    key, offset = task.data["key"], task.data["offset"]
    assert f"the key is {key}." in tools.open_drawer(1)
    assert "nothing useful" in tools.open_drawer(2)
    last = tools.open_drawer(4)
    assert f"plus {offset}." in last and "no drawer" in tools.open_drawer(5)
    assert tools.opened == [1, 2, 4, 5]
    assert len(last.split()) < 10  # the filler is in every drawer but the last
    right = [{"role": "assistant", "content": str(key + offset)}]
    assert env.grade(task, right).passed and not env.grade(task, "12").passed


def test_the_copy_answer_is_the_key_a_dash_the_code_and_cannot_be_forged():
    env = MemoryEnv(n_tasks=20, drawers=3, filler_words=3, sequential=True)
    task = env.tasks("train")[0]
    key, code = task.data["key"], task.data["offset"]
    tools = NextDrawerTools()
    tools.reset(**env.row(task))
    texts = [tools.open_next_drawer() for _ in range(4)]
    assert tools.opened == [1, 2, 3, 4] and f"the key is {key}." in texts[0]
    assert f"the code is {code}." in texts[2] and "no drawer" in texts[3]
    assert str(key) not in texts[2]  # the last drawer does not repeat the key

    def grade(text: str, **extra) -> bool:
        return env.grade(task, [{"role": "assistant", "content": text, **extra}]).passed

    assert task.data["answer"] == f"{key}-{code}" and grade(f"{key}-{code}")
    assert grade(f"The answer is {key} - {code}.")
    assert not grade(f"{key}-{code + 1}") and not grade(f"{key + 1}-{code}")
    assert not grade(f"{key + code}") and not grade(f"{key} {code}")  # a pair, not numbers
    # only the first pair counts: a list of guesses gets one
    assert not grade(f"{key + 1}-{code} {key}-{code}")
    call = {"type": "function", "function": {"name": "open_next_drawer", "arguments": {}}}
    assert not grade(f"{key}-{code}", tool_calls=[call])  # a tool call is not an answer


def test_the_config_builds_it():
    cfg = load_config(None, ["env.name=memory", "env.drawers=5", "env.filler_words=7",
                             "env.sequential=true", "env.answer=sum"])  # fmt: skip
    env = build_env(cfg.env)
    assert isinstance(env, MemoryEnv) and env.tasks("train")[0].data["drawers"] == 5
    assert env.tools_class() is NextDrawerTools and env.answer == "sum"
    assert build_env(load_config(None, ["env.name=memory"]).env).tools_class() is DrawerTools
    for bad, key in [("env.answer=add", "env.answer"), ("env.shot_summary=true", "shot_summary"),
                     ("env.drawer=3", "drawer"),
                     ("env.opens_after_summary=true", "opens_after_summary")]:  # fmt: skip
        with pytest.raises(ConfigError, match=key):
            load_config(None, ["env.name=memory", bad])


def test_the_worked_exchange_precedes_the_task_and_is_right():
    env = build_env(load_config(None, ["env.name=memory", "env.few_shot=true"]).env)
    task = env.tasks("train")[0]
    prompt = env.row(task)["prompt"]
    assert prompt[1:-1] == worked_exchange("copy") and prompt[-1]["content"] == task.prompt
    assert FEW_SHOT == worked_exchange("sum")
    for shot, answer in [(FEW_SHOT, "sum"), (prompt[1:-1], "copy")]:
        tool_results = " ".join(m["content"] for m in shot if m["role"] == "tool")
        key = int(re.search(r"the key is (\d+)", tool_results).group(1))
        code = int(re.search(r"(?:plus|code is) (\d+)", tool_results).group(1))
        data = {"answer": answer_of(answer, key, code), "key": key, "offset": code,
                "answer_kind": answer}  # fmt: skip
        assert env.grade(Task("shot", "", "train", data), shot[1:]).passed  # its drawers' answer
    assert all(t.data["key"] != key for s in ("train", "heldout") for t in env.tasks(s))
    with pytest.raises(ValueError, match="summary_after"):
        worked_exchange(drawers=2, summary_after=2)


def test_the_worked_exchange_shows_a_summary_turn_as_the_loop_renders_it():
    """``shot_summary``: after drawer 1 the exchange has the loop's summary request (the
    default prompt, a user turn after the tool result), a summary that carries the key, and
    the summary as the next window's user message (the default header + the summary); no
    tool result after it repeats the key."""
    cfg = load_config(None, ["env.name=memory", "env.few_shot=true", "env.shot_summary=true",
                             "env.sequential=true"])  # fmt: skip
    env = build_env(cfg.env)
    shot = env.row(env.tasks("train")[0])["prompt"][1:-1]
    i = [m["role"] for m in shot].index("tool")
    assert "the key is 512" in shot[i]["content"]
    request, summary, carried = shot[i + 1 : i + 4]
    context = cfg.rollout.context
    assert request == {"role": "user", "content": context.summary_prompt}
    assert summary["role"] == "assistant" and "512" in summary["content"]
    assert carried == {"role": "user", "content": context.summary_header + summary["content"]}
    later = " ".join(str(m.get("content")) for m in shot[i + 4 :] if m["role"] == "tool")
    assert "512" not in later and "the code is 64" in later
    assert shot[-1] == {"role": "assistant", "content": "512-64"}


def test_the_shipped_config_lets_the_environment_open_drawer_2():
    """``opens_after_summary`` (the shipped config) needs ``sequential``; the worked exchange
    stays the one where the policy opens drawer 2 after the summary (the exchange showing the
    environment open it made the base model write a summary first, docs/summarization.md)."""
    cfg = load_config(configs_dir() / "memory_summarize.yaml")
    assert cfg.env.opens_after_summary and cfg.env.sequential and cfg.env.drawers == 2
    env = build_env(cfg.env)
    shot = env.row(env.tasks("train")[0])["prompt"][1:-1]
    assert shot == worked_exchange("copy", drawers=2, summary_after=1, sequential=True)
    with pytest.raises(ValueError, match="sequential"):
        MemoryEnv(n_tasks=2, opens_after_summary=True)


def test_after_summary_names_one_of_the_instances_tools():
    tools = NextDrawerTools()
    assert after_summary_tool(tools) is None  # before reset, and without the option
    env = MemoryEnv(n_tasks=2, drawers=2, sequential=True, opens_after_summary=True)
    tools.reset(**env.row(env.tasks("train")[0]))
    assert after_summary_tool(tools) == "open_next_drawer"
    tools.after_summary = "open_drawer"
    with pytest.raises(ValueError, match="not one of its tools"):
        after_summary_tool(tools)


def run(tok, strategy: str, carry: bool, train_summaries: bool = True):
    env = MemoryEnv(n_tasks=4, drawers=5, filler_words=30)
    task = env.tasks("train")[0]
    row = env.row(task)
    cfg = SimpleNamespace(strategy=strategy, max_tokens=420, max_summaries=6,
                          summary_prompt="Summarize.", summary_header="Summary:\n",
                          summary_max_tokens=24, train_summaries=train_summaries)  # fmt: skip
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


def shipped(tok, strategy: str, carry: bool):
    """The shipped config's task and budget (configs/memory_summarize.yaml), its worked
    exchange included, under ``strategy``, with the scripted policy."""
    cfg = load_config(configs_dir() / "memory_summarize.yaml",
                      [f"rollout.context.strategy={strategy}"])  # fmt: skip
    env = build_env(cfg.env)
    task = env.tasks("heldout")[0]
    row = env.row(task)
    drawers = cfg.env.drawers
    reader = Reader(tok, drawers, carry, sequential=True, after=task.prompt)
    tools = tool_functions(NextDrawerTools())
    suffix = ToolLoop(tok, None, None, 2, 64)._get_tool_suffix_ids
    turn = cfg.generation.max_completion_length
    loop = ContextLoop(tok, cfg.rollout.context, turn, cfg.rollout.max_turns, reader, suffix,
                       tools)  # fmt: skip
    reader.instruction = loop.instruction_ids
    prompt = render_ids(tok, row["prompt"], tools)
    first, _, _ = reader([prompt], turn)
    instance = NextDrawerTools()
    instance.reset(**row)
    msgs = [[parse_turn(tok, first[0], prompt, tools)]]
    out = loop.run([row["prompt"]], [prompt], first, msgs, None,
                   [{"open_next_drawer": instance.open_next_drawer}],
                   environments=[instance])  # fmt: skip
    return cfg, env, task, loop.episodes[0], out[1][0], reader, instance


@pytest.mark.parametrize("strategy, carry, passes", [
    ("summarize", True, True), ("summarize", False, False), ("truncate", True, False)])  # fmt: skip
def test_the_shipped_config_needs_the_summary(tool_tok, strategy, carry, passes):
    """On the shipped budget every episode that opens the drawers leaves window 0 (summarized
    once, or its first drawer dropped), and the answering window holds the key only in a
    summary that carried it."""
    cfg, env, task, ep, msgs, reader, instance = shipped(tool_tok, strategy, carry)
    key = str(task.data["key"])
    assert instance.opened == list(range(1, cfg.env.drawers + 1)) and len(ep.windows) == 2
    assert len(ep.summaries) == (strategy == "summarize")
    # env.opens_after_summary: after the summary the environment opened drawer 2, not the
    # policy (one call of its own); under truncate the policy opened both
    summarize = strategy == "summarize"
    assert (ep.environment_calls, ep.tool_calls) == ((1, 1) if summarize else (0, 2))
    if summarize:
        mark = next(m["context_window"] for m in msgs if m.get("context_window"))
        assert "the code is" in mark["observation"] and key not in mark["observation"]
    (answering,) = reader.answer_windows
    assert "the key is" not in answering and (key in answering) == passes
    assert env.grade(task, msgs).passed == passes
    # the loop could not keep the episode in one window (its rule: the context, the next
    # turn and a result as long as the longest so far must fit), and every window fits
    assert all(len(w) <= cfg.rollout.context.max_tokens for w in ep.windows)


@pytest.mark.parametrize("train_summaries", [True, False])
def test_masked_summaries_are_context_in_their_own_window(tool_tok, train_summaries):
    """``rollout.context.train_summaries=false`` (the study's masked arm): the summary tokens
    get tool mask 0 (and log-prob 0.0) in the window that wrote them; the episode is the same."""
    flag = f"rollout.context.train_summaries={str(train_summaries).lower()}"
    assert load_config(None, [flag]).rollout.context.train_summaries is train_summaries
    env, task, ep, msgs, reader, instance = run(tool_tok, "summarize", True, train_summaries)
    assert env.grade(task, msgs).passed and ep.summaries
    for w in ep.windows:
        if w.summary is None:
            continue
        span = slice(len(w.completion_ids) - w.summary_tokens, len(w.completion_ids))
        assert set(w.tool_mask[span]) == {int(train_summaries)}
        if not train_summaries:
            assert set(w.logprobs[span]) == {0.0}
        assert 1 in w.tool_mask  # the turns are still policy tokens
