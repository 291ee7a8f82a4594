"""The distillation channel on a case with a known answer (the issue-17 construction of
tests/support/constructed_sdpo.py, with a separate teacher model instead of a hint).

A tiny untied Llama whose only trainable weight is its LM head ``W``; one problem, every reply
one token long and wrong (GRPO's advantages, and the policy loss's gradient, are 0). The
teacher is a frozen copy of the student whose LM-head row of the right token is raised by
``C d / |d|^2`` with ``d = h_S``: at the answer position the teacher gives the right token
``C = 4`` more logit than the student, and agrees with it elsewhere (same backbone).

**Forward KL over the full vocabulary** (``distill.loss.type=jsd``, ``beta=0``, a local
teacher): the gradient of ``KL(p_T || p_S)`` w.r.t. the student's logits is ``p_S - p_T``, so
w.r.t. ``W`` it is ``g = (p_S - p_T) h_S^T`` (the 4 rows are identical; the channel takes their
mean). AdamW's first step (no decay, no clipping) is ``dW = -lr g / (|g| + eps)``: where
``|g| >> eps`` the step is ``lr * sign(-g)`` exactly. ``p_T(right) > 5 p_S(right)`` so the
right row moves up by ``lr`` per entry along ``sign(h_S)``, and ``log p_S(right)`` rises by the
predicted amount: -10.908 -> -10.455, predicted -10.455 (run of 2026-11-26).

**Sampled reverse KL** (``reverse_kl``): per row ``r`` with sampled token ``y_r`` the gradient
w.r.t. the logits is ``-A_r (e_{y_r} - p_S)`` with ``A_r = log p_T(y_r) - log p_S(y_r) < 0``
(the teacher moved mass to the right token, so it likes every wrong token a little less): the
sampled tokens' rows move down. ``g = mean_r -A_r (e_{y_r} - p_S) h_S^T``; the same AdamW
prediction holds entry by entry where ``|g| >> eps``.

Control: ``distill.weight=0`` moves nothing, and builds no channel.
"""

from __future__ import annotations

import copy

import pytest
import torch
from support.constructed_sdpo import EPS, LR, constructed_cfg, last_hidden, untied_tiny

from composer_replication.lm.chat import as_messages
from composer_replication.run.train import build_env, build_trainer

C = 4.0


def _case(tmp_path, tokenizer, weight: float, loss: str):
    extra = (
        f"distill.weight={weight}",
        f"distill.loss.type={loss}",
        "distill.loss.beta=0" if loss == "jsd" else "distill.budget_usd=null",
        "distill.teachers=[{name: teacher, model: constructed}]",
    )
    cfg = constructed_cfg(tmp_path, 0.0, extra)
    env = build_env(cfg)
    task = env.tasks("train")[0]
    model = untied_tiny(len(tokenizer))
    h_S = last_hidden(model, tokenizer, as_messages(task.prompt))
    right = tokenizer(str(task.data["answer"]), add_special_tokens=False)["input_ids"][0]
    teacher = copy.deepcopy(model)
    with torch.no_grad():
        teacher.lm_head.weight[right] += C * h_S / h_S.dot(h_S)
    return cfg, env, model, teacher, h_S, right


def _train(cfg, env, model, teacher, tokenizer):
    """(W before, W after, the rows' sampled tokens, the trainer) of one real trainer step."""
    before = model.lm_head.weight.detach().clone()
    trainer = build_trainer(cfg, model, tokenizer, env,
                            channel_kwargs={"distill": {"models": {"teacher": teacher}}})  # fmt: skip
    sampled = []
    channel = trainer.channel("distill")
    if channel is not None:
        attach = channel.attach

        def spy(batch, rollouts):
            sampled.extend(batch["completion_ids"][:, 0].tolist())
            return attach(batch, rollouts)

        channel.attach = spy
    trainer.train()
    return before, model.lm_head.weight.detach().clone(), sampled, trainer


def _check_adam_step(g, before, after, h_S, right):
    """dW equals AdamW's first step where |g| >> eps; returns log p(right) before/after/predicted."""
    pred = -LR * g / (g.abs() + EPS)
    dW = after - before
    clear = g.abs() > 100 * EPS
    assert clear.sum() > 10
    torch.testing.assert_close(dW[clear], pred[clear], rtol=5e-3, atol=1e-7)
    assert dW.abs().max() <= LR * (1 + 1e-4)
    lp = [torch.log_softmax(w @ h_S, -1)[right].item() for w in (before, after, before + pred)]
    return lp


def test_forward_kl_from_a_local_teacher_moves_the_right_token_up_by_the_predicted_amount(
    tmp_path, tokenizer
):
    cfg, env, model, teacher, h_S, right = _case(tmp_path, tokenizer, 1.0, "jsd")
    W0 = model.lm_head.weight.detach().clone()
    p_S = torch.softmax(W0 @ h_S, -1)
    p_T = torch.softmax(teacher.lm_head.weight.detach() @ h_S, -1)
    assert p_T[right] > 5 * p_S[right]  # the constructed gap: the teacher knows better
    before, after, _, trainer = _train(cfg, env, model, teacher, tokenizer)
    rows = [r for r in trainer.state.log_history if "distill/active" in r]
    assert rows and rows[0]["distill/active"] == 1.0 and rows[0]["reward"] == 0.0
    assert rows[0]["distill/teacher/teacher/rows"] == 4.0
    g = torch.outer(p_S - p_T, h_S)
    assert (g[right].abs() > 100 * EPS).all()
    lp0, lp1, pred = _check_adam_step(g, before, after, h_S, right)
    print(f"log p(right): {lp0:.4f} -> {lp1:.4f}, predicted {pred:.4f}")
    assert lp1 - lp0 > 0.05
    assert lp1 - lp0 == pytest.approx(pred - lp0, rel=2e-2)


def test_sampled_reverse_kl_pushes_the_sampled_wrong_tokens_down_by_the_predicted_amount(
    tmp_path, tokenizer
):
    cfg, env, model, teacher, h_S, right = _case(tmp_path, tokenizer, 1.0, "reverse_kl")
    W0 = model.lm_head.weight.detach().clone()
    logp_S = torch.log_softmax(W0 @ h_S, -1)
    logp_T = torch.log_softmax(teacher.lm_head.weight.detach() @ h_S, -1)
    before, after, sampled, _ = _train(cfg, env, model, teacher, tokenizer)
    assert len(sampled) == 4 and right not in sampled  # every reply wrong
    p_S = logp_S.exp()
    g = torch.zeros_like(W0)
    for y in sampled:
        adv = (logp_T[y] - logp_S[y]).item()
        assert adv < 0  # the teacher likes each wrong token less than the student does
        e_y = torch.zeros_like(p_S)
        e_y[y] = 1.0
        g += torch.outer(-adv * (e_y - p_S), h_S) / len(sampled)
    _check_adam_step(g, before, after, h_S, right)
    for y in set(sampled):
        assert torch.log_softmax(after @ h_S, -1)[y] < logp_S[y]  # each sampled token went down


def test_control_weight_zero_moves_nothing_and_builds_no_channel(tmp_path, tokenizer):
    cfg, env, model, teacher, *_ = _case(tmp_path, tokenizer, 0.0, "jsd")
    before, after, _, trainer = _train(cfg, env, model, teacher, tokenizer)
    assert trainer.channel("distill") is None
    torch.testing.assert_close(after, before, rtol=0, atol=0)
