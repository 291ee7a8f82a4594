"""The placebo-contrast teacher (``sdpo.contrast: placebo``) on the constructed case.

The same tiny model as test_sdpo_constructed.py: only the LM head ``W`` trains, every reply is
one wrong token (GRPO's gradient is 0). The hint is the ``direction`` form ("0 is too small");
the placebo is the ``wrong`` form in the same template. The grader's forms are pinned to
those of the reply "0", so the trainer's hint is the one the case is built on whatever the
random model replies. The right token's row of ``W`` is set
so that the hinted context gives it ``C`` more logit than the placebo context. The contrast
teacher's logits are ``W (h_S + h_H - h_P)``, so with the forward KL AdamW's first step is
predicted from ``p_T = softmax(W (h_S + h_H - h_P))``. Controls: a hint equal to the placebo
(form ``wrong``) is no signal, nothing moves; without the contrast the same hint does move it.
"""

from __future__ import annotations

import pytest
import torch
from support.constructed_sdpo import adam_first_step, setup_case, train_one_step

CONTRAST = ("sdpo.contrast=placebo", "sdpo.feedback_form=direction")


def _pin_feedback(env) -> None:
    """Every verdict carries the feedback forms of the reply "0" ("0 is too small")."""
    fixed = env.grade(env.tasks("train")[0], "0").info["feedback_forms"]
    grade_batch = env.grade_batch

    def pinned(tasks, texts):
        results = grade_batch(tasks, texts)
        for r in results:
            r.info["feedback_forms"] = dict(fixed)
        return results

    env.grade_batch = pinned


def test_contrast_teacher_moves_the_right_token_by_the_predicted_amount(tmp_path, tokenizer):
    cfg, env, model, h_S, states, right = setup_case(
        tmp_path, tokenizer, 1.0, CONTRAST, lift=("direction", "wrong")
    )
    W0 = model.lm_head.weight.detach().clone()
    p_S = torch.softmax(W0 @ h_S, -1)
    p_T = torch.softmax(W0 @ (h_S + states["direction"] - states["wrong"]), -1)
    assert p_T[right] > 5 * p_S[right]
    _pin_feedback(env)
    before, after, trainer = train_one_step(cfg, env, model, tokenizer)
    assert [r["reward"] for r in trainer.state.log_history if "reward" in r] == [0.0]
    g, dW_pred = adam_first_step(p_S, p_T, h_S)
    dW = after - before
    clear = g.abs() > 1e-6
    assert clear[right].all()
    torch.testing.assert_close(dW[clear], dW_pred[clear], rtol=5e-3, atol=1e-7)
    logp0 = torch.log_softmax(before @ h_S, -1)[right]
    logp1 = torch.log_softmax(after @ h_S, -1)[right]
    pred = torch.log_softmax((before + dW_pred) @ h_S, -1)[right]
    assert logp1 - logp0 > 0.05
    # Looser than the plain teacher's 2%: here p_T differs from p_S at every vocabulary entry
    # (h_H - h_P moves all logits), by < 1e-6 on all but the right token's row, where float32
    # rounding of two 49k-way softmaxes decides the sign of Adam's unit step (measured: 0.271
    # vs 0.252; with the clear entries predicted and the rest as the trainer moved them, exact).
    assert (logp1 - logp0).item() == pytest.approx((pred - logp0).item(), rel=0.15)
    mixed = torch.where(clear, before + dW_pred, after)
    assert torch.log_softmax(mixed @ h_S, -1)[right].item() == pytest.approx(logp1.item(), abs=1e-4)


def test_a_hint_equal_to_the_placebo_teaches_nothing(tmp_path, tokenizer):
    """Form ``wrong`` is the placebo itself: the contrast teacher is the student, the
    divergence 0 on every token, and nothing moves. Without the contrast it moves."""
    cfg, env, model, *_ = setup_case(tmp_path / "c", tokenizer, 1.0, ("sdpo.contrast=placebo",))
    before, after, _ = train_one_step(cfg, env, model, tokenizer)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    cfg, env, model, *_ = setup_case(tmp_path / "p", tokenizer, 1.0)
    before, after, _ = train_one_step(cfg, env, model, tokenizer)
    assert (after - before).abs().max() > 1e-3
