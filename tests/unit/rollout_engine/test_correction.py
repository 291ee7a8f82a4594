"""The off-policy correction of ``rollout.engine: ray`` through the trainer's real code (TRL's
scoring and loss, switched on by ``_take_rollouts_from``): a hand-computed ratio and loss, and
a ratio of 1 at staleness 0 for groups the worker's generator made."""

from __future__ import annotations

import math

import pytest
import torch
from support.scripted_rollouts import ScriptedRollouts

from composer_replication.config import load_config
from composer_replication.envs import get_env
from composer_replication.lm.generator import Generator, Sampling
from composer_replication.rollout_engine.group import GroupRecord, Rollout, Sequence
from composer_replication.rollout_engine.learner import WorkerReward
from composer_replication.run.train import build_grpo_args
from composer_replication.trainer.data import build_prompt_dataset
from composer_replication.trainer.trainer import ComposerReplicationTrainer

PROMPT = [1, 2, 3]


def _trainer(tmp_path, model, tokenizer, source, *extra):
    cfg = load_config(None, [
        f"output_dir={tmp_path}", "max_steps=1", "generation.num_generations=2",
        "generation.prompts_per_step=1", "generation.max_completion_length=4",
        "grpo.mask_truncated_completions=false", "rollout.engine=ray", "env.num_train=4",
        "optim.gradient_checkpointing=false", *extra,
    ])  # fmt: skip
    env = get_env("arithmetic", levels=[1])
    trainer = ComposerReplicationTrainer(
        model=model, reward_funcs=[WorkerReward("arithmetic")], args=build_grpo_args(cfg),
        train_dataset=build_prompt_dataset(env, "train", 4, 0, conversational=True),
        processing_class=tokenizer, rollout_source=source,
    )  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1
    model.train()
    return trainer


def _logps(model, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    lp = logits[len(prompt) - 1 : -1].log_softmax(-1)
    return lp[torch.arange(len(completion)), torch.tensor(completion)].tolist()


def _group(completions, behaviour, rewards, version=0) -> GroupRecord:
    rollouts = [
        Rollout([Sequence(PROMPT, c, b, [1] * len(c), [version])], r)
        for c, b, r in zip(completions, behaviour, rewards, strict=True)
    ]
    return GroupRecord(0, "t", {"prompt": [{"role": "user", "content": "1+1"}], "task_id": "t"},
                       rollouts)  # fmt: skip


def test_the_decoupled_ratio_and_loss_by_hand(tmp_path, tokenizer, tiny_model):
    """Two rollouts of two tokens, rewards 1 and 0. Behaviour log-probs are the learner's
    minus log 1.5 and log 3 (rollout 0) and plus log 2 and 0 (rollout 1), so
    ``pi_old / pi_behav`` is 1.5, 3, 0.5, 1; truncated at C = 2: 1.5, 2, 0.5, 1.
    Advantages: (r - 0.5) / (std + 1e-4) with the unbiased std of (1, 0), 0.70711: +-0.70700.
    Before any update ``pi_theta = pi_old``, so PPO's clipped term is ``-A`` per token, and
    DAPO sums over the 4 tokens and divides by 4:
    loss = -(0.70700 * (1.5 + 2) - 0.70700 * (0.5 + 1)) / 4 = -0.35350."""
    comps = [[5, 6], [7, 8]]
    old = [_logps(tiny_model, PROMPT, c) for c in comps]
    shifts = [[math.log(1.5), math.log(3.0)], [-math.log(2.0), 0.0]]
    behaviour = [[o - s for o, s in zip(ol, sh, strict=True)] for ol, sh in zip(old, shifts, strict=True)]  # fmt: skip
    source = ScriptedRollouts([[_group(comps, behaviour, [1.0, 0.0])]])
    trainer = _trainer(tmp_path, tiny_model, tokenizer, source)
    batch = trainer._generate_and_score_completions([{}] * 2)
    ratio_BT = batch["importance_sampling_ratio"]
    assert ratio_BT.flatten().tolist() == pytest.approx([1.5, 2.0, 0.5, 1.0], abs=1e-5)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert batch["advantages"].tolist() == pytest.approx([a, -a], abs=1e-5)
    loss = trainer._compute_loss(tiny_model, batch)
    assert float(loss) == pytest.approx(-(a * 3.5 - a * 1.5) / 4, abs=1e-5)
    assert float(loss) == pytest.approx(-0.35350, abs=1e-4)


def test_with_the_correction_off_the_weight_is_one(tmp_path, tokenizer, tiny_model):
    """``rollout.correction=false``: the same kind of shifted behaviour log-probs (weights 1.5,
    3 on rollout 0; 0.5, 1, 1 on rollout 1, which is one token longer) leave the loss
    unweighted: ``-(a * 2 - a * 3) / 5`` (DAPO's sum over the 5 tokens), where the correction
    would give ``-(a * (1.5 + 2) - a * (0.5 + 1 + 1)) / 5``. The weight before truncation is
    still reported: mean 7 / 5, one token of 5 above C = 2."""
    comps = [[5, 6], [7, 8, 9]]
    old = [_logps(tiny_model, PROMPT, c) for c in comps]
    shifts = [[math.log(1.5), math.log(3.0)], [-math.log(2.0), 0.0, 0.0]]
    behaviour = [[o - s for o, s in zip(ol, sh, strict=True)] for ol, sh in zip(old, shifts, strict=True)]  # fmt: skip
    source = ScriptedRollouts([[_group(comps, behaviour, [1.0, 0.0])]])
    trainer = _trainer(tmp_path, tiny_model, tokenizer, source, "rollout.correction=false")
    batch = trainer._generate_and_score_completions([{}] * 2)
    mask_BT = batch["completion_mask"].bool()
    assert batch["importance_sampling_ratio"][mask_BT].tolist() == [1.0] * 5
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    loss = trainer._compute_loss(tiny_model, batch)
    assert float(loss) == pytest.approx(-(a * 2 - a * 3) / 5, abs=1e-5)
    metrics = trainer._metrics["train"]
    assert metrics["rollout/ratio_lag0_mean"][-1] == pytest.approx(7 / 5, abs=1e-5)
    assert metrics["rollout/ratio_lag0_above_cap"][-1] == pytest.approx(1 / 5)


def test_at_staleness_zero_the_ratio_is_one(tmp_path, tokenizer, tiny_model):
    """Groups sampled by the worker's generator with the learner's own weights: the learner's
    recomputed log-probs give ``pi_old / pi_behav`` = 1 within 1e-4 on every token (the
    numerical mismatch between generation and the training forward), reported under
    ``rollout/ratio_lag0_*``."""
    torch.manual_seed(0)
    with Generator(tiny_model, tokenizer.pad_token_id, [tokenizer.eos_token_id]) as gen:
        outs = gen.generate([PROMPT] * 4, Sampling(max_new_tokens=6, temperature=0.7))
    groups = [
        _group([o.ids for o in outs[i : i + 2]], [o.logprobs for o in outs[i : i + 2]], [1.0, 0.0])
        for i in (0, 2)
    ]
    for i, g in enumerate(groups):
        g.group_id = i
    source = ScriptedRollouts([groups])
    trainer = _trainer(tmp_path, tiny_model, tokenizer, source, "generation.prompts_per_step=2",
                       "generation.temperature=0.7")  # fmt: skip
    batch = trainer._generate_and_score_completions([{}] * 4)
    mask_BT = batch["completion_mask"].bool()
    ratio = batch["importance_sampling_ratio"][mask_BT]
    assert ratio.numel() >= 8 and (ratio - 1).abs().max() < 1e-4
    metrics = trainer._metrics["train"]
    assert metrics["rollout/ratio_lag0_max_dev"][-1] < 1e-4
    assert "rollout/ratio_stale_mean" not in metrics


def test_a_grading_the_machine_failed_is_masked_on_the_ray_engine(tmp_path, tokenizer, tiny_model):
    """Issue 56 on the Ray engine: a worker's verdict marked as the machine's failure
    (``machine_failed``) gives no reward and leaves the loss and the group statistics, as on
    the local engine. Rewards 1, 0 and a ``sandbox_start``: the graded two get
    ``+-0.5 / (std(1, 0) + 1e-4)`` with the unbiased std 0.70711, the masked one 0, and its
    tokens leave the completion mask."""
    from composer_replication.envs.base import StepResult, machine_failed
    from composer_replication.sandbox.infra import InfraFailure

    comps = [[5, 6], [7, 8], [9, 10]]
    behaviour = [_logps(tiny_model, PROMPT, c) for c in comps]
    verdicts = [StepResult("", 1.0, True, True, ""), StepResult("", 0.0, True, False, "no"),
                machine_failed("", InfraFailure("sandbox_start", "bwrap: no namespace"))]  # fmt: skip
    group = _group(comps, behaviour, [1.0, 0.0, 0.0])
    for rollout, verdict in zip(group.rollouts, verdicts, strict=True):
        rollout.verdict = verdict
    trainer = _trainer(tmp_path, tiny_model, tokenizer, ScriptedRollouts([[group]]),
                       "generation.num_generations=3")  # fmt: skip
    reward = trainer.reward_funcs[0]
    batch = trainer._generate_and_score_completions([{}] * 3)
    assert reward.last_infra_kinds == [None, None, "sandbox_start"]
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert batch["advantages"].tolist() == pytest.approx([a, -a, 0.0], abs=1e-5)
    assert batch["completion_mask"][2].sum() == 0 and batch["completion_mask"][:2].sum() == 4
    metrics = trainer._metrics["train"]
    assert metrics["env/infra_failed_frac"][-1] == pytest.approx(1 / 3)
    assert metrics["env/infra_failed/sandbox_start"][-1] == 1.0
