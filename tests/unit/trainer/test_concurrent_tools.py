"""The tool calls of a turn run at once across the batch (``rollout.TurnCalls`` in
``ComposerReplicationTrainer._tool_call_loop``, resets and remote gradings at once too): with
a slow tool, 8 rollouts overlap their calls (recorded by the tool itself: inside the sandbox,
or on the OpenEnv server) instead of running one after another, and the messages, masks and
rewards equal the sequential run's. The policy is scripted (support/scripted_policy.py), so
TRL's real loop runs and no model decides anything; the sequential run naps shorter (what a
call returns does not depend on how long it took), which keeps the test short."""

from __future__ import annotations

import copy

import pytest
import torch
from support.openenv_server import served
from support.scripted_agent import ANSWER, CALL
from support.scripted_policy import scripted_trainer
from support.slow_tools import SandboxNapTools, Spans, delayed_calculator

from composer_replication.envs.openenv.adapter import OpenEnvReward, openenv_tools_class
from composer_replication.envs.tools import bounded_tools
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.sandbox.sandbox import SLOTS

BATCH = 8


def _nap(tag: str) -> str:
    return f'<tool_call>{{"name": "nap", "arguments": {{"tag": "{tag}"}}}}</tool_call><|im_end|>'


@pytest.fixture
def tool_tok(tokenizer):
    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    return tok


@pytest.fixture
def slots():
    """8 sandbox slots for the test (naps need no core), the process's setting restored."""
    before = SLOTS._limit
    SLOTS.set_limit(BATCH)
    yield SLOTS
    SLOTS.set_limit(before)


def _round(trainer, concurrent: bool, rows) -> dict:
    trainer.concurrent_tools = concurrent
    torch.manual_seed(0)
    return trainer._generate_and_score_completions(rows)


def _same_batches(a: dict, b: dict) -> None:
    for key in ("completion_ids", "completion_mask", "tool_mask", "advantages"):
        assert torch.equal(a[key], b[key]), key


def test_sandboxed_naps_of_8_rollouts_overlap_and_change_nothing(tool_tok, tmp_path, slots):
    """Two tool turns of 8 rollouts: concurrent, all 8 naps of each turn are asleep at the
    same moment (peak 8, by the sandbox's own clock); sequential, never two. Per rollout the
    calls keep their order (call 1 is ``a``, call 2 is ``b``); messages and rewards equal."""
    rows = [{"prompt": [{"role": "user", "content": f"nap {i}"}], "task_id": f"t{i}"}
            for i in range(BATCH // 2) for _ in range(2)]  # fmt: skip
    seen: list = []

    def reward(completions, task_id, **_):
        seen.append(copy.deepcopy(completions))
        return [float(len(t)) for t in task_id]

    script = {"": [_nap("a"), _nap("b"), "done<|im_end|>"]}
    trainer = scripted_trainer(tool_tok, rows, SandboxNapTools, reward, 2, str(tmp_path), script)
    out = {}
    for concurrent, nap_s in ((True, 3.0), (False, 0.2)):
        SandboxNapTools.nap_s, SandboxNapTools.spans = nap_s, Spans()
        out[concurrent] = (_round(trainer, concurrent, rows), seen[-1], SandboxNapTools.spans)
    (b_c, msgs_c, spans_c), (b_s, msgs_s, spans_s) = out[True], out[False]
    assert len(spans_c.items) == len(spans_s.items) == 2 * BATCH
    for tag in "ab":  # every rollout's call of the turn asleep at once
        assert Spans([x for x in spans_c.items if x[0].endswith(f":{tag}")]).peak() == BATCH
    assert spans_s.peak() == 1
    assert msgs_c == msgs_s
    said = [[m["content"] for m in msgs if m["role"] == "tool"] for msgs in msgs_c]
    assert said == [[f"{r['task_id']} napped (a, call 1)", f"{r['task_id']} napped (b, call 2)"]
                    for r in rows]  # fmt: skip
    _same_batches(b_c, b_s)


def test_delayed_openenv_calls_of_8_rollouts_overlap_and_change_nothing(tool_tok, tmp_path):
    """The calculator served over OpenEnv, 2 s per call on the server: concurrent, the 8
    sessions' calls overlap there (peak 8); sequential, one at a time. Messages and the
    server's verdicts (8 gradings, also at once) are equal."""
    spans = Spans()
    env = delayed_calculator(2.0, spans)
    rows = [r for r in env.rows("train")[: BATCH // 2] for _ in range(2)]
    out = {}
    with served(env) as url:
        tools = bounded_tools(openenv_tools_class(url), 4)
        reward = OpenEnvReward("calculator")
        trainer = scripted_trainer(tool_tok, rows, tools, reward, 1, str(tmp_path),
                                   {"": [CALL, ANSWER]})  # fmt: skip
        for concurrent, delay_s in ((True, 2.0), (False, 0.1)):
            env.delay_s = delay_s
            spans.items.clear()
            batch = _round(trainer, concurrent, rows)
            verdicts = [(r.reward, r.passed, r.feedback) for r in reward.last_results]
            out[concurrent] = (batch, verdicts, list(spans.items))
    (b_c, v_c, spans_c), (b_s, v_s, spans_s) = out[True], out[False]
    assert len(spans_c) == len(spans_s) == BATCH
    assert Spans(spans_c).peak() == BATCH and Spans(spans_s).peak() == 1
    assert v_c == v_s and len(v_c) == BATCH
    _same_batches(b_c, b_s)
