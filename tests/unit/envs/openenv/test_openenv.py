"""OpenEnv both ways: our calculator served over OpenEnv (WebSocket sessions on 127.0.0.1),
stepped through the generic adapter, and trained on for 2 steps with every channel."""

from __future__ import annotations

import copy

import pytest
from support.openenv_server import served
from support.scripted_agent import scripted_calculator_model
from transformers.utils import get_json_schema

from composer_replication.config import load_config
from composer_replication.envs import get_env
from composer_replication.envs.calculator import CalculatorTools
from composer_replication.envs.openenv.adapter import OpenEnvError, openenv_tools_class
from composer_replication.envs.openenv.server import ServedToolEnv
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.run.train import build_env, build_trainer
from composer_replication.trainer.callbacks import read_metrics


@pytest.fixture(scope="module")
def calculator():
    return get_env("calculator")  # the same tasks as the trainer's env.name=calculator


def test_adapter_steps_the_served_environment(calculator):
    task = calculator.tasks("train")[0]
    with served(calculator) as url:
        cls = openenv_tools_class(url)
        env, other = cls(), cls()  # two sessions at once
        try:
            assert get_json_schema(env.calculate) == get_json_schema(CalculatorTools().calculate)
            assert env.reset(**calculator.row(task)) is None  # the row already holds the prompt
            other.reset(**calculator.row(calculator.tasks("train")[1]))
            a, b = task.data["answer"], calculator.tasks("train")[1].data["answer"]
            assert env.calculate(expression="2 * 21") == "42"
            assert env.calculate(expression="2 ** 999").startswith("error")
            call = {"type": "function", "function": {"name": "calculate",
                                                     "arguments": {"expression": "1"}}}  # fmt: skip
            right = [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "content": "1"}, {"role": "assistant", "content": str(a)}]  # fmt: skip
            verdict = env.episode.verdict(right)
            assert verdict.passed and verdict.reward == 1.0
            wrong = other.episode.verdict([{"role": "assistant", "content": str(b + 1)}])
            assert not wrong.passed and wrong.reward == 0.0
            assert wrong.info["failed_turn"] == 0 and wrong.feedback == "turn 0: no tool call"
        finally:
            env.episode.close()
            other.episode.close()


def test_unreachable_server_is_one_clear_error():
    with pytest.raises(OpenEnvError, match="127.0.0.1:9"):
        openenv_tools_class("http://127.0.0.1:9")


def test_two_training_steps_through_the_adapter(calculator, tokenizer, tmp_path, monkeypatch):
    seen = []
    original = ServedToolEnv._call
    monkeypatch.setattr(ServedToolEnv, "_call", lambda self, a: seen.append(a) or original(self, a))
    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    with served(calculator) as url:
        cfg = load_config("agent_quickstart.yaml", [
            f"output_dir={tmp_path / 'run'}", "max_steps=2", "num_threads=1",
            "optim.warmup_steps=0", "generation.num_generations=2",
            "generation.prompts_per_step=2", "generation.max_completion_length=64",
            "env.num_train=8", "eval.before_and_after=false", f"env.openenv_url={url}",
            "alpha_sdpo=0.5", "beta_replay=0.5", "sdpo.hint_sources=[feedback]",
        ])  # fmt: skip
        trainer = build_trainer(cfg, scripted_calculator_model(tok), tok, build_env(cfg))
        trainer.train()
    rows = read_metrics(f"{cfg.output_dir}/metrics.jsonl")
    assert len(rows) == 2 and len(seen) >= 8  # every rollout's call went to the server
    assert {a.tool_name for a in seen} == {"calculate"}
    for row in rows:
        assert row["tools/call_frequency"] == 1.0
        assert row["sdpo/turn_hinted_frac"] > 0 and row["sdpo/hint_turn_mean"] == 1.0
        assert row["replay/active"] == 1.0
