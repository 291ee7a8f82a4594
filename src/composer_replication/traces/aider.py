"""Aider chat transcripts (``.aider.chat.history.md`` and aider's published example transcripts).

Markdown conventions aider writes: ``# aider chat started at ...`` opens a session; lines starting
with ``#### `` are the user's input; lines starting with ``>`` are aider's own console output
(commands, "Applied edit", commit notices: not sent to the model, so not part of the prefix);
every other line after the first user input is the model's reply, which is the action (edit
blocks included). Text before the first user input (front matter, headings) and HTML wrapper tags
are preamble. Read line by line.
"""

from __future__ import annotations

from collections.abc import Iterator

from ._base import ReaderContext, SessionBuilder
from .schema import TraceState

FORMAT = "aider"
SESSION_MARK = "# aider chat started at"


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    rep = ctx.report
    b: SessionBuilder | None = None
    n_sessions = 0
    user: list[str] = []
    reply: list[str] = []
    reply_line = 0
    seen_user = False

    def flush_user() -> None:
        if user and b is not None:
            b.user("\n".join(user))
        user.clear()

    def flush_reply() -> None:
        nonlocal reply_line
        text = "\n".join(reply).strip("\n")
        if text and b is not None:
            b.assistant(reply_line, text)
        reply.clear()
        reply_line = 0

    with open(ctx.path, "rb") as fh:
        lineno = 0
        for raw in fh:
            lineno += 1
            rep.total_lines += 1
            rep.bytes += len(raw)
            line = raw.decode("utf-8", "replace").rstrip("\r\n").rstrip()
            if line.startswith(SESSION_MARK):
                flush_user()
                flush_reply()
                if b is not None:
                    b.finish()
                n_sessions += 1
                b = SessionBuilder(ctx, f"{ctx.path.name}#{n_sessions}")
                seen_user = False
            elif line.startswith("####"):
                flush_reply()
                if b is None:
                    n_sessions += 1
                    b = SessionBuilder(ctx, f"{ctx.path.name}#{n_sessions}")
                user.append(line[4:].strip())
                seen_user = True
            elif line.startswith(">"):
                pass  # aider console output
            elif not seen_user or line.startswith(("<div", "</div")):
                pass  # preamble / HTML wrapper
            else:
                flush_user()
                if not reply and not line:
                    rep.parsed += 1
                    continue
                if not reply:
                    reply_line = lineno
                reply.append(line)
            rep.parsed += 1
            if ctx.out:
                yield from ctx.drain()
    flush_user()
    flush_reply()
    if b is not None:
        b.finish()
    yield from ctx.drain()
