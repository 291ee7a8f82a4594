"""A hostile third-party OpenEnv server against the adapter (envs/openenv/adapter.py), and
hostile clients against our server: a red-team pass. Each test fails while its attack works.

The server is scripted (tests/support/hostile_openenv.py): it lists the tools a test gives it
and answers each call as the test says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("openenv")

from support.hostile_openenv import ECHO, scripted_server  # noqa: E402
from transformers.utils import get_json_schema  # noqa: E402

from composer_replication.envs.openenv.adapter import (  # noqa: E402
    GRADE_TOOL,
    OpenEnvError,
    OpenEnvReward,
    openenv_tools_class,
)
from composer_replication.envs.tools import bounded_tools, tool_methods  # noqa: E402

MESSAGES = [{"role": "assistant", "content": "done"}]


def _grading_server(verdict, reward, call_reward=0.5):
    def on_call(name, args):
        if name == GRADE_TOOL:
            return verdict, reward
        return {"result": "ok"}, call_reward

    return scripted_server([ECHO], on_call)


def _episode(url, **kwargs):
    tools = openenv_tools_class(url, **kwargs)()
    tools.reset(task_id="t")
    return tools


@pytest.mark.parametrize("reward", [1e39, 1e300, "1e39", True, [1], 10**400, float("nan")])
def test_a_reward_the_trainer_cannot_hold_is_an_error_naming_the_server(reward):
    """1e39 passed the old float64 finiteness check and became inf in TRL's float32 rewards:
    every loss 0, or NaN weights with ``scale_rewards=none``."""
    with _grading_server({"result": {"passed": True, "feedback": "", "info": {}}}, reward) as url:
        tools = _episode(url)
        tools.echo(text="x")
        with pytest.raises(OpenEnvError, match=GRADE_TOOL):
            OpenEnvReward()(None, [MESSAGES], environments=[tools])
        tools.episode.close()


@pytest.mark.parametrize("verdict", [
    {"error": {"error_type": "execution_error", "message": "boom"}},
    {"result": "not a verdict"},
    {},
])  # fmt: skip
def test_a_failed_grading_is_a_flagged_zero_not_the_last_call_reward(verdict):
    """Every failure used to fall back to the last call reward (0.5 here, counted as
    passed), silently."""
    with _grading_server(verdict, None) as url:
        tools = _episode(url)
        tools.echo(text="x")
        metrics = {}
        [reward] = OpenEnvReward()(
            None, [MESSAGES], environments=[tools], log_metric=metrics.__setitem__
        )
        assert reward == 0.0 and metrics["env/grading_failed_frac"] == 1.0
        tools.episode.close()


def test_a_server_without_the_grading_tool_gives_its_last_reward():
    verdict = {
        "error": {"error_type": "tool_not_found", "message": f"Tool not found: {GRADE_TOOL}"}
    }
    with _grading_server(verdict, None, call_reward=0.75) as url:
        tools = _episode(url)
        tools.echo(text="x")
        assert OpenEnvReward()(None, [MESSAGES], environments=[tools]) == [0.75]
        tools.episode.close()


def test_a_verdict_with_a_string_passed_flag_is_an_error():
    """``bool("false")`` is True: the pass flag must be a bool."""
    verdict = {"result": {"passed": "false", "feedback": "", "info": {}}}
    with _grading_server(verdict, 1.0) as url:
        tools = _episode(url)
        with pytest.raises(OpenEnvError, match="passed"):
            tools.episode.verdict(MESSAGES)
        tools.episode.close()


@pytest.mark.parametrize("info", [
    {"flags": 5},  # TypeError in the reward function: the step died
    {"flags": [1]},  # AttributeError (.startswith)
    {"flags": "grading_failed:x"},  # iterated letter by letter: a wrong grading_failed_frac
    {"feedback_forms": ["wrong"]},  # AttributeError in the hint channel
    {"feedback_forms": {"wrong": 3}},
    {"failed_turn": 10**20},  # overflowed torch's int64 in self-distillation
    {"failed_turn": True},  # read as turn 1
    {"failed_turn": -1},
    {"reason": ["x"]},
])  # fmt: skip
def test_a_verdict_info_the_trainer_cannot_read_is_an_error_naming_the_field(info):
    verdict = {"result": {"passed": False, "feedback": "", "info": info}}
    with _grading_server(verdict, 0.0) as url:
        tools = _episode(url)
        with pytest.raises(OpenEnvError, match=rf"info\['{next(iter(info))}'\]"):
            OpenEnvReward()(None, [MESSAGES], environments=[tools])
        tools.episode.close()


def test_a_verdict_info_keeps_plain_extras_and_drops_the_rest():
    info = {"failed_turn": 2, "reason": "r", "flags": ["f"], "feedback_forms": {"wrong": "w"},
            "targets_passed": 3, "note": "n", "nested": {"a": [1, {"b": 2}]}, "ids": [1, 2]}  # fmt: skip
    verdict = {"result": {"passed": False, "feedback": "", "info": info}}
    with _grading_server(verdict, 0.0) as url:
        tools = _episode(url)
        got = tools.episode.verdict(MESSAGES).info
        tools.episode.close()
    assert got == {"failed_turn": 2, "reason": "r", "flags": ["f"], "feedback_forms": {"wrong": "w"},
                   "targets_passed": 3, "note": "n"}  # fmt: skip


def test_a_rejected_call_reward_is_never_replaced_by_an_earlier_one():
    """A server without ``_grade``: its episode's reward is the last call's. The second call's
    1e39 is refused (TRL shows the tool's error to the model and goes on); the episode was
    graded 0.9 from the first call, passed."""
    rewards = iter([0.9, 1e39])
    verdict = {
        "error": {"error_type": "tool_not_found", "message": f"Tool not found: {GRADE_TOOL}"}
    }

    def on_call(name, args):
        return (verdict, None) if name == GRADE_TOOL else ({"result": "ok"}, next(rewards))

    with scripted_server([ECHO], on_call) as url:
        tools = _episode(url)
        tools.echo(text="x")
        with pytest.raises(OpenEnvError, match="1e\\+39|1e39"):
            tools.echo(text="y")
        with pytest.raises(OpenEnvError, match="echo"):
            OpenEnvReward()(None, [MESSAGES], environments=[tools])
        tools.episode.close()


def test_after_a_lost_connection_the_episode_is_not_graded_on_a_new_session():
    """openenv reconnects silently after a transport failure: the next call and the grading
    landed on a new, never-reset session, which scored a different episode 1.0."""
    calls = []

    def on_call(name, args):
        calls.append(name)
        if len(calls) == 1:
            raise ConnectionError("the server drops the connection")
        if name == GRADE_TOOL:
            return {"result": {"passed": True, "feedback": "", "info": {}}}, 1.0
        return {"result": "ok"}, None

    with scripted_server([ECHO], on_call) as url:
        tools = _episode(url)
        with pytest.raises(OpenEnvError, match="echo failed"):
            tools.echo(text="x")
        assert "lost" in tools.echo(text="y")
        result = tools.episode.verdict(MESSAGES)
        assert result.reward == 0.0 and result.info["flags"][0].startswith("grading_failed:")
        assert calls == ["echo"]  # nothing more reached the server
        tools.reset(task_id="next")  # a new episode gets a fresh session
        assert tools.echo(text="z") == "ok"
        tools.episode.close()


def test_huge_results_and_reset_observations_are_cut_and_utf8_safe():
    """A 95 MB result reached TRL's tokenizer whole (10 MB: 13 s, +1.7 GB); a lone surrogate
    in a reset observation stopped tokenization."""
    big = "x" * 2_000_000 + "\ud800"
    with scripted_server(
        [ECHO], lambda n, a: ({"result": big}, None), reset_observation={"note": "a \ud800 b"}
    ) as url:
        tools = openenv_tools_class(url, max_output_chars=1000)()
        shown = tools.reset(task_id="t")
        assert shown.encode("utf-8") and "note" in shown
        out = bounded_tools(type(tools), 5).echo(tools, text="x")
        assert len(out) < 1100 and out.encode("utf-8")
        tools.episode.close()


@pytest.mark.parametrize("name", [
    "__init__", "__getattribute__", "__del__", "_call", "_verdict", "episode", "reset",
    "get_reward", "class", "a b", "", 7,
])  # fmt: skip
def test_tool_names_that_cannot_be_public_methods_are_refused(name):
    """``__init__`` broke every instance, ``__del__`` made network calls during garbage
    collection, ``_call`` replaced the adapter's own transport, ``episode`` hid the session."""
    spec = dict(ECHO, name=name)
    with scripted_server([spec], lambda n, a: ({"result": "ok"}, None)) as url:
        with pytest.raises(OpenEnvError, match="tool names|no usable tool list"):
            openenv_tools_class(url)


def test_duplicate_tool_names_are_refused():
    with scripted_server([ECHO, ECHO], lambda n, a: ({"result": "ok"}, None)) as url:
        with pytest.raises(OpenEnvError, match="duplicated"):
            openenv_tools_class(url)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"self": {"type": "string"}}},
    {"type": "object", "properties": {"from": {"type": "string"}}},
    {"type": "object", "properties": {"file-path": {"type": "string"}}},
    {"type": "object", "properties": {"x": True}},
    {"type": "object", "properties": ["x"]},
    {"type": "object", "properties": {}, "required": 5},
    "not a schema",
])  # fmt: skip
def test_schemas_that_cannot_be_a_signature_are_a_clear_error(schema):
    spec = dict(ECHO, input_schema=schema)
    with scripted_server([spec], lambda n, a: ({"result": "ok"}, None)) as url:
        with pytest.raises(OpenEnvError, match="tool 'echo'"):
            openenv_tools_class(url)


def test_legitimate_schema_shapes_and_descriptions_build():
    """A nullable type list crashed class building; a description with an ``Args:`` line made
    TRL's schema builder raise."""
    spec = {"name": "find", "description": "Find things.\nArgs:\n  secret: gotcha",
            "input_schema": {"type": "object", "properties": {
                "query": {"type": ["string", "null"], "description": "Args: what to find"}},
                "required": ["query"]}}  # fmt: skip
    with scripted_server([spec], lambda n, a: ({"result": json.dumps(a)}, None)) as url:
        cls = openenv_tools_class(url)
        assert set(tool_methods(cls)) == {"find"}
        schema = get_json_schema(cls.find)["function"]
        assert list(schema["parameters"]["properties"]) == ["query"]


# ---- our server against hostile clients -------------------------------------------------


def test_resets_that_are_never_graded_leave_no_workspace(tmp_path):
    """Each ungraded reset of a served feature_deletion session left its workspace on disk
    (80 resets: 80 directories)."""
    from composer_replication.config import TaskGenConfig
    from composer_replication.envs import get_env
    from composer_replication.envs.openenv.server import Served, ServedToolEnv

    fixture = Path(__file__).parents[3] / "fixtures" / "feature_deletion" / "textkit"
    env = get_env("feature_deletion", sources=[str(fixture)], task_dir=tmp_path / "tasks",
                  generation=TaskGenConfig(workers=1))  # fmt: skip
    session = ServedToolEnv(Served.of(env, 4))
    task_id = env.tasks("train")[0].task_id
    session.reset(task_id=task_id)
    first = session._tools.workspace
    session.reset(task_id=task_id)
    assert first.exists() is False and session._tools.workspace.exists()
    second = session._tools.workspace
    session.close()  # OpenEnv calls this when the session ends
    assert not second.exists()


def test_idle_sessions_time_out():
    """64 idle connections held every session slot, with no timeout."""
    from openenv.core.env_server import http_server

    from composer_replication.envs import get_env
    from composer_replication.envs.openenv.server import create_env_app

    seen = {}
    original = http_server.HTTPEnvServer.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen["timeout"] = self._session_idle_timeout_s

    http_server.HTTPEnvServer.__init__ = spy
    try:
        create_env_app(get_env("calculator"), session_timeout_s=30.0)
    finally:
        http_server.HTTPEnvServer.__init__ = original
    assert seen["timeout"] == 30.0
