"""The distill channel runs no policy forward beyond TRL's own: in one training step, every
forward of the student's backbone (so a forward through shared prefixes counts too) outside
generation happens inside TRL's log-prob forward (``_get_per_token_logps_and_entropies``,
which TRL calls for its loss and, when it needs them, its old log-probs), in the TRL
configurations named below.

* ``trl_generation``: TRL generates (``generation.shared_prefix=false``) and computes no old
  log-probs (one use of each batch): ``as_advantage`` folds with the log-probs of TRL's own
  loss forward. (Before, the channel ran a full-vocabulary fp32 forward of its own here.)
* ``shared_prefix``: our generator, with the sampling log-probs it recorded; TRL's forwards run
  through shared prefixes (lm/prefix.py), no old log-probs: the same fold. (Before: the extra
  forward, and not through prefixes.)
* ``old_logps``: ``grpo.num_iterations=2``, so TRL computes ``old_per_token_logps`` once per
  generation round: the fold reads them.

The full-vocabulary JSD runs no forward of its own either: the teacher's hidden states come
from its scoring forward, the student's from the captured policy forward."""

from __future__ import annotations

import pytest
from support.distill import tiny_student_and_teacher, train_overrides

from composer_replication.config import load_config
from composer_replication.lm.models import backbone, load_model
from composer_replication.run.train import build_env, build_trainer
from composer_replication.trainer.trainer import ComposerReplicationTrainer

CONFIGS = {
    "trl_generation": ("generation.shared_prefix=false",),
    "shared_prefix": ("generation.shared_prefix=true",),
    "old_logps": ("generation.shared_prefix=false", "grpo.num_iterations=2"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_student_and_teacher(tmp_path_factory.mktemp("forwards"))


def count_forwards(monkeypatch, run_dir, student, tokenizer, *extra: str) -> dict[str, int]:
    """The student's backbone forwards in one training step, by where they ran: ``trl`` (in
    TRL's log-prob forward), ``other`` (anywhere else but generation)."""
    cfg = load_config(None, train_overrides(run_dir, f"model.name={student}", "max_steps=1",
                                            *extra))  # fmt: skip
    model = load_model(str(student))
    trainer = build_trainer(cfg, model, tokenizer, build_env(cfg))
    where = {"now": "other"}
    counts = {"trl": 0, "other": 0}
    for name, place in (("_generate_single_turn", "generation"),
                        ("_get_per_token_logps_and_entropies", "trl")):  # fmt: skip
        real = getattr(ComposerReplicationTrainer, name)

        def marked(self, *args, _real=real, _place=place, **kwargs):
            where["now"] = _place
            try:
                return _real(self, *args, **kwargs)
            finally:
                where["now"] = "other"

        monkeypatch.setattr(ComposerReplicationTrainer, name, marked)

    def count(*_):
        if where["now"] != "generation":
            counts[where["now"]] += 1

    backbone(model).register_forward_pre_hook(count)
    trainer.train()
    return counts


@pytest.mark.parametrize("config", list(CONFIGS))
def test_as_advantage_runs_no_forward_beyond_trls(tmp_path, models, tokenizer, monkeypatch,
                                                  config):  # fmt: skip
    student, teacher = models
    counts = count_forwards(
        monkeypatch, tmp_path, student, tokenizer, *CONFIGS[config], "distill.weight=0.5",
        f"distill.teachers={teacher}", "distill.loss.as_advantage=true",
    )  # fmt: skip
    assert counts["trl"] > 0 and counts["other"] == 0, (config, counts)


def test_full_vocabulary_jsd_runs_no_forward_beyond_trls(tmp_path, models, tokenizer,
                                                         monkeypatch):  # fmt: skip
    student, teacher = models
    counts = count_forwards(
        monkeypatch, tmp_path, student, tokenizer, *CONFIGS["trl_generation"],
        "distill.weight=0.5", f"distill.teachers={teacher}", "distill.loss.type=jsd",
    )  # fmt: skip
    assert counts["trl"] > 0 and counts["other"] == 0, counts
