"""feature_deletion in ComposerReplicationTrainer: a scripted tiny model runs the tests through
the tool in its first turn and answers in its second; TRL's tool loop runs the real tool (the
sandboxed suite on the episode's workspace) and the reward comes from grading each rollout's
workspace (TRL passes the tool instances to the reward function)."""

from __future__ import annotations

import copy
from pathlib import Path

from support.scripted_lm import ScriptedLlama

from composer_replication.config import load_config
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.run.train import build_env, build_trainer
from composer_replication.trainer.callbacks import read_metrics

FIXTURE = Path(__file__).parents[2] / "fixtures" / "feature_deletion" / "textkit"
CALL = '<tool_call>{"name": "run_tests", "arguments": {}}</tool_call><|im_end|>'
ANSWER = "done<|im_end|>"


def test_feature_deletion_trains_with_tool_calls_and_graded_rewards(
    tokenizer, textkit_tasks, tmp_path
):
    from conftest import make_tiny_model

    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    cfg = load_config(
        "feature_deletion.yaml",
        [
            f"output_dir={tmp_path / 'run'}",
            "max_steps=1",
            "num_threads=1",
            f"env.task_sources=[{FIXTURE}]",
            f"env.task_dir={textkit_tasks}",
            "env.task_generation.workers=2",
            "env.task_generation.suite_timeout_s=30",
            "generation.num_generations=2",
            "generation.max_completion_length=160",
            "env.max_tool_output_chars=200",
            "env.tests_budget_s=120",
            "env.few_shot=false",  # the script counts assistant turns from the prompt's end
            "rollout.max_turns=2",
            "eval.before_and_after=false",
            "alpha_sdpo=0.5",
            "sdpo.hint_sources=[feedback]",
        ],
    )
    model = make_tiny_model(len(tok), 0, cls=ScriptedLlama, max_positions=2048)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    model.set_script(enc("<|im_start|>assistant\n"), [enc(CALL), enc(ANSWER)])
    env = build_env(cfg)
    assert env.tests_budget_s == 120.0  # the config reaches the tools
    trainer = build_trainer(cfg, model, tok, env)
    trainer.train()
    rows = read_metrics(f"{cfg.output_dir}/metrics.jsonl")
    [row] = rows
    assert row["tools/call_frequency"] == 1.0 and row["rollout/turns"] == 2.0
    assert row["env/pass_rate"] == 0.0  # running the tests rebuilds nothing
    assert row["env/flagged_frac"] == 0.0
    # the hint (the failing tests and their first error) is distilled at turn 0, which ran them
    assert row["sdpo/active"] == 1.0 and row["sdpo/hint_turn_mean"] == 0.0
    results = trainer.reward_funcs[0].last_results
    assert results and all("0 of" in r.feedback for r in results)
    assert all(r.info["failed_turn"] == 0 for r in results)  # the turn that ran the tests
