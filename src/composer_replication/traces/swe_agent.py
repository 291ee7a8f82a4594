"""SWE-agent trajectories (``*.traj``, 0.x and 1.x) and mini-swe-agent (``*.traj.json``).

SWE-agent writes ``{"environment", "trajectory", "history", "info", ...}``; ``history`` is the exact
message list the model saw (system prompt, demonstrations, observations as user messages, or
``role: tool`` messages with ``tool_call_ids`` in function-calling configs), so it is what we read.
The per-step ``trajectory`` entries (thought / action / observation, sometimes a full ``messages``
snapshot) repeat it and are not needed. SWE-agent's "thought" is visible model output, so it stays
in the action text. mini-swe-agent writes a plain message list, or ``{"messages": [...], "info"}``.
"""

from __future__ import annotations

from collections.abc import Iterator

from ._base import ReaderContext, as_dict, as_list, load_document
from .openai_messages import read_message_list
from .schema import TraceState

FORMAT = "swe_agent"


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    doc = load_document(ctx)
    if doc is None:
        return
    if isinstance(doc, list):
        msgs = doc
    else:
        d = as_dict(doc)
        msgs = as_list(d.get("history")) or as_list(d.get("messages"))
    if not msgs:
        ctx.report.skip_item(0, "no_history")
        return
    name = ctx.path.name.removesuffix(".json").removesuffix(".traj")
    sid = f"{ctx.path.parent.name}/{name}"
    yield from read_message_list(ctx, sid, msgs)
