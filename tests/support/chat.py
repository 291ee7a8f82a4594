"""Structural checks of OpenAI chat messages (a reader's prefixes)."""

from __future__ import annotations


def assert_valid_openai_prefix(prefix: list[dict]) -> None:
    """Each assistant tool_calls message is followed by exactly its tool messages."""
    i = 0
    while i < len(prefix):
        m = prefix[i]
        assert m["role"] in ("system", "user", "assistant", "tool"), m
        assert isinstance(m["content"], str)
        assert set(m) <= {"role", "content", "tool_calls", "tool_call_id"}, m
        if m["role"] == "tool":
            raise AssertionError(f"tool message not after its call: {m}")
        i += 1
        if m["role"] == "assistant" and m.get("tool_calls"):
            want = {tc["id"] for tc in m["tool_calls"]}
            got = set()
            while i < len(prefix) and prefix[i]["role"] == "tool":
                got.add(prefix[i]["tool_call_id"])
                i += 1
            assert got == want, (want, got)
