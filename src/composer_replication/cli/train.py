"""``composer-replication train`` and ``eval``: one run of a config, and a model on a task split."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer
from rich.table import Table

from composer_replication.cli.common import (
    console,
    exit_on,
    exit_on_interrupt,
    quiet_libraries,
    require_extra,
)
from composer_replication.config import load_config
from composer_replication.progress import plain_line


def train_command(
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="[CONFIG.yaml] then key=value overrides, e.g. configs/agent_quickstart.yaml "
            "max_steps=2 optim.learning_rate=1e-5"
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML run config (default: configs/quickstart.yaml)"),
    ] = None,
) -> None:
    """Train with GRPO (+ channels) on an embedded task; evaluate base and trained model."""
    from composer_replication.run.preflight import check_model_sources, preflight, process_rank
    from composer_replication.run.train import run_training

    with exit_on():  # bad input: one line, exit 2, before any model loads
        config, overrides = config_argument(config, overrides or [])
        cfg = load_config(config, overrides)
        check_env_needs(cfg)  # a sandbox, a grader, an extra
        check_model_sources(cfg)  # a model path that does not exist, a hub id (also teachers')
        checked = preflight(cfg)  # resume, replay data, task sets and sources
    quiet_libraries()
    if process_rank()[0] != 0:  # torchrun / accelerate launch: rank 0 speaks for the run
        with exit_on():
            run_training(cfg, console=None, checked=checked)
        return
    print_run_header(cfg)
    with exit_on(), exit_on_interrupt(lambda: interrupted_run(cfg)):
        summary = run_training(cfg, console=console, report=print_result, checked=checked)
    print_train_summary(summary)


def config_argument(config: Path | None, args: list[str]) -> tuple[Path | None, list[str]]:
    """``(config, overrides)`` from ``--config`` and the positional arguments: one that ends
    in ``.yaml`` or ``.yml`` and has no ``=`` names the run config (``train
    configs/agent_quickstart.yaml max_steps=3``; a file, or a shipped config's name). Refused
    in one line: such a file that does not exist, two of them, or one with ``--config``."""
    from composer_replication.config import ConfigError, resolve_config_path

    files = [a for a in args if "=" not in a and a.lower().endswith((".yaml", ".yml"))]
    if not files:
        return config, args
    if config is not None or len(files) > 1:
        given = [f"--config {config}"] if config is not None else []
        raise ConfigError(f"two run configs ({', '.join([*given, *files])}): give one")
    path = resolve_config_path(files[0])  # not found: one line naming it
    return path, [a for a in args if a != files[0]]


def interrupted_run(cfg) -> str:
    """What a run stopped by Ctrl-C leaves: its logged steps and its newest checkpoint."""
    from composer_replication.trainer.callbacks import METRICS_FILE, read_metrics

    out = Path(cfg.output_dir)
    rows = read_metrics(out / METRICS_FILE)
    text = f"stopped after step {rows[-1]['step'] if rows else 0} of {cfg.max_steps}"
    if rows:
        text += f"; its steps are in {out / METRICS_FILE}"
    if any(out.glob("checkpoint-*")):
        text += "; continue from the newest checkpoint with resume_from=latest"
    return text


def check_env_needs(cfg) -> None:
    """What the run's environment needs on this machine, checked before anything loads: the
    sandbox of a code environment, the pytest that grades Feature Deletion, OpenEnv (extras)."""
    if getattr(cfg.env, "openenv_url", None):  # tool environments only
        require_extra("openenv", "openenv")
    if cfg.env.name == "humaneval":
        from composer_replication.sandbox.sandbox import ensure_isolation

        ensure_isolation(cfg.sandbox)
    if cfg.env.name == "feature_deletion":
        from composer_replication.sandbox.pytest_suite import require_pytest

        require_pytest()


def print_run_header(cfg) -> None:
    """A few lines saying what this run is (the full config goes to its run directory)."""
    from composer_replication.run.train import run_header

    console.rule("[bold]composer-replication train")
    for label, text in run_header(cfg):
        plain_line(console, f"{label:<9} {text}")


def print_result(tag: str, summary: dict) -> None:
    """One held-out result, printed as soon as it is known (``held-out base: 23.4% [...]``)."""
    plain_line(console, f"held-out {tag}: {format_eval(summary)}")


def format_eval(s: dict) -> str:
    """``pass% [CI]   reward r`` for an evaluation summary (plus turns and tool calls per
    rollout for a tool environment, and summaries and windows per rollout under a
    ``rollout.context`` strategy)."""
    text = (
        f"{s['pass_rate']:.1%} [{s['pass_ci95_low']:.1%}, {s['pass_ci95_high']:.1%}]"
        f"   reward {s['mean_reward']:.3f}"
    )
    if "turns_per_rollout" in s:
        text += (
            f"   turns {s['turns_per_rollout']:.2f}  tool calls {s['tool_calls_per_rollout']:.2f}"
            f"  failed calls {s['tool_error_frac']:.0%}"
        )
    if "context/summaries" in s:  # a rollout.context strategy (docs/summarization.md)
        text += (
            f"   summaries {s['context/summaries']:.2f}  windows {s['context/windows']:.2f}"
            f"  ended at cap {s['context/ended_at_cap']:.0%}"
        )
    return text


def print_train_summary(summary) -> None:
    """Held-out results of base and trained model, their paired difference, and where the run
    wrote its files (with ``eval.before_and_after=false``, no table: nothing was evaluated)."""
    if summary.base or summary.trained:
        _print_eval_table(summary)
        n = summary.base["n"] if summary.base else summary.trained["n"]
        evaluated = f"n = {n} held-out problems"
    else:
        evaluated = "no held-out evaluation (eval.before_and_after=false)"
    console.print(
        f"{evaluated}; train {summary.train_seconds:.0f} s, "
        f"total {summary.total_seconds:.0f} s; checkpoint: {summary.final_checkpoint}; "
        f"metrics: {summary.run_dir / 'metrics.jsonl'}; plot: {summary.run_dir / 'training_curves.png'}"
    )
    for report in summary.channel_reports:
        console.print(f"[bold yellow]warning:[/] {report}", highlight=False)


def _print_eval_table(summary) -> None:
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
    tool_profile: Annotated[
        str,
        typer.Option(
            "--tool-profile",
            "--harness",  # its name before issue 59
            help="feature_deletion: native, claude_code, codex or bash (the tools' vocabulary)",
        ),
    ] = "native",
    show: Annotated[int, typer.Option("--show", min=0, help="print this many completions")] = 5,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="a run config: evaluate on its env with its rollout settings (max_turns, "
            "max_tool_calls, rollout.context: the loop and budget training runs), its "
            "sandbox and its eval temperature and seed, as its run's own evaluation does; "
            "--env, --levels, --max-* and the feature_deletion options are then not used",
        ),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature",
            min=0.0,
            max=5.0,
            help="sample at this temperature (default: greedy, or the config's)",
        ),
    ] = None,
    unsafe_run_without_isolation: Annotated[
        bool,
        typer.Option(
            "--unsafe-run-without-isolation",
            help="run model-written code without bubblewrap (unsafe; see docs/sandbox.md)",
        ),
    ] = False,
) -> None:
    """Greedy pass@1 and mean reward with 95% CIs on a task split (sampled with
    ``--temperature``); with ``--config``, on a run config's environment and rollout settings
    (a ``rollout.context`` strategy runs the loop training runs: docs/summarization.md)."""
    from rich.markup import escape

    from composer_replication.config import SandboxConfig
    from composer_replication.envs import build_env
    from composer_replication.evaluation import evaluate
    from composer_replication.lm.models import load_model, load_tokenizer, resolve_model_source
    from composer_replication.progress import progress_bar
    from composer_replication.run.train import eval_turn_tokens

    quiet_libraries()
    context, seed, shared_prefix = None, 1234, True
    with exit_on(ValueError, FileNotFoundError):
        resolve_model_source(model)  # a bad name fails before the task set is built
        if config is not None:  # the run's own settings, as its evaluation uses them
            cfg = load_config(config, [])
            section, sandbox, env = cfg.env, cfg.sandbox, cfg.env.name
            max_turns, max_tool_calls = cfg.rollout.max_turns, cfg.rollout.max_tool_calls
            max_new_tokens, context = eval_turn_tokens(cfg), cfg.rollout.context
            seed, shared_prefix = cfg.eval.seed, cfg.generation.shared_prefix
            temperature = cfg.eval.temperature if temperature is None else temperature
        else:
            sandbox = SandboxConfig(unsafe_run_without_isolation=unsafe_run_without_isolation)
            section = eval_env_section(env, levels=parse_levels(levels),
                                       task_sources=task_source,
                                       tool_profile=tool_profile)  # fmt: skip
        check_env_needs(SimpleNamespace(env=section, sandbox=sandbox))
        environment = build_env(section, sandbox)  # as `train` builds its environment
        try:  # an unknown --split: before the model
            total = min(n, len(environment.tasks(split)))
        except ValueError as err:
            raise ValueError(f"--split {split}: {err}") from None
        tok = load_tokenizer(model)
        lm = load_model(model)
    with progress_bar(console, f"eval {env}/{split}", total) as adv:
        res = evaluate(lm, tok, environment, split, n, max_new_tokens, batch_size, progress=adv,
                       max_turns=max_turns, max_tool_calls=max_tool_calls,
                       temperature=temperature or 0.0, seed=seed, shared_prefix=shared_prefix,
                       context=context)  # fmt: skip
    for tid, comp, ok in list(zip(res.task_ids, res.completions, res.passed, strict=True))[:show]:
        console.print(f"[{'green' if ok else 'red'}]{tid}[/] {escape(repr(comp))}")
    s = res.summary()
    console.print(f"{model} on {env}/{split}: n={s['n']}  pass@1 {format_eval(s)}")


def eval_env_section(name: str, **options: Any) -> Any:
    """The ``env`` config section ``eval`` runs on: environment ``name`` with those of the
    command's ``options`` its section has (``levels`` for arithmetic, ``task_sources`` and
    ``tool_profile`` for feature_deletion), validated as a run config's ``env`` is."""
    from composer_replication.config.env import ENV_CONFIGS, env_config

    fields = ENV_CONFIGS[name].model_fields if name in ENV_CONFIGS else {}
    given = {k: v for k, v in options.items() if v is not None and k in fields}
    return env_config({"name": name, **given})


def parse_levels(text: str) -> list[int]:
    """``--levels 1,2`` -> [1, 2]; anything else is bad input naming the option."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(
            f"--levels {text!r}: expected comma-separated integers, e.g. 1,2"
        ) from None
