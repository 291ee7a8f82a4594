"""The run's model card names the base model, the recipe and the held-out result."""

from __future__ import annotations

from composer_replication.config import load_config
from composer_replication.run.card import model_card, write_model_card

SUMMARY = {
    "base": {"pass_rate": 0.234, "pass_ci95_low": 0.18, "pass_ci95_high": 0.299, "n": 192},
    "trained": {"pass_rate": 0.911, "pass_ci95_low": 0.863, "pass_ci95_high": 0.944, "n": 192},
    "delta": {"delta_pass_rate": 0.677, "ci95_low": 0.611, "ci95_high": 0.743},
}


def test_card_has_base_model_recipe_and_result(tmp_path):
    cfg = load_config(None, ["sdpo.weight=0.1", "model.name=org/base-model"])
    text = model_card(cfg, SUMMARY)
    assert "base_model: org/base-model" in text and "None" not in text
    assert "channel `sdpo`: weight 0.1, loss `jsd`" in text
    assert "channel `replay`: off" in text
    assert "| trained | 91.1% | [86.3%, 94.4%] | 192 |" in text
    assert "+67.7% [+61.1%, +74.3%]" in text
    (tmp_path / "final").mkdir()
    write_model_card(cfg, SUMMARY, tmp_path, tmp_path / "final", tmp_path / "absent")
    assert (tmp_path / "final" / "README.md").read_text() == text
    assert not (tmp_path / "absent").exists()


def test_card_without_evaluation_says_so():
    cfg = load_config(None, [])
    assert "No held-out evaluation ran" in model_card(cfg, {"trained": None})
