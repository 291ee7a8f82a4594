"""Hostile agent logs for the Claude Code, Codex and Gemini CLI readers (issue 59's attacks),
and :data:`BATTERY`, a script that reads each one and prints a JSON line per attack: run it
with ``support.venv_trainer.run_in_venv`` so the readers run from a virtual environment under a
memory limit, as a user's ``composer-replication ingest`` would.

Each line: ``name``, ``cpu_s`` (process time of the read), ``states``, ``error`` (the first
line of an exception that escaped, empty if none), ``valid`` (every state's prefix is valid
OpenAI chat), ``skipped``, ``warnings``, ``orphans``, ``changes`` (context changes) and
``last_complete`` (the last state's ``context_complete``), ``leaked`` (the first state shows a
planted secret).
"""

from __future__ import annotations

import json
from typing import Any

Record = dict[str, Any]


def cc_user(uuid: Any, parent: Any, text: Any, sid: str = "S") -> Record:
    return {"type": "user", "uuid": uuid, "parentUuid": parent, "sessionId": sid,
            "message": {"role": "user", "content": text}}  # fmt: skip


def cc_answer(uuid: Any, parent: Any, mid: str, calls: tuple[str, ...] = (), sid: str = "S"):
    content = [{"type": "text", "text": "ok"}]
    content += [{"type": "tool_use", "id": c, "name": "Bash", "input": {"command": "ls"}}
                for c in calls]  # fmt: skip
    return {"type": "assistant", "uuid": uuid, "parentUuid": parent, "sessionId": sid,
            "message": {"role": "assistant", "id": mid, "content": content}}  # fmt: skip


def cc_result(uuid: str, parent: str, call_id: str, sid: str = "S") -> Record:
    block = {"type": "tool_result", "tool_use_id": call_id, "content": "r"}
    return {"type": "user", "uuid": uuid, "parentUuid": parent, "sessionId": sid,
            "message": {"role": "user", "content": [block]}}  # fmt: skip


def claude_code(size: int) -> dict[str, list[Record] | bytes]:
    """Claude Code attacks; ``size`` scales the long ones."""
    branch = [cc_user("root", None, "start"), cc_answer("a0", "root", "m_a0"),
              cc_user("b0", "root", "B")]  # fmt: skip
    last = {"a": "a0", "b": "b0"}
    for i in range(1, size):
        for side in "ab":  # each record continues the branch the one before cut off
            branch.append(cc_user(f"{side}{i}u", last[side], f"{side} {i}"))
            branch.append(cc_answer(f"{side}{i}", f"{side}{i}u", f"m_{side}{i}"))
            last[side] = f"{side}{i}"
    deep = [cc_user("root", None, "start")]
    for i in range(size):  # a long chain, then one rewind to the root after another
        deep += [cc_answer(f"x{i}", deep[-1]["uuid"], f"m{i}"), cc_user(f"y{i}", f"x{i}", "u")]
    deep += [cc_user(f"r{i}", "root", f"again {i}") for i in range(size)]
    cycle = [cc_user(f"c{i}", f"c{(i + 1) % size}", "u") for i in range(size)]
    cycle += [cc_answer("self", "self", "m"), cc_answer(7, 7, "m2")]
    big = "u" * 3_000_000
    huge = [cc_user(big, None, "start"), cc_answer(big + "a", big, "m" * 1_000_000, ("c" * 2_000_000,)),
            cc_result("r", big + "a", "c" * 2_000_000)]  # fmt: skip
    cross = [cc_user("r1", None, "s1", "S1"), cc_answer("a1", "r1", "m1", ("call_1",), "S1"),
             cc_user("r2", None, "s2", "S2"), cc_result("res", "r2", "call_1", "S2"),
             cc_answer("a2", "res", "m2", (), "S2")]  # fmt: skip
    good = json.dumps(cc_user("root", None, "start")).encode() + b"\n"
    bad = b'{"type":"user","uuid":"b","parentUuid":"root","sessionId":"S","message":' \
          b'{"role":"user","content":"\xff\xfe \xc3"}}\n\xff\xff\n'  # fmt: skip
    tail = json.dumps(cc_answer("a", "root", "m")).encode() + b"\n"
    secret = [cc_user("root", None, 'DB_PAſſWORD = "hunter2hunter2" and apı_key=zz9zz9zz9zz9'),
              cc_answer("a", "root", "m")]  # fmt: skip
    return {"cc_case_folded_secret": secret, "cc_branch_switch_loop": branch, "cc_deep_rewinds": deep, "cc_parent_cycles": cycle,
            "cc_huge_ids": huge, "cc_cross_session_result": cross,
            "cc_tiny_records": b'{"type":"user"}\n' * (size * 50),
            "cc_non_utf8": good + bad + tail}  # fmt: skip


def _cx(kind: str, payload: Record) -> Record:
    return {"timestamp": "2026-01-01T00:00:00Z", "type": kind, "payload": payload}


def _cx_msg(role: str, text: str) -> Record:
    part = "input_text" if role == "user" else "output_text"
    return _cx("response_item", {"type": "message", "role": role,
                                 "content": [{"type": part, "text": text}]})  # fmt: skip


def _cx_call(cid: str) -> Record:
    return _cx("response_item", {"type": "function_call", "name": "shell", "call_id": cid,
                                 "arguments": '{"command": ["ls"]}'})  # fmt: skip


def _cx_out(cid: str) -> Record:
    return _cx("response_item", {"type": "function_call_output", "call_id": cid, "output": "r"})


def codex(size: int) -> dict[str, list[Record] | bytes]:
    meta = _cx("session_meta", {"id": "S"})
    loop = [meta]
    for i in range(size):  # a turn, then a rollback of it, again and again
        loop += [_cx_msg("user", f"q{i}"), _cx_call(f"c{i}"), _cx_out(f"c{i}"),
                 _cx_msg("assistant", "x"), _cx("event_msg", {"type": "thread_rolled_back",
                                                              "num_turns": 1})]  # fmt: skip
    rollback = [meta, _cx_msg("user", "q"), _cx_msg("assistant", "x"),
                _cx("event_msg", {"type": "thread_rolled_back", "num_turns": 10**30}),
                _cx_msg("user", "q2"), _cx_msg("assistant", "y")]  # fmt: skip
    huge = [
        _cx("session_meta", {"id": "S" * 3_000_000}),
        _cx_msg("user", "q"),
        _cx_call("c" * 3_000_000),
        _cx_out("c" * 3_000_000),
        _cx_msg("assistant", "y"),
    ]
    cross = [_cx("session_meta", {"id": "S1"}), _cx_msg("user", "q"), _cx_call("k1"),
             _cx("session_meta", {"id": "S2"}), _cx_msg("user", "q2"), _cx_out("k1"),
             _cx_msg("assistant", "y")]  # fmt: skip
    bad = json.dumps(meta).encode() + b"\n" + b'{"type":"response_item","payload":{"type":' \
          b'"message","role":"user","content":[{"type":"input_text","text":"\xff\xc3"}]}}\n' \
          + json.dumps(_cx_msg("assistant", "y")).encode() + b"\n"  # fmt: skip
    return {"codex_rollback_loop": loop, "codex_huge_rollback": rollback, "codex_huge_ids": huge,
            "codex_cross_session_result": cross, "codex_non_utf8": bad,
            "codex_tiny_records": b'{"type":"event_msg"}\n' * (size * 50)}  # fmt: skip


def _gm(i: int, calls: tuple[str, ...] = ()) -> Record:
    return {"id": f"g{i}", "type": "gemini", "content": "x", "toolCalls": [
        {"id": c, "name": "run_shell_command", "args": {"command": "ls"},
         "result": [{"functionResponse": {"id": c, "name": "run_shell_command",
                                          "response": {"output": "r"}}}]} for c in calls]}  # fmt: skip


def gemini(size: int) -> dict[str, list[Record] | bytes]:
    head = {"sessionId": "G", "projectHash": "h", "startTime": "2026-01-01T00:00:00Z"}

    def user(i: int) -> Record:
        return {"id": f"u{i}", "type": "user", "content": [{"text": "q"}]}

    bad = json.dumps(head).encode() + b'\n{"id":"u","type":"user","content":[{"text":"\xff"}]}\n'
    return {
        "gemini_huge_ids": [head, user(0), _gm(0, ("c" * 3_000_000,))],
        "gemini_repeated_ids": [head] + [r for _ in range(size) for r in (user(0), _gm(0, ("same",)))],
        "gemini_non_utf8": bad + json.dumps(_gm(1)).encode() + b"\n",
        "gemini_tiny_records": b'{"$set":{}}\n' * (size * 50),
    }  # fmt: skip


BATTERY = r"""
import json, os, resource, sys, tempfile, time
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
from support import hostile_logs
from support.chat import assert_valid_openai_prefix
from composer_replication.traces import ingest

def valid(prefix):
    try:
        assert_valid_openai_prefix(prefix)
    except AssertionError:
        return False
    return True


tmp = Path(tempfile.mkdtemp())
for fmt, make in (("claude_code", hostile_logs.claude_code), ("codex", hostile_logs.codex),
                  ("gemini_cli", hostile_logs.gemini)):
    for name, log in make(SIZE).items():
        path = tmp / f"{name}.jsonl"
        data = log if isinstance(log, bytes) else b"".join(
            json.dumps(r).encode() + b"\n" for r in log)
        path.write_bytes(data)
        del log, data
        out = {"name": name, "error": "", "states": 0, "valid": True}
        t = time.process_time()
        try:
            run = ingest([path], fmt)
            last = None
            for state in run:
                out["states"] += 1
                if out["states"] == 1:
                    text = json.dumps(state.prefix)
                    out["leaked"] = "hunter2" in text or "zz9zz9" in text
                if out["states"] % 50 == 1:  # checking every prefix would cost as much again
                    out["valid"] &= valid(state.prefix)
                last = state
            out["valid"] &= last is None or valid(last.prefix)
            f = run.report.files[0]
            out.update(skipped=dict(f.skipped_by_reason), warnings=dict(f.warnings),
                       orphans=dict(f.orphans), changes=dict(f.context_changes),
                       last_complete=None if last is None else last.meta.context_complete)
        except Exception as err:  # what a user would see: must be one clear line
            out["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        out["cpu_s"] = round(time.process_time() - t, 2)
        path.unlink()
        print(json.dumps(out), flush=True)
"""
"""The attack script; ``SIZE`` and ``MEMORY_BYTES`` are replaced before it runs."""


def battery(size: int, memory_bytes: int) -> str:
    return BATTERY.replace("MEMORY_BYTES", str(memory_bytes)).replace("SIZE", str(size))
