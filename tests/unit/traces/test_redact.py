"""Planted-secrets corpus: recall must be 100%; false positives on the public fixtures counted.

Secrets are generated (random, format-valid, fake) and planted in every place a reader takes text
from: user text, tool-call arguments (nested JSON, shell commands, file contents), tool results,
thinking, in Claude Code, Codex and SWE-agent logs. Nothing planted may survive into the
serialized states.
"""

from __future__ import annotations

import base64
import random
import re
import string
import sys
from pathlib import Path

import orjson
import pytest
from support.planted_secrets import assignment_matrix, container

from composer_replication.traces import Redactor, ingest

RNG = random.Random(1234)
ALNUM = string.ascii_letters + string.digits


def _r(n: int, alphabet: str = ALNUM) -> str:
    return "".join(RNG.choice(alphabet) for _ in range(n))


def _b64url(obj: dict) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(obj)).decode().rstrip("=")


def planted() -> list[tuple[str, str, str]]:
    """(kind, secret value, text it appears in). The value is what must disappear."""
    pem_body = "\n".join(_r(64, ALNUM + "+/") for _ in range(6))
    jwt = ".".join(
        [_b64url({"alg": "HS256", "typ": "JWT"}), _b64url({"sub": _r(10)}), _r(43, ALNUM + "_-")]
    )
    items = [
        ("openai_api_key", "sk-proj-" + _r(64, ALNUM + "_-")),
        ("openai_api_key", "sk-" + _r(20) + "T3BlbkFJ" + _r(20)),
        ("anthropic_api_key", "sk-ant-api03-" + _r(93, ALNUM + "_-") + "AA"),
        ("openrouter_api_key", "sk-or-v1-" + _r(64, "0123456789abcdef")),
        ("huggingface_token", "hf_" + _r(34, string.ascii_letters)),
        ("google_api_key", "AIza" + _r(35, ALNUM + "_-")),
        ("aws_access_key", "AKIA" + _r(16, string.ascii_uppercase + string.digits)),
        ("github_token", "ghp_" + _r(36)),
        ("github_token", "github_pat_" + _r(22) + "_" + _r(59)),
        ("gitlab_token", "glpat-" + _r(20, ALNUM + "_-")),
        ("slack_token", f"xoxb-{_r(12, string.digits)}-{_r(13, string.digits)}-{_r(24)}"),
        ("slack_webhook", f"https://hooks.slack.com/services/T{_r(8)}/B{_r(8)}/{_r(24)}"),
        ("jwt", jwt),
    ]
    out = [(k, v, f"use this: {v} thanks") for k, v in items]
    aws_secret = _r(40, ALNUM + "/+")
    out.append(("aws_secret_key", aws_secret, f"aws_secret_access_key = {aws_secret}"))
    pw = _r(14, ALNUM + "!$%")
    out.append(("url_password", pw, f"postgres://admin:{pw}@db.internal:5432/app"))
    env_pw = _r(16)
    out.append(("env_secret", env_pw, f"# config\nDATABASE_PASSWORD={env_pw}\nDEBUG=1"))
    tok = _r(24)
    out.append(("env_secret", tok, f"export MY_SERVICE_API_TOKEN='{tok}'"))
    api = _r(32)
    out.append(("secret_assignment", api, f'{{"api_key": "{api}", "region": "eu"}}'))
    pem = f"-----BEGIN RSA PRIVATE KEY-----\n{pem_body}\n-----END RSA PRIVATE KEY-----"
    out.append(("private_key", pem_body.splitlines()[2], f"key file:\n{pem}\n"))
    ossh = "\n".join(_r(70, ALNUM + "+/") for _ in range(4))
    pem2 = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{ossh}\n-----END OPENSSH PRIVATE KEY-----"
    out.append(("private_key", ossh.splitlines()[1], pem2))
    return out


CORPUS = planted()


def _claude_lines(texts: list[str]) -> list[bytes]:
    lines = []
    for i, text in enumerate(texts):
        sid = {"sessionId": "planted", "type": "user", "uuid": f"u{i}"}
        lines.append(orjson.dumps({**sid, "message": {"role": "user", "content": text}}))
        tool_input = {"command": f"echo start && {text}", "content": text, "nested": [{"v": text}]}
        lines.append(
            orjson.dumps(
                {
                    "sessionId": "planted",
                    "type": "assistant",
                    "uuid": f"a{i}",
                    "message": {
                        "id": f"m{i}",
                        "role": "assistant",
                        "model": "claude-x",
                        "content": [
                            {"type": "thinking", "thinking": f"I see {text}"},
                            {"type": "text", "text": f"Saving {text}"},
                            {
                                "type": "tool_use",
                                "id": f"t{i}",
                                "name": "Write",
                                "input": tool_input,
                            },
                        ],
                    },
                }
            )
        )
        result = [{"type": "tool_result", "tool_use_id": f"t{i}", "content": f"wrote {text}"}]
        lines.append(
            orjson.dumps(
                {
                    "sessionId": "planted",
                    "type": "user",
                    "message": {"role": "user", "content": result},
                }
            )
        )
    return lines


def _codex_lines(texts: list[str]) -> list[bytes]:
    lines = [orjson.dumps({"type": "session_meta", "payload": {"id": "planted-codex"}})]
    for i, text in enumerate(texts):
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }
        args = orjson.dumps({"cmd": text}).decode()
        for payload in (
            item,
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]},
            {"type": "function_call", "name": "exec", "arguments": args, "call_id": f"c{i}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": text},
        ):
            lines.append(orjson.dumps({"type": "response_item", "payload": payload}))
    return lines


@pytest.fixture(scope="module")
def planted_output(tmp_path_factory) -> tuple[bytes, Redactor]:
    d = tmp_path_factory.mktemp("planted")
    texts = [t for _, _, t in CORPUS]
    (d / "session.jsonl").write_bytes(b"\n".join(_claude_lines(texts)) + b"\n")
    (d / "rollout-planted.jsonl").write_bytes(b"\n".join(_codex_lines(texts)) + b"\n")
    history = [{"role": "system", "content": "sys"}]
    for text in texts:
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
    (d / "run.traj").write_bytes(orjson.dumps({"history": history, "trajectory": []}))
    red = Redactor()
    run = ingest([d], redactor=red)
    out = b"\n".join(s.to_json() for s in run)
    assert {f.format for f in run.report.files} == {"claude_code", "codex", "swe_agent"}
    assert run.report.states == 3 * len(CORPUS)
    return out, red


def test_recall_is_total_on_planted_corpus(planted_output) -> None:
    out, red = planted_output
    survivors = [(kind, value) for kind, value, _ in CORPUS if value.encode() in out]
    recall = 1 - len(survivors) / len(CORPUS)
    print(f"\nredaction recall on {len(CORPUS)} planted secrets x contexts: {recall:.0%}")
    assert survivors == []
    kinds = {kind for kind, _, _ in CORPUS}
    missing = {k for k in kinds if f"<REDACTED:{k}>".encode() not in out}
    assert missing == set(), missing  # each secret got its own typed placeholder
    assert set(red.counts) >= kinds


def test_library_detector_is_in_use() -> None:
    red = Redactor()
    assert red.uses_library
    # only the library knows SendGrid keys: proves its plugins run
    key = "SG." + _r(22) + "." + _r(43)
    assert red.redact(f"key {key}") == "key <REDACTED:sendgrid_key>"


@pytest.mark.parametrize(
    "text",
    [
        "the task-runner has 12 items",
        "see https://example.com/a:b@c",  # no password in a path
        "export PATH=/usr/bin:$PATH",
        "token = get_token()",
        "def password_strength(pw): ...",
        "sk-learn is not a key",
        "AKIA is a prefix",
        "eyJ appears in base64 sometimes",
    ],
)
def test_ordinary_text_is_untouched(text: str) -> None:
    assert Redactor().redact(text) == text


def test_false_positives_on_fixtures(fixtures_dir: Path) -> None:
    red = Redactor()
    states = list(ingest([fixtures_dir], redactor=red))
    fp = sum(red.counts.values())
    print(f"\nredactions on public fixtures (false positives): {fp} {dict(red.counts)}")
    assert states
    assert fp <= 5, dict(red.counts)


class _NoRedaction(Redactor):
    def redact(self, text: str) -> str:
        return text


def test_control_without_redaction_every_planted_secret_reaches_output(tmp_path: Path) -> None:
    """The recall test is not vacuous: unredacted, every planted value is in the output."""
    texts = [t for _, _, t in CORPUS]
    (tmp_path / "session.jsonl").write_bytes(b"\n".join(_claude_lines(texts)) + b"\n")
    out = b"\n".join(s.to_json() for s in ingest([tmp_path], redactor=_NoRedaction()))
    assert all(value.encode() in out for _, value, _ in CORPUS)


def _encodings(text: str) -> dict[str, str]:
    """``text`` as it can sit inside a log: JSON-escaped once, twice and three times (a command
    holding JSON inside a tool call's JSON arguments), inside a shell command's escaped JSON,
    and with ``\\u`` escapes for every letter."""
    once = orjson.dumps({"cmd": text}).decode()
    uni = (
        '"'
        + "".join(
            f"\\u{ord(c):04x}" if c.isalpha() else orjson.dumps(c).decode()[1:-1] for c in text
        )
        + '"'
    )
    return {
        "json": once,
        "json_in_json": orjson.dumps({"arguments": once}).decode(),
        "three_layers": orjson.dumps(orjson.dumps({"arguments": once}).decode()).decode(),
        "shell_escaped": 'curl -d "' + once.replace('"', '\\"') + '" https://api',
        "unicode_escaped": '{"t": ' + uni + "}",
    }


def _decoded_layers(text: str) -> str:
    """Every string reachable by JSON-decoding ``text`` repeatedly, joined (what a reader of
    the output could recover)."""
    seen, todo = [text], [text]
    while todo:
        cur = todo.pop()
        for cand in (cur, cur.replace('\\"', '"')):
            try:
                val = orjson.loads(cand)
            except orjson.JSONDecodeError:
                continue
            strings = [val] if isinstance(val, str) else []
            if isinstance(val, dict):
                strings = [v for v in val.values() if isinstance(v, str)]
            for s in strings:
                if s not in seen:
                    seen.append(s)
                    todo.append(s)
    return "\n".join(seen)


@pytest.mark.parametrize("encoding", list(_encodings("x")))
def test_secrets_inside_escaped_layers_are_redacted(encoding: str) -> None:
    red = Redactor()
    for kind, secret, text in CORPUS:
        encoded = _encodings(text)[encoding]
        out = red.redact(encoded)
        recovered = _decoded_layers(out)
        assert secret not in recovered, (kind, encoding, out[:200])
        assert "<REDACTED:" in out, (kind, encoding)


def test_escaped_redaction_keeps_everything_else_byte_for_byte() -> None:
    secret = "ghp_" + _r(36)
    inner = orjson.dumps({"password": "p4ssw0rd-is-long", "note": "tabs\there é"}).decode()
    text = orjson.dumps({"cmd": f"echo {inner} {secret}", "n": 1}).decode()
    out = Redactor().redact(text)
    assert secret not in out and "p4ssw0rd-is-long" not in _decoded_layers(out)
    expected = text.replace(secret, "<REDACTED:github_token>").replace(
        "p4ssw0rd-is-long", "<REDACTED:secret_assignment>"
    )
    assert out == expected


def test_ingest_redacts_secrets_in_double_encoded_tool_arguments(tmp_path: Path) -> None:
    """A Codex function call whose JSON arguments hold a JSON-encoded command with secrets."""
    secrets = [v for _, v, _ in CORPUS[:6]]
    command = orjson.dumps({"script": " && ".join(f"echo {s}" for s in secrets)}).decode()
    args = orjson.dumps({"cmd": command}).decode()
    lines = [
        orjson.dumps({"type": "session_meta", "payload": {"id": "nested"}}),
        orjson.dumps({"type": "response_item", "payload": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}}),
        orjson.dumps({"type": "response_item", "payload": {
            "type": "function_call", "name": "exec", "arguments": args, "call_id": "c1"}}),
        orjson.dumps({"type": "response_item", "payload": {
            "type": "function_call_output", "call_id": "c1", "output": "ok"}}),
    ]  # fmt: skip
    (tmp_path / "rollout-nested.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    run = ingest([tmp_path], redactor=Redactor())
    out = b"\n".join(s.to_json() for s in run).decode()
    assert run.report.states >= 1
    recovered = _decoded_layers(out) + "\n" + out
    assert not [s for s in secrets if s in recovered]


def test_the_ingest_report_carries_no_secret(tmp_path: Path) -> None:
    """Strings from the file that reach the report (unknown record types, orphan call ids) are
    redacted like the states."""
    gh = "ghp_" + _r(36)
    lines = [
        {"type": gh, "sessionId": "r", "uuid": "x0"},
        {"type": "user", "sessionId": "r", "uuid": "u1", "message": {"role": "user",
         "content": [{"type": "tool_result", "tool_use_id": gh, "content": "out"}]}},
    ]  # fmt: skip
    (tmp_path / "s.jsonl").write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    run = ingest([tmp_path], redactor=Redactor())
    list(run)
    shown = repr(run.report) + repr(run.report.unknown_record_types())
    assert run.report.files and gh not in shown
    assert "<REDACTED:github_token>" in shown


# ---- assignment-style secrets by kind of spelling (issue 37) -----------------------------------

MATRIX = assignment_matrix()


def test_assignment_secrets_are_redacted_in_every_spelling() -> None:
    red = Redactor()
    survivors = [case for case, value, text in MATRIX if value in red.redact(text)]
    print(f"\nassignment matrix: {len(MATRIX)} spellings, {len(survivors)} survive")
    assert survivors == []


def test_assignment_matrix_is_not_vacuous() -> None:
    """Every planted value is in its text, and the plain text around it survives."""
    red = Redactor()
    assert all(value in text for _, value, text in MATRIX)
    text = container("shell", f"DB_PASSWORD={MATRIX[0][1]}")
    assert red.redact(text).startswith("cd /srv && export DB_PASSWORD=")
    assert red.redact(text).endswith(" && ./run.sh --verbose")


def test_assignment_secrets_do_not_survive_ingest(tmp_path: Path) -> None:
    """The matrix as user text, tool-call arguments (shell commands, file contents, nested
    JSON) and tool results of a Claude Code log: none of it is in the ingested states."""
    texts = [t for _, _, t in MATRIX[::7]] + [t for c, _, t in MATRIX if "|json" in c]
    (tmp_path / "session.jsonl").write_bytes(b"\n".join(_claude_lines(texts)) + b"\n")
    out = b"\n".join(s.to_json() for s in ingest([tmp_path], redactor=Redactor()))
    planted = {v for c, v, t in MATRIX if t in texts}
    assert planted and not [v for v in planted if v.encode() in out]


@pytest.mark.parametrize(
    "text",
    [
        "sorted(xs, key=len)",
        "token = get_token2(x)",
        "usage: input_tokens: 12345678, output_tokens: 2048",
        '"tokenizer": "gpt2-tok-v1"',
        "the sort key: alphabetical order",
        "password: see the vault",
    ],
)
def test_assignment_look_alikes_are_untouched(text: str) -> None:
    assert Redactor().redact(text) == text


def test_a_result_for_an_unknown_call_shows_its_id_redacted(tmp_path) -> None:
    """A tool result whose call is not in the log becomes user content labelled with its id:
    a secret there (a hostile or mangled log) must be redacted like the result's text."""
    secret = "ghp_" + _r(36)
    recs = [{"type": "user", "sessionId": "s", "uuid": "u", "message": {"content": "go"}},
            {"type": "user", "sessionId": "s", "uuid": "r", "parentUuid": "u", "message": {
                "content": [{"type": "tool_result", "tool_use_id": secret, "content": "x"}]}},
            {"type": "assistant", "sessionId": "s", "uuid": "a", "parentUuid": "r",
             "message": {"id": "m", "content": [{"type": "text", "text": "done"}]}}]  # fmt: skip
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    (state,) = list(ingest([path], "claude_code"))
    label = state.prefix[-1]["content"]
    assert label.startswith("[tool result for unknown call <REDACTED:"), label
    assert secret not in orjson.dumps(state.prefix).decode()


_FRAGMENTS = ["api_key", "API-KEY", "private_key", "privateKey", "access-key", "AUTH_KEY",
              "apikey", "ssh.key", "monkey", "keyboard", "token", "TOKENS", "tokenizer",
              "db_password", "PASSWD", "pwd", "Secret", "credentials", "client_secret",
              "access_token", " = ", "=", ": ", ":=", "=>", '"', "'", "`", "\n", " ", "\t",
              "s3cr3tValue99", "abc", "xK9#mQ2$pL", "get_token2(x)", "\u0130", "\u212a", "é",
              "<REDACTED:x>", "_", "-", "."]  # fmt: skip


def test_matching_only_near_triggers_equals_a_scan_of_the_whole_text() -> None:
    """The assignment patterns are tried only at their triggers' start offsets: on random
    texts of names, operators, quotes, values, look-alikes and Unicode that lowercases to
    another length, the result is what ``re.sub`` over the whole text gives."""
    from composer_replication.traces import redact

    rng = random.Random(7)
    fast = [p for p in redact.PATTERNS if p.starts is not None]
    assert len(fast) == 3
    replaced = 0
    for _ in range(3000):
        text = "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 14)))
        for pat in fast:

            def mark(m, pat=pat) -> str:
                a, b = m.span(pat.group)
                return m.string[m.start() : a] + "<X>" + m.string[b : m.end()]

            want = pat.regex.sub(mark, text)
            starts = redact._trigger_starts(pat, text)
            got = want if starts is None else redact._sub_at(pat, text, starts, mark)
            assert got == want, (pat.kind, text)
            replaced += got != text
    assert replaced > 50  # the texts do hold assignments


def test_case_folding_letters_do_not_hide_a_secret_from_the_trigger_offsets() -> None:
    """Attack on the trigger offsets: Python's ``re.IGNORECASE`` matches ``ſ`` (U+017F) as
    ``s`` and ``ı`` (U+0131) as ``i``, but ``str.lower`` keeps both, so ``paſſword = ...`` has
    no ``password`` trigger in the lowercased text and was never tried, while a scan of the
    whole text redacts it. Also: secrets at the very end, overlapping triggers, and multi-byte
    characters before them (byte and character offsets differ)."""
    from composer_replication.traces import redact

    texts = ['paſſword = "hunter2hunter2"', "ſecret_key: 'abcdef123456'", "apı_key='zz9zz9zz9zz9'",
             "DB_PAſſWD=s3cr3tValue99", 'client_ſecret="abc123abc123"', "credentıal: xK9mQ2pL77",
             "x ποσό apikey=abc123def456", "token=apikey_api_key=9x9x9x9x9x", "password=abc123abc1",
             "€€€ secret_key = 'abcdefgh12'"]  # fmt: skip
    for text in texts:
        for pat in (p for p in redact.PATTERNS if p.starts is not None):
            whole = pat.regex.sub("<X>", text)
            starts = redact._trigger_starts(pat, text)
            fast = whole if starts is None else redact._sub_at(pat, text, starts, lambda m: "<X>")
            assert fast == whole, (pat.kind, text)
    assert "hunter2" not in redact.Redactor().redact(texts[0])


def test_the_case_folding_letters_are_all_known() -> None:
    """Every character ``re.IGNORECASE`` matches as an ASCII letter lowercases to that letter,
    to text of another length (then no offsets are used), or is folded by ``_fold``."""
    from composer_replication.traces import redact

    letter = re.compile("[a-z]", re.IGNORECASE)
    odd = [chr(c) for c in range(0x80, sys.maxunicode + 1) if letter.fullmatch(chr(c))]
    for ch in odd:
        low = ch.lower()
        assert len(low) != 1 or low.isascii() or ch in redact._MATCHES_ASCII, ch
        assert redact._fold(ch) == ch.lower() if len(low) != 1 else redact._fold(ch).isascii()
