"""The constructed case of channel 2 (tests/unit/channels/test_sdpo_constructed.py and
test_sdpo_contrast.py): a tiny untied Llama whose only trainable weight is its LM head, one
arithmetic problem, one-token replies that are all wrong, and a fixed hint."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from composer_replication.channels.hints import HintTemplates, insert_hint
from composer_replication.config import load_config
from composer_replication.lm.chat import as_messages, render_prompt
from composer_replication.run.train import build_env, build_trainer

LR, EPS, C = 1e-2, 1e-8, 4.0


def constructed_cfg(tmp_path, weight: float, extra: tuple[str, ...] = ()):
    """One optimizer step of AdamW (no decay, no clipping) on 4 one-token replies."""
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
            *extra,
        ],
    )


def untied_tiny(vocab: int) -> LlamaForCausalLM:
    """A 2-layer Llama with an untied LM head, the only weight that trains."""
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
def last_hidden(model, tokenizer, messages) -> torch.Tensor:
    """The backbone's last hidden state at the answer position after ``messages``."""
    ids = tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]
    return model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]


def hint_for(cfg, env, task, form: str) -> str:
    """The channel's hint text of ``form`` for a wrong reply to ``task``."""
    return HintTemplates(feedback=cfg.sdpo.feedback_template).feedback.format(
        feedback=env.grade(task, "0").info["feedback_forms"][form]
    )


def setup_case(
    tmp_path, tokenizer, weight: float, extra: tuple[str, ...] = (), lift=("wrong", None)
):
    """(cfg, env, model, h_S, states, right): the LM-head row of the right token is raised so
    that the context hinted with form ``lift[0]`` gives it ``C`` more logit than the one hinted
    with ``lift[1]`` (None: the student's, no hint). ``states`` maps a form (or None) to the
    hidden state at the answer position."""
    cfg = constructed_cfg(tmp_path, weight, extra)
    env = build_env(cfg)
    task = env.tasks("train")[0]
    model = untied_tiny(len(tokenizer))
    plain = as_messages(task.prompt)
    forms = {f for f in lift if f is not None} | {"wrong"}
    states = {None: last_hidden(model, tokenizer, plain)}
    for f in forms:
        states[f] = last_hidden(model, tokenizer, insert_hint(plain, hint_for(cfg, env, task, f)))
    right = tokenizer(str(task.data["answer"]), add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        d = states[lift[0]] - states[lift[1]]
        model.lm_head.weight[right] += C * d / d.dot(d)
    return cfg, env, model, states[None], states, right


def train_one_step(cfg, env, model, tokenizer):
    """(LM head before, after, the trainer) of one real trainer step."""
    before = model.lm_head.weight.detach().clone()
    trainer = build_trainer(cfg, model, tokenizer, env)
    trainer.train()
    return before, model.lm_head.weight.detach().clone(), trainer


def adam_first_step(
    p_S: torch.Tensor, p_T: torch.Tensor, h_S: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the forward-KL gradient ``(p_S - p_T) h_S^T`` w.r.t. the head, AdamW's first step on it)."""
    g = torch.outer(p_S - p_T, h_S)
    return g, -LR * g / (g.abs() + EPS)
