"""The self-distillation channel on a case with a known answer.

A tiny untied Llama whose only trainable weight is its LM head ``W``. One problem, every reply
one token long and wrong (so GRPO's advantages, and the policy loss's gradient, are 0), the
hint a fixed text. The student's and the hinted teacher's hidden states at the answer position,
``h_S`` and ``h_T``, are fixed (the backbone is frozen). ``W``'s row of the right token is set so
that the hinted teacher gives it ``c`` more logit than the student: the teacher knows better.

With the channel's divergence the forward KL (``sdpo.loss.beta=0``), the gradient of
``KL(p_T || p_S)`` w.r.t. the student's logits is ``p_S - p_T``, so w.r.t. ``W`` it is
``g = weight * (p_S - p_T) h_S^T`` (every row identical, the channel's mean over them). AdamW's
first step (no weight decay, no clipping) is ``dW = -lr * g / (|g| + eps)``, so the student's
logits move by ``dW h_S`` and ``log p_S(right)`` by a predictable amount, which must be positive.
The test checks ``dW`` entry by entry where the gradient is clearly non-zero (there the step is
``lr * sign``), the log-prob change against the prediction, and a control: with
``sdpo.weight=0`` nothing moves.
"""

from __future__ import annotations

import pytest
import torch
from support.constructed_sdpo import EPS, LR, adam_first_step, setup_case, train_one_step


@pytest.fixture(scope="module")
def weight_one_step(tmp_path_factory, tokenizer):
    """The constructed case trained one step at ``sdpo.weight=1`` (shared by two tests)."""
    cfg, env, model, h_S, states, right = setup_case(
        tmp_path_factory.mktemp("w1"), tokenizer, weight=1.0
    )
    W0 = model.lm_head.weight.detach().clone()
    p_S, p_T = torch.softmax(W0 @ h_S, -1), torch.softmax(W0 @ states["wrong"], -1)
    before, after, trainer = train_one_step(cfg, env, model, tokenizer)
    return h_S, right, p_S, p_T, before, after, trainer


def test_one_step_moves_the_right_token_up_by_the_predicted_amount(weight_one_step):
    h_S, right, p_S, p_T, before, after, trainer = weight_one_step
    assert p_T[right] > 5 * p_S[right]  # the constructed gap
    rewards = [r["reward"] for r in trainer.state.log_history if "reward" in r]
    assert rewards == [0.0]  # every reply wrong: GRPO contributes no gradient

    g, dW_pred = adam_first_step(p_S, p_T, h_S)
    dW = after - before
    # Where |g| >> eps Adam's first step is lr * sign(g): those entries must match exactly. The
    # rest are vocabulary entries where p_S and p_T agree to ~1e-7 (the trainer's batched
    # forward and ours differ at that level), so only their bound holds.
    clear = g.abs() > 100 * EPS
    assert clear[right].all()
    torch.testing.assert_close(dW[clear], dW_pred[clear], rtol=5e-3, atol=1e-7)
    assert dW.abs().max() <= LR * (1 + 1e-4)

    logp0 = torch.log_softmax(before @ h_S, -1)[right]
    logp1 = torch.log_softmax(after @ h_S, -1)[right]
    pred = torch.log_softmax((before + dW_pred) @ h_S, -1)[right]
    assert logp1 - logp0 > 0.05
    print(f"log p(right): {logp0:.4f} -> {logp1:.4f}, predicted {pred:.4f}")
    assert (logp1 - logp0).item() == pytest.approx((pred - logp0).item(), rel=2e-2)


def test_control_without_the_channel_nothing_moves(tmp_path, tokenizer):
    cfg, env, model, *_ = setup_case(tmp_path, tokenizer, weight=0.0)
    before, after, _ = train_one_step(cfg, env, model, tokenizer)
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_the_weight_does_not_set_the_step_when_the_channel_is_the_only_gradient(
    tmp_path, tokenizer, weight_one_step
):
    """Why a small ``sdpo.weight`` is no protection in the sparse regime (docs/results.md,
    regime (b)): with every reply wrong the policy loss's gradient is 0, and Adam's update
    ``m / (sqrt(v) + eps)`` is invariant to the scale of the only gradient left. So the channel
    at weight 0.1 takes the same lr-sized first step as at weight 1 (where ``|g| >> eps``)."""
    h_S, _, p_S, p_T, before_1, after_1, _ = weight_one_step
    g, _ = adam_first_step(p_S, p_T, h_S)  # at weight 1; at 0.1 it is 0.1 * g
    clear = g.abs() > 1000 * EPS
    cfg, env, model, *_ = setup_case(tmp_path, tokenizer, weight=0.1)
    before, after, _ = train_one_step(cfg, env, model, tokenizer)
    torch.testing.assert_close(before, before_1, rtol=0, atol=0)  # the same starting point
    dW_1, dW_01 = after_1 - before_1, after - before
    assert clear.sum() > 10
    assert dW_1[clear].abs().min() > 0.99 * LR  # a full lr-sized step per entry...
    torch.testing.assert_close(dW_01[clear], dW_1[clear], rtol=1e-2, atol=0)  # ...at 0.1 too
