"""An OpenEnv server that fails to start an episode (an error frame with code 500 for the
reset, before the policy's first action) is the machine's failure: the rollout is masked, not
scored 0. A failure after the episode started keeps its 0 (a submission can crash a server)."""

from __future__ import annotations

import pytest

pytest.importorskip("openenv")

from support.hostile_openenv import ECHO, scripted_server  # noqa: E402

from composer_replication.envs.base import infra_kind  # noqa: E402
from composer_replication.envs.openenv.adapter import (  # noqa: E402
    GRADE_TOOL,
    OpenEnvReward,
    openenv_tools_class,
)
from composer_replication.sandbox.infra import KINDS, SERVER_ERROR  # noqa: E402

MESSAGES = [{"role": "assistant", "content": "done"}]
VERDICT = {"result": {"passed": True, "feedback": "", "info": {}}}


def _grade(name, args):
    return (VERDICT, 1.0) if name == GRADE_TOOL else ({"result": "ok"}, None)


def test_a_server_that_cannot_reset_the_episode_is_masked_and_counted():
    logged = {}
    error = {"message": "internal server error", "code": 500}

    def episode_reset_fails(data):  # the tool listing's reset (no task) still works
        return error if data.get("task_id") else None

    with scripted_server([ECHO], _grade, reset_error=episode_reset_fails) as url:
        tools = openenv_tools_class(url)()
        shown = tools.reset(task_id="t")
        assert shown.startswith("error: the environment server could not start the episode")
        reward = OpenEnvReward()
        out = reward(None, [MESSAGES], environments=[tools], log_metric=logged.__setitem__)
        tools.episode.close()
    assert out == [None]  # TRL: out of the group's statistics
    assert infra_kind(reward.last_results[0]) == SERVER_ERROR
    assert "internal server error" in reward.last_results[0].info["infra_detail"]
    assert (
        logged["env/infra_failed_frac"] == 1.0 and logged[f"env/infra_failed/{SERVER_ERROR}"] == 1
    )
    assert all(logged[f"env/infra_failed/{k}"] == 0 for k in KINDS if k != SERVER_ERROR)


def test_a_grading_that_fails_after_the_episode_started_keeps_its_zero():
    def grade_fails(name, args):
        if name == GRADE_TOOL:
            return {"error": {"error_type": "execution_error", "message": "500"}}, None
        return {"result": "ok"}, None

    with scripted_server([ECHO], grade_fails) as url:
        tools = openenv_tools_class(url)()
        tools.reset(task_id="t")
        tools.echo(text="x")
        reward = OpenEnvReward()
        out = reward(None, [MESSAGES], environments=[tools])
        tools.episode.close()
    assert out == [0.0] and infra_kind(reward.last_results[0]) is None


def test_a_verdict_may_mark_a_machine_failure_only_with_a_known_kind():
    from composer_replication.envs.openenv.adapter import OpenEnvError, verdict_info

    assert verdict_info({"infra_failure": SERVER_ERROR}, "w") == {"infra_failure": SERVER_ERROR}
    with pytest.raises(OpenEnvError, match="infra_failure"):
        verdict_info({"infra_failure": "the policy says so"}, "w")
