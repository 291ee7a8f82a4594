"""``composer-replication`` command line: thin wrappers that parse a config, log it, build the
parts and run them."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from composer_replication.config import ConfigError, dump_config, load_config

app = typer.Typer(
    help="RL post-training for Hugging Face causal LMs: GRPO/DAPO, hint self-distillation, "
    "multi-teacher trace replay, DiLoCo.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(stderr=False)
err_console = Console(stderr=True)


def _fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
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
    try:
        cfg = load_config(config, overrides or [])
    except ConfigError as err:
        _fail(str(err))
    _quiet_libraries()
    console.rule("[bold]composer-replication train")
    console.print(dump_config(cfg), markup=False)
    from composer_replication.envs.sandbox import SandboxUnavailableError
    from composer_replication.trainer.run import run_training

    try:
        summary = run_training(cfg, console=console)
    except SandboxUnavailableError as err:
        _fail(str(err))
    _print_train_summary(summary)


def _quiet_libraries() -> None:
    """Silence deprecation chatter from transformers/TRL; our own output is the summary."""
    import warnings

    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="trl")
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _fmt_eval(s: dict) -> str:
    return (
        f"{s['pass_rate']:.1%} [{s['pass_ci95_low']:.1%}, {s['pass_ci95_high']:.1%}]"
        f"   reward {s['mean_reward']:.3f}"
    )


def _print_train_summary(summary) -> None:
    table = Table(title=f"held-out results ({summary.run_dir})")
    table.add_column("model")
    table.add_column("pass@1 greedy [95% CI]   mean reward")
    if summary.base:
        table.add_row("base", _fmt_eval(summary.base))
    if summary.trained:
        table.add_row("trained", _fmt_eval(summary.trained))
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


@app.command("eval")
def eval_cmd(
    model: Annotated[
        str, typer.Option("--model", help="hub id, local dir, .gguf, or embedded:NAME")
    ],
    env: Annotated[str, typer.Option("--env", help="arithmetic or humaneval")] = "arithmetic",
    split: Annotated[str, typer.Option("--split", help="train or heldout")] = "heldout",
    n: Annotated[int, typer.Option("--n", min=1, help="number of problems")] = 200,
    levels: Annotated[
        str, typer.Option("--levels", help="arithmetic levels, comma-separated")
    ] = "1,2",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 16,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 32,
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
    from composer_replication.envs.base import get_env
    from composer_replication.envs.sandbox import SandboxUnavailableError
    from composer_replication.evaluation import evaluate
    from composer_replication.models import ModelLoadError, load_model, load_tokenizer
    from composer_replication.trainer.run import _progress

    _quiet_libraries()
    try:
        if env == "arithmetic":
            kwargs: dict = {"levels": [int(x) for x in levels.split(",")]}
        else:
            kwargs = {
                "sandbox": SandboxConfig(unsafe_run_without_isolation=unsafe_run_without_isolation)
            }
        environment = get_env(env, **kwargs)
        tok = load_tokenizer(model)
        lm = load_model(model)
    except (ModelLoadError, ValueError, FileNotFoundError, SandboxUnavailableError) as err:
        _fail(str(err))
    total = min(n, len(environment.tasks(split)))
    with _progress(console, f"eval {env}/{split}", total) as adv:
        res = evaluate(lm, tok, environment, split, n, max_new_tokens, batch_size, progress=adv)
    for tid, comp, ok in list(zip(res.task_ids, res.completions, res.passed, strict=True))[:show]:
        console.print(f"[{'green' if ok else 'red'}]{tid}[/] {comp!r}")
    s = res.summary()
    console.print(f"{model} on {env}/{split}: n={s['n']}  pass@1 {_fmt_eval(s)}")


@app.command()
def ablate(
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value overrides of the ablation config")
    ] = None,
    config: Annotated[Path, typer.Option("--config", "-c", help="ablation YAML")] = Path(
        "configs/ablation.yaml"
    ),
) -> None:
    """Train every arm (GRPO, +SDPO, +replay, all, TRL SDPO peer) for every seed; write the
    results table (docs/results.md) and a held-out-vs-step plot."""
    from composer_replication.config import load_ablation_config, resolve_config_path

    try:
        acfg = load_ablation_config(resolve_config_path(str(config)), overrides or [])
        for arm in acfg.arms:  # validate every arm's run config before training anything
            from composer_replication.ablation import arm_config

            arm_config(acfg, arm, acfg.seeds[0])
    except ConfigError as err:
        _fail(str(err))
    _quiet_libraries()
    from composer_replication.ablation import run_ablation

    command = (
        "composer-replication ablate --config "
        + str(config)
        + "".join(f" {o}" for o in overrides or [])
    )
    rows = run_ablation(acfg, command, console)
    table = Table(title="ablation: final held-out pass@1 (mean over seeds, 95% t-CI)")
    for col in ("arm", "mean [95% CI]", "per seed"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["arm"],
            f"{r['mean']:.1%} [{r['ci95_low']:.1%}, {r['ci95_high']:.1%}]",
            ", ".join(f"{v:.1%}" for v in r["per_seed"]),
        )
    console.print(table)


def _register_subcommands() -> None:
    from composer_replication.cli_diloco import diloco_command
    from composer_replication.cli_ingest import ingest_command
    from composer_replication.cli_replay import pairs_command, replay_command, serve_command

    app.command("ingest")(ingest_command)
    app.command("serve")(serve_command)
    app.command("replay")(replay_command)
    app.command("pairs")(pairs_command)
    app.command("diloco", context_settings={"allow_extra_args": True})(diloco_command)


_register_subcommands()


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
