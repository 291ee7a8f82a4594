"""``rollout.context`` on the Ray engine without Ray (docs/summarization.md): the worker's loop
(``ToolLoop`` running the local engine's ``ContextLoop``) records each context window as its own
``Sequence`` with its turns' policy versions; the learner packs a rollout's sequences into ONE
row that equals the local engine's packed row token for token (ids, tool mask, behaviour
log-probs, window of each token), and the trainer scores it with the windows (block-diagonal),
logging the summaries.

The policy follows a script (the calculator's ``208 * 67``): rollout 0 calls the tool until its
window is full, summarizes, and answers in the next window; rollout 1 answers at once. Each
generation call is tagged with a new policy version (3, 4, ...), as a worker loading newer
weights between turns would be."""

from __future__ import annotations

import math
import pickle
from types import SimpleNamespace

import pytest
import torch
from conftest import make_tiny_model
from support.scripted_rollouts import ScriptedRollouts

from composer_replication.envs.base import StepResult
from composer_replication.envs.calculator import CalculatorEnv, CalculatorTools
from composer_replication.envs.tools import bounded_tools
from composer_replication.lm.packing import pad_windows
from composer_replication.rollout import ToolLoop, context_stats, instruction_after_tools
from composer_replication.rollout_engine.group import GroupRecord
from composer_replication.rollout_engine.learner import WorkerReward, group_rows, group_tokens
from composer_replication.rollout_engine.worker import episode_rollout

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "208 * 67"}}</tool_call><|im_end|>'
ANSWER = "13936<|im_end|>"
SUMMARY = "208*67=13936<|im_end|>"
PROMPT, HEADER = "Summarize.", "Summary:\n"
CONTEXT = SimpleNamespace(strategy="summarize", max_tokens=360, max_summaries=2,
                          summary_prompt=PROMPT, summary_header=HEADER,
                          summary_max_tokens=16)  # fmt: skip


class Script:
    """The worker's turn function by script: ``(prompts, limit=None) -> (ids, log-probs,
    version)``; the k-th call is version 3 + k and its tokens' log-probs are -0.1 (k + 1)."""

    def __init__(self, tok):
        self.tok, self.calls, self.limits = tok, 0, []
        self.instruction: list[int] = []

    def __call__(self, prompts, limit=None):
        enc = lambda s: self.tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        first, out = self.calls == 0, []
        for b, ids in enumerate(prompts):
            if self.instruction and ids[-len(self.instruction) :] == self.instruction:
                out.append(enc(SUMMARY)[:limit])
            elif HEADER in self.tok.decode(ids) or (first and b % 2 == 1):
                out.append(enc(ANSWER))
            else:
                out.append(enc(CALL))
        self.limits.append(limit)
        lp = -0.1 * (self.calls + 1)
        version, self.calls = 3 + self.calls, self.calls + 1
        return out, [[lp] * len(o) for o in out], version


def _worker_group(tok) -> tuple[list, GroupRecord]:
    """The worker's loop on a group of 2 and the record it sends (through pickle, as Ray's
    object store carries it)."""
    env = CalculatorEnv(per_kind=4, few_shot=False)
    task = env.tasks("train")[0]
    row = env.row(task)
    script = Script(tok)
    loop = ToolLoop(tok, None, script, 12, 40, True, CONTEXT)
    script.instruction = instruction_after_tools(tok, PROMPT)[1]
    instances = [bounded_tools(CalculatorTools, 64)() for _ in range(2)]
    episodes = loop.run([row, row], instances)
    episodes[0].context.environment_calls = 2  # as the memory env's after-summary calls count
    results = [StepResult("", r, True, r > 0, "") for r in (1.0, 0.0)]
    rollouts = [episode_rollout(e, r) for e, r in zip(episodes, results, strict=True)]
    record = GroupRecord(7, task.task_id, row, rollouts)
    assert loop.tool_calls == 2 and script.limits == [None, 40, 16, 40]
    return episodes, pickle.loads(pickle.dumps(record))


def test_the_learner_packs_a_records_windows_as_the_local_engine_does(tool_tok):
    """Rollout 0: window 0 = 2 calls (versions 3, 4) and the summary (version 5); window 1 =
    its prompt and the answer (version 6). The record carries 2 sequences; the learner's row
    is window 0's prompt, then window 0's completion, window 1's prompt (mask 0, log-prob 0)
    and window 1's completion: the local engine's row (``ContextEpisode.packed``, what
    ``ContextLoop`` hands TRL) and the hand concatenation of the sequences."""
    episodes, group = _worker_group(tool_tok)
    r0, r1 = group.rollouts
    assert [len(r.sequences) for r in group.rollouts] == [2, 1]
    s0, s1 = r0.sequences
    assert (s0.turn_versions, s1.turn_versions, r1.sequences[0].turn_versions) == (
        [3, 4, 5], [6], [3])  # fmt: skip
    assert group.oldest_version == 3 and group.staleness(6) == 3
    assert s0.summary == "208*67=13936" and s0.summary_tokens == 13 and s1.summary is None
    ask = f"13936<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    assert tool_tok.decode(s0.completion_ids[:-13]).endswith(ask)  # result, then the ask
    assert tool_tok.decode(s1.prompt_ids).endswith(HEADER + "208*67=13936<|im_end|>\n"
                                                   "<|im_start|>assistant\n")  # fmt: skip
    rows = group_rows([group])
    assert [r["worker_reward"] for r in rows] == [1.0, 0.0]
    batch = group_tokens([group], 2)
    # the local engine's packed row (the episode the worker's ContextLoop built)
    for b, e in enumerate(episodes):
        ids, mask, logps, window = e.context.packed()
        assert batch["prompt_ids"][b] == e.prompt_ids == e.context.windows[0].prompt_ids
        assert batch["completion_ids"][b] == ids == e.completion_ids
        assert batch["env_mask"][b] == mask == e.tool_mask
        assert batch["logprobs"][b] == logps == e.logprobs
    # and by hand, from the record's sequences
    n1 = len(s1.prompt_ids)
    assert batch["completion_ids"][0] == s0.completion_ids + s1.prompt_ids + s1.completion_ids
    assert batch["env_mask"][0] == s0.tool_mask + [0] * n1 + s1.tool_mask
    assert batch["logprobs"][0] == s0.behaviour_logps + [0.0] * n1 + s1.behaviour_logps
    assert batch["completion_ids"][1] == r1.sequences[0].completion_ids
    # behaviour log-probs: each turn's own (-0.1 per call), 0 where the policy wrote nothing
    own = [lp for lp, m in zip(batch["logprobs"][0], batch["env_mask"][0], strict=True) if m]
    assert sorted(set(own)) == pytest.approx([-0.4, -0.3, -0.2, -0.1])  # its 4 turns
    assert sum(batch["env_mask"][0]) == 2 * 33 + 13 + 6
    source = ScriptedRollouts([[group]])
    source.pending = [group]
    windows = source.packed_windows()
    n0 = len(s0.completion_ids)
    assert windows == [[0] * n0 + [1] * (n1 + len(s1.completion_ids)),
                       [0] * len(r1.sequences[0].completion_ids)]  # fmt: skip
    assert windows == [e.context.packed()[3] for e in episodes]
    back = source.context_episodes()
    assert [len(e.summaries) for e in back] == [1, 0] and back[0].tokens_saved > 0
    assert back[0].tokens_saved == episodes[0].context.tokens_saved
    assert [e.environment_calls for e in back] == [2, 0]
    assert context_stats(back)["environment_calls"] == 1.0  # the trainer's rollout/ metric


def test_a_packed_ray_row_is_scored_with_its_windows(tmp_path, tool_tok):
    """The trainer on the record (``ScriptedRollouts``: the learner's code without Ray): the
    batch carries ``completion_window`` and the behaviour log-probs of the packed row; the
    learner's pre-update log-probs of window 1 equal window 1 scored alone (the packed
    forward; a window never sees an earlier one); the step logs 1 summary per 2 episodes."""
    from composer_replication.config import load_config
    from composer_replication.envs import get_env
    from composer_replication.run.train import build_grpo_args
    from composer_replication.trainer.data import build_prompt_dataset
    from composer_replication.trainer.trainer import ComposerReplicationTrainer

    episodes, group = _worker_group(tool_tok)
    cfg = load_config(None, [
        f"output_dir={tmp_path}", "max_steps=1", "generation.num_generations=2",
        "generation.prompts_per_step=1", "generation.max_completion_length=40",
        "grpo.mask_truncated_completions=false", "rollout.engine=ray", "env.num_train=4",
        "optim.gradient_checkpointing=false",
    ])  # fmt: skip
    model = make_tiny_model(len(tool_tok), max_positions=1024, weight_scale=6.0)
    trainer = ComposerReplicationTrainer(
        model=model, reward_funcs=[WorkerReward("calculator")], args=build_grpo_args(cfg),
        train_dataset=build_prompt_dataset(get_env("arithmetic", levels=[1]), "train", 4, 0,
                                           conversational=True),
        processing_class=tool_tok, rollout_source=ScriptedRollouts([[group]]),
    )  # fmt: skip
    model.train()
    batch = trainer._generate_and_score_completions([{}] * 2)
    k = batch["completion_ids"].shape[1]
    keep = batch["completion_mask"].bool()
    expected = pad_windows([e.context.packed()[3] for e in episodes], k)
    assert torch.equal(batch["completion_window"], expected)
    behaviour = [e.logprobs for e in episodes]
    for b in range(2):
        n = len(behaviour[b])
        assert batch["tool_mask"][b, :n].tolist() == episodes[b].tool_mask
        got = batch["sampling_per_token_logps"][b, :n].tolist()
        assert got == pytest.approx(behaviour[b], abs=1e-6)
    w1 = episodes[0].context.windows[1]
    with torch.no_grad():
        ids = torch.tensor([w1.prompt_ids + w1.completion_ids])
        alone = trainer._get_per_token_logps_and_entropies(
            model, ids, torch.ones_like(ids), len(w1.completion_ids)
        )[0][0]
    where = (batch["completion_window"][0] == 1) & keep[0]
    old = batch["old_per_token_logps"][0][where][-len(w1.completion_ids) :]
    assert torch.allclose(old, alone, atol=1e-5)
    # the control: the same row scored as one sequence (window 1 sees window 0) differs
    with torch.no_grad():
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        leaky = trainer._get_per_token_logps_and_entropies(model, ids, mask, k)[0]
    assert (leaky[0][where][-len(w1.completion_ids) :] - alone).abs().max() > 2e-2
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert batch["advantages"].tolist() == pytest.approx([a, -a], abs=1e-5)
    metrics = trainer._metrics["train"]
    assert metrics["rollout/summaries"][-1] == 0.5 and metrics["rollout/windows"][-1] == 1.5
    assert metrics["rollout/summary_tokens"][-1] == 13
    assert metrics["rollout/reward_by_summaries/1"][-1] == 1.0
    assert metrics["rollout/reward_by_summaries/0"][-1] == 0.0
