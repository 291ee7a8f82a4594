"""Cleaning preference pairs before training: filters on the ``chosen`` answer's text length,
word count and special-character ratio, then MinHash-LSH near-duplicate removal (datasketch;
Broder 1997 "On the resemblance and containment of documents"). Each filter reports how many
pairs it dropped.

The text of an answer is its content plus one ``name {canonical args}`` line per tool call.
This module is the native backend. ``NormalizeConfig.backend="datajuicer"`` names the same
recipe run by data-juicer's operators (`DJNormalizer` in ``normalize_dj.py``, which lists where
its statistics are defined differently); the caller picks the engine
(`composer_replication.prefs.export.normalize_with_backend`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from composer_replication.traces.actions import canonical_args

from .agreement import DPOPair

_WORD = re.compile(r"\S+")

Backend = Literal["native", "datajuicer"]


class NormalizeConfig(BaseModel):
    """Thresholds of the normalization recipe (applied to ``chosen``)."""

    model_config = ConfigDict(extra="forbid")

    min_chars: int = Field(1, ge=0)
    """Drop answers shorter than this many characters."""
    max_chars: int = Field(20_000, ge=1)
    """Drop answers longer than this many characters."""
    min_words: int = Field(1, ge=0)
    """Drop answers with fewer whitespace-separated words."""
    max_words: int = Field(5_000, ge=1)
    """Drop answers with more words."""
    max_special_char_ratio: float = Field(0.5, ge=0, le=1)
    """Drop answers whose share of characters that are neither alphanumeric nor whitespace is
    above this."""
    dedup: bool = True
    """Remove near-duplicate answers (keeps the first)."""
    minhash_threshold: float = Field(0.8, gt=0, le=1)
    """Estimated Jaccard similarity above which two answers are near-duplicates."""
    minhash_num_perm: int = Field(128, ge=16, le=1024)
    """MinHash permutations."""
    shingle_size: int = Field(5, ge=1, le=32)
    """Character n-gram size of the shingles (lower-cased, whitespace collapsed)."""
    backend: Backend = "native"
    """Engine that runs this recipe: ``native`` (this module and datasketch) or ``datajuicer``
    (data-juicer ops, extra ``datajuicer``; same thresholds, some statistics defined differently,
    see ``normalize_dj.py``)."""

    @model_validator(mode="after")
    def _ranges(self) -> NormalizeConfig:
        if self.min_chars > self.max_chars:
            raise ValueError("min_chars must be <= max_chars")
        if self.min_words > self.max_words:
            raise ValueError("min_words must be <= max_words")
        return self


@dataclass
class NormalizeReport:
    input: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        drops = ", ".join(f"{k} -{v}" for k, v in self.dropped.items())
        return f"normalize: {self.input} pairs -> {self.kept} kept ({drops})"


def answer_text(message: dict[str, Any]) -> str:
    """Content plus one line per tool call."""
    parts = [message.get("content") or ""]
    for c in message.get("tool_calls") or []:
        fn = c["function"]
        parts.append(f"{fn['name']} {canonical_args(fn.get('arguments', '{}'))}")
    return "\n".join(p for p in parts if p)


def special_char_ratio(text: str) -> float:
    if not text:
        return 0.0
    special = sum(1 for ch in text if not (ch.isalnum() or ch.isspace()))
    return special / len(text)


def _shingles(text: str, k: int) -> set[bytes]:
    t = " ".join(text.lower().split())
    if len(t) <= k:
        return {t.encode()}
    return {t[i : i + k].encode() for i in range(len(t) - k + 1)}


def _filters(cfg: NormalizeConfig):
    return [
        ("text_length", lambda t: cfg.min_chars <= len(t) <= cfg.max_chars),
        ("word_count", lambda t: cfg.min_words <= len(_WORD.findall(t)) <= cfg.max_words),
        ("special_char_ratio", lambda t: special_char_ratio(t) <= cfg.max_special_char_ratio),
    ]


def near_duplicates(texts: Sequence[str], cfg: NormalizeConfig) -> set[int]:
    """Indices of texts that near-duplicate an earlier kept text (MinHash LSH)."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=cfg.minhash_threshold, num_perm=cfg.minhash_num_perm)
    dups: set[int] = set()
    for i, text in enumerate(texts):
        mh = MinHash(num_perm=cfg.minhash_num_perm, seed=1)
        mh.update_batch(list(_shingles(text, cfg.shingle_size)))
        if lsh.query(mh):
            dups.add(i)
        else:
            lsh.insert(str(i), mh)
    return dups


def normalize_pairs(
    pairs: Sequence[DPOPair], cfg: NormalizeConfig | None = None
) -> tuple[list[DPOPair], NormalizeReport]:
    """Apply the filters in order, then near-dup removal; report drops per filter. The native
    backend only: a config for another backend is refused (`normalize_with_backend` picks)."""
    cfg = cfg or NormalizeConfig()
    if cfg.backend != "native":
        raise ValueError(
            f"normalize_pairs is the native backend, the config asks for {cfg.backend!r}: "
            "run it with prefs.export.normalize_with_backend (or DJNormalizer)"
        )
    report = NormalizeReport(input=len(pairs))
    kept = list(pairs)
    for name, keep in _filters(cfg):
        before = len(kept)
        kept = [p for p in kept if keep(answer_text(p.chosen))]
        report.dropped[name] = before - len(kept)
    if cfg.dedup:
        dups = near_duplicates([answer_text(p.chosen) for p in kept], cfg)
        kept = [p for i, p in enumerate(kept) if i not in dups]
        report.dropped["minhash_near_dup"] = len(dups)
    report.kept = len(kept)
    return kept, report
