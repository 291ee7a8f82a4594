"""One switch, ``generation.shared_prefix``, decides whether shared prompt prefixes run once
(lm/prefix.py) in the trainer's generation and log-prob forwards, in the channels' forwards
and in evaluation: a short run with every channel counts the prefix forwards in each place."""

from __future__ import annotations

import inspect
from collections import Counter

import pytest

import composer_replication.lm.prefix as prefix
from composer_replication.config import load_config
from composer_replication.run.train import run_training

PLACES = ("trainer/trainer.py", "channels/", "evaluation.py", "rollout.py", "lm/generator.py")


def _place(skip: int = 2) -> str:
    """Which part of the package asked for a prefix forward (or built a generator). The
    generator (lm/generator.py) generates on its own thread for every caller: its prefix
    forwards count under its name, and whose generator it is is known when it is built."""
    for frame in inspect.stack()[skip:]:
        for part in PLACES:
            if part in frame.filename.replace("\\", "/"):
                return {"rollout.py": "evaluation.py"}.get(part, part)
    return "other"


@pytest.fixture
def counted(monkeypatch):
    """Counts of prefix forwards (the prefill of a generation, a forward through a prefix
    cache) by the place that asked, and ``("generator", place, shared_prefix)`` for each
    generator built."""
    from composer_replication.lm.generator import Generator

    counts: Counter[str | tuple] = Counter()
    for name in ("prefill", "_forward_with_prefix"):
        real = getattr(prefix, name)

        def wrapped(*args, _real=real, **kwargs):
            counts[_place()] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(prefix, name, wrapped)
    real_init = Generator.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        counts["generator", _place(), self.shared_prefix] += 1

    monkeypatch.setattr(Generator, "__init__", init)
    return counts


def _run(tmp_path, shared: bool):
    from support.tiny_run import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    cfg = load_config(None, [
        f"model.name={model}", f"output_dir={tmp_path / 'run'}", "max_steps=1", "num_threads=1",
        f"generation.shared_prefix={str(shared).lower()}", "generation.num_generations=2",
        "generation.prompts_per_step=2", "generation.max_completion_length=4",
        "optim.gradient_checkpointing=false", "env.levels=[1]", "env.num_train=8",
        "sdpo.weight=0.5", "replay.weight=0.1", "replay.dataset=embedded:fixture-replay-pairs",
        "replay.pairs_per_step=2", "replay.max_pairs=4", "eval.n=4", "eval.max_new_tokens=4",
    ])  # fmt: skip
    return run_training(cfg)


def _generators(counted: Counter) -> dict[str, set[bool]]:
    out: dict[str, set[bool]] = {}
    for key in counted:
        if isinstance(key, tuple):
            out.setdefault(key[1], set()).add(key[2])
    return out


def test_false_runs_no_prefix_forward_anywhere(tmp_path, counted):
    summary = _run(tmp_path, shared=False)
    assert summary.trained is not None and summary.base is not None
    # off: the trainer generates on TRL's own path, bit for bit; evaluation without reuse
    assert _generators(counted) == {"evaluation.py": {False}}
    assert not [k for k in counted if not isinstance(k, tuple)], counted


def test_true_runs_prefixes_once_in_the_trainer_the_channels_and_evaluation(tmp_path, counted):
    summary = _run(tmp_path, shared=True)
    assert summary.trained is not None
    # the trainer's log-prob forwards, the channels', and the generations (the trainer's and
    # evaluation's generators, both with the switch on, generate on the generator's thread)
    assert {"trainer/trainer.py", "channels/", "lm/generator.py"} <= set(counted), counted
    assert _generators(counted) == {"trainer/trainer.py": {True}, "evaluation.py": {True}}
