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
RECORDS = REPO / "docs" / "evidence_runs"
EXPERIMENTS = sorted(
    p.stem
    for p in (REPO / "configs" / "evidence").glob("*.yaml")
    if (RECORDS / Path(load_ablation_config(p).output_dir).name).is_dir()
)


def test_some_experiments_have_records():
    assert {"evidence_a", "evidence_b", "evidence_c"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_recorded_run_matches_its_arm_config_today(name):
    acfg = load_ablation_config(resolve_config_path(f"evidence/{name}.yaml"))
    record = RECORDS / Path(acfg.output_dir).name
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
