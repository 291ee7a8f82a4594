"""Held-out evaluation under ``rollout.context`` (docs/summarization.md): ``evaluate`` runs
the loop training runs (``rollout.ContextLoop`` through ``rollout.ToolLoop``), so its scores
are the grades of that loop's episodes, summaries included. A scripted policy on the memory
task passes only when its summary carries the first drawer's key."""

from __future__ import annotations

import pytest
from conftest import make_tiny_model
from support.memory_policy import ReaderGenerator
from support.tiny_run import save_tiny_model
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.config import configs_dir, load_config
from composer_replication.config.env import ContextConfig
from composer_replication.envs.memory import MemoryEnv, task_prompt
from composer_replication.evaluation import evaluate
from composer_replication.rollout import ContextLoop
from composer_replication.run.train import eval_turn_tokens

CONTEXT = ContextConfig(strategy="summarize", max_tokens=420, max_summaries=6,
                        summary_prompt="Summarize.", summary_header="Summary:\n",
                        summary_max_tokens=24)  # fmt: skip


@pytest.mark.parametrize("carry", [True, False])
def test_evaluate_scores_the_context_loops_episodes(tool_tok, monkeypatch, carry):
    runs = []
    real = ContextLoop.run

    def spy(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        runs.append((self, out))
        return out

    monkeypatch.setattr(ContextLoop, "run", spy)
    env = MemoryEnv(n_tasks=30, drawers=5, filler_words=30)
    policy = ReaderGenerator(tool_tok, 5, carry, CONTEXT.summary_prompt)
    res = evaluate(make_tiny_model(len(tool_tok)), tool_tok, env, "heldout", 3, 40, 3,
                   max_turns=12, max_tool_calls=12, context=CONTEXT,
                   generator=policy)  # fmt: skip
    [(loop, out)] = runs  # one loop, all three episodes
    messages = out[1]
    tasks = env.tasks("heldout")[:3]
    assert res.task_ids == [t.task_id for t in tasks] and policy.reader.summaries >= 3
    # the scores are the grades of the loop's episodes
    assert res.passed == [env.grade(t, m).passed for t, m in zip(tasks, messages, strict=True)]
    assert res.pass_rate == (1.0 if carry else 0.0)
    # every episode summarized; the stats and the transcripts show it
    summaries = [len(e.summaries) for e in loop.episodes]
    assert min(summaries) >= 1
    assert res.tool_stats["context/summaries"] == pytest.approx(sum(summaries) / 3)
    assert res.tool_stats["calls/open_drawer"] == 5.0  # each episode opened the 5 drawers
    for task, text in zip(tasks, res.completions, strict=True):
        assert "[window 1; summary: " in text
        assert (f"key={task.data['key']}" in text) == carry


def test_the_eval_turn_is_the_training_turn():
    """Under a strategy the per-turn cap of evaluation is the budget's (training's)."""
    base = ["env.name=memory", "generation.max_completion_length=40", "eval.max_new_tokens=16"]
    assert eval_turn_tokens(load_config(None, base)) == 16
    ctx = ["rollout.context.strategy=summarize", "rollout.context.max_tokens=420",
           "rollout.context.summary_max_tokens=24"]  # fmt: skip
    assert eval_turn_tokens(load_config(None, [*base, *ctx])) == 40


def test_the_eval_command_runs_a_configs_strategy(tool_tok, tmp_path, monkeypatch):
    """``eval --config`` on the shipped memory config (the scripted policy reads its window
    after the task, not the worked exchange): the same loop, summaries in the transcripts."""
    import composer_replication.rollout as rollout

    config = configs_dir() / "memory_summarize.yaml"
    cfg = load_config(config)
    policy = ReaderGenerator(tool_tok, cfg.env.drawers, True, cfg.rollout.context.summary_prompt,
                             sequential=True, after=task_prompt(cfg.env.drawers))  # fmt: skip
    monkeypatch.setattr(rollout, "Generator", lambda *a, **k: policy)
    model = save_tiny_model(tmp_path / "tiny", max_positions=1024)
    args = ["eval", "--model", str(model), "--config", str(config), "--n", "2", "--show", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "pass@1 100.0%" in text and "[window 1; summary: " in text and "key=" in text
    assert policy.reader.summaries >= 2
