"""Auto-detection of a log file's format from its name and its first bytes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from composer_replication.config.base import UserError

FORMATS = (
    "claude_code",
    "codex",
    "swe_agent",
    "openhands",
    "gemini_cli",
    "openai_messages",
    "aider",
)
HEAD_BYTES = 256 * 1024
HEAD_LINES = 40


class UnknownFormatError(UserError, ValueError):
    """The file matches none of the supported formats."""


def detect_format(path: Path) -> str:
    """Return one of ``FORMATS`` or raise `UnknownFormatError` naming the file."""
    fmt = sniff(path)
    if fmt is None:
        raise UnknownFormatError(
            f"{path}: not a recognised agent log (supported: {', '.join(FORMATS)}); "
            "pass --format to force one"
        )
    return fmt


STATE_KEYS = frozenset({"state_id", "session_id", "step", "prefix", "action", "schema_version"})
"""The keys of a `TraceState` line: a file that starts with one is ingest output."""


def sniff(path: Path) -> str | None:
    name = path.name
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES).removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM
    if name.endswith(".md"):
        return "aider" if _looks_aider(head) else None
    if name.endswith((".traj", ".traj.json")):
        return "swe_agent"
    stripped = head.lstrip()
    if not stripped:
        return _by_name(path)
    lines = [ln for ln in head.split(b"\n")[:HEAD_LINES] if ln.strip()]
    first = _loads(lines[0]) if lines else None
    multi_objects = len(lines) > 1 and isinstance(first, dict)
    if isinstance(first, dict) and STATE_KEYS <= first.keys():
        return None  # our own output (ingest --out of an earlier run), not an agent log
    if name.endswith(".jsonl") or multi_objects:
        return _vote_jsonl(lines) or _by_name(path)
    doc = _loads(head) if len(head) < HEAD_BYTES else None
    if doc is not None:
        return _classify_doc(doc)
    return _classify_doc_prefix(stripped) or _by_name(path)


def _by_name(path: Path) -> str | None:
    """Empty or undecidable files: fall back on conventional locations/names."""
    s = str(path)
    if "rollout-" in path.name or "/.codex/" in s:
        return "codex"
    if path.suffix == ".jsonl":
        return "claude_code" if ("claude" in s.lower() or "/projects/" in s) else "openai_messages"
    return None


def _loads(b: bytes) -> Any:
    try:
        return orjson.loads(b)
    except orjson.JSONDecodeError:
        return None


def _looks_aider(head: bytes) -> bool:
    return b"# aider chat started at" in head or any(
        ln.startswith(b"#### ") for ln in head.split(b"\n")
    )


CLAUDE_TYPES = {
    "user",
    "assistant",
    "summary",
    "system",
    "queue-operation",
    "file-history-snapshot",
}
CODEX_TYPES = {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}


def _vote_jsonl(lines: list[bytes]) -> str | None:
    votes: Counter[str] = Counter()
    for i, ln in enumerate(lines):
        obj = _loads(ln)
        if not isinstance(obj, dict):
            continue
        fmt = _classify_record(obj, first=i == 0)
        if fmt:
            votes[fmt] += 1
    return votes.most_common(1)[0][0] if votes else None


def _classify_record(obj: dict[str, Any], first: bool) -> str | None:
    t = _str_type(obj)  # a dict/list "type" must not reach the set lookups below (unhashable)
    if t in CODEX_TYPES and "payload" in obj:
        return "codex"
    if "parentUuid" in obj or "sessionId" in obj and t in CLAUDE_TYPES or "leafUuid" in obj:
        return "claude_code"
    if t in ("user", "assistant") and isinstance(obj.get("message"), dict):
        return "claude_code"
    if "projectHash" in obj or t == "gemini" or "$set" in obj or _is_gemini_stream(obj, t):
        return "gemini_cli"
    if (
        isinstance(obj.get("history"), list)
        or "observation" in obj
        or ("action" in obj and ("source" in obj or "args" in obj))
        or _looks_openhands_sdk(obj)
    ):
        return "openhands"
    if t == "message" and isinstance(obj.get("content"), list):
        content = obj["content"]
        if any(
            isinstance(c, dict) and _str_type(c) in ("input_text", "output_text") for c in content
        ):
            return "codex"
    if first and set(obj) <= {"id", "timestamp", "instructions", "git"} and "id" in obj:
        return "codex"  # legacy rollout header
    if isinstance(obj.get("messages"), list) or "role" in obj:
        return "openai_messages"
    return None


GEMINI_STREAM_KEYS = {"init": "session_id", "tool_use": "tool_id", "tool_result": "tool_id"}


def _is_gemini_stream(obj: dict[str, Any], t: str | None) -> bool:
    """A Gemini CLI ``--output-format stream-json`` event: ``init`` (``session_id``),
    ``tool_use`` / ``tool_result`` (``tool_id``), or a ``message`` whose content is a string
    (chat-message logs carry no ``type: message``; Codex message items carry a list)."""
    if t in GEMINI_STREAM_KEYS:
        return GEMINI_STREAM_KEYS[t] in obj
    return t == "message" and "role" in obj and isinstance(obj.get("content"), str)


def _str_type(obj: dict[str, Any]) -> str | None:
    """The record's ``type`` when it is a string, else None: detection is total over any JSON
    value, so a record with an odd ``type`` votes for nothing instead of ending the run."""
    t = obj.get("type")
    return t if isinstance(t, str) else None


def is_openhands_sdk_event(obj: dict[str, Any]) -> bool:
    """A typed OpenHands SDK event: a ``kind`` such as ``ActionEvent`` or
    ``UserRejectObservation`` (the reader's test; detection also wants ``source`` or
    ``llm_message``, see `_looks_openhands_sdk`)."""
    kind = obj.get("kind")
    return isinstance(kind, str) and kind.endswith(("Event", "Observation"))


def _looks_openhands_sdk(obj: dict[str, Any]) -> bool:
    return is_openhands_sdk_event(obj) and ("source" in obj or "llm_message" in obj)


def _classify_doc(doc: Any) -> str | None:
    if isinstance(doc, list):
        items = [x for x in doc[:20] if isinstance(x, dict)]
        if any("action" in x or "observation" in x or _looks_openhands_sdk(x) for x in items):
            return "openhands"
        if any("role" in x for x in items):
            return "openai_messages"
        if any(_str_type(x) in ("user", "assistant") and "message" in x for x in items):
            return "claude_code"
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("loglines"), list):
        return "claude_code"
    if isinstance(doc.get("history"), list):
        hist = [x for x in doc["history"][:5] if isinstance(x, dict)]
        if "trajectory" in doc or "info" in doc or any("role" in x for x in hist):
            return "swe_agent"
        return "openhands"
    msgs = doc.get("messages")
    if isinstance(msgs, list):
        if (
            "sessionId" in doc
            or "projectHash" in doc
            or any(isinstance(m, dict) and _str_type(m) in ("user", "gemini") for m in msgs[:5])
        ):
            return "gemini_cli"
        return "openai_messages"
    return None


def _classify_doc_prefix(head: bytes) -> str | None:
    """A large single JSON document: decide from keys seen near its start."""
    h = head[:HEAD_BYTES]
    if h.startswith(b"{"):
        if b'"loglines"' in h:
            return "claude_code"
        if b'"trajectory"' in h or b'"history"' in h and b'"role"' in h:
            return "swe_agent"
        if b'"projectHash"' in h or b'"type": "gemini"' in h or b'"type":"gemini"' in h:
            return "gemini_cli"
        if b'"messages"' in h:
            return "openai_messages"
    if h.startswith(b"["):
        if b'"observation"' in h or b'"action"' in h:
            return "openhands"
        if b'"role"' in h:
            return "openai_messages"
    return None
