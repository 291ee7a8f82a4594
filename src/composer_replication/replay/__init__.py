"""Teacher replay: a pool of teachers (config/teachers.py; their clients live in teachers/)
answers every state of a trace, under a hard budget, with a resumable journal, VOI gating and
tiers; and a local OpenAI-compatible server."""

from .budget import BudgetLedger, worst_case_prompt_tokens
from .journal import Journal
from .replay import ReplayResult, replay_trace

__all__ = [
    "BudgetLedger",
    "Journal",
    "ReplayResult",
    "replay_trace",
    "worst_case_prompt_tokens",
]
