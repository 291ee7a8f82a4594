"""The tool calls of a turn run at once across the batch (``rollout.TurnCalls`` in
``ComposerReplicationTrainer._tool_call_loop``): with a slow tool, 8 rollouts overlap their
calls (recorded by the tool itself: inside the sandbox, or on the OpenEnv server) instead of
running one after another, and the messages, masks and rewards equal the sequential run's."""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset
from support.openenv_server import served
from support.scripted_agent import CALL, scripted_calculator_model
from support.slow_tools import SandboxNapTools, Spans, delayed_calculator
from trl import GRPOConfig

from composer_replication.chat_templates import ensure_tool_template
from composer_replication.envs.openenv_adapter import OpenEnvReward, openenv_tools_class
from composer_replication.envs.sandbox import SLOTS
from composer_replication.rollout import bounded_tools
from composer_replication.trainer.trainer import ComposerReplicationTrainer

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


def _trainer(tmp_path, model, tok, rows, tools, reward, concurrent: bool, turns: int):
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH, num_generations=2,
        max_completion_length=160, max_tool_calling_iterations=turns, report_to="none",
        save_strategy="no", use_cpu=True, seed=0, generation_kwargs={"use_cache": False},
    )  # fmt: skip
    return ComposerReplicationTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
        processing_class=tok, environment_factory=tools, concurrent_tools=concurrent,
    )  # fmt: skip


def _round(trainer, rows, seen: list) -> dict:
    """One generation + scoring round on ``rows``; the messages the reward saw go to ``seen``."""
    torch.manual_seed(0)
    seen.clear()
    return trainer._generate_and_score_completions(rows)


def _same_batches(a: dict, b: dict) -> None:
    for key in ("completion_ids", "completion_mask", "tool_mask", "advantages"):
        assert torch.equal(a[key], b[key]), key


def test_sandboxed_naps_of_8_rollouts_overlap_and_change_nothing(tool_tok, tmp_path, slots):
    """Two tool turns of 8 rollouts: concurrent, all 8 naps of a turn run at the same moment
    (peak 8, by the sandbox's own clock); sequential, never two. Per rollout, the calls keep
    their order (call 1 is ``a``, call 2 is ``b``), and messages and rewards are equal."""
    rows = [{"prompt": [{"role": "user", "content": f"nap {i}"}], "task_id": f"t{i}"}
            for i in range(BATCH // 2) for _ in range(2)]  # fmt: skip
    seen: list = []

    def reward(completions, task_id, **_):
        seen.append(completions)
        return [float(i % 3) for i, _ in enumerate(completions)]

    SandboxNapTools.nap_s = 1.5
    results = {}
    for concurrent in (True, False):
        model = scripted_calculator_model(tool_tok, (_nap("a"), _nap("b"), "done<|im_end|>"),
                                          shots=0)  # fmt: skip
        trainer = _trainer(tmp_path, model, tool_tok, rows, SandboxNapTools, reward, concurrent, 2)
        SandboxNapTools.spans = Spans()
        batch = _round(trainer, rows, seen)
        results[concurrent] = (batch, copy.deepcopy(seen[0]), SandboxNapTools.spans)
    (b_c, msgs_c, spans_c), (b_s, msgs_s, spans_s) = results[True], results[False]
    assert len(spans_c.items) == len(spans_s.items) == 2 * BATCH
    assert spans_c.peak() == BATCH and spans_s.peak() == 1
    for tag in "ab":
        turn = Spans([x for x in spans_c.items if x[0].endswith(f":{tag}")])
        assert turn.peak() == BATCH  # every rollout's call of this turn at once
    assert msgs_c == msgs_s
    tools_said = [[m["content"] for m in msgs if m["role"] == "tool"] for msgs in msgs_c]
    assert tools_said == [[f"{r['task_id']} napped (a, call 1)", f"{r['task_id']} napped (b, call 2)"]
                          for r in rows]  # fmt: skip
    _same_batches(b_c, b_s)


def test_delayed_openenv_calls_of_8_rollouts_overlap_and_change_nothing(tool_tok, tmp_path):
    """The calculator served over OpenEnv with 1 s of latency per call: concurrent, the 8
    sessions' calls overlap on the server (peak 8); sequential, one at a time. Messages and
    the server's rewards (8 gradings, also concurrent) are equal."""
    spans = Spans()
    env = delayed_calculator(1.0, spans)
    rows = env.rows("train")[: BATCH // 2]
    rows = [r for r in rows for _ in range(2)]
    results = {}
    with served(env) as url:
        tools = bounded_tools(openenv_tools_class(url), 4)
        for concurrent in (True, False):
            reward = OpenEnvReward("calculator")
            trainer = _trainer(tmp_path, scripted_calculator_model(tool_tok), tool_tok, rows,
                               tools, reward, concurrent, 1)  # fmt: skip
            spans.items.clear()
            batch = _round(trainer, rows, [])
            verdicts = [(r.reward, r.passed, r.feedback) for r in reward.last_results]
            results[concurrent] = (batch, verdicts, list(spans.items))
    (b_c, v_c, spans_c), (b_s, v_s, spans_s) = results[True], results[False]
    assert len(spans_c) == len(spans_s) == BATCH
    assert Spans(spans_c).peak() == BATCH and Spans(spans_s).peak() == 1
    assert v_c == v_s and len(v_c) == BATCH
    assert b_c["completion_ids"].shape[0] == BATCH and CALL  # every rollout called
    _same_batches(b_c, b_s)
