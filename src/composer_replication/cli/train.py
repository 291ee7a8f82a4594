"""``composer-replication train`` and ``eval``: one run of a config, and a model on a task split."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from composer_replication.cli.common import console, exit_on, quiet_libraries
from composer_replication.config import ConfigError, dump_config, load_config


def train_command(
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="key=value overrides, e.g. max_steps=2 optim.learning_rate=1e-5"),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML run config (default: configs/quickstart.yaml)"),
    ] = None,
) -> None:
    """Train with GRPO (+ channels) on an embedded task; evaluate base and trained model."""
    from composer_replication.envs.openenv.adapter import OpenEnvError
    from composer_replication.lm.models import ModelLoadError
    from composer_replication.run.train import check_resume, process_rank, run_training
    from composer_replication.sandbox.sandbox import SandboxUnavailableError

    with exit_on(ConfigError):
        cfg = load_config(config, overrides or [])
        check_resume(cfg)  # a missing or mismatched checkpoint fails before anything runs
    quiet_libraries()
    if process_rank()[0] != 0:  # torchrun / accelerate launch: rank 0 speaks for the run
        with exit_on(ConfigError, ModelLoadError, SandboxUnavailableError, OpenEnvError):
            run_training(cfg, console=None)
        return
    console.rule("[bold]composer-replication train")
    console.print(dump_config(cfg), markup=False)
    with exit_on(
        ConfigError, ModelLoadError, SandboxUnavailableError, OpenEnvError
    ):  # e.g. a bad model id
        summary = run_training(cfg, console=console)
    print_train_summary(summary)


def format_eval(s: dict) -> str:
    """``pass% [CI]   reward r`` for an evaluation summary (plus turns and tool calls per
    rollout for a tool environment)."""
    text = (
        f"{s['pass_rate']:.1%} [{s['pass_ci95_low']:.1%}, {s['pass_ci95_high']:.1%}]"
        f"   reward {s['mean_reward']:.3f}"
    )
    if "turns_per_rollout" in s:
        text += (
            f"   turns {s['turns_per_rollout']:.2f}  tool calls {s['tool_calls_per_rollout']:.2f}"
            f"  failed calls {s['tool_error_frac']:.0%}"
        )
    return text


def print_train_summary(summary) -> None:
    """Held-out results of base and trained model, their paired difference, and where the run
    wrote its files."""
    table = Table(title=f"held-out results ({summary.run_dir})")
    table.add_column("model")
    decoding = (summary.base or summary.trained or {}).get("decoding", "greedy")
    table.add_column(f"pass@1 {decoding} [95% CI]   mean reward")
    if summary.base:
        table.add_row("base", format_eval(summary.base))
    if summary.trained:
        table.add_row("trained", format_eval(summary.trained))
    if summary.delta:
        d = summary.delta
        table.add_row(
            "trained - base",
            f"{d['delta_pass_rate']:+.1%} [{d['ci95_low']:+.1%}, {d['ci95_high']:+.1%}] (paired)",
        )
    console.print(table)
    n = summary.base["n"] if summary.base else (summary.trained or {}).get("n")
    console.print(
        f"n = {n} held-out problems; train {summary.train_seconds:.0f} s, "
        f"total {summary.total_seconds:.0f} s; checkpoint: {summary.final_checkpoint}; "
        f"metrics: {summary.run_dir / 'metrics.jsonl'}; plot: {summary.run_dir / 'training_curves.png'}"
    )
    for report in summary.channel_reports:
        console.print(f"[bold yellow]warning:[/] {report}", highlight=False)


def eval_command(
    model: Annotated[
        str, typer.Option("--model", help="hub id, local dir, .gguf, or embedded:NAME")
    ],
    env: Annotated[
        str,
        typer.Option(
            "--env", help="arithmetic, humaneval, calculator or feature_deletion (tool use)"
        ),
    ] = "arithmetic",
    split: Annotated[str, typer.Option("--split", help="train or heldout")] = "heldout",
    n: Annotated[int, typer.Option("--n", min=1, help="number of problems")] = 200,
    levels: Annotated[
        str, typer.Option("--levels", help="arithmetic levels, comma-separated")
    ] = "1,2",
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, help="per turn for tool environments")
    ] = 16,
    max_turns: Annotated[
        int, typer.Option("--max-turns", min=1, help="tool environments: turns per rollout")
    ] = 3,
    max_tool_calls: Annotated[
        int, typer.Option("--max-tool-calls", min=0, help="tool environments: calls per rollout")
    ] = 4,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 32,
    task_source: Annotated[
        list[str] | None,
        typer.Option("--task-source", help="feature_deletion: a directory or name==version"),
    ] = None,
    show: Annotated[int, typer.Option("--show", min=0, help="print this many completions")] = 5,
    unsafe_run_without_isolation: Annotated[
        bool,
        typer.Option(
            "--unsafe-run-without-isolation",
            help="run model-written code without bubblewrap (unsafe; see docs/sandbox.md)",
        ),
    ] = False,
) -> None:
    """Greedy pass@1 and mean reward with 95% CIs on a task split."""
    from composer_replication.config import SandboxConfig
    from composer_replication.envs import get_env
    from composer_replication.envs.feature_deletion.generate import TaskSetError
    from composer_replication.envs.feature_deletion.source import SourceError
    from composer_replication.evaluation import evaluate
    from composer_replication.lm.models import ModelLoadError, load_model, load_tokenizer
    from composer_replication.progress import progress_bar
    from composer_replication.sandbox.sandbox import SandboxUnavailableError

    quiet_libraries()
    errors = (ModelLoadError, ValueError, FileNotFoundError, SandboxUnavailableError, SourceError,
              TaskSetError)  # fmt: skip
    with exit_on(*errors):
        if env == "arithmetic":
            kwargs: dict = {"levels": [int(x) for x in levels.split(",")]}
        elif env == "humaneval":
            kwargs = {
                "sandbox": SandboxConfig(unsafe_run_without_isolation=unsafe_run_without_isolation)
            }
        elif env == "feature_deletion" and task_source:
            kwargs = {"sources": task_source}
        else:
            kwargs = {}
        environment = get_env(env, **kwargs)
        tok = load_tokenizer(model)
        lm = load_model(model)
    total = min(n, len(environment.tasks(split)))
    with progress_bar(console, f"eval {env}/{split}", total) as adv:
        res = evaluate(lm, tok, environment, split, n, max_new_tokens, batch_size, progress=adv,
                       max_turns=max_turns, max_tool_calls=max_tool_calls)  # fmt: skip
    for tid, comp, ok in list(zip(res.task_ids, res.completions, res.passed, strict=True))[:show]:
        console.print(f"[{'green' if ok else 'red'}]{tid}[/] {comp!r}")
    s = res.summary()
    console.print(f"{model} on {env}/{split}: n={s['n']}  pass@1 {format_eval(s)}")
