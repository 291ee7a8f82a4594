"""Assignment-style secrets by kind of spelling (issue 37): every secret-sounding name x
separator x quoting x container, plus JSON forms, each with a fresh random value. Shared by the
redaction tests (tests/unit/traces/test_redact.py) and the teacher-request test
(tests/unit/replay/test_hostile_server.py)."""

from __future__ import annotations

import random
import string

import orjson

SECRET_NAMES = ["DB_PASSWORD", "db_password", "dbPassword", "PASSWD", "API_KEY", "api-key",
                "apiKey", "client_secret", "ClientSecret", "GITHUB_TOKEN", "auth.token",
                "aws_credentials", "PRIVATE_KEY", "ssh-key", "SECRET"]  # fmt: skip
SEPARATORS = ["=", " = ", ": ", ":", " := "]
QUOTES = ["", "'", '"']
CONTAINERS = ["line", "shell", "env_prefix", "heredoc", "yaml", "code"]


def container(kind: str, line: str) -> str:
    """``line`` placed where such a line is met: alone, in a shell command, an ``env`` prefix,
    a heredoc writing ``.env``, a YAML mapping, Python code."""
    return {
        "line": line,
        "shell": f"cd /srv && export {line} && ./run.sh --verbose",
        "env_prefix": f"env {line} python app.py",
        "heredoc": f"cat > .env <<'EOF'\nDEBUG=1\n{line}\nEOF\necho done",
        "yaml": f"service:\n  image: app\n  {line}\n  replicas: 2",
        "code": f"def connect():\n    {line}\n    return open_db()",
    }[kind]


def assignment_matrix(seed: int = 1234) -> list[tuple[str, str, str]]:
    """(case id, secret value, text): every name x separator x quoting x container, plus the
    JSON forms (nested objects, a JSON string inside tool-call arguments)."""
    rng = random.Random(seed)
    alnum = string.ascii_letters + string.digits

    def r(n: int) -> str:
        return "".join(rng.choice(alnum) for _ in range(n))

    out = []
    for name in SECRET_NAMES:
        for sep in SEPARATORS:
            for q in QUOTES:
                value = r(14) + rng.choice(string.digits) + r(5)
                for where in CONTAINERS:
                    text = container(where, f"{name}{sep}{q}{value}{q}")
                    out.append((f"{name}|{sep}|{q}|{where}", value, text))
        value = r(18) + "7"
        nested = {"config": {"db": {name: value, "host": "db.internal"}}, "n": 3}
        out.append((f"{name}|json", value, orjson.dumps(nested).decode()))
        line = f"{name}={value}"
        args = orjson.dumps({"command": f"export {line}; deploy"}).decode()
        out.append((f"{name}|tool_args", value, orjson.dumps({"arguments": args}).decode()))
    return out
