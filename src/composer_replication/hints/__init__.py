"""Hints for channel 2: turn a failed rollout's verifier feedback, a successful sibling, or a
hint model's text into the context of the self-teacher.

The self-teacher is the policy itself, shown the hint, scoring the *same* completion tokens
(SDPO: Hübotter et al., "Reinforcement Learning via Self-Distillation", 2026; OPSD: Zhao et
al., "Self-Distilled Reasoner: On-Policy Self-Distillation", 2026). Where the hinted teacher
puts less probability than the student on a token, the student learns to avoid it.
"""

from composer_replication.hints.build import (
    Hint,
    HintModel,
    HintTemplates,
    OpenAIHintModel,
    build_hints,
    insert_hint,
)

__all__ = ["Hint", "HintModel", "HintTemplates", "OpenAIHintModel", "build_hints", "insert_hint"]
