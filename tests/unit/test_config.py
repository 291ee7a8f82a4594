"""Config parsing: every shipped YAML validates; unknown keys and bad values name the key."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    default_config_path,
    dump_config,
    load_config,
)

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_configs_dir_is_not_empty():
    assert CONFIGS, "configs/ has no YAML files"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_parses(path):
    import yaml

    from composer_replication.ablation import arm_config
    from composer_replication.config import load_ablation_config

    if "arms" in (yaml.safe_load(path.read_text()) or {}):  # an ablation: every arm's run config
        acfg = load_ablation_config(path)
        assert all(
            isinstance(arm_config(acfg, a, s), RunConfig) for a in acfg.arms for s in acfg.seeds
        )
    else:
        assert isinstance(load_config(path), RunConfig)


def test_default_config_is_quickstart():
    assert default_config_path().name == "quickstart.yaml"
    assert load_config().model.name == "embedded:smollm2-135m-instruct"


def test_overrides_top_level_and_nested():
    cfg = load_config(None, ["max_steps=2", "optim.learning_rate=3e-6", "env.levels=[1]"])
    assert cfg.max_steps == 2
    assert cfg.optim.learning_rate == pytest.approx(3e-6)
    assert cfg.env.levels == [1]


def test_unknown_top_level_key_is_named():
    with pytest.raises(ConfigError, match="no_such_key: unknown key"):
        load_config(None, ["no_such_key=1"])


def test_unknown_nested_key_is_named():
    with pytest.raises(ConfigError, match=r"grpo\.epsilon_hi: unknown key"):
        load_config(None, ["grpo.epsilon_hi=0.3"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("max_steps=0", "max_steps"),
        ("generation.num_generations=1", "generation.num_generations"),
        ("grpo.loss_type=ppo", "grpo.loss_type"),
        ("optim.learning_rate=-1", "optim.learning_rate"),
        ("env.levels=[9]", "env"),
    ],
)
def test_out_of_range_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert key in str(info.value)


def test_override_must_be_key_value():
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["max_steps"])


def test_override_into_scalar_is_an_error():
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"max_steps": 3}, ["max_steps.x=1"])


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listy)


def test_channel_weights_need_their_inputs():
    with pytest.raises(ConfigError, match="replay: .*needs dataset"):
        load_config(None, ["beta_replay=0.1", "replay.dataset=null"])
    with pytest.raises(ConfigError, match="hint_model_url"):
        load_config(None, ["alpha_sdpo=0.1", "sdpo.hint_sources=[model]"])


def test_weight_aliases_map_onto_the_channel_sections():
    cfg = load_config(None, ["alpha_sdpo=0.1", "beta_replay=0.05"])
    assert cfg.sdpo.weight == 0.1 and cfg.replay.weight == 0.05
    assert cfg == load_config(None, ["sdpo.weight=0.1", "replay.weight=0.05"])
    assert "alpha_sdpo" not in dump_config(cfg) and "weight: 0.1" in dump_config(cfg)
    assert load_config(None, ["alpha_sdpo=0.1", "sdpo.weight=0.1"]).sdpo.weight == 0.1
    with pytest.raises(ConfigError, match="alpha_sdpo=0.1 and sdpo.weight=0.2 disagree"):
        load_config(None, ["alpha_sdpo=0.1", "sdpo.weight=0.2"])
    with pytest.raises(ConfigError, match="sdpo.weight: Input should be greater than or equal"):
        load_config(None, ["alpha_sdpo=-1"])


def test_old_yaml_with_flat_loss_fields_still_loads(tmp_path):
    """A config written before the loss unions: ``sdpo.loss: taid`` / ``jsd_beta``,
    ``replay.loss: simpo`` with a flat ``beta``."""
    old = tmp_path / "old.yaml"
    old.write_text(
        "alpha_sdpo: 0.2\nbeta_replay: 0.1\n"
        "sdpo: {loss: jsd, jsd_beta: 0.3, temperature: 0.7}\n"
        "replay: {dataset: x.jsonl, loss: simpo, beta: 2.5, gamma: 0.5}\n"
    )
    cfg = load_config(old)
    assert cfg.sdpo.weight == 0.2 and cfg.replay.weight == 0.1
    assert (cfg.sdpo.loss.type, cfg.sdpo.loss.beta, cfg.sdpo.loss.temperature) == ("jsd", 0.3, 0.7)
    assert (cfg.replay.loss.type, cfg.replay.loss.beta, cfg.replay.loss.gamma) == (
        "simpo",
        2.5,
        0.5,
    )
    assert load_config(None, ["sdpo.loss=taid"]).sdpo.loss.type == "taid"


def test_loss_unions_are_keyed_on_type_with_their_own_fields():
    cfg = load_config(
        None, ["replay.loss.type=simpo", "sdpo.loss.type=taid", "sdpo.loss.alpha=0.01"]
    )
    assert cfg.replay.loss.beta == 2.0  # SimPO's own default (the paper's), not DPO's 0.1
    assert load_config(None, []).replay.loss.beta == 0.1
    assert cfg.sdpo.loss.alpha == 0.01 and cfg.sdpo.loss.t_start == 0.4
    with pytest.raises(ConfigError, match=r"sdpo.loss.taid.beta: unknown key"):
        load_config(None, ["sdpo.loss.type=taid", "sdpo.loss.beta=0.3"])
    with pytest.raises(ConfigError, match=r"sdpo.loss.*does not match any of the expected tags"):
        load_config(None, ["sdpo.loss.type=kl"])
    with pytest.raises(ConfigError, match="t_end"):
        load_config(None, ["sdpo.loss.type=taid", "sdpo.loss.t_start=0.8", "sdpo.loss.t_end=0.5"])


def test_config_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, composer_replication.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_unknown_key_exits_nonzero_naming_it():
    result = CliRunner().invoke(
        app, ["train", "--config", str(default_config_path()), "no_such_key=1"]
    )
    assert result.exit_code != 0
    assert "no_such_key" in result.output
