"""config/channels.py: a channel section answers whether its channel is on (``enabled``),
and every reader asks it instead of comparing the weight itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from composer_replication.config import RunConfig
from composer_replication.config.channels import ChannelSection

SRC = Path(__file__).resolve().parents[3] / "src" / "composer_replication"
SECTIONS = ("sdpo", "replay", "distill")


@pytest.mark.parametrize("name", ["sdpo", "replay", "distill"])
def test_a_section_is_enabled_exactly_when_its_weight_is_positive(name):
    cfg = RunConfig()
    section = getattr(cfg, name)
    assert isinstance(section, ChannelSection) and not section.enabled
    assert section.model_copy(update={"weight": 0.5}).enabled


def test_run_config_records_only_the_enabled_sections():
    cfg = RunConfig.model_validate({"sdpo": {"weight": 0.3}})
    assert set(cfg.channel_settings()) == {"sdpo"}


def test_no_module_rederives_a_channel_switch_from_its_weight():
    """``cfg.<section>.weight > 0`` (or ``<= 0``, or ``getattr(cfg, name).weight > 0``)
    outside the section itself; 9 places before issue 59."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare) or not isinstance(node.left, ast.Attribute):
                continue
            owner = node.left.value
            section = isinstance(owner, ast.Attribute) and owner.attr in SECTIONS
            looked_up = isinstance(owner, ast.Call) and ast.unparse(owner.func) == "getattr"
            if node.left.attr == "weight" and (section or looked_up):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
