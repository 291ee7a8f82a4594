"""Rollouts the machine failed leave the gradient (trainer/masking.py): out of the loss, out of
their group's statistics, counted per kind, and a run whose machine keeps failing stops."""

from __future__ import annotations

import math

import pytest
import torch

from composer_replication.config import load_config
from composer_replication.envs import get_env
from composer_replication.envs.base import StepResult, machine_failed
from composer_replication.run.train import build_trainer
from composer_replication.sandbox.infra import (
    GRADER_KILLED,
    HARNESS_START,
    KINDS,
    SANDBOX_START,
    SERVER_ERROR,
    SLOT_TIMEOUT,
    InfraFailure,
)
from composer_replication.trainer.callbacks import METRICS_FILE, read_metrics
from composer_replication.trainer.masking import (
    InfraBudget,
    InfraFailureBudgetError,
    mask_machine_failures,
    valid_rows,
)
from composer_replication.trainer.rewards import EnvReward

PASS, FAIL = 1.0, 0.0
PLAN = [
    [PASS, FAIL, SANDBOX_START, GRADER_KILLED],  # 2 graded: mean 0.5, std 0.7071
    [PASS, SLOT_TIMEOUT, SERVER_ERROR, FAIL],  # the same numbers, other kinds
    [SANDBOX_START, SANDBOX_START, GRADER_KILLED, PASS],  # 1 graded: no baseline, dropped
]
"""Three groups of 4: each machine failure kind planted, in the place the grading would put it."""


def _batch(kinds, group_size=4, length=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = len(kinds)
    completion_mask = torch.ones(n, length, dtype=torch.long)
    completion_mask[1, 3:] = 0
    tool_mask = torch.ones(n, length, dtype=torch.long)
    tool_mask[0, 1] = 0
    return {
        "completion_ids": torch.randint(0, 50, (n, length), generator=g),
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.randn(n, generator=g),
        "num_items_in_batch": (completion_mask * tool_mask).sum(),
    }


def test_valid_rows_drop_groups_with_fewer_than_two_graded():
    kinds = [None, "x", None, "x", None, "x", "x", "x", "x", "x", "x", "x"]
    assert valid_rows(kinds, 4).tolist() == [True, False, True, False] + [False] * 8


def test_mask_zeroes_rows_and_recounts_tokens():
    """Rows 2, 3 (group 0), 5, 6 (group 1) failed; group 2 keeps one graded row and is
    dropped whole. Loss tokens: 12 rows x 5 minus row 1's 2 padded and row 0's tool token
    = 57; the kept rows 0, 1, 4, 7 hold 4 + 3 + 5 + 5 = 17."""
    kinds = [None if isinstance(x, float) else x for row in PLAN for x in row]
    batch = _batch(kinds)
    adv_before = batch["advantages"].clone()
    assert int(batch["num_items_in_batch"]) == 57
    masked = mask_machine_failures(batch, kinds, 4)
    keep = [0, 1, 4, 7]
    assert masked.rows == 8 and masked.dropped_groups == 1
    assert int(batch["num_items_in_batch"]) == 17
    assert batch["infra_masked"].tolist() == [i not in keep for i in range(12)]
    for i in range(12):
        kept = i in keep
        assert bool(batch["completion_mask"][i].any()) == kept
        assert bool(batch["tool_mask"][i].any()) == kept
        assert batch["advantages"][i] == (adv_before[i] if kept else 0.0)


def test_mask_of_one_process_share_counts_over_all_rows():
    kinds = [None, None, "x", "x", "x", None, None, None]
    batch = _batch(kinds[4:], length=3)
    masked = mask_machine_failures(batch, kinds, 4, rows=slice(4, 8))
    assert masked.rows == 3 and masked.dropped_groups == 0
    assert batch["infra_masked"].tolist() == [True, False, False, False]


def _scripted_trainer(tmp_path, tokenizer, tiny_model, plan, *extra):
    cfg = load_config(
        None,
        [
            f"output_dir={tmp_path}",
            "max_steps=1",
            "generation.num_generations=4",
            f"generation.prompts_per_step={len(plan)}",
            "generation.max_completion_length=4",
            "env.num_train=16",
            *extra,
        ],
    )
    env = get_env("arithmetic", levels=[1])
    trainer = build_trainer(cfg, tiny_model, tokenizer, env)
    reward = trainer.reward_funcs[0]
    assert isinstance(reward, EnvReward)

    def grade_batch(tasks, completions):  # the plan, whatever the tiny model wrote
        flat = [x for row in plan for x in row]
        return [
            StepResult(c, x, True, x == PASS, "")
            if isinstance(x, float)
            else machine_failed(c, InfraFailure(x, "planted"))
            for c, x in zip(completions, flat, strict=True)
        ]

    env.grade_batch = grade_batch
    rows = [trainer.train_dataset[i] for i in range(len(plan))]
    return trainer, [r for r in rows for _ in range(4)]


def test_each_machine_failure_is_masked_counted_and_out_of_the_group_statistics(
    tmp_path, tokenizer, tiny_model
):
    """Group 0: graded rewards (1, 0): mean 0.5, sample std sqrt(0.5) = 0.70711, advantages
    +-0.5 / (0.70711 + 1e-4) = +-0.70701; its failed rows 0. Group 1 the same. Group 2 has one
    graded row: dropped, every advantage 0 and every row out of the loss."""
    trainer, inputs = _scripted_trainer(tmp_path, tokenizer, tiny_model, PLAN)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(inputs)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    expected = [a, -a, 0, 0, a, 0, 0, -a, 0, 0, 0, 0]
    assert batch["advantages"].tolist() == pytest.approx(expected, abs=1e-5)
    kept = [0, 1, 4, 7]
    assert [bool(batch["completion_mask"][i].any()) for i in range(12)] == [
        i in kept and bool(batch["completion_mask"][i].any()) for i in range(12)
    ]
    assert all(not batch["completion_mask"][i].any() for i in range(12) if i not in kept)
    assert int(batch["num_items_in_batch"]) == int(batch["completion_mask"].sum())
    metrics = trainer._metrics["train"]
    assert metrics["env/infra_failed_frac"] == [pytest.approx(7 / 12)]
    counts = {k: metrics[f"env/infra_failed/{k}"] for k in KINDS}
    assert counts == {SANDBOX_START: [3.0], GRADER_KILLED: [2.0], SLOT_TIMEOUT: [1.0],
                      SERVER_ERROR: [1.0], HARNESS_START: [0.0]}  # fmt: skip
    assert metrics["env/pass_rate"] == [pytest.approx(3 / 5)]  # of the 5 graded rollouts
    assert metrics["reward"] == [pytest.approx(3 / 5)]  # TRL's mean leaves the NaN rows out
    _assert_masked_rows_do_not_move_the_loss(trainer, batch, kept)


def _assert_masked_rows_do_not_move_the_loss(trainer, batch, kept):
    """The loss of the masked batch, whatever its masked rows' completions, equals the loss of
    the batch without them (the same tokens, advantages and divisor)."""
    trainer.current_gradient_accumulation_steps = 1
    trainer.args.steps_per_generation = 1
    rows = torch.tensor(kept)
    alone = {k: v[rows] if torch.is_tensor(v) and v.dim() else v for k, v in batch.items()}
    alone.pop("infra_masked")
    alone["num_items_in_batch"] = alone["completion_mask"].sum()
    assert int(alone["num_items_in_batch"]) == int(batch["num_items_in_batch"])
    scrambled = dict(batch, completion_ids=batch["completion_ids"].clone())
    scrambled["completion_ids"][batch["infra_masked"]] = 7
    full = trainer._compute_loss(trainer.model, scrambled)
    assert full.item() == pytest.approx(trainer._compute_loss(trainer.model, alone).item())


def test_dynamic_sampling_refills_the_dropped_groups(tmp_path, tokenizer, tiny_model):
    plan = [PLAN[2], PLAN[0]]  # the first group has one graded rollout: dropped, refilled
    trainer, inputs = _scripted_trainer(
        tmp_path, tokenizer, tiny_model, plan, "grpo.dynamic_sampling.enabled=true"
    )
    trainer.model.train()
    batch = trainer._generate_and_score_completions(inputs)
    metrics = trainer._metrics["train"]
    assert metrics["dynamic_sampling/refills"] == [1.0]
    assert metrics["dynamic_sampling/infra_dropped_groups"] == [2.0]  # one per round
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert batch["advantages"].tolist() == pytest.approx([a, -a, 0, 0] * 2, abs=1e-5)


def test_budget_stops_after_three_steps_over_the_share_with_one_line():
    budget = InfraBudget(0.5)
    over = [SANDBOX_START] * 3 + [None]
    budget.observe(over, 1)
    budget.observe([None, None, SANDBOX_START, SANDBOX_START], 2)  # 50%: not over, resets
    budget.observe(over, 3)
    budget.observe([GRADER_KILLED] * 4, 4)
    with pytest.raises(InfraFailureBudgetError) as err:
        budget.observe(over, 5)
    line = str(err.value)
    assert "\n" not in line and "sandbox_start" in line and "step 5" in line


def test_a_run_whose_sandboxes_all_fail_stops_within_three_steps(tmp_path, tokenizer, tiny_model):
    """HumanEval on a machine whose bwrap cannot be executed: every grading is a
    ``sandbox_start`` failure, masked; the third step stops the run with one line."""
    from composer_replication.envs.humaneval import HumanEvalEnv

    cfg = load_config(
        None,
        [
            f"output_dir={tmp_path}",
            "max_steps=6",
            "env.name=humaneval",
            "generation.num_generations=2",
            "generation.prompts_per_step=2",
            "generation.max_completion_length=4",
            "env.num_train=8",
            "eval.before_and_after=false",
        ],
    )
    env = HumanEvalEnv(sandbox=cfg.sandbox)
    env.sandbox.bwrap = str(tmp_path / "no-bwrap-here")
    trainer = build_trainer(cfg, tiny_model, tokenizer, env)
    with pytest.raises(InfraFailureBudgetError) as err:
        trainer.train()
    line = str(err.value)
    assert "\n" not in line and line.startswith("step 3:") and SANDBOX_START in line
    assert trainer.state.global_step == 2
    rows = read_metrics(tmp_path / METRICS_FILE)
    assert [r["env/infra_failed_frac"] for r in rows] == [1.0, 1.0]
    assert [r[f"env/infra_failed/{SANDBOX_START}"] for r in rows] == [4.0, 4.0]
