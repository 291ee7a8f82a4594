"""SelfDistillChannel's teacher weights: ``initial`` is the model before any update (a frozen
copy, or with LoRA the adapter disabled), ``live`` the current policy, in training mode with
TRL's default gradient checkpointing on (which once made the prefix-cache forward drop the
shared prompt: these tests caught it)."""

from __future__ import annotations

import copy

import pytest
import torch

from composer_replication.channels.base import Rollouts
from composer_replication.channels.self_distill import SelfDistillChannel
from composer_replication.config import PeftConfig, SdpoConfig, load_config
from composer_replication.envs.arithmetic import grade_answer
from composer_replication.lm.models import apply_lora, backbone
from composer_replication.run.train import build_env, build_trainer


def _cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            "max_steps=1",
            "optim.warmup_steps=0",
            "optim.learning_rate=5e-2",  # one step moves the policy visibly
            "generation.num_generations=4",
            "generation.prompts_per_step=2",
            "generation.max_completion_length=4",
            "env.num_train=8",
            "env.levels=[3]",
            "sdpo.weight=1.0",
            "sdpo.hint_sources=[feedback]",
            *extra,
        ],
    )


def _teacher_and_reference(cfg, model, reference, tokenizer):
    """Train one step, then the teacher's states on a fresh scored batch and the states of
    ``reference`` (a plain forward of the same hinted inputs, no cache)."""
    trainer = build_trainer(cfg, model, tokenizer, build_env(cfg))
    trainer.train()
    rows = [trainer.train_dataset[i] for i in range(2)]
    batch = trainer._generate_and_score_completions([r for r in rows for _ in range(4)])
    hinted = batch["sdpo_hinted"].nonzero().squeeze(1)
    teacher, _ = trainer.channel("sdpo").teacher_states(trainer.model, batch, hinted)
    ids = torch.cat([batch["sdpo_prompt_ids"][hinted], batch["completion_ids"][hinted]], 1)
    mask = torch.cat([batch["sdpo_prompt_mask"][hinted], batch["completion_mask"][hinted]], 1)
    k = batch["completion_ids"].shape[1]
    pos = (mask.cumsum(1) - 1).clamp(min=0)  # positions count real tokens only, like the teacher
    with torch.no_grad():
        ref = backbone(reference)(input_ids=ids, attention_mask=mask, position_ids=pos)
        ref = ref.last_hidden_state
    keep = batch["completion_mask"][hinted].bool()
    return teacher[keep], ref[:, -k - 1 : -1][keep]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_initial_teacher_is_the_model_before_training(tmp_path, tokenizer, tiny_model, lora):
    initial = copy.deepcopy(tiny_model).eval()
    model = apply_lora(tiny_model, PeftConfig(enabled=True, r=4, alpha=8)) if lora else tiny_model
    cfg = _cfg(tmp_path, "sdpo.teacher=initial")
    teacher, ref = _teacher_and_reference(cfg, model, initial, tokenizer)
    torch.testing.assert_close(teacher, ref, rtol=1e-4, atol=1e-4)
    live, _ = _teacher_and_reference(
        _cfg(tmp_path / "live", "sdpo.teacher=live"), model, initial, tokenizer
    )
    assert not torch.allclose(live, ref, atol=1e-3)  # the live policy has moved away


def test_live_teacher_in_training_mode_sees_the_whole_prompt(tmp_path, tokenizer, tiny_model):
    """The live teacher, called in training mode after a step (TRL turned gradient
    checkpointing on), equals a plain forward of the same model on prompt + completion."""
    cfg = _cfg(tmp_path, "sdpo.teacher=live", "optim.gradient_checkpointing=true")
    trainer = build_trainer(cfg, tiny_model, tokenizer, build_env(cfg))
    trainer.train()
    assert any(getattr(m, "gradient_checkpointing", False) for m in tiny_model.modules())
    tiny_model.train()
    teacher, ref = _teacher_and_reference(
        _cfg(tmp_path / "again", "sdpo.teacher=live", "max_steps=1"),
        tiny_model,
        tiny_model,
        tokenizer,
    )
    torch.testing.assert_close(teacher, ref, rtol=1e-4, atol=1e-4)


def test_rows_the_machine_failed_get_no_hint(tokenizer):
    """A masked row (trainer/masking.py ``infra_masked``) is no failure of the policy: no hint,
    no teacher forward; the other failures of the batch are hinted as before."""
    ch = SelfDistillChannel(SdpoConfig(weight=0.1, hint_sources=["feedback"]))
    ch.tokenizer = tokenizer
    replies = ["7", "8", "9", "6"]
    results = [grade_answer(r, 7) for r in replies]
    batch = {
        "completion_ids": torch.zeros(4, 2, dtype=torch.long),
        "advantages": torch.zeros(4),
        "infra_masked": torch.tensor([False, True, False, False]),
    }
    rollouts = Rollouts(["What is 3 + 4?"] * 4, replies, results, group_size=2)
    assert ch.attach(batch, rollouts)["sdpo_hinted"].tolist() == [False, False, True, True]
