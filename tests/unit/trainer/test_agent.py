"""Multi-turn tool rollouts in ComposerReplicationTrainer (a scripted tiny model that calls
``calculate`` and then answers): every channel runs on tool batches, self-distillation is
pinned to the turn the verifier blamed, and tool-result tokens carry no gradient of any loss."""

from __future__ import annotations

import copy

import pytest
import torch
from support.generation import forward_logprobs
from support.scripted_agent import scripted_calculator_model

from composer_replication.config import load_config
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.rollout import turn_index
from composer_replication.run.train import build_env, build_trainer
from composer_replication.trainer.callbacks import read_metrics


def _cfg(tmp_path, *extra):
    return load_config(
        "agent_quickstart.yaml",
        [
            f"output_dir={tmp_path / 'run'}",
            "max_steps=2",
            "num_threads=1",
            "optim.warmup_steps=0",
            "generation.num_generations=2",
            "generation.prompts_per_step=2",
            "generation.max_completion_length=64",
            "env.num_train=8",
            "eval.before_and_after=false",
            *extra,
        ],
    )


@pytest.fixture
def agent(tokenizer, tmp_path):
    """(cfg, trainer) for the agent quickstart with all three channels on."""
    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    cfg = _cfg(tmp_path, "alpha_sdpo=0.5", "beta_replay=0.5", "sdpo.hint_sources=[feedback]")
    trainer = build_trainer(cfg, scripted_calculator_model(tok), tok, build_env(cfg))
    return cfg, trainer


def test_agent_config_trains_with_tools_and_every_channel(agent):
    cfg, trainer = agent
    trainer.train()
    rows = read_metrics(f"{cfg.output_dir}/metrics.jsonl")
    assert len(rows) == 2
    for row in rows:
        assert row["tools/call_frequency"] == 1.0  # one call per rollout, then the answer
        assert row["rollout/turns"] == 2.0
        assert row["sdpo/active"] == 1.0 and row["sdpo/num_tokens"] > 0
        assert row["sdpo/turn_hinted_frac"] > 0 and row["sdpo/hint_turn_mean"] == 1.0
        assert row["replay/active"] == 1.0 and row["replay/loss"] > 0


def _scored_batch(trainer):
    rows = [trainer.train_dataset[i] for i in range(2)]
    trainer.model.train()
    batch = trainer._generate_and_score_completions([r for r in rows for _ in range(2)])
    assert (batch["tool_mask"] == 0).any(), "the scripted rollouts made no tool call"
    return batch


def _assert_logprobs_are_the_generations_own(trainer, batch) -> None:
    """TRL's tool loop generates every turn through the trainer's generator: each model
    token's sampling log-prob (``sampling_per_token_logps``, 0 on tool-result tokens) is the
    generation's own, equal to a fresh forward's ``log_softmax(logits / T)``."""
    lps_BK = batch["sampling_per_token_logps"]
    own_BK = (batch["completion_mask"] * batch["tool_mask"]).bool()
    checked = 0
    for b in range(lps_BK.shape[0]):
        prompt = batch["prompt_ids"][b][batch["prompt_mask"][b].bool()].tolist()
        completion = batch["completion_ids"][b][batch["completion_mask"][b].bool()].tolist()
        want = forward_logprobs(trainer.model, prompt, completion, trainer.temperature)
        mask = own_BK[b, : len(completion)]
        torch.testing.assert_close(lps_BK[b, : len(completion)][mask], want[mask],
                                   atol=1e-5, rtol=1e-5)  # fmt: skip
        assert (lps_BK[b, : len(completion)][~mask] == 0).all()
        checked += int(mask.sum())
    assert checked > 0 and (~own_BK & batch["completion_mask"].bool()).any()


def test_sdpo_mask_is_the_blamed_turn_only_and_logprobs_are_the_generations(agent):
    _, trainer = agent
    batch = _scored_batch(trainer)
    _assert_logprobs_are_the_generations_own(trainer, batch)  # (a fixture's setup saved)
    sdpo = trainer.channel("sdpo")
    index = turn_index(batch["tool_mask"], batch["completion_mask"])
    blamed = batch["sdpo_turn"]
    assert (blamed[batch["sdpo_hinted"]] == 1).all()  # "answered 13936, expected ..." at turn 1
    mask = sdpo.token_mask(batch)
    assert mask.any() and (index[mask] == 1).all()  # nothing of turn 0, no tool token
    sdpo.cfg = sdpo.cfg.model_copy(update={"turn_scope": "all"})
    wide = sdpo.token_mask(batch)
    assert (index[wide] >= 0).all() and (index[wide] == 0).any()  # both turns, still no tool token


def _loss_and_grads(trainer, batch, replay_state):
    """Loss and flat gradient of one micro-batch; the replay channel draws the same pairs
    each time (its draw is per optimizer step, so rewind it)."""
    replay = trainer.channel("replay")
    replay.rng.setstate(replay_state)
    replay._step_of_chunks = -1
    model = trainer.model
    model.zero_grad()
    loss = trainer._compute_loss(model, batch)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return float(loss), grads


def test_tool_result_tokens_carry_no_gradient(agent):
    """Keep turn 0 and the tool result after it in the loss (turn 1 masked out of the
    completion), give the rows non-zero advantages and pin distillation to turn 0: changing
    the tool-result tokens must change neither the loss nor any gradient (policy, self-
    distillation; replay pairs come from logs, not rollouts). Control: with the tool mask
    switched off the same change does move the gradients, so the test can fail."""
    _, trainer = agent
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop in real training
    batch = _scored_batch(trainer)
    index = turn_index(batch["tool_mask"], batch["completion_mask"])
    tool = (batch["tool_mask"] == 0) & (batch["completion_mask"] == 1)
    first_tool = tool.float().argmax(dim=1)
    after = torch.arange(tool.shape[1])[None, :] >= first_tool[:, None]
    batch["completion_mask"] = batch["completion_mask"] * ~(after & (index >= 1))
    n = len(batch["advantages"])  # rows of a group are identical here: unequal advantages
    batch["advantages"] = torch.linspace(1.0, 2.0, n)
    batch["sdpo_turn"] = torch.zeros_like(batch["sdpo_turn"])
    batch["sdpo_hinted"] = torch.ones_like(batch["sdpo_hinted"])
    perturbed = dict(batch)
    ids = batch["completion_ids"].clone()
    ids[tool] = (ids[tool] + 17) % 1000 + 100
    perturbed["completion_ids"] = ids
    state = trainer.channel("replay").rng.getstate()
    loss_a, grads_a = _loss_and_grads(trainer, batch, state)
    loss_b, grads_b = _loss_and_grads(trainer, perturbed, state)
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    scale = float(grads_a.abs().max())
    assert scale > 0
    torch.testing.assert_close(grads_a, grads_b, atol=1e-5 * scale, rtol=0)
    unmasked = {k: (torch.ones_like(v) if k == "tool_mask" else v) for k, v in batch.items()}
    control = {**unmasked, "completion_ids": ids}
    _, grads_c = _loss_and_grads(trainer, unmasked, state)
    _, grads_d = _loss_and_grads(trainer, control, state)
    assert (grads_c - grads_d).abs().max() > 1e-2 * scale


def test_contrast_teacher_on_tool_rollouts(tokenizer, tmp_path):
    """``sdpo.contrast=placebo`` on multi-turn rollouts: the placebo goes where the hint goes,
    in the calculator's own content-free form ("turn 1 went wrong"). A placebo equal to the
    hint makes the teacher the student: the loss is then the policy loss alone (the same as
    with no hinted row), while the real placebo adds a distillation term."""
    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    cfg = _cfg(tmp_path, "alpha_sdpo=0.5", "sdpo.hint_sources=[feedback]", "sdpo.contrast=placebo")
    trainer = build_trainer(cfg, scripted_calculator_model(tok), tok, build_env(cfg))
    trainer.current_gradient_accumulation_steps = 1
    batch = _scored_batch(trainer)
    hinted = batch["sdpo_hinted"]
    assert hinted.any()
    placebo = tok.decode(batch["sdpo_placebo_ids"][hinted][0])
    assert "turn 1 went wrong" in placebo and "turn 1: answered" not in placebo
    same = {**batch, "sdpo_placebo_ids": batch["sdpo_prompt_ids"],
            "sdpo_placebo_mask": batch["sdpo_prompt_mask"]}  # fmt: skip
    none = {**batch, "sdpo_hinted": torch.zeros_like(hinted)}
    with torch.no_grad():
        real, equal, policy = (
            float(trainer._compute_loss(trainer.model, b)) for b in (batch, same, none)
        )
    # the scripted turns are near one-hot in every context, so the real term is small (6e-8
    # measured) but present, and the equal placebo's is exactly 0
    assert abs(equal - policy) < 1e-3 * abs(real - policy)
