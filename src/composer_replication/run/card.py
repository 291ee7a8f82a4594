"""The run's model card (``README.md`` in the run directory and in ``final/``): the base model,
the recipe (channels with their weights and losses, GRPO/DAPO settings, data) and the held-out
result, in place of TRL's generic card (which names the base model "None" when it was loaded
from a local directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from composer_replication.config import CHANNEL_SECTIONS, RunConfig


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _result_lines(base: dict | None, trained: dict | None, delta: dict | None) -> list[str]:
    if not trained:
        return ["No held-out evaluation ran (`eval.before_and_after: false`)."]
    lines = ["| model | pass@1 (greedy) | 95% CI | n |", "| --- | --- | --- | --- |"]
    for name, s in (("base", base), ("trained", trained)):
        if s:
            ci = f"[{_pct(s['pass_ci95_low'])}, {_pct(s['pass_ci95_high'])}]"
            lines.append(f"| {name} | {_pct(s['pass_rate'])} | {ci} | {s['n']} |")
    if delta:
        lines.append(
            f"\nPaired difference trained - base: {delta['delta_pass_rate']:+.1%} "
            f"[{delta['ci95_low']:+.1%}, {delta['ci95_high']:+.1%}]."
        )
    return lines


def _recipe_lines(cfg: RunConfig) -> list[str]:
    g, p = cfg.generation, cfg.grpo
    lines = [
        f"- policy: GRPO (`loss_type={p.loss_type}`, clip {p.epsilon}/{p.epsilon_high}, "
        f"KL beta {p.beta}), {g.prompts_per_step} prompts x {g.num_generations} samples a step, "
        f"{cfg.max_steps} steps, lr {cfg.optim.learning_rate}",
    ]
    for name in CHANNEL_SECTIONS:
        section = getattr(cfg, name)
        state = f"weight {section.weight}, loss `{section.loss.type}`" if section.weight else "off"
        lines.append(f"- channel `{name}`: {state}")
    env_opts = cfg.env.model_dump(exclude_defaults=True)
    lines.append(f"- environment: `{cfg.env.name}` {env_opts or ''}".rstrip())
    return lines


def model_card(cfg: RunConfig, summary: dict[str, Any]) -> str:
    """Markdown text of the card; ``summary`` is the run's ``eval.json`` content."""
    header = [
        "---",
        "library_name: transformers",
        "tags: [composer-replication, grpo, trl]",
        f"base_model: {cfg.model.name}",
        "---",
        "",
        f"# {Path(cfg.output_dir).name}",
        "",
        f"`{cfg.model.name}` post-trained with composer-replication (GRPO on verifiable "
        "rewards, with hint self-distillation and replay preferences when their weights are on).",
        "",
        "## Recipe",
        "",
        *_recipe_lines(cfg),
        "",
        f"## Held-out result ({cfg.env.name}, split `{cfg.eval.split}`)",
        "",
        *_result_lines(summary.get("base"), summary.get("trained"), summary.get("delta")),
        "",
        "The full config is `config.yaml`; per-step metrics `metrics.jsonl`.",
        "",
    ]
    return "\n".join(header)


def write_model_card(cfg: RunConfig, summary: dict[str, Any], *dirs: Path) -> None:
    """Write the card as ``README.md`` into each of ``dirs`` that exists."""
    text = model_card(cfg, summary)
    for d in dirs:
        if Path(d).is_dir():
            (Path(d) / "README.md").write_text(text)
