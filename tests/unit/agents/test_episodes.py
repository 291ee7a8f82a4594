"""Real mini-swe-agent episodes (the unmodified harness from PyPI, in its own venv) run in the
sandbox against the proxy on a Feature Deletion task and graded by the environment; the
answers come from a scripted policy, so the grading and the token alignment are checked
against known outcomes.

Builds the harness venv on first use (``tests/support/agent_venv.py``: ~2 min and ~750 MB
from PyPI, then cached under ~/.cache/composer-replication/)."""

from __future__ import annotations

import pytest
from support.agent_proxy import RIGHT, TASK_ID, WRONG, Played, trainer_stub
from support.textkit import textkit_env

from composer_replication.agents.episodes import AgentEpisodes, AgentReward
from composer_replication.config import AgentProxyConfig

pytestmark = pytest.mark.agent_venv  # builds the harness venv on first use


@pytest.fixture(scope="module")
def env(textkit_tasks):
    return textkit_env(textkit_tasks)


def test_mini_swe_agent_episodes_are_graded_and_joined(env, tool_tok, agent_venv):
    """Two episodes of the same task, one after the other: the right edit scores 1, the wrong
    one 0; each sequence holds both turns, with the harness's tool result between them masked
    out."""
    tok, venv = tool_tok, agent_venv
    task = env.task_by_id(TASK_ID)
    prompt = env.row(task)["prompt"]
    cfg = AgentProxyConfig(enabled=True, venv=venv, timeout_s=120, workers=1)
    policy = Played(tok, RIGHT + WRONG)  # one episode at a time: the first gets RIGHT
    episodes = AgentEpisodes(env, cfg, tok, policy=policy)
    trainer = trainer_stub()
    try:
        out = episodes([prompt, prompt], trainer)
    finally:
        episodes.close()
    rewards = AgentReward()(None, None, out["agent_result"])
    assert rewards == [1.0, 0.0], [r.feedback for r in out["agent_result"]]
    for i, ep in enumerate(episodes.last_episodes):
        assert len(ep.turns) == 2 and ep.run.exit_code == 0, ep.run.output
        first, second = ep.turns
        assert "Counter.__init__" in tok.decode(first.prompt_ids)  # the harness's prompt
        assert second.messages[-2]["role"] == "tool"  # mini's observation of the edit
        ids, mask = out["completion_ids"][i], out["env_mask"][i]
        assert out["prompt_ids"][i] == first.prompt_ids
        assert ids == first.completion_ids + second.prompt_ids[
            len(first.prompt_ids) + len(first.completion_ids):] + second.completion_ids  # fmt: skip
        assert sum(mask) == len(first.completion_ids) + len(second.completion_ids)
        assert len(ids) == len(mask) == len(out["logprobs"][i])
    m = trainer._metrics["train"]
    assert m["agent/turns"] == [2.0] and m["agent/dropped_turns"] == [0.0]
    assert m["agent/diverged_frac"] == [0.0]
