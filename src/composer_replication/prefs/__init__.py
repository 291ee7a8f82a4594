"""Teacher agreement -> preference pairs -> normalization -> TRL-ready export."""

from .agreement import (
    AgreementStats,
    DPOPair,
    MiniLMEmbedder,
    action_key,
    extract_dpo_pairs,
    extract_pairs,
)
from .export import (
    export_pairs,
    normalize_with_backend,
    pair_record,
    pairs_from_journal,
    replay_and_normalize_trace,
)
from .normalize import NormalizeConfig, NormalizeReport, normalize_pairs
from .normalize_dj import DJNormalizer

__all__ = [
    "AgreementStats",
    "DJNormalizer",
    "DPOPair",
    "MiniLMEmbedder",
    "NormalizeConfig",
    "NormalizeReport",
    "action_key",
    "export_pairs",
    "extract_dpo_pairs",
    "extract_pairs",
    "normalize_pairs",
    "normalize_with_backend",
    "pair_record",
    "pairs_from_journal",
    "replay_and_normalize_trace",
]
