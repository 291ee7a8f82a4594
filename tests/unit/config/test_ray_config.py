"""The asynchronous-rollout settings (``rollout.engine``, ``rollout.max_staleness``,
``rollout.force_staleness``, ``rollout.correction``, the ``ray:`` section): ranges and unknown keys refused, what the
ray engine does not run refused naming the key, the old
``generation.vllm.async_rollouts.max_staleness`` folded into ``rollout.max_staleness`` with one
deprecation line, and a missing Ray refused in one line before any model loads."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys

import pytest
import yaml

from composer_replication.config import ConfigError, dump_config, load_config
from composer_replication.config import run as run_config
from composer_replication.run import preflight as preflight_module
from composer_replication.run.preflight import RAY_MISSING, preflight

RAY = ["rollout.engine=ray"]


def test_defaults_are_the_local_engine():
    cfg = load_config(None, [])
    assert cfg.rollout.engine == "local"
    assert cfg.rollout.max_staleness == 4 and cfg.rollout.force_staleness is None
    assert cfg.ray.address is None and cfg.ray.num_workers == 2


def test_the_ray_section_and_engine_parse_from_overrides():
    cfg = load_config(
        None, [*RAY, "ray.num_workers=3", "ray.worker.num_cpus=0.5", "ray.address=auto",
               "rollout.max_staleness=1", "rollout.force_staleness=1"],
    )  # fmt: skip
    assert (cfg.rollout.engine, cfg.ray.num_workers, cfg.ray.worker.num_cpus) == ("ray", 3, 0.5)
    assert (cfg.ray.address, cfg.rollout.force_staleness) == ("auto", 1)


def test_the_correction_switch_sets_trl_s_truncation():
    """On: TRL's token-truncated weight capped at ``correction_cap``; off: truncated to [1, 1]
    (a weight of 1, the pre-update forward kept); the local engine: none of TRL's switches."""
    from composer_replication.run.train import correction_args

    on = correction_args(load_config(None, [*RAY, "rollout.correction_cap=3"]))
    off = correction_args(load_config(None, [*RAY, "rollout.correction=false"]))
    assert on["vllm_importance_sampling_correction"] and off["vllm_importance_sampling_correction"]
    assert (on["vllm_importance_sampling_clip_min"], on["vllm_importance_sampling_clip_max"]) == (
        None,
        3.0,
    )
    assert off["vllm_importance_sampling_clip_min"] == 1.0
    assert off["vllm_importance_sampling_clip_max"] == pytest.approx(1.0, abs=1e-15)
    assert correction_args(load_config(None, [])) == {}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["ray.num_workers=0"], "ray.num_workers"),
        (["ray.bogus=1"], "ray.bogus: unknown key"),
        (["ray.worker.num_cpu=1"], "did you mean 'num_cpus'"),
        (["rollout.engine=slurm"], "rollout.engine"),
        (["ray.address= "], "ray.address"),
        (
            [*RAY, "rollout.max_staleness=1", "rollout.force_staleness=2"],
            "force_staleness=2 is above",
        ),
        (["rollout.force_staleness=0"], "force_staleness needs rollout.engine=ray"),
        (["rollout.correction=false"], "correction=false needs rollout.engine=ray"),
        (["rollout.correction=maybe"], "rollout.correction"),
        ([*RAY, "generation.backend=vllm"], "rollout.engine=ray does not run generation.backend"),
        ([*RAY, "diloco.enabled=true"], "rollout.engine=ray does not run diloco"),
        ([*RAY, "peft.enabled=true"], "peft with ray.weight_sync=full .* set ray.weight_sync=lora"),
        ([*RAY, "peft.enabled=true", "ray.weight_sync=delta"], "peft with ray.weight_sync=delta"),
        ([*RAY, "ray.weight_sync=lora"], "ray.weight_sync=lora without peft.enabled=true"),
        ([*RAY, "ray.weight_sync=fp8"], "ray.weight_sync"),
        ([*RAY, "ray.delta_codec=int4"], "ray.delta_codec"),
        (
            [*RAY, "env.name=calculator", "env.openenv_url=http://127.0.0.1:9"],
            "rollout.engine=ray does not run env.openenv_url",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


def test_the_agent_quickstart_loads_on_the_ray_engine():
    """Tool environments run on the Ray engine's workers (multi-turn): no refusal."""
    cfg = load_config("configs/agent_quickstart.yaml", [*RAY, "ray.num_workers=2"])
    assert (cfg.env.name, cfg.rollout.engine) == ("calculator", "ray")


def test_the_adaptive_sampler_runs_on_the_ray_engine():
    cfg = load_config(None, [*RAY, "data.sampler=adaptive"])
    assert (cfg.rollout.engine, cfg.data.sampler.type) == ("ray", "adaptive")


def test_the_old_staleness_key_is_folded_with_one_deprecation_line(caplog, monkeypatch):
    monkeypatch.setattr(run_config, "_warned", set())
    old = "generation.vllm.async_rollouts.max_staleness"
    with caplog.at_level(logging.WARNING, logger=run_config.__name__):
        cfg = load_config(None, [f"{old}=2"])
        load_config(None, [f"{old}=3"])  # logged once per process
    assert cfg.rollout.max_staleness == 2
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert lines == [f"{old} is deprecated: use rollout.max_staleness"]
    with pytest.raises(ConfigError, match="disagree: set rollout.max_staleness only"):
        load_config(None, [f"{old}=2", "rollout.max_staleness=3"])
    assert load_config(None, [f"{old}=3", "rollout.max_staleness=3"]).rollout.max_staleness == 3


def test_a_config_saved_before_the_move_loads_and_compares_equal(tmp_path):
    """A run's ``config.yaml`` written before ``rollout.max_staleness`` existed (the old key,
    at its default) reads as today's config: resume and re-run checks see no difference."""
    cfg = load_config(None, [])
    data = yaml.safe_load(dump_config(cfg))
    assert "max_staleness" not in data["generation"]["vllm"]["async_rollouts"]
    assert data["ray"]["num_workers"] == 2 and data["rollout"]["engine"] == "local"
    del data["rollout"]["max_staleness"], data["rollout"]["engine"], data["ray"]
    data["generation"]["vllm"]["async_rollouts"]["max_staleness"] = 4
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(data))
    assert run_config.saved_config_diffs(saved, cfg) == []


def test_a_missing_ray_is_one_line_before_anything_loads(tmp_path, monkeypatch):
    cfg = load_config(None, [*RAY, f"output_dir={tmp_path / 'run'}"])
    real = importlib.util.find_spec
    monkeypatch.setattr(
        preflight_module.importlib.util, "find_spec",
        lambda name, *a: None if name == "ray" else real(name, *a),
    )  # fmt: skip
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    assert str(err.value) == RAY_MISSING and "\n" not in RAY_MISSING
    assert not (tmp_path / "run").exists()  # nothing written, nothing built


def test_the_config_package_imports_neither_torch_nor_ray():
    code = (
        "import sys; import composer_replication.config as c; c.load_config(None, "
        "['rollout.engine=ray']); print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_ray_resume_needs_the_checkpoints_engine_state(tmp_path):
    from composer_replication.run.preflight import check_engine_state

    cfg = load_config(None, [*RAY])
    with pytest.raises(ConfigError, match="no rollout_engine.json .* rollout.engine=local"):
        check_engine_state(cfg, str(tmp_path))
    (tmp_path / "rollout_engine.json").write_text("{}")
    check_engine_state(cfg, str(tmp_path))
    check_engine_state(load_config(None, []), None)
