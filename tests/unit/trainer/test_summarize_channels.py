"""Hints (sdpo) and on-policy distillation on packed episodes (docs/summarization.md;
channels/packed.py): the hinted teacher and a local distillation teacher score every window
of a summarized episode as that window alone; the hint's turn mask does not count the summary
as a turn; an optimizer step trains through both channels.

The episode is test_summarize_training's scripted one: row 0 calls the calculator twice,
summarizes (window 0) and answers in window 1; row 1 answers at once. Here row 0 fails, its
answer (graded turn 2: the summary is not a graded turn) blamed by the verifier."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_tiny_model
from test_summarize_training import build

from composer_replication.channels import DistillChannel, SelfDistillChannel
from composer_replication.channels.hints import insert_hint
from composer_replication.channels.packed import window_spans
from composer_replication.config import SdpoConfig, load_config
from composer_replication.envs.base import StepResult
from composer_replication.lm.chat import as_messages, render_prompt

FEEDBACK = "the product of 208 and 67 is 13936"


class Verdicts:
    """Row 0 (the episode that summarizes) fails, its graded turn 2 (the answer in window 1)
    blamed; row 1 passes. Keeps its verdicts, as EnvReward does."""

    __name__ = "verdicts"

    def __init__(self):
        self.last_results: list[StepResult] = []

    def __call__(self, completions, **_):
        self.last_results = [
            StepResult("", 1.0, True, True, "") if i % 2 else
            StepResult("", 0.0, True, False, FEEDBACK, {"failed_turn": 2})
            for i in range(len(completions))
        ]  # fmt: skip
        return [r.reward for r in self.last_results]


def channels(tok_len: int) -> list:
    distill = load_config(None, ["distill.weight=1", "distill.teachers=runs/t/final"]).distill
    teacher = make_tiny_model(tok_len, seed=1, max_positions=512, weight_scale=6.0)  # as the policy
    return [SelfDistillChannel(SdpoConfig(weight=0.1, hint_sources=["feedback"])),
            DistillChannel(distill, models={"teacher0": teacher})]  # fmt: skip


@pytest.fixture(scope="module")
def hinted(tokenizer, tmp_path_factory):
    """One scored round with both channels attached (the tests only read it)."""
    from composer_replication.lm.chat_templates import ensure_tool_template

    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    trainer, rows = build(tok, tmp_path_factory.mktemp("hinted"), "grpo", rewards=Verdicts(),
                          channels=channels(len(tok)))  # fmt: skip
    trainer.model.eval()
    return trainer, rows, trainer._generate_and_score_completions(rows)


def _logps(model, ids: list[int], n: int) -> torch.Tensor:
    """Log-probs of the last ``n`` of ``ids``, the sequence scored alone (a plain forward)."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=x).logits[0, -n - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, x[0, -n:, None]).squeeze(1)


def _episode(trainer):
    ep = trainer.context_episodes[0]
    assert len(ep.windows) == 2 and ep.summaries == ["208*67=13936"]
    return ep.windows, window_spans(ep.windows)


def test_the_hinted_teacher_scores_each_window_alone_under_its_hinted_prompt(hinted):
    trainer, rows, batch = hinted
    sdpo = trainer.channels[0]
    assert batch["sdpo_hinted"].tolist() == [True, False]
    hint = batch["sdpo_hint"][0]
    assert FEEDBACK in hint
    h_KH, w = sdpo.teacher_states(trainer.model, batch, torch.tensor([0]))
    ids = batch["completion_ids"][0]
    packed = torch.log_softmax(h_KH[0].float() @ w.float().T, -1).gather(1, ids[:, None])[:, 0]
    windows, spans = _episode(trainer)
    messages = insert_hint(as_messages(rows[0]["prompt"]), hint)
    tools = trainer.tools
    for k, (win, (start, end)) in enumerate(zip(windows, spans, strict=True)):
        shown = [*messages, win.context_message] if k else messages
        text = render_prompt(trainer.processing_class, shown, tools=tools)
        assert hint in text and (k == 0 or "208*67=13936" in text)  # window 1: hint + summary
        prompt = trainer.processing_class(text, add_special_tokens=False)["input_ids"]
        alone = _logps(trainer.model, prompt + win.completion_ids, end - start)
        assert torch.allclose(packed[start:end], alone, atol=1e-5), k
    # the control: the teacher's row as one sequence (window 1 sees window 0) differs
    t_ids = torch.cat([batch["sdpo_prompt_ids"][:1], batch["sdpo_prompt_comp_ids"][:1]], 1)
    t_mask = torch.cat([batch["sdpo_prompt_mask"][:1], batch["sdpo_prompt_comp_mask"][:1]], 1)
    with torch.no_grad():
        logits = trainer.model(input_ids=t_ids, attention_mask=t_mask).logits[0].float()
    kt = batch["sdpo_prompt_comp_ids"].shape[1]
    leaky_all = torch.log_softmax(logits[-kt - 1 : -1], -1)
    index = batch["sdpo_prompt_index"][0]
    start, end = spans[1]
    at = index[start:end]
    leaky = leaky_all[at].gather(1, t_ids[0, -kt:][at][:, None])[:, 0]
    assert (leaky - packed[start:end]).abs().max() > 2e-2


def test_the_hints_turn_mask_skips_the_summary(hinted):
    """Graded turns: the two calls (0, 1) and the answer (2); the summary is none. Pinned to
    turn 2, the mask is the answer's 6 tokens in window 1; counting the summary as a turn
    would pin its 13 tokens instead. Pinned to turn 1 with ``turn_and_rest``: the second call
    (33 tokens), the summary after it (13) and the answer (6)."""
    trainer, _, batch = hinted
    sdpo = trainer.channels[0]
    assert batch["sdpo_turn"].tolist() == [2, -1]
    _, spans = _episode(trainer)
    mask = sdpo.token_mask(batch)[0]
    start, end = spans[1]
    assert mask.nonzero()[:, 0].tolist() == list(range(end - 6, end))
    unaware = {k: v for k, v in batch.items() if k != "sdpo_summary"}  # the summary a turn
    s0, e0 = spans[0]
    assert sdpo.token_mask(unaware)[0].nonzero()[:, 0].tolist() == list(range(e0 - 13, e0))
    rest = SelfDistillChannel(SdpoConfig(weight=0.1, turn_scope="turn_and_rest"))
    assert int(rest.token_mask(dict(batch, sdpo_turn=torch.tensor([1, -1])))[0].sum()) == 52


def test_a_local_distillation_teacher_scores_each_window_alone(hinted):
    trainer, _, batch = hinted
    distill = trainer.channels[1]
    scorer = distill.scorers[0]
    assert batch["distill_status"].tolist() == [0, 0]  # SCORED
    actual = batch["distill_actual"][0]
    windows, spans = _episode(trainer)
    prompt = batch["prompt_ids"][0][batch["prompt_mask"][0].bool()].tolist()
    for k, (win, (start, end)) in enumerate(zip(windows, spans, strict=True)):
        shown = prompt if k == 0 else win.prompt_ids
        alone = _logps(scorer.model, shown + win.completion_ids, end - start)
        assert torch.allclose(actual[start:end].float(), alone, atol=1e-5), k
    assert torch.isnan(actual[spans[0][1] : spans[1][0]]).all()  # window 1's prompt: unscored
    # the control: the packed row as one sequence (window 1 sees window 0) differs
    n = spans[1][1]
    seq = prompt + batch["completion_ids"][0][:n].tolist()
    leaky = torch.tensor(scorer.score([seq], [len(prompt)], 1, 0)[0].actual)
    start, end = spans[1]
    assert (leaky[start:end] - actual[start:end].float()).abs().max() > 2e-2


def test_an_optimizer_step_with_hints_and_distillation_through_a_summary(tool_tok, tmp_path):
    trainer, _ = build(tool_tok, tmp_path, "dapo", max_steps=1, rewards=Verdicts(),
                       channels=channels(len(tool_tok)))  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = next(h for h in trainer.state.log_history if "rollout/summaries" in h)
    assert logs["rollout/summaries"] == 0.5
    for name in ("sdpo", "distill"):
        assert logs[f"{name}/active"] == 1.0 and logs[f"{name}/num_tokens"] > 0, name
        assert abs(logs[f"{name}/loss"]) > 0, name
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
