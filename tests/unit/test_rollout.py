"""Tool-call bounds, the turn structure of a tool batch, and the greedy agent loop."""

from __future__ import annotations

import copy

import torch
from support.scripted_agent import ANSWER, CALL, scripted_calculator_model
from transformers.utils import get_json_schema

from composer_replication.envs.calculator import CalculatorEnv, CalculatorTools
from composer_replication.envs.tools import (
    BUDGET_EXHAUSTED,
    NOT_OFFERED,
    bounded_tools,
    call_tool,
    tool_call_counts,
    tool_methods,
    wire_safe,
    wire_snippet,
)
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.rollout import RolloutStats, run_agent, turn_index


def test_bounded_tools_refuse_past_the_budget_and_reset_per_rollout():
    cls = bounded_tools(CalculatorTools, max_calls=2)
    env = cls()
    env.reset(answer=1)
    assert [env.calculate("2 * 3"), env.calculate("4 + 4")] == ["6", "8"]
    assert env.calculate("1 + 1") == BUDGET_EXHAUSTED.format(n=2)
    assert env.calls == [("2 * 3", "6"), ("4 + 4", "8")]  # the refused call never ran
    env.reset(answer=2)
    assert env.calculate("1 + 1") == "2"


def test_bounded_tools_keep_the_schema_trl_renders():
    plain, bounded = CalculatorTools(), bounded_tools(CalculatorTools, 1)()
    assert get_json_schema(bounded.calculate) == get_json_schema(plain.calculate)
    assert list(tool_methods(type(bounded))) == ["calculate"]


def test_call_tool_reports_unknown_names_and_errors_like_trl():
    env = CalculatorTools()
    assert call_tool(env, {"function": {"name": "calc", "arguments": {}}})[1] is True
    text, failed = call_tool(env, {"function": {"name": "calculate", "arguments": {"x": 1}}})
    assert failed and "TypeError" in text
    assert call_tool(env, {"name": "calculate", "arguments": {"expression": "3*3"}}) == ("9", False)
    assert call_tool(env, {"name": "calculate", "arguments": {"expression": "1/0"}})[1] is True


def test_turn_index_numbers_runs_of_model_tokens():
    # turn 0 (3 tokens), tool result (2), turn 1 (2), padding (2)
    tool_mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1, 1, 1, 1]])
    comp_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0, 0]])
    assert turn_index(tool_mask, comp_mask).tolist() == [
        [0, 0, 0, -1, -1, 1, 1, -1, -1],
        [0, 0, -1, 1, 1, 1, -1, -1, -1],
    ]


def test_run_agent_runs_the_tool_and_grades_the_conversation(tokenizer):
    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    env = CalculatorEnv(per_kind=300)
    task = next(
        t for t in env.tasks("train") + env.tasks("heldout") if t.task_id == "calc:208 * 67"
    )
    other = env.tasks("heldout")[0]
    model = scripted_calculator_model(tok)
    rows = [env.row(task), env.row(other)]
    out = run_agent(model, tok, rows, CalculatorTools, max_turns=3, max_new_tokens=40, batch_size=2)
    first = out[0].messages
    assert [m["role"] for m in first] == ["assistant", "tool", "assistant"]
    assert first[1]["content"] == "13936" and first[2]["content"] == "13936"
    assert env.grade(task, first).passed and not env.grade(other, out[1].messages).passed
    assert env.grade(other, out[1].messages).info["failed_turn"] == 1
    st = RolloutStats.of(out)
    assert (st.turns, st.tool_calls, st.tool_error_frac) == (2.0, 1.0, 0.0)


def test_run_agent_stops_at_max_turns_without_running_the_last_calls(tokenizer):
    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    env = CalculatorEnv(per_kind=50)
    model = scripted_calculator_model(tok, turns=(CALL, CALL, ANSWER))
    tools = bounded_tools(CalculatorTools, 1)
    [r] = run_agent(model, tok, [env.row(env.tasks("heldout")[0])], tools, 2, 40, 1)
    assert [m["role"] for m in r.messages] == ["assistant", "tool", "assistant"]
    assert r.messages[-1].get("tool_calls")  # written in the last turn, not run
    assert (r.turns, r.tool_calls) == (2, 1)


def test_evaluate_on_a_tool_env_reports_turns_and_tool_calls(tokenizer):
    from composer_replication.evaluation import evaluate

    tok = copy.deepcopy(tokenizer)  # evaluate installs the tool template itself
    env = CalculatorEnv(per_kind=50)
    res = evaluate(scripted_calculator_model(tok), tok, env, "heldout", n=2, max_new_tokens=40,
                   batch_size=2, max_turns=3, max_tool_calls=4)  # fmt: skip
    s = res.summary()
    assert s["n"] == 2 and s["decoding"] == "greedy"
    assert (s["turns_per_rollout"], s["tool_calls_per_rollout"], s["tool_error_frac"]) == (2, 1, 0)
    assert s["pass_rate"] == 0.0  # "13936" is the answer of another task
    assert "calculate({'expression': '208 * 67'}) | -> 13936 | 13936" in res.completions[0]
    assert s["calls/calculate"] == 1.0  # per rollout, by name: the same calls as the total
    assert sum(v for k, v in s.items() if k.startswith("calls/")) == s["tool_calls_per_rollout"]
    (first, _) = res.episodes("base")
    assert first == {"tag": "base", "task_id": res.task_ids[0], "passed": False, "reward": 0.0,
                     "completion": res.completions[0]}  # fmt: skip


def test_tool_call_counts_sum_names_the_env_does_not_offer_under_one_key():
    """A policy can invent any number of tool names; the metric keys stay bounded."""
    call = lambda name: {"type": "function", "function": {"name": name, "arguments": "{}"}}  # noqa: E731
    rollouts = [
        [{"role": "assistant", "tool_calls": [call("Read"), call("Transliterate")]},
         {"role": "tool", "content": "x"}, {"role": "tool", "content": "y"},
         {"role": "assistant", "tool_calls": [{"name": "Bash"}, call("inflection.py")]},
         {"role": "tool", "content": "z"}, {"role": "tool", "content": "w"},
         {"role": "assistant", "tool_calls": [call("Read")]}],  # cut off: not run, not counted
        [{"role": "assistant", "content": "no call"}, "not a message"],
    ]  # fmt: skip
    assert tool_call_counts(rollouts, ["Read", "Bash", "Edit"]) == {
        "Bash": 0.5, "Read": 0.5, NOT_OFFERED: 1.0,
    }  # fmt: skip
    assert tool_call_counts([], ["Read"]) == {}


def test_wire_safe_escapes_lone_surrogates_and_cuts_before_escaping():
    assert wire_safe("a\udc80b") == "a\\udc80b"
    assert wire_safe({"x": 1}) == {"x": 1}  # not text: untouched
    assert wire_safe("short", 5) == "short"
    cut = wire_safe("x" * 10 + "\udc80" * 1_000_000, 12)
    # the first 12 characters after escaping, then a line naming the original length
    assert cut == "x" * 10 + "\\u\n... (cut: 1000010 characters in all)"
    cut.encode("utf-8")  # the tokenizer can take it


def test_wire_snippet_quotes_short_safe_and_never_raises():
    assert wire_snippet("p" * 200, 10) == "p" * 10 + "..."
    assert wire_snippet("a\udc80", 10) == "a\\udc80"
    assert wire_snippet("1", 10, repr) == "'1'"
    # an int past str()'s digit limit is named, not raised
    assert wire_snippet(10**5000, 80, repr) == "<unprintable int>"


def test_the_tool_loop_outside_a_trainer_gives_the_trainers_tokens(tokenizer, tmp_path):
    """``ToolLoop`` (what a Ray rollout worker runs) on the local trainer's own scripted
    generation: prompt ids, completion ids (call, tool result, answer) and tool masks equal
    the trainer's round, row for row, with concurrent tool calls; each turn's tag is kept."""
    from support.scripted_policy import ScriptedTrainer, scripted_trainer

    from composer_replication.rollout import ToolLoop

    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    env = CalculatorEnv(per_kind=4, few_shot=False)
    rows = [r for r in [env.row(t) for t in env.tasks("train")[:2]] for _ in range(2)]
    tools = bounded_tools(CalculatorTools, 4)
    reward = lambda completions, **_: [0.0] * len(completions)  # noqa: E731
    trainer = scripted_trainer(tok, rows, tools, reward, 1, str(tmp_path), {"": [CALL, ANSWER]})
    batch = trainer._generate_and_score_completions(rows)

    def generate(prompts):
        ids, _ = ScriptedTrainer._generate_single_turn(trainer, prompts)
        return ids, [[-0.5] * len(i) for i in ids], len(prompts)

    loop = ToolLoop(tok, trainer.model.config, generate, max_turns=2, max_completion_length=8192)
    episodes = loop.run(rows, [tools() for _ in rows])
    for b, e in enumerate(episodes):
        keep = batch["completion_mask"][b].bool()
        assert e.completion_ids == batch["completion_ids"][b][keep].tolist()
        assert e.tool_mask == batch["tool_mask"][b][keep].tolist()
        assert e.prompt_ids == batch["prompt_ids"][b][batch["prompt_mask"][b].bool()].tolist()
        assert [m["role"] for m in e.messages] == ["assistant", "tool", "assistant"]
        assert e.messages[1]["content"] == "13936"
        assert e.logprobs == [-0.5 if m else 0.0 for m in e.tool_mask]
        assert e.turn_tags == [4, 4]  # both turns generated for the whole batch at once
