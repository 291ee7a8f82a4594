"""``ablate`` checks every arm's inputs before the first arm trains: an arm with a model path
that does not exist or missing preference data is one line, exit 2, and nothing is trained.
Before, only the arms' configs were validated, and such an arm failed when its turn came,
after the earlier arms had trained (minutes to hours)."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.cli.common import BAD_INPUT


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.name=./nope"], "arm 'b': model path './nope' does not exist"),
        (["replay.weight=0.1", "replay.dataset=/nonexistent"],
         "arm 'b': preference data not found: /nonexistent"),
    ],
)  # fmt: skip
def test_a_bad_arm_input_stops_ablate_before_any_arm_trains(tmp_path, no_model, overrides, message):
    config = tmp_path / "ablation.yaml"
    config.write_text(yaml.safe_dump({
        "seeds": [0], "output_dir": str(tmp_path / "runs"),
        "arms": [{"name": "a", "overrides": []}, {"name": "b", "overrides": overrides}],
    }))  # fmt: skip
    result = CliRunner().invoke(app, ["ablate", "--config", str(config)])
    assert result.exit_code == BAD_INPUT, result.output
    assert " ".join(result.output.split()).startswith(f"error: {message}")
    assert not (tmp_path / "runs").exists()


def test_an_arm_whose_runs_all_finished_is_not_checked_again(tmp_path, no_model):
    """A finished arm is only reused: its teacher (or model) deleted since must not stop the
    study's other arms; an arm with a seed still to train is checked."""
    from composer_replication.config import ConfigError, load_ablation_config
    from composer_replication.run.ablation import check_arm_inputs

    config = tmp_path / "ablation.yaml"
    config.write_text(yaml.safe_dump({
        "seeds": [0, 1], "output_dir": str(tmp_path / "runs"),
        "arms": [{"name": "a", "overrides": []}, {"name": "b", "overrides": ["model.name=./gone"]}],
    }))  # fmt: skip
    acfg = load_ablation_config(config)
    for seed in (0, 1):
        (tmp_path / "runs" / "b" / f"seed{seed}").mkdir(parents=True)
        (tmp_path / "runs" / "b" / f"seed{seed}" / "final_eval.json").write_text("{}")
    check_arm_inputs(acfg)
    (tmp_path / "runs" / "b" / "seed1" / "final_eval.json").unlink()
    with pytest.raises(ConfigError, match="arm 'b': model path './gone' does not exist"):
        check_arm_inputs(acfg)


def test_an_arm_whose_teacher_has_another_tokenizer_stops_ablate_first(tmp_path, monkeypatch):
    """A distill teacher's tokenizer is compared with the student's before the first arm
    trains (tokenizers only, no model loads), not when that arm's turn comes."""
    from support.distill import other_tokenizer_model

    other = other_tokenizer_model(tmp_path)
    monkeypatch.setattr("composer_replication.lm.models.load_model", _no_model_loads)
    config = tmp_path / "ablation.yaml"
    config.write_text(yaml.safe_dump({
        "seeds": [0], "output_dir": str(tmp_path / "runs"),
        "arms": [{"name": "a", "overrides": []},
                 {"name": "b", "overrides": ["distill.weight=1", f"distill.teachers={other}"]}],
    }))  # fmt: skip
    result = CliRunner().invoke(app, ["ablate", "--config", str(config)])
    assert result.exit_code == BAD_INPUT, result.output
    text = " ".join(result.output.split())
    assert text.startswith("error: arm 'b': ") and "does not use the student's tokenizer" in text
    assert not (tmp_path / "runs").exists()


def _no_model_loads(*args, **kwargs):
    raise AssertionError("a model was loaded before the inputs were checked")
