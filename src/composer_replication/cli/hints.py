"""`composer-replication hints uplift`: can the model use a hint in context (before training)?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from composer_replication.cli.common import console, exit_on

hints_app = typer.Typer(help="Hints for self-distillation.", no_args_is_help=True)

FORMS = ["verifier", "direction", "digits", "wrong", "sibling", "model"]


@hints_app.command("uplift")
def uplift_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Report directory.")] = Path(
        "runs/uplift"
    ),
    model: Annotated[str, typer.Option(help="Model reference.")] = "embedded:smollm2-135m-instruct",
    level: Annotated[list[int], typer.Option(help="Arithmetic level (repeatable).")] = [1, 2, 3],  # noqa: B006
    prompts: Annotated[int, typer.Option(min=1, help="Train problems per level.")] = 48,
    samples: Annotated[int, typer.Option(min=1, help="Sampled replies per problem.")] = 8,
    form: Annotated[
        list[str], typer.Option(help=f"Hint form (repeatable): {', '.join(FORMS)}.")
    ] = FORMS,  # noqa: B006
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 16,
    seed: Annotated[int, typer.Option()] = 0,
    max_failures: Annotated[int, typer.Option(min=1, help="Failures measured per level.")] = 128,
) -> None:
    """Sample replies, keep the failed ones, and measure per hint form how much the hint raises
    the correct answer's log-prob and the greedy pass rate (writes uplift.md/.json/.png)."""
    from composer_replication.hints.uplift import markdown, run_uplift

    unknown = [f for f in form if f not in FORMS]
    if unknown:
        console.print(f"[red]error:[/red] unknown --form {unknown}; known: {FORMS}")
        raise typer.Exit(2)
    with exit_on(ValueError):
        rows = run_uplift(
            model, level, prompts, samples, form, out, temperature, max_new_tokens, seed=seed,
            console=console, max_failures=max_failures,
        )  # fmt: skip
    console.print(markdown(rows), markup=False, highlight=False, soft_wrap=True)
    console.print(f"report: {out / 'uplift.md'}, {out / 'uplift.json'}, {out / 'uplift.png'}")
