"""Teacher replay: pools of OpenAI-compatible or local teachers, a hard budget, a resumable
journal, VOI gating and tiers, and a local OpenAI-compatible server."""

from .budget import BudgetLedger, worst_case_prompt_tokens
from .journal import Journal
from .replay import ReplayResult, replay_trace
from .teachers import (
    LocalHFTeacher,
    OpenAITeacher,
    PoolError,
    TeacherError,
    TeacherPool,
    TeacherSpec,
    build_teacher,
    load_pool,
)

__all__ = [
    "BudgetLedger",
    "Journal",
    "LocalHFTeacher",
    "OpenAITeacher",
    "PoolError",
    "ReplayResult",
    "TeacherError",
    "TeacherPool",
    "TeacherSpec",
    "build_teacher",
    "load_pool",
    "replay_trace",
    "worst_case_prompt_tokens",
]
