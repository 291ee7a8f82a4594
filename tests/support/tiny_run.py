"""A tiny random Llama saved as a model directory, and the overrides that make a full
``run_training`` of it take seconds on a CPU (for DiLoCo runs of the real trainer)."""

from __future__ import annotations

from pathlib import Path


def save_tiny_model(out: Path, seed: int = 0, max_positions: int = 256) -> Path:
    """The embedded tokenizer plus a 2-layer random Llama of its vocabulary in ``out``: a
    directory ``model.name`` accepts."""
    from conftest import make_tiny_model

    from composer_replication.lm.models import DEFAULT_MODEL, load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    make_tiny_model(len(tokenizer), seed=seed, max_positions=max_positions).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_run_overrides(model_dir: Path, output_dir: Path, store_uri: str) -> list[str]:
    """4 inner steps, a sync every 2, object-store backend; no evaluation.

    ``alpha_sdpo`` gives the random model a non-zero loss (its replies are all wrong, so the
    GRPO advantages are all zero, while the hinted teacher still differs from the student);
    no warm-up and lr 1e-3 so the weights move visibly in 4 steps."""
    return [
        f"model.name={model_dir}",
        f"output_dir={output_dir}",
        "max_steps=4",
        "num_threads=1",
        "alpha_sdpo=0.5",
        "optim.learning_rate=1.0e-3",
        "optim.warmup_steps=0",
        "generation.num_generations=2",
        "generation.prompts_per_step=2",
        "generation.max_completion_length=4",
        "env.num_train=16",
        "eval.before_and_after=false",
        "diloco.sync_every=2",
        "diloco.backend=object_store",
        f"diloco.store_uri={store_uri}",
        "diloco.timeout_s=300",
    ]


def every_channel_overrides(output_dir: Path, steps: int) -> list[str]:
    """A ``steps``-step arithmetic run of a tiny model with GRPO, hinted self-distillation and
    replay pairs all on, no evaluation: the smoke train of the device check and of the
    lowest-versions environment."""
    return [
        f"output_dir={output_dir}",
        f"max_steps={steps}",
        "num_threads=1",
        "optim.warmup_steps=0",
        "generation.num_generations=2",
        "generation.prompts_per_step=2",
        "generation.max_completion_length=5",
        "env.num_train=8",
        "eval.before_and_after=false",
        "alpha_sdpo=0.5",
        "beta_replay=0.5",
        "replay.pairs_per_step=2",
    ]
