"""Real mini-swe-agent episodes (the unmodified harness from PyPI, in its own venv) run in the
sandbox against the proxy on a Feature Deletion task and graded by the environment; the
answers come from a scripted policy, so the grading and the token alignment are checked
against known outcomes.

Builds the harness venv on first use (``tests/support/agent_venv.py``: ~2 min and ~750 MB
from PyPI, then cached under ~/.cache/composer-replication/)."""

from __future__ import annotations

import errno

import pytest
from support.agent_proxy import RIGHT, TASK_ID, WRONG, Played, trainer_stub
from support.textkit import textkit_env

from composer_replication.agents import episodes as episodes_mod
from composer_replication.agents.episodes import AgentEpisodes, AgentReward
from composer_replication.config import AgentProxyConfig


@pytest.fixture(scope="module")
def env(textkit_tasks):
    return textkit_env(textkit_tasks)


@pytest.mark.agent_venv  # builds the harness venv on first use
def test_mini_swe_agent_episodes_are_graded_and_joined(env, tool_tok, agent_venv):
    """Two episodes of the same task, one after the other: the right edit scores 1, the wrong
    one 0; each sequence holds both turns, with the harness's tool result between them masked
    out."""
    tok, venv = tool_tok, agent_venv
    task = env.task_by_id(TASK_ID)
    row = env.row(task)
    prompt = row["prompt"]
    cfg = AgentProxyConfig(enabled=True, venv=venv, timeout_s=120, workers=1)
    policy = Played(tok, RIGHT + WRONG)  # one episode at a time: the first gets RIGHT
    episodes = AgentEpisodes(env, cfg, tok, policy=policy)
    trainer = trainer_stub([row, row])
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
    m = trainer.logged["train"]
    assert m["agent/turns"] == [2.0] and m["agent/dropped_turns"] == [0.0]
    assert m["agent/diverged_frac"] == [0.0]


def _command_episodes(env, tok, tmp_path, workers: int = 1) -> AgentEpisodes:
    """Episodes of the ``command`` harness (``true``) in a stand-in venv, with a policy that
    answers nothing: for tests that replace ``run_agent``."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    cfg = AgentProxyConfig(enabled=True, venv=str(venv), harness="command", command="true",
                           workers=workers)  # fmt: skip
    return AgentEpisodes(env, cfg, tok, policy=Played(tok, []))


def _first_of_two(env, tok, tmp_path, monkeypatch, first, outcome):
    """Two episodes (``first``, then another training task) whose ``run_agent`` is replaced:
    ``outcome()`` for ``first`` (a result, or an exception it raises), an empty run for the
    other. Returns (the episodes, the stand-in trainer, their results)."""
    from composer_replication.sandbox.shell import ShellResult

    other = next(t for t in env.tasks("train") if t.task_id != first.task_id)

    def run_agent(box, workspace, run, socket_dir, socket_name, python_path=(), policy_wait=None):
        if dict(run.env)["AGENT_TASK"] == env.user_message(first):
            return outcome()
        return ShellResult("", 0)

    monkeypatch.setattr(episodes_mod, "run_agent", run_agent)
    episodes = _command_episodes(env, tok, tmp_path, workers=2)
    rows = [env.row(first), env.row(other)]
    trainer = trainer_stub(rows)
    try:
        out = episodes([r["prompt"] for r in rows], trainer)
    finally:
        episodes.close()
    return episodes, trainer, out["agent_result"], out


def test_an_episode_error_fails_that_episode_not_the_batch(env, tool_tok, tmp_path, monkeypatch):
    """Issue 55: an exception in one episode (here the read-back's ENAMETOOLONG, as a tree
    past the host's PATH_MAX raised it) escaped ``AgentEpisodes`` and aborted the whole
    rollout batch: one shell command of the model stopped a training step. Now that episode
    scores 0, flagged ``episode_failed``, and the others are graded as usual."""

    def outcome():
        raise OSError(errno.ENAMETOOLONG, "File name too long")

    bad = env.tasks("train")[0]
    episodes, trainer, (failed, graded), _ = _first_of_two(
        env, tool_tok, tmp_path, monkeypatch, bad, outcome
    )
    assert failed.reward == 0.0 and "File name too long" in failed.feedback
    assert "episode_failed:OSError" in failed.info["flags"]
    assert "targets" in graded.info and not any("episode_failed" in f for f in graded.info["flags"])
    assert trainer.logged["train"]["agent/failed_frac"] == [0.5]
    assert not any(e.tools.workspace.exists() for e in episodes.last_episodes)  # removed


def test_a_harness_that_could_not_start_is_the_machines_failure(
    env, tool_tok, tmp_path, monkeypatch
):
    """Issue 54's CI: on a loaded machine one of 8 mini-swe-agent episodes ended at once with
    ``mini: not found`` (exit 127), no request made, and was graded as the policy's 0 (a
    group's advantages learned from a machine fault; ``agent/turns`` 1.75 where every episode
    that ran took 2). A harness whose shell finds no program, before any request, is now the
    machine's failure (``harness_start``): masked, its workspace removed, left out of the
    agent metrics; one that ran and asked nothing is still graded."""
    from composer_replication.envs.base import infra_kind
    from composer_replication.sandbox.shell import ShellResult

    lost = env.tasks("train")[0]
    not_found = ShellResult("/bin/sh: 3: mini: not found\n", 127)
    episodes, trainer, (masked, graded), out = _first_of_two(
        env, tool_tok, tmp_path, monkeypatch, lost, lambda: not_found
    )
    assert infra_kind(masked) == "harness_start" and "exit status 127" in masked.feedback
    assert infra_kind(graded) is None and "targets" in graded.info
    assert not any(e.tools.workspace.exists() for e in episodes.last_episodes)  # removed
    m = trainer.logged["train"]
    assert m["agent/failed_frac"] == [0.0] and m["agent/seconds"][0] >= 0
    assert len(out["completion_ids"][0]) == 1  # one masked token, as any unusable episode


def test_a_harness_that_crashes_is_graded_and_shown(env, tool_tok, tmp_path, monkeypatch, caplog):
    """A harness that ends with a non-zero status of its own (here a traceback of its model
    client) is graded as it stands, as any agent that gives up, but counted
    (``agent/harness_failed_frac``) and its output logged, so a run's log says why an episode
    ended early; one stopped by the time limit is a timeout, not a crash."""
    from composer_replication.agents.episodes import harness_failed
    from composer_replication.envs.base import infra_kind
    from composer_replication.sandbox.shell import ShellResult

    crashed = env.tasks("train")[0]
    trace = ShellResult("litellm.APIConnectionError: Connection error.\n", 1)
    with caplog.at_level("WARNING", logger="composer_replication.agents.episodes"):
        episodes, trainer, (graded_crash, graded), _ = _first_of_two(
            env, tool_tok, tmp_path, monkeypatch, crashed, lambda: trace
        )
    assert infra_kind(graded_crash) is None and "targets" in graded_crash.info  # graded
    assert trainer.logged["train"]["agent/harness_failed_frac"] == [0.5]
    assert any("exited with status 1" in r.message and "APIConnectionError" in r.message
               for r in caplog.records)  # fmt: skip
    timed_out = episodes_mod.Episode(crashed, None, run=ShellResult("", None, timed_out=True))
    assert not harness_failed(timed_out)


def test_two_tasks_with_one_text_each_get_their_own_episode(env, tool_tok, tmp_path, monkeypatch):
    """Issue 59: prompts were mapped back to tasks by their user-message text, so two tasks
    posed with one text both ran (and were graded as) the same task. The task now comes from
    the prompt's dataset row (its ``task_id``, the trainer's ``rollout_rows``)."""
    from composer_replication.sandbox.shell import ShellResult

    first, second = env.tasks("train")[:2]
    monkeypatch.setattr(env, "user_message", lambda task: "Fix the repository.")
    seen = []

    def run_agent(box, workspace, run, socket_dir, socket_name, python_path=(), policy_wait=None):
        seen.append(dict(run.env)["AGENT_TASK"])
        return ShellResult("", 0)

    monkeypatch.setattr(episodes_mod, "run_agent", run_agent)
    episodes = _command_episodes(env, tool_tok, tmp_path)
    rows = [env.row(first), env.row(second)]
    assert rows[0]["prompt"] == rows[1]["prompt"]  # one text for both
    try:
        out = episodes([r["prompt"] for r in rows], trainer_stub(rows))
    finally:
        episodes.close()
    assert seen == ["Fix the repository."] * 2
    assert [e.task.task_id for e in episodes.last_episodes] == [first.task_id, second.task_id]
    targets = [r.info["targets"] for r in out["agent_result"]]
    assert targets == [len(t.data["failing_tests"]) for t in (first, second)]


def test_prompts_without_their_rows_are_refused(env, tool_tok, tmp_path):
    episodes = _command_episodes(env, tool_tok, tmp_path)
    row = env.row(env.tasks("train")[0])
    try:
        with pytest.raises(ValueError, match="2 prompts came without their dataset rows"):
            episodes([row["prompt"]] * 2, trainer_stub([row]))
    finally:
        episodes.close()
