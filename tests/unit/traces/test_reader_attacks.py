"""Attacks on the Claude Code, Codex and Gemini CLI readers from a virtual environment (issue
59): hostile logs (support/hostile_logs.py) read by an interpreter of a ``--without-pip`` venv
(support/venv_trainer.py) under a 2 GiB address-space limit. Each must give a bounded, valid
result or a clear one-line report, never a traceback.

Found by this battery and fixed: a Claude Code log switching branch at every record rebuilt the
branch each time (2000 pairs: 250 s; see test_claude_code.py's budget test); a secret named
with ``ſ`` or ``ı`` (``paſſword``: ``re.IGNORECASE`` matches them as ``s``/``i``, ``str.lower``
keeps them) passed redaction (test_redact.py)."""

from __future__ import annotations

import json

from support.hostile_logs import battery
from support.venv_trainer import run_in_venv

CPU_BOUND_S = 10.0  # per attack, process time (the slowest measured here: 0.7 s)


def test_hostile_logs_from_a_venv_are_bounded_and_valid() -> None:
    proc = run_in_venv(
        battery(1500, 2 << 30), timeout=600, packages=("orjson", "msgspec", "xxhash")
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    results = {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert len(results) == 18
    for r in results.values():
        assert not r["error"] and r["valid"] and r["cpu_s"] < CPU_BOUND_S, r
    loop = results["cc_branch_switch_loop"]
    assert loop["warnings"] == {"branch_switch_budget": 1} and loop["last_complete"] is False
    assert loop["states"] == 2 * 1500 - 1
    assert results["cc_parent_cycles"]["warnings"]["parent_cycle"] >= 1
    for name in ("cc_cross_session_result", "codex_cross_session_result"):
        # a result naming another session's call is that session's orphan, never attached
        assert results[name]["orphans"] == {"tool_result_without_call": 1,
                                            "tool_call_without_result": 1}, name  # fmt: skip
    for name in ("cc_non_utf8", "codex_non_utf8", "gemini_non_utf8"):
        assert results[name]["skipped"].get("invalid_json", 0) >= 1 and results[name]["states"] == 1
    assert results["cc_tiny_records"]["skipped"] == {"message_not_an_object": 75000}
    assert results["codex_tiny_records"]["skipped"] == {"unknown_record_type": 75000}
    assert results["codex_rollback_loop"]["changes"] == {"rollback": 1500}
    assert results["cc_case_folded_secret"]["leaked"] is False  # True before: ſ, ı passed
