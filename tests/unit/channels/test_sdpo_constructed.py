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
from transformers import LlamaConfig, LlamaForCausalLM

from composer_replication.chat import as_messages, render_prompt
from composer_replication.config import load_config
from composer_replication.hints.build import HintTemplates, insert_hint
from composer_replication.trainer.run import build_env, build_trainer

LR, EPS, C = 1e-2, 1e-8, 4.0


def _cfg(tmp_path, weight: float):
    return load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            "max_steps=1",
            f"optim.learning_rate={LR}",
            "optim.warmup_steps=0",
            "optim.weight_decay=0",
            "optim.max_grad_norm=1e9",
            "optim.gradient_checkpointing=false",
            "generation.num_generations=4",
            "generation.prompts_per_step=1",
            "generation.max_completion_length=1",
            "env.num_train=1",
            "env.levels=[3]",
            f"sdpo.weight={weight}",
            "sdpo.hint_sources=[feedback]",
            "sdpo.feedback_form=wrong",
            "sdpo.loss.beta=0",
            "eval.before_and_after=false",
        ],
    )


def _untied_tiny(vocab: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg)
    for name, p in model.named_parameters():
        p.requires_grad_(name == "lm_head.weight")
    return model


@torch.no_grad()
def _last_hidden(model, tokenizer, messages) -> torch.Tensor:
    ids = tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]
    return model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]


def _setup(tmp_path, tokenizer, weight: float):
    cfg = _cfg(tmp_path, weight)
    env = build_env(cfg)
    task = env.tasks("train")[0]
    model = _untied_tiny(len(tokenizer))
    hint = HintTemplates(feedback=cfg.sdpo.feedback_template).feedback.format(
        feedback=env.grade(task, "0").info["feedback_forms"]["wrong"]
    )
    plain = as_messages(task.prompt)
    h_S = _last_hidden(model, tokenizer, plain)
    h_T = _last_hidden(model, tokenizer, insert_hint(plain, hint))
    right = tokenizer(str(task.data["answer"]), add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():  # the teacher knows better: +C logit on the right token
        d = h_T - h_S
        model.lm_head.weight[right] += C * d / d.dot(d)
    return cfg, env, model, h_S, h_T, right


def _train_one_step(cfg, env, model, tokenizer):
    before = model.lm_head.weight.detach().clone()
    trainer = build_trainer(cfg, model, tokenizer, env)
    trainer.train()
    return before, model.lm_head.weight.detach().clone(), trainer


def test_one_step_moves_the_right_token_up_by_the_predicted_amount(tmp_path, tokenizer):
    cfg, env, model, h_S, h_T, right = _setup(tmp_path, tokenizer, weight=1.0)
    W0 = model.lm_head.weight.detach().clone()
    p_S, p_T = torch.softmax(W0 @ h_S, -1), torch.softmax(W0 @ h_T, -1)
    assert p_T[right] > 5 * p_S[right]  # the constructed gap
    before, after, trainer = _train_one_step(cfg, env, model, tokenizer)
    rewards = [r["reward"] for r in trainer.state.log_history if "reward" in r]
    assert rewards == [0.0]  # every reply wrong: GRPO contributes no gradient

    g = torch.outer(p_S - p_T, h_S)
    dW_pred = -LR * g / (g.abs() + EPS)
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
    cfg, env, model, *_ = _setup(tmp_path, tokenizer, weight=0.0)
    before, after, _ = _train_one_step(cfg, env, model, tokenizer)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
