"""One teacher description (config/teachers.py) for replay's pool and ``distill.teachers``:
the same classes on both sides, a union keyed on ``type``, unknown keys and out-of-range values
refused, and a pool written before (``base_url: local``, no ``type``) still loading, with one
deprecation line naming the new key and the journal key it had."""

from __future__ import annotations

import json
import logging

import pytest
from pydantic import ValidationError

from composer_replication.config import (
    LocalTeacherConfig,
    PoolError,
    RemoteTeacherConfig,
    TeacherPool,
    load_config,
    load_pool,
)

POOL = """teachers:
  - {name: served, base_url: "http://127.0.0.1:8101/v1", model: smol, tier: 1, top_k: 4}
  - {name: here, type: local, model: runs/teacher/final, max_tokens: 8}
"""


def test_replay_and_distill_read_one_description(tmp_path):
    path = tmp_path / "pool.yaml"
    path.write_text(POOL)
    pool = load_pool(path)
    cfg = load_config(None, ["distill.weight=1", "distill.route=best",
                             f"distill.teachers={json.dumps([t.model_dump() for t in pool.teachers])}"])  # fmt: skip
    assert [type(t) for t in pool.teachers] == [RemoteTeacherConfig, LocalTeacherConfig]
    assert cfg.distill.teachers == pool.teachers  # a pool entry is a distill teacher as it is
    served, here = pool.teachers
    assert (served.tier, served.top_k, here.max_tokens, here.device) == (1, 4, 8, "same")


def test_an_old_local_teacher_loads_with_a_line_naming_the_new_key(tmp_path, caplog):
    path = tmp_path / "pool.yaml"
    path.write_text("teachers:\n  - {name: old, base_url: local, model: m, temperature: 0.5}\n")
    with caplog.at_level(logging.WARNING, logger="composer_replication.config.teachers"):
        (teacher,) = load_pool(path).teachers
    assert isinstance(teacher, LocalTeacherConfig) and teacher.temperature == 0.5
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["teachers[0].base_url: local is deprecated: use type: local"], lines
    # replay's journal key is what the old spelling hashed: old journals still match
    assert teacher.request_params() == {"base_url": "local", "model": "m", "max_tokens": 256,
                                        "temperature": 0.5}  # fmt: skip


@pytest.mark.parametrize(
    ("teacher", "field"),
    [
        ({"type": "local", "name": "a", "model": "m", "base_url": "http://x/v1"}, "base_url"),
        ({"type": "remote", "name": "a", "base_url": "http://x/v1", "device": "cpu"}, "device"),
        ({"type": "remote", "name": "a", "base_url": "http://x/v1", "top_k": 0}, "top_k"),
        ({"type": "local", "name": "a", "model": "m", "tier": "1"}, "tier"),
        ({"type": "cloud", "name": "a", "model": "m"}, "type"),
    ],
)  # fmt: skip
def test_a_teacher_refuses_what_its_kind_does_not_have(teacher, field):
    with pytest.raises(ValidationError, match=field):
        TeacherPool.model_validate({"teachers": [teacher]})


def test_a_pool_names_its_model_and_distill_refuses_a_slash(tmp_path):
    path = tmp_path / "pool.yaml"
    path.write_text("teachers:\n  - {name: a, base_url: 'http://x/v1'}\n")
    with pytest.raises(PoolError, match="model is empty"):
        load_pool(path)
    with pytest.raises(ValueError, match="hold '/'"):
        load_config(None, ["distill.weight=1", "distill.teachers=[{name: a/b, model: m}]"])
