"""`composer-replication hints uplift`: can the model use a hint in context (before training)?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from composer_replication.cli.common import console, exit_on

hints_app = typer.Typer(help="Hints for self-distillation.", no_args_is_help=True)

FORMS = {
    "arithmetic": ["verifier", "direction", "digits", "wrong", "sibling", "model",
                   "verifier/contrast", "direction/contrast", "digits/contrast"],
    "calculator": ["verifier", "process", "wrong", "sibling", "model"],
}  # fmt: skip
"""Hint forms per env; ``<form>/contrast``: the placebo-contrast teacher (single turn)."""
DEFAULT_FORMS = {"arithmetic": FORMS["arithmetic"][:6], "calculator": FORMS["calculator"][:4]}


@hints_app.command("uplift")
def uplift_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Report directory.")] = Path(
        "runs/uplift"
    ),
    model: Annotated[str, typer.Option(help="Model reference.")] = "embedded:smollm2-135m-instruct",
    env: Annotated[
        str, typer.Option(help="arithmetic (single turn) or calculator (multi-turn tool agent).")
    ] = "arithmetic",
    level: Annotated[list[int], typer.Option(help="Arithmetic level (repeatable).")] = [1, 2, 3],  # noqa: B006
    shots: Annotated[
        list[int], typer.Option(help="Calculator: worked exchanges in the prompt (repeatable).")
    ] = [1, 2],  # noqa: B006
    prompts: Annotated[int, typer.Option(min=1, help="Train problems per level.")] = 48,
    samples: Annotated[int, typer.Option(min=1, help="Sampled replies per problem.")] = 8,
    form: Annotated[
        list[str] | None,
        typer.Option(
            help="Hint form (repeatable; default: the env's forms but 'model'): "
            + "; ".join(f"{e}: {', '.join(f)}" for e, f in FORMS.items())
        ),
    ] = None,  # fmt: skip
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 1.0,
    max_new_tokens: Annotated[
        int | None, typer.Option(min=1, help="Per reply or turn (default 16; calculator 48).")
    ] = None,
    seed: Annotated[int, typer.Option()] = 0,
    max_failures: Annotated[int, typer.Option(min=1, help="Failures measured per level.")] = 128,
    contrast_scale: Annotated[
        float,
        typer.Option(min=0.0, help="Scale g of the '/contrast' forms' hint-minus-placebo logits."),
    ] = 1.0,
) -> None:
    """Sample replies, keep the failed ones, and measure per hint form how much the hint raises
    the correct answer's log-prob and the greedy pass rate (writes uplift.md/.json/.png). On
    the calculator the hint goes at the turn the verifier blamed, as in training."""
    from composer_replication.config import check_output_dir
    from composer_replication.run.uplift import markdown, run_uplift
    from composer_replication.run.uplift_turns import run_uplift_calculator

    if env not in FORMS:
        console.print(f"[red]error:[/red] unknown --env {env!r}; known: {', '.join(FORMS)}")
        raise typer.Exit(2)
    form = form or DEFAULT_FORMS[env]
    unknown = [f for f in form if f not in FORMS[env]]
    if unknown:
        console.print(f"[red]error:[/red] unknown --form {unknown} for {env}; known: {FORMS[env]}")
        raise typer.Exit(2)
    with exit_on(ValueError):
        check_output_dir(out, "--out")  # before the model loads, not after the measurement
        if env == "calculator":
            rows = run_uplift_calculator(
                model, shots, prompts, samples, form, out, temperature,
                max_new_tokens=max_new_tokens or 48, seed=seed, console=console,
                max_failures=max_failures,
            )  # fmt: skip
        else:
            rows = run_uplift(
                model, level, prompts, samples, form, out, temperature, max_new_tokens or 16,
                seed=seed, console=console, max_failures=max_failures,
                contrast_scale=contrast_scale,
            )  # fmt: skip
    console.print(markdown(rows), markup=False, highlight=False, soft_wrap=True)
    console.print(f"report: {out / 'uplift.md'}, {out / 'uplift.json'}, {out / 'uplift.png'}")


@hints_app.command("report")
def report_command(
    dirs: Annotated[list[Path], typer.Argument(help="Report directories holding uplift.json.")],
) -> None:
    """Recompute the tables of recorded uplift measurements with this version's statistics
    (rewrites each directory's uplift.md, its rows in uplift.json and uplift.png; the
    measurements stay as recorded). No model loads."""
    from composer_replication.run.uplift import markdown, rereport

    for out in dirs:
        with exit_on(ValueError):
            rows = rereport(out)
        console.print(f"{out}:", markup=False, highlight=False)
        console.print(markdown(rows), markup=False, highlight=False, soft_wrap=True)
