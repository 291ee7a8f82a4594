"""The finished evidence runs kept in docs/evidence_runs stay reusable: for every ablation
config whose records are kept there, each recorded arm/seed's ``config.yaml`` equals the
config today's code builds for that arm (``run.ablation.check_reusable``). A changed default or
shipped base config that would make ``ablate`` refuse to resume those experiments (or
silently change what "the same arm" means) fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from composer_replication.config import resolve_config_path
from composer_replication.config.ablation import load_ablation_config
from composer_replication.run.ablation import arm_config, arm_dir, check_reusable

REPO = Path(__file__).resolve().parents[3]
CONFIGS = sorted((REPO / "configs" / "evidence").glob("*.yaml"))
EXPERIMENTS = sorted(
    p.stem for p in CONFIGS if (REPO / str(load_ablation_config(p).records_dir)).is_dir()
)


def test_some_experiments_have_records():
    assert {"evidence_a", "evidence_b", "evidence_c"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_experiment_keeps_its_finished_runs_in_the_repository(path):
    """Each shipped experiment names its record folder under docs/evidence_runs (relative to the
    repository root, as its output_dir), so a run finished in one session survives the next
    session's fresh clone (``records_dir``)."""
    acfg = load_ablation_config(path)
    assert acfg.records_dir == f"docs/evidence_runs/{Path(acfg.output_dir).name}"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_recorded_run_matches_its_arm_config_today(name):
    acfg = load_ablation_config(resolve_config_path(f"evidence/{name}.yaml"))
    record = REPO / str(acfg.records_dir)
    checked = 0
    for arm in acfg.arms:
        for seed in acfg.seeds:
            cfg = arm_config(acfg, arm, seed)
            saved = record / arm_dir(acfg, arm.name).name / f"seed{seed}"
            if not (saved / "config.yaml").is_file():
                continue  # a run the record does not hold (not finished, or another config's)
            check_reusable(cfg.model_copy(update={"output_dir": str(saved)}))
            checked += 1
    assert checked > 0, f"{name}: no recorded run of any of its arms under {record}"
