"""bench/bench_distill_step.py measures regime (a)'s own arms: the study's base overrides and
each arm's overrides and learning rate, only the teacher replaced (docs/benchmarks.md)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import bench_distill_step  # noqa: E402 - bench/bench_distill_step.py

from composer_replication.config import load_config, resolve_config_path  # noqa: E402


def test_arms_are_the_studys_with_the_teacher_replaced(tmp_path):
    for arm in ("grpo", "grpo+distill"):
        base, overrides = bench_distill_step.arm_overrides(arm, "runs/x/final")
        assert base == "quickstart.yaml"
        assert {"num_threads=1", "optim.gradient_checkpointing=false"} <= set(overrides)
        assert "optim.learning_rate=5.0e-6" in overrides
        cfg = load_config(resolve_config_path(base), [*overrides, f"output_dir={tmp_path}"])
        assert cfg.optim.learning_rate == 5e-6
        if arm == "grpo":
            assert cfg.distill.weight == 0 and not any("distill" in o for o in overrides)
        else:
            assert cfg.distill.weight == 1.0 and cfg.distill.loss.type == "reverse_kl"
            assert [t.model for t in cfg.distill.teachers] == ["runs/x/final"]


def test_without_a_teacher_the_students_own_weights_teach(tmp_path):
    base, overrides = bench_distill_step.arm_overrides("grpo+distill", None)
    student = load_config(resolve_config_path(base), []).model.name
    overrides = [o.replace("{student}", student) for o in overrides]
    cfg = load_config(resolve_config_path(base), [*overrides, f"output_dir={tmp_path}"])
    (teacher,) = cfg.distill.teachers
    assert teacher.model == student and teacher.allow_student_weights
