"""Config parsing: every shipped YAML validates; unknown keys and bad values name the key; one
YAML loader reports missing and malformed files by file, line and column; the shipped configs
are package data (checked in a built wheel)."""

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    configs_dir,
    default_config_path,
    dump_config,
    load_ablation_config,
    load_config,
    load_yaml_mapping,
    resolve_config_path,
)

REPO = Path(__file__).resolve().parents[3]
SHIPPED = sorted(configs_dir().rglob("*.yaml"))
SHIPPED_NAMES = sorted(p.relative_to(configs_dir()).as_posix() for p in SHIPPED)


def test_configs_dir_is_not_empty():
    assert {"quickstart.yaml", "ablation.yaml", "teachers/local.yaml"} <= set(SHIPPED_NAMES)


def test_top_level_configs_is_the_packaged_directory():
    """One source of truth: the repository's ``configs/`` is the package's directory."""
    assert (REPO / "configs").resolve() == configs_dir()


@pytest.mark.parametrize("path", SHIPPED, ids=SHIPPED_NAMES)
def test_every_shipped_config_parses(path):
    from composer_replication.config import TeacherPool, load_pool
    from composer_replication.run.ablation import arm_config

    if path.parent.name == "teachers":
        assert isinstance(load_pool(path), TeacherPool)
    elif path.parent.name == "accelerate":  # accelerate's own loader rejects unknown keys
        from accelerate.commands.config.config_args import ClusterConfig

        assert ClusterConfig.from_yaml_file(str(path)).num_processes >= 2
    elif "arms" in load_yaml_mapping(path):  # an ablation: every arm's run config
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
        ("env.shots=3", "env.shots"),
        ("env.shots=1", "env.shots: unknown key"),  # only the calculator has shots
    ],
)
def test_out_of_range_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert key in str(info.value)


def test_calculator_shots_reach_the_env():
    from composer_replication.run.train import build_env

    cfg = load_config("agent_quickstart.yaml", ["env.shots=1"])
    env = build_env(cfg)
    assert env.shots == 1 and len(env.row(env.tasks("train")[0])["prompt"]) == 6


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


def test_yaml_loader_names_file_line_and_column(tmp_path):
    """The flow list opened on line 2 is still open when the stream ends: line 3, column 1."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: 2\nenv: {levels: [1, 2\n")
    with pytest.raises(ConfigError) as info:
        load_yaml_mapping(bad)
    assert str(info.value).startswith(f"{bad}:3:1: not valid YAML: expected ',' or ']'")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(empty))}: the config file is empty"):
        load_yaml_mapping(empty)
    with pytest.raises(ConfigError, match="is a directory, not a config file"):
        load_yaml_mapping(tmp_path)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(
        ConfigError, match=rf"{re.escape(str(scalar))}: top level must be a mapping.*got str"
    ):
        load_yaml_mapping(scalar)
    with pytest.raises(ConfigError, match="teacher pool file not found"):
        load_yaml_mapping(tmp_path / "nope.yaml", "teacher pool")


DUPLICATED_SECTION = "optim:\n  learning_rate: 1.0e-6\nmax_steps: 3\noptim:\n  warmup_ratio: 0.1\n"
"""``optim`` twice: YAML keeps the last, so the first section's learning rate would be dropped
without a word and the run would train at the default rate."""


def test_a_duplicated_key_names_its_line_and_the_first_one(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text(DUPLICATED_SECTION)
    with pytest.raises(ConfigError) as info:
        load_config(dup)
    assert str(info.value) == (
        f"{dup}:4:1: not valid YAML: duplicate key 'optim' (first on line 1)"
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text("env:\n  name: arithmetic\n  levels: [1]\n  levels: [2]\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(nested))}:4:3: .*duplicate key"):
        load_yaml_mapping(nested)
    with pytest.raises(ConfigError, match="duplicate key 'lr'"):
        apply_overrides({}, ["optim={lr: 1, lr: 2}"])


def test_merge_keys_may_still_override_what_they_merge(tmp_path):
    """``<<: *base`` then a key of ``base``: an override, not a duplicate."""
    merged = tmp_path / "merged.yaml"
    merged.write_text("x: &base {a: 1, b: 2}\ny:\n  <<: *base\n  b: 3\n")
    assert load_yaml_mapping(merged)["y"] == {"a": 1, "b": 3}


NESTED_MERGE = "base: &b {x: 1}\na:\n  inner: &m\n    <<: *b\n    x: 5\nc:\n  <<: *m\n"
"""``inner`` merges ``base`` and sets ``x`` again; ``c``, a shallower mapping, merges ``inner``:
PyYAML flattens ``inner`` (in place) while building ``c``, before ``inner`` itself is built."""


def test_a_merged_mapping_that_overrides_a_key_may_itself_be_merged(tmp_path):
    nested = tmp_path / "nested_merge.yaml"
    nested.write_text(NESTED_MERGE)
    data = load_yaml_mapping(nested)
    assert data["a"]["inner"] == {"x": 5} and data["c"] == {"x": 5}
    nested.write_text(NESTED_MERGE + "  x: 6\n  x: 7\n")  # still a duplicate in ``c``
    with pytest.raises(ConfigError, match=r":9:3: .*duplicate key 'x' \(first on line 8\)"):
        load_yaml_mapping(nested)


MIS_INDENTED_ABLATION = "seeds: [0, 1]\narms:\n  - name: grpo\n  overrides: [max_steps=1]\n"
"""``overrides`` sits at the list's indentation (line 4, column 3) instead of under ``name``."""


def test_malformed_ablation_yaml_is_a_config_error(tmp_path):
    bad = tmp_path / "ablation.yaml"
    bad.write_text(MIS_INDENTED_ABLATION)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bad))}:4:3: not valid YAML"):
        load_ablation_config(bad)
    result = CliRunner().invoke(app, ["ablate", "--config", str(bad)])
    assert result.exit_code == 2
    assert f"error: {bad}:4:3: not valid YAML" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_teacher_pool_uses_the_same_loader(tmp_path):
    from composer_replication.config import PoolError, load_pool

    bad = tmp_path / "pool.yaml"
    bad.write_text("teachers:\n  - {name: a, base_url: http://x/v1\n")
    with pytest.raises(PoolError, match=rf"^{re.escape(str(bad))}:3:1: not valid YAML"):
        load_pool(bad)
    assert load_pool("teachers/local.yaml").teachers  # a shipped pool by name


def test_shipped_configs_resolve_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("ablation.yaml", "configs/ablation.yaml", "teachers/local.yaml"):
        assert resolve_config_path(name).resolve() == configs_dir() / name.removeprefix("configs/")
    (tmp_path / "configs").mkdir()
    own = tmp_path / "configs" / "ablation.yaml"
    own.write_text("arms: [{name: grpo}]\n")
    assert resolve_config_path("configs/ablation.yaml") == Path("configs/ablation.yaml")
    with pytest.raises(ConfigError, match="config file not found: nope.yaml"):
        resolve_config_path("nope.yaml")


def test_wheel_ships_the_configs_and_finds_the_default(tmp_path):
    """Build a wheel from a copy of the project (no build isolation, no network), check its file
    list, then import ``composer_replication.config`` from the unpacked wheel in a process whose
    working directory has no ``configs/``: the default config is the packaged file."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    shutil.copytree(REPO / "src", project / "src", ignore=ignore)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*cmd, "-w", str(tmp_path / "dist"), str(project)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("composer_replication-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"composer_replication/configs/{n}" for n in SHIPPED_NAMES} <= names
    assert not any(n.startswith(("support/", "tests/")) for n in names)
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    code = (
        "import composer_replication.config as c, sys; "
        "print(c.__file__); print(c.default_config_path()); "
        "print(c.load_config(None, ['max_steps=3']).max_steps, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    site = tmp_path / "site" / "composer_replication"
    assert out[:3] == [
        str(site / "config" / "__init__.py"),
        str(site / "configs" / "quickstart.yaml"),
        "3 False",
    ]


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


def test_a_loss_mapping_without_type_is_the_default_loss_and_typos_get_a_suggestion():
    assert load_config(None, ["sdpo.loss.beta=0.3"]).sdpo.loss.type == "jsd"
    assert load_config(None, ["replay.loss.beta=0.2"]).replay.loss.type == "dpo"
    with pytest.raises(
        ConfigError, match=r"sdpo\.loss\.jsd\.beta2: unknown key; did you mean 'beta'"
    ):
        load_config(None, ["sdpo.loss.beta2=1"])
    with pytest.raises(ConfigError, match=r"zzz: unknown key \(override 'zzz=1'\)$"):
        load_config(None, ["zzz=1"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env.name=calculator", "env.levels=[1]"], "env.levels: unknown key"),
        (["env.name=arithmetic", "env.task_sources=[x]"], "env.task_sources: unknown key"),
        (["env.name=calculator", "env.shots=1", "env.few_shot=false"], "shots need few_shot"),
        (["env.name=feature_deletion", "env.tests_budget_s=0.5"], "env.tests_budget_s"),
        (["env.name=humaneval", "env.openenv_url=http://h:1"], "env.openenv_url: unknown key"),
        (["env.name=nope"], "unknown environment 'nope'; known: arithmetic, calculator"),
    ],
)
def test_each_environment_holds_only_its_own_options(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_env_name_on_the_command_line_starts_the_section_afresh():
    """quickstart.yaml sets arithmetic's levels; naming another environment drops them, and
    the other env.* overrides still apply."""
    cfg = load_config(None, ["env.num_train=7", "env.name=calculator", "env.shots=1"])
    assert (cfg.env.name, cfg.env.num_train, cfg.env.shots) == ("calculator", 7, 1)
    assert not hasattr(cfg.env, "levels")
    same = load_config(None, ["env.name=arithmetic"])  # the file's own name: its options stay
    assert same.env.levels == [1, 2]
    assert load_config(None, ["env.levels=[3]"]).env.levels == [3]


def test_a_dumped_config_loads_back_with_its_environment(tmp_path):
    """``config.yaml`` of a run (dump_config) holds the variant's options and reloads as the
    same config."""
    cfg = load_config("feature_deletion.yaml", ["env.reward=fraction"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    again = load_config(path)
    assert again == cfg and again.env.reward == "fraction"


def test_an_old_flat_env_section_still_loads():
    """Run directories written before ``env`` became a union hold every environment's options
    in one mapping (``config.yaml`` of docs/evidence_runs): the other environments' options at
    their defaults are dropped; one set to something else is still an unknown key."""
    saved = sorted((REPO / "docs" / "evidence_runs").glob("*/*/seed*/config.yaml"))
    assert len(saved) > 100
    for path in saved:
        assert load_config(path).env.name in ("arithmetic", "calculator", "memory")
    flat = {
        "name": "arithmetic",
        "levels": [1],
        "shots": 2,
        "few_shot": True,
        "reward": "all_or_nothing",
    }
    assert RunConfig.model_validate({"env": flat}).env.levels == [1]
    with pytest.raises(ValueError, match="shots"):
        RunConfig.model_validate({"env": {**flat, "shots": 1}})


def test_distill_evidence_configs_carry_the_preregistered_analysis():
    """docs/results.md (issue 38) fixes the primary metric at step 10 in regime (a) and 4 in
    (c), steps to 80%, and the wall-time budget T and T/2."""
    for name, step in (("distill_a.yaml", 10), ("distill_c.yaml", 4)):
        report = load_ablation_config(REPO / "configs" / "evidence" / name).report
        assert (report.primary_step, report.threshold, report.wall_fractions) == (
            step,
            0.8,
            [1.0, 0.5],
        )


def test_an_error_from_an_override_names_the_override_not_only_the_file(tmp_path):
    """Before, ``optim.foo.bar=1`` was reported as an unknown key of quickstart.yaml, a file
    that has no such line."""
    with pytest.raises(ConfigError) as info:
        load_config(None, ["optim.lerning_rate=1e-5", "max_steps=0"])
    lines = str(info.value).splitlines()
    assert lines[0].startswith("invalid config (") and "quickstart.yaml" in lines[0]
    assert (
        "  max_steps: Input should be greater than or equal to 1 (override 'max_steps=0')" in lines
    )
    assert (
        "  optim.lerning_rate: unknown key; did you mean 'learning_rate'? "
        "(override 'optim.lerning_rate=1e-5')"
    ) in lines
    bad = tmp_path / "run.yaml"
    bad.write_text("max_steps: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad, ["optim.learning_rate=1e-5"])
    assert (
        str(info.value).splitlines()[1] == "  max_steps: Input should be greater than or equal to 1"
    )
    with pytest.raises(ConfigError, match=r"  optim: .* \(override 'optim=3'\)"):
        load_config(None, ["optim=3"])
    with pytest.raises(
        ConfigError, match=r"sdpo.loss.jsd.beta: .* \(override 'sdpo.loss.beta=7'\)"
    ):
        load_config(None, ["sdpo.loss.beta=7"])


def test_a_cross_field_error_does_not_blame_every_override():
    """A rule over the whole config (``grpo.weight=0`` with no channel) is reported at the root;
    every override lies under the root, so each was named as its cause (``output_dir=...``,
    ``max_steps=1`` too). Which one caused it cannot be told: none is named."""
    with pytest.raises(ConfigError) as info:
        load_config(None, ["output_dir=/tmp/x", "max_steps=1", "grpo.weight=0"])
    root = [line for line in str(info.value).splitlines() if line.startswith("  (root):")]
    assert len(root) == 1 and "trains nothing" in root[0], str(info.value)
    assert "override" not in root[0]


def test_a_config_path_that_is_not_a_regular_file_or_is_huge_is_named(tmp_path):
    """A FIFO (or /dev/zero) was reported as 'config file not found', though it exists; a
    read of it could block or never end. A file far beyond any config's size is refused
    before it is read whole."""
    import os

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(fifo))}: not a regular file"):
        load_config(fifo)
    with pytest.raises(ConfigError, match="^/dev/zero: not a regular file"):
        load_config("/dev/zero")
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as fh:
        fh.truncate(64 * 2**20)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(huge))}: 64 MiB, too large"):
        load_yaml_mapping(huge)


def test_a_tilde_in_output_dir_is_the_home_directory():
    """Before, the output checks expanded ``~`` but training wrote to a folder named ``~`` in
    the working directory."""
    from pathlib import Path

    assert load_config(None, ["output_dir=~/cr_runs/x"]).output_dir == str(
        Path.home() / "cr_runs" / "x"
    )
    assert load_config(None, ["output_dir=runs/a~b"]).output_dir == "runs/a~b"
    ablation = load_ablation_config(configs_dir() / "ablation.yaml", ["output_dir=~/cr_runs/ab"])
    assert ablation.output_dir == str(Path.home() / "cr_runs" / "ab")  # and its arms' runs below
