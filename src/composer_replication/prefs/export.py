"""Export preference pairs in TRL's conversational preference format, and the one-call pipeline.

Each record has ``prompt`` (the state's messages), ``chosen`` and ``rejected`` (a one-message
assistant list each), the format ``trl.DPOTrainer`` reads unchanged
(https://huggingface.co/docs/trl/dataset_formats#preference), plus provenance columns:
``state_id``, ``session_id``, ``source_format``, ``teachers``, ``n_teachers_agreeing``,
``n_teachers``, ``cost_usd``, the original OpenAI messages as JSON (``chosen_json``,
``rejected_json``) and the tool schemas the teachers were given (``tools_json``: the source
harness's, when it has a profile; '' otherwise), with which channel 3 renders the prompt.

``tool_format="text"`` (default) writes tool calls into the message text and tool results as
user turns (`composer_replication.lm.chat.flatten_messages`: ``<tool_call>`` / ``<tool_response>``
blocks), which every chat template renders (SmolLM2's ignores ``tool_calls``); ``"openai"``
keeps OpenAI ``tool_calls`` / ``tool`` messages for templates that support them.
"""

from __future__ import annotations

import os
import sqlite3
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from composer_replication.lm.chat import flatten_messages

from .agreement import AgreementStats, DPOPair, Embedder, extract_pairs
from .dataset import PAIRS_FILE
from .normalize import NormalizeConfig, NormalizeReport, normalize_pairs

ToolFormat = Literal["text", "openai"]


def _messages(msgs: Sequence[dict[str, Any]], tool_format: ToolFormat) -> list[dict[str, Any]]:
    if tool_format == "text":
        return flatten_messages(msgs)
    if tool_format != "openai":
        raise ValueError(f"tool_format must be 'text' or 'openai', got {tool_format!r}")
    return [dict(m) for m in msgs]


def pair_record(pair: DPOPair, tool_format: ToolFormat = "text") -> dict[str, Any]:
    """One TRL conversational preference record with provenance columns."""
    return {
        "prompt": _messages(pair.state_messages, tool_format),
        "chosen": _messages([pair.chosen], tool_format),
        "rejected": _messages([pair.rejected], tool_format),
        "state_id": pair.state_id,
        "session_id": pair.session_id,
        "source_format": pair.source_format,
        "teachers": list(pair.teachers),
        "n_teachers_agreeing": pair.n_teachers_agreeing,
        "n_teachers": pair.n_teachers,
        "cost_usd": float(pair.cost),
        "chosen_json": orjson.dumps(pair.chosen).decode(),
        "rejected_json": orjson.dumps(pair.rejected).decode(),
        "tools_json": orjson.dumps(pair.tools).decode() if pair.tools else "",
    }


def export_pairs(
    pairs: Sequence[DPOPair], out_dir: str | os.PathLike[str], tool_format: ToolFormat = "text"
):
    """Write ``out_dir/pairs.jsonl`` (``PAIRS_FILE``) and ``out_dir/dataset`` (``datasets.save_to_disk``);
    return the ``datasets.Dataset``."""
    from datasets import Dataset

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = [pair_record(p, tool_format) for p in pairs]
    with open(out / PAIRS_FILE, "wb") as fh:
        for r in records:
            fh.write(orjson.dumps(r) + b"\n")
    if tool_format == "openai":  # heterogeneous nested messages: keep Arrow columns uniform
        records = [_uniform(r) for r in records]
    ds = Dataset.from_list(records) if records else Dataset.from_dict(_empty_columns())
    ds.save_to_disk(str(out / "dataset"))
    return ds


def _uniform(record: dict[str, Any]) -> dict[str, Any]:
    def fix(m: dict[str, Any]) -> dict[str, Any]:
        return {"role": m["role"], "content": m.get("content") or "",
                "tool_calls": m.get("tool_calls") or [], "tool_call_id": m.get("tool_call_id", "")}  # fmt: skip

    return {**record, **{k: [fix(m) for m in record[k]] for k in ("prompt", "chosen", "rejected")}}


def _empty_columns() -> dict[str, list]:
    keys = pair_record(DPOPair("", [], {"role": "assistant", "content": ""},
                               {"role": "assistant", "content": ""}, 0, [])).keys()  # fmt: skip
    return {k: [] for k in keys}


@dataclass
class PairsResult:
    pairs: list[DPOPair]
    agreement: AgreementStats
    normalize: NormalizeReport
    dataset: Any = None

    def summary(self) -> str:
        a = self.agreement
        return (
            f"agreement: {a.states} states, {a.pairs} pairs; no answers {a.no_answers}, "
            f"no consensus {a.no_consensus}, agent agrees with consensus {a.agent_agrees}, "
            f"groups merged by embedding {a.merged_by_embedding}\n{self.normalize.summary()}"
        )


def normalize_with_backend(
    pairs: Sequence[DPOPair], cfg: NormalizeConfig | None = None
) -> tuple[list[DPOPair], NormalizeReport]:
    """Run ``cfg``'s normalization recipe on the engine ``cfg.backend`` names: `normalize_pairs`
    (native) or data-juicer's `DJNormalizer` (imported only when chosen)."""
    cfg = cfg or NormalizeConfig()
    if cfg.backend == "datajuicer":
        from .normalize_dj import DJNormalizer

        return DJNormalizer(cfg)(pairs)
    return normalize_pairs(pairs, cfg)


def pairs_from_journal(
    db: str | os.PathLike[str],
    *,
    agreement_threshold: int = 2,
    strategy: Literal["plurality", "weighted"] = "plurality",
    embedder: Embedder | None = None,
    similarity_threshold: float = 0.9,
    normalize: NormalizeConfig | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    tool_format: ToolFormat = "text",
    include_incomplete: bool = False,
) -> PairsResult:
    """Read a replay journal, extract pairs, normalize them, and (with ``out_dir``) export.
    States marked ``context_complete: false`` make no pair unless ``include_incomplete``."""
    from composer_replication.replay.journal import Journal, JournalError

    if not Path(db).is_file():
        raise FileNotFoundError(f"replay journal not found: {db}")
    with Journal(db) as jr:
        try:
            states, actions, costs = jr.states(), jr.teacher_actions(), jr.costs_by_state()
            teachers = jr.get_meta("teachers", {})
        except (sqlite3.DatabaseError, ValueError) as err:  # damaged pages or rows
            raise JournalError(f"{db}: damaged replay journal: {err}") from err
        if jr.unrecorded_path.exists():
            warnings.warn(
                f"{jr.unrecorded_path} holds paid answers the journal refused; they are not in "
                "these pairs: run the same replay again to import them",
                stacklevel=2,
            )
    if not include_incomplete:
        states = [s for s in states if s.meta.context_complete]
    weights = {name: spec.get("weight", 1.0) for name, spec in teachers.items()}
    pairs, stats = extract_pairs(
        states, actions, agreement_threshold, strategy=strategy, weights=weights,
        embedder=embedder, similarity_threshold=similarity_threshold, costs=costs,
    )  # fmt: skip
    kept, report = normalize_with_backend(pairs, normalize)
    ds = export_pairs(kept, out_dir, tool_format) if out_dir is not None else None
    return PairsResult(kept, stats, report, ds)


async def replay_and_normalize_trace(
    states: Sequence[Any],
    teachers: Sequence[Any],
    *,
    journal: str | os.PathLike[str],
    budget_usd: float | None = None,
    agreement_threshold: int = 2,
    strategy: Literal["plurality", "weighted"] = "plurality",
    embedder: Embedder | None = None,
    normalize: NormalizeConfig | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    tool_format: ToolFormat = "text",
    **replay_kwargs: Any,
):
    """Replay -> pairs -> normalize (-> export) in one call; returns ``(ReplayResult,
    PairsResult)``. ``replay_kwargs`` go to `replay_trace` (``selected``, ``tiered``, ...)."""
    from composer_replication.replay.replay import replay_trace

    result = await replay_trace(
        states, teachers, journal=journal, budget_usd=budget_usd,
        agreement_threshold=agreement_threshold, **replay_kwargs,
    )  # fmt: skip
    pairs = pairs_from_journal(
        journal, agreement_threshold=agreement_threshold, strategy=strategy, embedder=embedder,
        normalize=normalize, out_dir=out_dir, tool_format=tool_format,
    )  # fmt: skip
    return result, pairs
