"""The Ray engine's reward function logs, from the group records, the tool telemetry the local
engine's ``EnvReward`` logs (no Ray here: the rows ``group_rows`` makes of hand-built records)."""

from __future__ import annotations

import json

from composer_replication.envs.base import StepResult
from composer_replication.rollout_engine.group import GroupRecord, Rollout, Sequence
from composer_replication.rollout_engine.learner import WorkerReward, group_rows


def _call(name: str, result: str) -> list[dict]:
    call = {"type": "function", "function": {"name": name, "arguments": {}}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": name, "content": result},
        {"role": "assistant", "content": "done"},
    ]


def _rollout(messages: list[dict], reward: float, info: dict, valid: bool = True) -> Rollout:
    verdict = StepResult("", reward, True, reward > 0, "", info) if valid else None
    return Rollout([Sequence([1], [2], [-0.5], [1], [0])], reward, verdict, valid, messages)


def test_worker_reward_logs_the_tool_telemetry_of_the_records(tmp_path):
    """Two groups of two: task ``a`` (one good ``run_tests`` call, one call of a tool not
    offered, which is invalid) and task ``b`` (a call whose result is an error, and a rollout
    lost to the machine: left out). Hand-counted: ``tools/calls/run_tests`` = 2 calls / 4
    rollouts = 0.5, ``tools/calls/_not_offered`` = 0.25; the invalid-call rate over the 3
    graded rollouts (1, 1 and 0 calls invalid of 1 each) = 2/3; task ``a``'s estimate (0.1
    over 10 rollouts: likely to fail) puts its rollouts' rates (0 and 1) in the likely-fail
    split: 0.5; ``b``'s estimate has too few rollouts to count. The do-nothing check a worker
    ran on ``a`` scored 0; the first rollout goes to the episode log with the step."""
    a = GroupRecord(0, "a", {"task_id": "a"}, [
        _rollout(_call("run_tests", "1 of 3 passed"), 0.0, {"edits": 0, "flags": []}),
        _rollout(_call("rm_rf", "ok"), 0.0, {"edits": 1, "flags": ["wrote_test:t.py"]}),
    ], info={"task_estimate": (0.1, 10), "do_nothing_reward": 0.0})  # fmt: skip
    b = GroupRecord(1, "b", {"task_id": "b"}, [
        _rollout(_call("run_tests", "error: no such file"), 1.0, {"edits": 2, "flags": []}),
        _rollout([], 0.0, {}, valid=False),
    ], info={"task_estimate": (0.5, 2)})  # fmt: skip
    rows = group_rows([a, b])
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    reward = WorkerReward("fd", ("run_tests", "edit_file"), tmp_path / "episodes.jsonl")
    logged: dict[str, float] = {}

    class State:
        global_step = 4

    out = reward(None, [None] * 4, log_metric=logged.__setitem__, trainer_state=State(), **columns)
    assert out == [0.0, 0.0, 1.0, None]
    assert logged["tools/calls/run_tests"] == 0.5 and logged["tools/calls/_not_offered"] == 0.25
    assert abs(logged["env/hack/invalid_call_rate"] - 2 / 3) < 1e-9
    assert logged["env/hack/invalid_call_rate_likely_fail"] == 0.5
    assert "env/hack/invalid_call_rate_likely_pass" not in logged
    assert abs(logged["env/hack/no_edit_frac"] - 1 / 3) < 1e-9
    assert abs(logged["env/hack/test_edit_frac"] - 1 / 3) < 1e-9
    assert logged["env/hack/do_nothing_nonzero_tasks"] == 0.0
    assert logged["env/pass_rate"] == 1 / 3 and logged["env/flagged_frac"] == 0.25
    [line] = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert line["step"] == 5 and line["task_id"] == "a" and line["messages"][1]["content"]


def test_a_single_turn_worker_reward_logs_no_tool_telemetry():
    g = GroupRecord(0, "a", {"task_id": "a"}, [_rollout([], 1.0, {})])
    rows = group_rows([g])
    logged: dict[str, float] = {}
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    out = WorkerReward("arithmetic")(None, [None], log_metric=logged.__setitem__, **columns)
    assert out == [1.0] and logged["env/pass_rate"] == 1.0
    assert not [k for k in logged if k.startswith(("tools/", "env/hack/"))]
