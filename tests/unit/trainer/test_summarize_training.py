"""Training through summaries (docs/summarization.md): an episode that summarized is ONE
packed row; its windows are scored with block-diagonal attention; every window's policy
tokens (its turns, and the summary in its own window) carry the episode's advantage; the loss
under ``grpo`` and ``dapo`` equals a hand-computed value, on a 2-window episode and on one of
three budgets (4 windows); an optimizer step runs.

The policy follows a script (``_generate_single_turn``), so the episode's shape is fixed;
the model that scores and trains is a tiny random Llama."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch
from conftest import make_tiny_model
from datasets import Dataset
from trl import GRPOConfig

from composer_replication.envs.calculator import CalculatorEnv, CalculatorTools
from composer_replication.envs.tools import bounded_tools
from composer_replication.trainer.trainer import ComposerReplicationTrainer

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "208 * 67"}}</tool_call><|im_end|>'
ANSWER = "13936<|im_end|>"
SUMMARY = "208*67=13936<|im_end|>"
PROMPT, HEADER = "Summarize.", "Summary:\n"


class SummarizingTrainer(ComposerReplicationTrainer):
    """Row 0 of a round calls the tool until the window is full, summarizes, and answers in
    the next window; row 1 answers at once (one window)."""

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        tok = self.processing_class
        turns = [self.turn(tok.decode(ids), b) for b, ids in enumerate(prompt_ids)]
        return [tok(t, add_special_tokens=False)["input_ids"] for t in turns], None

    def turn(self, text: str, b: int) -> str:
        """The scripted turn of row ``b`` after its context ``text``."""
        if text.rstrip().endswith(PROMPT + "<|im_end|>\n<|im_start|>assistant"):
            return SUMMARY
        if HEADER in text:
            return ANSWER
        if text.count("<|im_start|>assistant") == 1:  # the first turn of the round
            return CALL if b % 2 == 0 else ANSWER
        return CALL


class LongSummarizingTrainer(SummarizingTrainer):
    """Row 0 calls the tool in every window until it has written ``SUMMARIES`` summaries
    (numbered ``#1``, ``#2``, ...: the next window's prompt shows the last one), then answers;
    row 1 answers at once."""

    SUMMARIES = 3

    def turn(self, text: str, b: int) -> str:
        done = max((int(k) for k in re.findall(r"13936 #(\d)", text)), default=0)
        if text.rstrip().endswith(PROMPT + "<|im_end|>\n<|im_start|>assistant"):
            return f"208*67=13936 #{done + 1}<|im_end|>"
        if text.count("<|im_start|>assistant") == 1 and b % 2 == 1:
            return ANSWER
        return ANSWER if done >= self.SUMMARIES else CALL


def build(tok, tmp_path, loss_type: str, max_steps: int = 1, rewards=None, channels=(),
          trainer_class=SummarizingTrainer, max_summaries: int = 2, **args):  # fmt: skip
    """The trainer on two rows of one calculator task (``rewards``: by default row 0 passes,
    row 1 fails; ``channels``: the channels it trains with, as they would come from a run)."""
    env = CalculatorEnv(per_kind=4, few_shot=False)
    row = env.row(env.tasks("train")[0])
    rows = [row, row]
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
        max_completion_length=40, max_tool_calling_iterations=8, report_to="none",
        save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True, loss_type=loss_type,
        beta=0.0, max_steps=max_steps, learning_rate=1e-3, logging_steps=1, bf16=False, **args,
    )  # fmt: skip
    context = SimpleNamespace(strategy="summarize", max_tokens=360, max_summaries=max_summaries,
                              summary_prompt=PROMPT, summary_header=HEADER,
                              summary_max_tokens=16)  # fmt: skip
    if rewards is None:
        rewards = lambda completions, **_: [float(i % 2 == 0) for i in range(len(completions))]  # noqa: E731
    model = make_tiny_model(len(tok), max_positions=512, weight_scale=6.0)
    trainer = trainer_class(
        model=model, reward_funcs=rewards, args=args,
        train_dataset=Dataset.from_list(rows * 4), processing_class=tok,
        environment_factory=bounded_tools(CalculatorTools, 64), context=context,
        channels=list(channels),
    )  # fmt: skip
    return trainer, rows


@pytest.fixture(scope="module")
def scored(tokenizer, tmp_path_factory):
    """One scored round, shared by the tests of this module (they only read it)."""
    import copy

    from composer_replication.lm.chat_templates import ensure_tool_template

    tool_tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tool_tok)
    trainer, rows = build(tool_tok, tmp_path_factory.mktemp("scored"), "grpo")
    trainer.model.train()
    return trainer, trainer._generate_and_score_completions(rows)


def test_the_summarized_episode_is_one_packed_row(scored, tool_tok):
    """Row 0: window 0 = 2 calls (2 x 33 tokens, results masked), the instruction (masked),
    the summary (13 tokens, trained); window 1 = its prompt (system + task + summary: masked)
    and the answer (6 tokens). Row 1: the answer only. Same advantage on every window."""
    trainer, batch = scored
    ep = trainer.context_episodes[0]
    assert len(ep.windows) == 2 and ep.summaries == ["208*67=13936"]
    window, tool_mask = batch["completion_window"], batch["tool_mask"]
    keep = batch["completion_mask"].bool()
    w0 = (window[0] == 0) & keep[0]
    w1 = (window[0] == 1) & keep[0]
    n0, n1 = int((tool_mask[0] * w0).sum()), int((tool_mask[0] * w1).sum())
    assert (n0, n1) == (2 * 33 + 13, 6)
    assert int(w1.sum()) == len(ep.windows[1].prompt_ids) + 6  # its prompt, then the answer
    assert tool_mask[0][w1].tolist() == [0] * len(ep.windows[1].prompt_ids) + [1] * 6
    # the ask (masked): the tool result's end of turn, then the instruction as the template
    # renders a user turn after a tool message; no empty assistant turn between them
    ask = f"<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    n_ask = len(tool_tok(ask, add_special_tokens=False)["input_ids"])
    assert tool_tok.decode(batch["completion_ids"][0][w0].tolist()[-13 - n_ask : -13]) == ask
    assert tool_mask[0][w0].tolist()[-13 - n_ask : -13] == [0] * n_ask
    assert (window[1][keep[1]] == 0).all() and int((tool_mask[1] * keep[1]).sum()) == 6
    a = 0.5 / (math.sqrt(0.5) + 1e-4)  # rewards (1, 0): TRL's group-normalized advantage
    assert batch["advantages"].tolist() == pytest.approx([a, -a], abs=1e-5)


def _batch_logps(trainer, batch, packed: bool = True):
    """The policy's per-token log-probs of the batch's completions: with the packed windows'
    positions (the trainer's loss path), or as plain rows (``packed=False``)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    k = batch["completion_ids"].shape[1]
    trainer._loss_windows = batch["completion_window"] if packed else None
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, k)[0]
    trainer._loss_windows = None
    return logps


def _alone_logps(trainer, window):
    """Log-probs of one window's completion, the window scored as a sequence of its own."""
    ids = torch.tensor([window.prompt_ids + window.completion_ids])
    with torch.no_grad():
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, torch.ones_like(ids), len(window.completion_ids)
        )[0]


def test_packed_logps_equal_each_window_scored_alone(scored):
    trainer, batch = scored
    ep = trainer.context_episodes[0]
    packed = _batch_logps(trainer, batch)
    w0, w1 = ep.windows[0], ep.windows[1]
    alone = _alone_logps(trainer, w1)
    where = (batch["completion_window"][0] == 1) & batch["completion_mask"][0].bool()
    got = packed[0][where][-len(w1.completion_ids) :]
    assert torch.allclose(got, alone[0], atol=1e-5)
    # the control: the packed row scored as one sequence (window 1 sees window 0)
    leaky = _batch_logps(trainer, batch, packed=False)
    assert (leaky[0][where][-len(w1.completion_ids) :] - alone[0]).abs().max() > 2e-2
    # window 0 scored alone too: the prompt and window 0's completion
    alone0 = _alone_logps(trainer, w0)
    assert torch.allclose(packed[0][: len(w0.completion_ids)], alone0[0], atol=1e-5)


def assert_losses(trainer, batch, expected: dict[str, float]) -> None:
    """The trainer's loss on ``batch`` under each loss type equals ``expected[type]``; the
    trainer's loss type is restored afterwards."""
    trainer.current_gradient_accumulation_steps = 1  # set by HF's training loop
    before = trainer.loss_type
    try:
        for loss_type, value in expected.items():
            trainer.loss_type = loss_type
            loss = float(trainer._compute_loss(trainer.model, batch))
            assert loss == pytest.approx(value, rel=1e-4, abs=1e-6), loss_type
    finally:
        trainer.loss_type = before


def test_the_loss_equals_the_hand_computed_value(scored):
    """Ratio r = 1.1 on window 1's tokens (old log-probs set 0.0953 below the new), 1 on the
    others; advantages (a, -a), a = 0.70700; policy tokens n0 = 79 (window 0: 2 calls and the
    summary) and n1 = 6 (window 1) in row 0, m = 6 in row 1. TRL's per-token loss is -r * A
    (unclipped: 1.1 is inside [0.8, 1.28]).

    grpo (per-episode mean, then mean over rows): ((-a (n0 + 1.1 n1) / (n0 + n1)) + a) / 2
    = a (1 - 85.6 / 85) / 2 = -0.0035294 a = -0.0024953.
    dapo (token level): (-a (n0 + 1.1 n1) + a m) / (n0 + n1 + m) = -79.6 a / 91
    = -0.61844. Under grpo the 2-window episode weighs as much as the 1-window one."""
    trainer, batch = scored
    logps = _batch_logps(trainer, batch)
    c = math.log(1.1)
    batch = dict(batch, old_per_token_logps=logps - c * (batch["completion_window"] == 1))
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    n0, n1, m = 79, 6, 6
    expected = {
        "grpo": ((-a * (n0 + 1.1 * n1) / (n0 + n1)) + a) / 2,
        "dapo": (-a * (n0 + 1.1 * n1) + a * m) / (n0 + n1 + m),
    }
    assert expected["grpo"] == pytest.approx(-0.0024953, abs=1e-6)
    assert expected["dapo"] == pytest.approx(-0.61844, abs=1e-5)
    assert_losses(trainer, batch, expected)


def test_an_optimizer_step_through_a_summary(tool_tok, tmp_path):
    trainer, _ = build(tool_tok, tmp_path, "dapo", max_steps=1)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rollout/summaries" in h]
    assert len(logs) == 1 and all(h["rollout/summaries"] == 0.5 for h in logs)
    assert all(h["rollout/summary_tokens"] == 13 for h in logs)
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert moved


def test_dynamic_sampling_merges_the_windows_with_their_rows():
    """DAPO's merge re-pads ``completion_window`` on the right with its rows' other tensors."""
    from composer_replication.trainer.trainer import merge_groups

    def batch(k: int, window: list[list[int]]) -> dict:
        return {
            "advantages": torch.tensor([1.0, -1.0]),
            "completion_ids": torch.ones(2, k, dtype=torch.long),
            "completion_mask": torch.ones(2, k, dtype=torch.long),
            "completion_window": torch.tensor(window),
            "num_items_in_batch": torch.tensor(2 * k),
        }

    a, b = batch(2, [[0, 0], [0, 1]]), batch(3, [[0, 1, 2], [0, 0, 0]])
    out = merge_groups([a, b], [(1, 0), (0, 0)], group_size=2)
    assert out["completion_window"].tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 0], [0, 1, 0]]
    assert out["completion_mask"].tolist()[2:] == [[1, 1, 0], [1, 1, 0]]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_loss_through_a_shared_prefix_equals_the_packed_loss(
    tool_tok, tmp_path, monkeypatch, checkpointing
):
    """The loss forward runs the prefix every window repeats once (lm/packing.py
    ``packed_logps_with_prefix``; under gradient checkpointing with its chunks checkpointed);
    the loss and every gradient equal the packed forward's (``shared_prefix`` off)."""
    import composer_replication.trainer.trainer as trainer_module

    calls = []
    real = trainer_module.packed_logps_with_prefix
    monkeypatch.setattr(trainer_module, "packed_logps_with_prefix",
                        lambda *a, **k: calls.append(1) or real(*a, **k))  # fmt: skip
    trainer, rows = build(tool_tok, tmp_path, "dapo", gradient_checkpointing=checkpointing)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(rows)
    assert (batch["completion_window"] > 0).any()  # a summarized episode is in the batch
    trainer.current_gradient_accumulation_steps = 1
    results = []
    for shared in (False, True):
        trainer.shared_prefix = shared
        trainer.model.zero_grad()
        before = len(calls)
        loss = trainer._compute_loss(trainer.model, dict(batch))
        loss.backward()
        assert (len(calls) > before) == shared  # the path taken
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
        results.append((float(loss), grads))
    (loss0, g0), (loss1, g1) = results
    assert loss0 != 0.0 and loss1 == pytest.approx(loss0, rel=1e-5, abs=1e-7)
    for name, g in g0.items():
        torch.testing.assert_close(g1[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_an_episode_of_three_budgets_trains_as_one_row(tool_tok, tmp_path):
    """Row 0 runs 3.2x the 360-token budget (1,164 tokens over its 4 windows): 6 calls, 3
    summaries, the answer in window 3; row 1 answers at once. Per window: its policy tokens
    are its calls and its summary (tool results, the instruction and the window's prompt
    masked), and every token of the row has the episode's advantage. The loss with ratio r_k on window k's policy tokens (old
    log-probs set log r_k below the new; r = 1, 1.05, 1.1, 1.2, inside the clip range
    [0.8, 1.28], so TRL's per-token loss is -r A), n_k policy tokens per window, m in row 1,
    advantages (a, -a):
    grpo (per-episode mean, then mean over rows): (-a sum_k r_k n_k / sum_k n_k + a) / 2;
    dapo (token level): (-a sum_k r_k n_k + a m) / (sum_k n_k + m)."""
    trainer, rows = build(tool_tok, tmp_path, "grpo", trainer_class=LongSummarizingTrainer,
                          max_summaries=3)  # fmt: skip
    trainer.model.train()
    batch = trainer._generate_and_score_completions(rows)
    ep = trainer.context_episodes[0]
    assert len(ep.windows) == 4 and ep.summaries == [f"208*67=13936 #{k}" for k in (1, 2, 3)]
    assert ep.ended == "done" and sum(len(w) for w in ep.windows) > 3 * 360
    enc = lambda s: tool_tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    window, tool_mask = batch["completion_window"], batch["tool_mask"]
    keep = batch["completion_mask"].bool()
    n = []
    for k, w in enumerate(ep.windows):
        calls = len(w.turn_tags) - (w.summary is not None) - (k == 3)
        assert calls == (2 if k < 3 else 0)  # 2 calls fill a window; window 3 answers
        policy = calls * len(enc(CALL)) + (len(enc(f"{w.summary}<|im_end|>")) if k < 3 else 0)
        policy += len(enc(ANSWER)) if k == 3 else 0
        where = (window[0] == k) & keep[0]
        n.append(int((tool_mask[0] * where).sum()))
        assert n[-1] == policy
        if k:  # the window's prompt (system, task, the last summary) is context: mask 0
            assert tool_mask[0][where].tolist()[: len(w.prompt_ids)] == [0] * len(w.prompt_ids)
    assert n == [2 * 33 + 15] * 3 + [6]  # a call 33 tokens, a summary 15
    m = int((tool_mask[1] * keep[1]).sum())
    assert m == 6 and (window[1][keep[1]] == 0).all()
    a = 0.5 / (math.sqrt(0.5) + 1e-4)  # rewards (1, 0): TRL's group-normalized advantage
    assert batch["advantages"].tolist() == pytest.approx([a, -a], abs=1e-5)
    r = [1.0, 1.05, 1.1, 1.2]
    logps = _batch_logps(trainer, batch)
    shift = torch.zeros_like(logps)
    for k, rk in enumerate(r):
        shift += math.log(rk) * (window == k) * keep
    batch = dict(batch, old_per_token_logps=logps - shift)
    rn = sum(rk * nk for rk, nk in zip(r, n, strict=True))
    expected = {"grpo": (-a * rn / sum(n) + a) / 2, "dapo": (-a * rn + a * m) / (sum(n) + m)}
    # by hand: n = (81, 81, 81, 6), sum 249; sum r n = 81 (1 + 1.05 + 1.1) + 1.2 * 6 = 262.35
    assert rn == pytest.approx(262.35) and expected["dapo"] == pytest.approx(-256.35 * a / 255)
    assert expected["grpo"] == pytest.approx((1 - 262.35 / 249) * a / 2)
    assert_losses(trainer, batch, expected)
