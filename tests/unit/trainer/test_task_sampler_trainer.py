"""``data.sampler: adaptive`` in the local trainer, on a tiny random model: each round's
groups (DAPO's refills included) come from the sampler, never from the held-out split, and a
run resumed from a checkpoint draws the same tasks per step as the uninterrupted run (the
sampler's state travels in the checkpoint; HF's batch skipping on resume draws nothing)."""

from __future__ import annotations

import json
from collections import Counter

from support.tiny_run import save_tiny_model

from composer_replication.config import load_config
from composer_replication.envs import build_env
from composer_replication.envs.sampler import SAMPLER_FILE
from composer_replication.run.train import run_training
from composer_replication.trainer.callbacks import read_metrics
from composer_replication.trainer.trainer import DRAWS_FILE


def draws(run_dir) -> list[tuple[int, str, list[str]]]:
    lines = (run_dir / DRAWS_FILE).read_text().splitlines()
    return [(d["step"], d["round"], d["tasks"]) for d in map(json.loads, lines)]


def test_adaptive_run_resumes_the_same_task_sequence(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    common = [
        f"model.name={model}", "data.sampler=adaptive", "grpo.dynamic_sampling.enabled=true",
        "grpo.dynamic_sampling.max_refills=1", "optim.warmup_steps=0",
        "generation.num_generations=2", "generation.prompts_per_step=2",
        "generation.max_completion_length=2", "env.levels=[1]", "env.num_train=12",
        "num_threads=2", "eval.before_and_after=false", "save_steps=1", "seed=5",
        "save_total_limit=null", "max_steps=2",
    ]  # fmt: skip
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    cfg = load_config(None, [*common, f"output_dir={full}"])
    run_training(cfg)
    assert (full / "checkpoint-1" / SAMPLER_FILE).is_file()
    run_training(
        load_config(None, [*common, f"output_dir={resumed}", f"resume_from={full}/checkpoint-1"])
    )
    whole = draws(full)
    assert [s for s, _, _ in whole] == [1, 1, 2, 2]  # each step: batch + refill
    assert {r for _, r, _ in whole} == {"batch", "refill"}
    assert draws(resumed) == [d for d in whole if d[0] > 1]
    # the drawn tasks are the ones scored: the checkpoint's counts are 2 rollouts per draw
    state = json.loads((full / "checkpoint-1" / SAMPLER_FILE).read_text())
    scored = Counter({t: state["successes"].get(t, 0) + n for t, n in state["failures"].items()})
    step_1 = Counter(t for s, _, tasks in whole if s == 1 for t in tasks)
    assert scored == Counter({t: 2 * n for t, n in step_1.items()})

    env = build_env(cfg.env)
    train = {t.task_id for t in env.tasks("train")}
    heldout = {t.task_id for t in env.tasks("heldout")}
    drawn = {t for _, _, tasks in whole for t in tasks}
    assert drawn <= train and not drawn & heldout
    rows = read_metrics(full / "metrics.jsonl")
    assert all(0.0 <= r["sampler/signal_frac"] <= 1.0 for r in rows)
    assert all("sampler/sampled_pass_rate_p50" in r for r in rows)


def test_sampler_updates_skip_machine_failures_and_fall_back_to_the_reward_threshold():
    """The update of one scored round, without a model: verdicts where the reward function
    keeps them (rows whose grading the machine failed left out), else rewards against
    ``success_threshold``."""
    from collections import defaultdict
    from types import SimpleNamespace

    import torch

    from composer_replication.config.data import AdaptiveSamplerConfig
    from composer_replication.envs.sampler import TaskSampler
    from composer_replication.trainer.trainer import ComposerReplicationTrainer as T

    inputs = [{"task_id": t} for t in ("a", "a", "b", "b")]
    graded = SimpleNamespace(
        last_results=[SimpleNamespace(passed=p) for p in (True, False, False, False)],
        last_infra_kinds=[None, "sandbox_timeout", None, None],
    )
    for funcs, rewards, expected, signal in (
        ([graded], [1.0, 0.0, 0.0, 0.0], {"a": (1, 0), "b": (0, 2)}, 0.0),  # a: one graded
        ([lambda **_: None], [0.9, 0.2, 0.7, 0.6], {"a": (1, 1), "b": (2, 0)}, 0.5),
    ):
        fake = SimpleNamespace(
            num_generations=2,
            reward_funcs=funcs,
            reward_weights=torch.ones(1),
            task_sampler=TaskSampler(["a", "b"], 2, 0, AdaptiveSamplerConfig()),
            _metrics={"train": defaultdict(list)},
        )
        fake._infra_kinds = lambda fake=fake: T._infra_kinds(fake)
        T._update_sampler(fake, inputs, torch.tensor(rewards).unsqueeze(1))
        sampler = fake.task_sampler
        got = {t: (sampler.successes[t], sampler.failures[t]) for t in ("a", "b")}
        assert got == expected
        assert fake._metrics["train"]["sampler/signal_frac"] == [signal]
