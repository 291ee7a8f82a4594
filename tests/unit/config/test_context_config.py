"""``rollout.context`` (docs/summarization.md): defaults, ranges, unknown keys, and the
cross-field rules, each refused in one line naming the key before any model loads."""

from __future__ import annotations

import pytest

from composer_replication.config import ConfigError, load_config
from composer_replication.config.env import DEFAULT_SUMMARY_PROMPT

AGENT = ["env.name=calculator", "eval.before_and_after=false",
         "generation.max_completion_length=64"]  # fmt: skip
SUMMARIZE = [*AGENT, "rollout.context.strategy=summarize", "rollout.context.max_tokens=1024",
             "rollout.context.summary_max_tokens=128"]  # fmt: skip


def test_defaults_change_nothing():
    c = load_config(None, []).rollout.context
    assert c.strategy == "none" and c.max_tokens == 2048 and c.max_summaries == 4
    assert c.summary_prompt == DEFAULT_SUMMARY_PROMPT and c.summary_max_tokens == 256


def test_a_summarize_run_parses():
    c = load_config(None, [*SUMMARIZE, "rollout.context.max_summaries=2"]).rollout.context
    assert (c.strategy, c.max_tokens, c.max_summaries, c.summary_max_tokens) == (
        "summarize",
        1024,
        2,
        128,
    )
    ray = load_config(None, [*SUMMARIZE, "rollout.engine=ray"]).rollout  # the workers run it
    assert (ray.engine, ray.context.strategy) == ("ray", "summarize")


def test_hints_and_distillation_run_on_packed_episodes():
    """sdpo and the distill channel score packed episodes window by window
    (channels/packed.py; tests/unit/trainer/test_summarize_channels.py): not refused."""
    cfg = load_config(None, [*SUMMARIZE, "alpha_sdpo=0.1", "distill.weight=1",
                             "distill.teachers=runs/t/final"])  # fmt: skip
    assert cfg.sdpo.enabled and cfg.distill.enabled


def test_before_and_after_evaluation_runs_with_a_strategy():
    """Evaluation runs the same loop (evaluation.py), so it is no longer refused."""
    cfg = load_config(None, [*SUMMARIZE, "eval.before_and_after=true"])
    assert cfg.eval.before_and_after and cfg.rollout.context.strategy == "summarize"


@pytest.mark.parametrize(
    "override, match",
    [
        ("rollout.context.strategy=compact", "rollout.context.strategy"),
        ("rollout.context.max_tokens=10", "rollout.context.max_tokens"),
        ("rollout.context.max_summaries=0", "rollout.context.max_summaries"),
        ("rollout.context.summary_max_tokens=2", "rollout.context.summary_max_tokens"),
        ("rollout.context.summary_prompt=", "rollout.context.summary_prompt"),
        ("rollout.context.budget=3", "budget"),
    ],
)
def test_ranges_and_unknown_keys_are_refused(override, match):
    with pytest.raises(ConfigError, match=match) as err:
        load_config(None, [*SUMMARIZE, override])
    assert any(match in line for line in str(err.value).splitlines())


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["env.name=arithmetic", "rollout.context.strategy=truncate"], "needs a tool environment"),
        ([*SUMMARIZE, "rollout.context.summary_max_tokens=600"], "under half"),
        # 64 (turn) + 99 (summary, under half of 200) + 64 (room) = 227 > 200
        (
            [*SUMMARIZE, "rollout.context.max_tokens=200", "rollout.context.summary_max_tokens=99"],
            r"max_tokens >= 227",
        ),
        (
            [*AGENT, "rollout.context.strategy=truncate", "rollout.context.max_tokens=64"],
            r"max_tokens >= 65",
        ),
    ],
)
def test_cross_field_rules_name_the_keys(overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        load_config(None, overrides)
    line = next(x for x in str(err.value).splitlines() if "rollout.context" in x)
    assert match.replace("\\", "").split(" ")[0] in line
