"""The feature_deletion environment on the vendored textkit fixture (9 tasks), for tests."""

from __future__ import annotations

from pathlib import Path

TEXTKIT = Path(__file__).resolve().parents[1] / "fixtures" / "feature_deletion" / "textkit"


def textkit_env(task_dir: Path, workers: int = 2, **options):
    from composer_replication.config import TaskGenConfig
    from composer_replication.envs import get_env

    return get_env("feature_deletion", sources=[str(TEXTKIT)], task_dir=task_dir,
                   generation=TaskGenConfig(workers=workers, suite_timeout_s=30),
                   heldout_fraction=0.3, **options)  # fmt: skip


def textkit_records(task_dir: Path) -> list[dict]:
    """The task records of the one textkit task set generated under ``task_dir``."""
    import json

    (tasks_file,) = Path(task_dir).glob("*/tasks.jsonl")
    return [json.loads(line) for line in tasks_file.read_text().splitlines()]


def original_line(task) -> str:
    """The longest line of the body a textkit task deleted (what an attack must never read)."""
    from composer_replication.envs.feature_deletion.candidates import original_body
    from composer_replication.envs.feature_deletion.workspace import candidate_of

    body = original_body((TEXTKIT / task.data["file"]).read_text(), candidate_of(task.data))
    return max(body.splitlines(), key=len).strip()
