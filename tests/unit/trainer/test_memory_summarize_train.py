"""`composer-replication train configs/memory_summarize.yaml` end to end (issue 61;
docs/summarization.md): 2 optimizer steps on the memory task with ``summarize``, through the
CLI, a tiny random model trained, its turns written by a scripted policy (tests/support/
memory_policy.py, standing in for the generator, so summaries happen whatever the random
weights say). The episode log shows the summaries, the metrics count them, and the run's
before/after evaluation runs the same loop (its episodes summarize too)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from support.memory_policy import ReaderGenerator
from support.tiny_run import save_tiny_model
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.config.env import DEFAULT_SUMMARY_PROMPT
from composer_replication.trainer.callbacks import read_metrics


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), max_positions=1024)


def test_train_memory_summarize_two_steps(model_dir, tool_tok, tmp_path, monkeypatch):
    import composer_replication.rollout as rollout
    import composer_replication.trainer.trainer as trainer_module

    policy = ReaderGenerator(tool_tok, 6, True, DEFAULT_SUMMARY_PROMPT, sequential=True)
    for module in (rollout, trainer_module):  # the trainer's generator and evaluation's
        monkeypatch.setattr(module, "Generator", lambda *a, **k: policy)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", "configs/memory_summarize.yaml", f"model.name={model_dir}",
        f"output_dir={out}", "max_steps=2", "num_threads=1", "generation.num_generations=2",
        "generation.prompts_per_step=1", "optim.warmup_steps=0", "eval.n=2",
        "eval.batch_size=2", "env.filler_words=10", "env.drawers=6", "env.few_shot=false", "env.shot_summary=false", "rollout.context.max_tokens=480",
        "rollout.context.summary_max_tokens=32", "rollout.context.max_summaries=6",
        # shorter rows: the same loop, cheaper (more summaries, so no episode ends at the cap)
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = read_metrics(out / "metrics.jsonl")
    train = [r for r in rows if "rollout/summaries" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["rollout/summaries"] >= 1 and r["rollout/windows"] >= 2 for r in train)
    # env.opens_after_summary (the shipped config): the trainer's loop ran the environment's
    # call after each summary (TRL's `environments` reach the loop)
    assert all(r["rollout/environment_calls"] == r["rollout/summaries"] for r in train)
    episodes = [orjson.loads(x) for x in (out / "episodes.jsonl").read_bytes().splitlines()]
    assert episodes and {e["step"] for e in episodes} == {1, 2}
    for e in episodes:  # each episode's summaries, readable where they took effect
        marks = [m["context_window"] for m in e["messages"] if m.get("context_window")]
        assert marks and all(w["summary"].startswith("key=") for w in marks)
        assert e["reward"] == 1.0  # the key reached the answer through the summary
    # the before/after evaluation ran the same loop: its episodes summarized as well
    evals = [orjson.loads(x) for x in (out / "eval_episodes.jsonl").read_bytes().splitlines()]
    assert {e.get("tag") for e in evals} >= {"base", "trained"}, evals[0].keys()
    # (JSON, not repr: a transcript with both quote kinds is repr'd with escaped ' marks)
    assert all("[window 1; summary: 'key=" in orjson.dumps(e).decode() for e in evals)
    assert Path(out / "final").is_dir()


def test_the_scripted_generator_has_the_generators_interface():
    """The stand-in is called as lm/generator.py's Generator is (the trainer closes its
    generator with ``close(wait)``): a drifted signature failed the end-to-end test above
    only after training had finished."""
    import inspect

    from composer_replication.lm.generator import Generator

    for name in ("generate", "close"):
        real, scripted = (list(inspect.signature(getattr(c, name)).parameters)
                          for c in (Generator, ReaderGenerator))  # fmt: skip
        assert scripted == real, name
