"""feature_deletion trained in each tool profile (``env.tool_profile``): a scripted tiny model
runs the tests through the profile's command tool (Claude Code's ``Bash``, Codex's ``shell``,
``bash``) in its first turn and answers in its second. TRL's tool loop runs the real tool (a
sandboxed shell on the episode's workspace); the rollouts are graded from their workspaces as
with the native tools; the metrics and the logged episode name the profile's tools."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import orjson
import pytest
from support.harness_pairs import claude_code_pairs
from support.scripted_lm import ScriptedLlama

from composer_replication.config import load_config
from composer_replication.envs.profiles import tool_names
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.run.train import (
    VocabularyWarning,
    build_env,
    build_trainer,
    check_pair_vocabulary,
)
from composer_replication.trainer.callbacks import read_metrics

FIXTURE = Path(__file__).parents[2] / "fixtures" / "feature_deletion" / "textkit"
PYTEST = ["python", "-m", "pytest", "-q", "-x", "--tb=line", "tests"]
RUN_TESTS = {
    "claude_code": ("Bash", {"command": " ".join(PYTEST)}),
    "codex": ("shell", {"command": PYTEST}),
    "bash": ("bash", {"command": " ".join(PYTEST)}),
}


@pytest.fixture(scope="module")
def task_dir(textkit_tasks):
    return textkit_tasks  # the session's textkit task set (tests/conftest.py)


@pytest.fixture(scope="module")
def claude_pairs(tmp_path_factory):
    """Channel 3's pairs from replayed Claude Code logs (their vocabulary: Claude Code's)."""
    return claude_code_pairs(tmp_path_factory.mktemp("pairs"))[3] / "pairs.jsonl"


@pytest.mark.parametrize("harness", sorted(RUN_TESTS))
def test_feature_deletion_trains_in_a_harness_profile(
    harness, tokenizer, task_dir, claude_pairs, tmp_path
):
    """With ``claude_code``, channel 3 also trains on pairs replayed from Claude Code logs:
    the same vocabulary as the rollouts, so no VocabularyWarning."""
    from conftest import make_tiny_model

    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    cfg = load_config(
        "feature_deletion.yaml",
        [
            f"output_dir={tmp_path / 'run'}",
            f"env.tool_profile={harness}",
            "max_steps=1",
            "num_threads=1",
            f"env.task_sources=[{FIXTURE}]",
            f"env.task_dir={task_dir}",
            "env.task_generation.workers=2",
            "env.task_generation.suite_timeout_s=30",
            "generation.num_generations=2",
            "generation.max_completion_length=200",
            "env.max_tool_output_chars=300",
            "env.tests_budget_s=120",
            "env.few_shot=false",  # the script counts assistant turns from the prompt's end
            "rollout.max_turns=2",
            "eval.before_and_after=false",
            *(
                [f"replay.dataset={claude_pairs}", "beta_replay=0.1", "replay.max_length=256"]
                if harness == "claude_code"
                else []
            ),
        ],
    )
    name, args = RUN_TESTS[harness]
    call = f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call><|im_end|>"
    model = make_tiny_model(len(tok), 0, cls=ScriptedLlama, max_positions=2048)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    model.set_script(enc("<|im_start|>assistant\n"), [enc(call), enc("done<|im_end|>")])
    env = build_env(cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = build_trainer(cfg, model, tok, env)
        # the prompt's tool schemas are the profile's, and no native tool is offered
        offered = {t.__name__ for t in trainer.tools}
        assert offered == tool_names(harness)
        trainer.train()
    assert not [w for w in caught if issubclass(w.category, VocabularyWarning)]
    [row] = read_metrics(f"{cfg.output_dir}/metrics.jsonl")
    if harness == "claude_code":  # the pairs were drawn and scored
        assert row["replay/active"] == 1.0 and row["replay/num_pairs"] == 2.0
    assert row[f"tools/calls/{name}"] == 1.0 and row["tools/call_frequency"] == 1.0
    assert row["tools/failure_frequency"] == 0.0 and row["rollout/turns"] == 2.0
    assert row["env/pass_rate"] == 0.0  # running the tests rebuilds nothing
    results = trainer.reward_funcs[0].last_results
    assert results and all("0 of" in r.feedback for r in results)
    assert all(r.info["failed_turn"] == 0 for r in results)  # the turn that ran the tests
    log = Path(cfg.output_dir, "episodes.jsonl").read_bytes()
    [episode] = [orjson.loads(x) for x in log.splitlines()]
    first, result, last = episode["messages"]
    assert first["tool_calls"][0]["function"]["name"] == name and result["name"] == name
    assert "NotImplementedError" in result["content"]  # the sandboxed pytest ran and failed
    assert episode["reward"] == 0.0 and episode["flags"] == [] and episode["step"] == 1


def test_pairs_of_another_vocabulary_warn(claude_pairs, tmp_path):
    """The check's control: the same Claude Code pairs on the native tools warn, naming the
    profile to use."""
    from composer_replication.envs.feature_deletion.env import FeatureDeletionTools

    cfg = load_config(
        "feature_deletion.yaml", [f"replay.dataset={claude_pairs}", "beta_replay=0.1"]
    )
    with pytest.warns(VocabularyWarning, match="env.tool_profile=claude_code"):
        assert check_pair_vocabulary(cfg, FeatureDeletionTools)
    off = load_config("feature_deletion.yaml", [])
    assert check_pair_vocabulary(off, FeatureDeletionTools) is None
