"""Hint uplift at the failed turn of multi-turn rollouts (run/uplift_turns.py)."""

from __future__ import annotations

import copy
import json

import pytest
from support.scripted_agent import scripted_calculator_model
from typer.testing import CliRunner

from composer_replication.channels.hints import HintTemplates
from composer_replication.envs.calculator import CalculatorEnv
from composer_replication.envs.tools import tool_functions
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.run.uplift import continuation_logps
from composer_replication.run.uplift_turns import (
    measure_turns,
    sample_turn_failures,
    split_at_turn,
    turn_text,
)

CALL = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
    "name": "calculate", "arguments": {"expression": "208 * 67"}}}]}  # fmt: skip


@pytest.fixture
def tool_tok(tokenizer):
    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    return tok


def test_split_at_turn_counts_assistant_turns_only():
    msgs = [CALL, {"role": "tool", "content": "13936"}, {"role": "assistant", "content": "1"}]
    assert split_at_turn(msgs, 0) == ([], CALL)
    assert split_at_turn(msgs, 1) == (msgs[:2], msgs[2])
    assert split_at_turn(msgs, 2) is None


def test_reference_turn_is_the_call_then_the_number():
    env = CalculatorEnv(per_kind=50)
    task = env.tasks("train")[0]
    ref = env.reference_turn(task, [])
    assert ref["tool_calls"][0]["function"]["arguments"] == {"expression": task.data["expression"]}
    answer = str(task.data["answer"])
    assert env.reference_turn(task, [CALL, {"role": "tool", "content": "1"}])["tool_calls"]
    got = env.reference_turn(task, [CALL, {"role": "tool", "content": answer}])
    assert got == {"role": "assistant", "content": answer}


def test_turn_text_is_the_templates_rendering_of_the_turn(tool_tok):
    env = CalculatorEnv(per_kind=50)
    prompt = env.row(env.tasks("train")[0])["prompt"]
    tools = tool_functions(env.tools_class()())
    text = turn_text(tool_tok, prompt, CALL, tools)
    assert text.startswith("<tool_call>") and '"208 * 67"' in text and "<|im_end|>" in text
    assert turn_text(tool_tok, prompt, {"role": "assistant", "content": "42"}, tools).startswith(
        "42"
    )


def test_shots_cut_the_worked_exchanges():
    two, one = CalculatorEnv(per_kind=20), CalculatorEnv(per_kind=20, shots=1)
    t = two.tasks("train")[0]
    assert len(two.row(t)["prompt"]) == len(one.row(t)["prompt"]) + 4
    with pytest.raises(ValueError, match="worked exchanges"):
        CalculatorEnv(per_kind=20, shots=3)


def test_failures_are_cut_at_the_blamed_turn_and_measured_there(tool_tok):
    """The scripted model calls calculate('208 * 67') then answers 13936: every other task fails
    at turn 1 ("answered 13936, expected ..."), after a right call and its tool result."""
    env = CalculatorEnv(per_kind=300)
    tasks = [t for t in env.tasks("heldout") if t.task_id != "calc:208 * 67"][:1]
    model = scripted_calculator_model(tool_tok)
    failures, n, won = sample_turn_failures(model, tool_tok, env, tasks, 2, 0.0, 2, 2, 34, 2)
    assert (n, won, len(failures)) == (2, 0, 2)
    f = failures[0]
    assert [m["role"] for m in f.history] == ["assistant", "tool"]
    assert f.history[1]["content"] == "13936" and f.turn["content"] == "13936"
    assert (f.turns_left, f.calls_left) == (1, 1)
    # the cut is aligned: the scripted turn is certain after the history, the reference is not
    tools = tool_functions(env.tools_class()())
    ctx = f.prompt + f.history
    ref = turn_text(tool_tok, ctx, env.reference_turn(f.task, f.history), tools)
    (s_rep, s_ref), _ = continuation_logps(
        model, tool_tok, [ctx, ctx], [turn_text(tool_tok, ctx, f.turn, tools), ref], 2, tools
    )
    assert s_rep > s_ref + 20
    forms = ["verifier", "process"]
    ms = measure_turns(model, tool_tok, env, failures[:1], forms, HintTemplates(), 34, 2, "2 shots")
    assert len(ms) == 2 and {m.turn for m in ms} == {1}
    by = {m.form: m for m in ms}
    assert by["verifier"].leak and not by["process"].leak
    assert "turn 1: answered 13936" in by["process"].hint
    assert not any(m.passed_plain or m.passed_hinted for m in ms)  # the script answers 13936


def test_model_written_hints_at_the_failed_turn(tool_tok):
    """Source ``model``: the model writes the hint itself. With no worked exchange, the scripted
    model writes "The answer is 5." in every first assistant turn: its rollouts fail at turn 0
    (no tool call), and asked for a hint it writes the same line, which becomes the hint."""
    env = CalculatorEnv(per_kind=50, shots=0)
    model = scripted_calculator_model(tool_tok, turns=("The answer is 5.<|im_end|>",), shots=0)
    failures, n, won = sample_turn_failures(model, tool_tok, env, env.tasks("train")[:2], 1, 0.0,
                                            2, 2, 12, 2)  # fmt: skip
    assert (n, won, len(failures)) == (2, 0, 2)
    ms = measure_turns(model, tool_tok, env, failures, ["model"], HintTemplates(), 12, 2, "0 shots")
    assert [m.hint for m in ms] == ["Hint: The answer is 5."] * 2
    assert all(m.turn == 0 and m.reason == "no tool call" for m in ms)
    assert not any(m.leak or m.passed_plain or m.passed_hinted for m in ms)


def test_cli_calculator_report_on_a_tiny_model(tmp_path, tokenizer, tiny_model):
    from composer_replication.cli import app

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "uplift"
    args = ["hints", "uplift", "--env", "calculator", "--shots", "1", "--out", str(out),
            "--model", str(model_dir), "--prompts", "1", "--samples", "2", "--form", "process",
            "--form", "model", "--max-new-tokens", "4"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "uplift.json").read_text())
    assert data["meta"]["1 shot"]["sampled"] == 2
    assert data["meta"]["1 shot"]["reasons"] == {"no tool call": 2}  # a random model calls nothing
    # the random model writes only newlines when asked for a hint: no `model` hint, no row
    assert {m["form"] for m in data["measurements"]} == {"process"}
    bad = CliRunner().invoke(app, ["hints", "uplift", "--env", "calculator", "--form", "digits"])
    assert bad.exit_code == 2 and "unknown --form" in bad.output
