"""Attacks on the policy proxy's HTTP layer (agents/proxy.py; issue 55, class 4): nothing of a
request is read before its key and length are checked, and nothing an agent or another local
user does with connections holds the trainer's memory, file handles or answers. Each test
failed while its attack worked (the report of issue 55 has the lines).

Requests are written by hand on raw sockets: a client library would not send what an
attacker sends (a length it never fills, half a header block)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from composer_replication.agents.proxy import (
    MAX_BODY_BYTES,
    PolicyProxy,
    private_socket_dir,
    remove_socket_dir,
)

MSG = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()


class Echo:
    """A policy answering "ok" (its token ids), or raising ``fail``, or waiting for ``gate``."""

    def __init__(self, tok, fail: Exception | None = None, gate: threading.Event | None = None):
        self.tok, self.fail, self.gate = tok, fail, gate

    def __call__(self, prompt_ids):
        if self.gate is not None:
            self.gate.wait(30)
        if self.fail is not None:
            raise self.fail
        ids = self.tok("ok", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return ids, [0.0] * len(ids)


def _conn(path: str, timeout: float = 5.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def _head(key: str, length: int | None, extra: str = "") -> bytes:
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: proxy", f"Authorization: Bearer {key}",
             "Content-Type: application/json"]  # fmt: skip
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + extra + "\r\n\r\n").encode()


def _status(s: socket.socket) -> int | str:
    """The response's status code; ``"closed"`` if the server closed the connection without
    one; ``"silent"`` if nothing came within the socket's timeout."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return "closed" if not data else int(data.split()[1])
            data += chunk
    except TimeoutError:
        return "silent"
    except ConnectionResetError:
        return "closed"
    return int(data.split()[1])


def _closed(s: socket.socket) -> bool:
    """Whether the server closes the connection (after what it sent) within the timeout."""
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.fixture
def proxy_of(tool_tok, tmp_path):
    made = []

    def make(policy=None, **kw):
        p = PolicyProxy(policy or Echo(tool_tok), tool_tok, str(tmp_path / "p.sock"), **kw)
        made.append(p.start())
        return p

    yield make
    for p in made:
        p.stop()


def test_an_unauthenticated_or_oversized_body_is_refused_unread(proxy_of):
    """The handler awaited the whole body, then checked the key and the size: a 400 MiB
    unauthenticated body took the trainer from 54 MB to 874 MB. Now the key and the
    Content-Length are answered before a byte of the body is read: the 401 and the 413
    arrive while the client has sent 1 kB of the 400 MiB it announced."""
    proxy = proxy_of()
    key = proxy.open_episode()
    for who, want in (("cr-guessed", 401), (key, 413)):
        s = _conn(proxy.socket_path)
        s.sendall(_head(who, 400 << 20) + b"x" * 1024)
        assert _status(s) == want, who
        assert _closed(s), who  # and the rest is not drained: the connection is closed
        s.close()
    s = _conn(proxy.socket_path)
    s.sendall(_head(key, None))  # no length, not chunked: refused, nothing read
    assert _status(s) == 411
    s.close()
    s = _conn(proxy.socket_path, timeout=20)  # chunked: read against the cap, chunk by chunk
    s.sendall(_head(key, None, "\r\nTransfer-Encoding: chunked"))
    chunk = b"x" * (1 << 20)
    try:
        for _ in range(MAX_BODY_BYTES // len(chunk) + 2):
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert _status(s) == 413
    s.close()
    turns, refused = proxy.close_episode(key)
    assert refused == 3 and turns == []


def test_a_body_not_sent_in_time_is_refused(proxy_of):
    """There was no deadline on the body: a request that announced 100 bytes and sent 10 held
    its handler (and a file handle) for as long as the client liked."""
    proxy = proxy_of(body_timeout_s=1.0)
    key = proxy.open_episode()
    s = _conn(proxy.socket_path)
    s.sendall(_head(key, 100) + b"x" * 10)
    assert _status(s) == 408
    s.close()
    assert proxy.close_episode(key)[1] == 1


def test_half_sent_headers_are_closed_and_connections_are_capped(proxy_of):
    """Without a limit on connections or a deadline on headers, 300 half-sent requests held
    300 trainer file handles for 42 s. Past ``max_connections`` a connection is closed as it
    comes, and one that has not sent its headers in ``header_timeout_s`` is closed; then the
    proxy answers again."""
    proxy = proxy_of(max_connections=4, header_timeout_s=1.0)
    half = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"
    held = [_conn(proxy.socket_path) for _ in range(4)]
    for s in held:
        s.sendall(half)
    time.sleep(0.2)  # the four are accepted before the fifth comes
    extra = _conn(proxy.socket_path)
    assert _status(extra) == "closed"  # over the cap: closed at once
    for s in held:
        assert _status(s) == "closed"  # headers never finished: closed at the deadline
    s = _conn(proxy.socket_path)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\n\r\n")
    assert _status(s) == 200
    s.close()
    assert proxy.dropped == 5


def test_a_key_has_at_most_max_in_flight_requests(proxy_of, tool_tok):
    """One key's requests were all accepted at once (each holding a handler and its body);
    past ``max_in_flight`` they are refused at once (429, counted), other keys unaffected."""
    gate = threading.Event()
    proxy = proxy_of(Echo(tool_tok, gate=gate), max_in_flight=1)
    key = proxy.open_episode()
    first = _conn(proxy.socket_path, timeout=30)
    first.sendall(_head(key, len(MSG)) + MSG)
    time.sleep(0.3)  # the first is being answered (waits at the gate)
    second = _conn(proxy.socket_path)
    second.sendall(_head(key, len(MSG)) + MSG)
    try:
        assert _status(second) == 429
    finally:
        gate.set()
    assert _status(first) == 200
    turns, refused = proxy.close_episode(key)
    assert len(turns) == 1 and refused == 1


def test_a_policy_failure_is_a_counted_error(proxy_of, tool_tok):
    """A policy exception escaped to FastAPI: an uncounted 500 (plain text), invisible in the
    episode's refused requests. Now it is a JSON 500 counted in ``errors`` and refused."""
    proxy = proxy_of(Echo(tool_tok, fail=RuntimeError("CUDA out of memory")))
    key = proxy.open_episode()
    s = _conn(proxy.socket_path)
    s.sendall(_head(key, len(MSG)) + MSG)
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    assert data.split()[1] == b"500"
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"] == "internal_error"
    assert proxy.errors == 1
    assert proxy.close_episode(key)[1] == 1


def _as_user(uid: int, path: str) -> str:
    """What a process of user ``uid`` (a forked child that really switches: setgroups,
    setgid, setuid) gets when it connects to ``path`` and asks for the model list."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists; it ends with os._exit
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            try:
                s.connect(path)
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\n\r\n")
                got = "answered" if s.recv(100) else "closed"
            except OSError as e:
                got = type(e).__name__
            os.write(w, got.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode()
    os.waitpid(pid, 0)
    return got


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_another_local_user_cannot_connect(proxy_of, tool_tok, tmp_path):
    """The socket was 0666 in a world-readable directory: any local user could reach the
    policy (and guess at keys). In the directory the rollouts use (``private_socket_dir``),
    other users -- ``nobody`` outside the sandbox included -- cannot open a path to it; and
    a peer of a foreign user that reaches a socket anyway is closed unheard."""
    path = private_socket_dir()
    proxy = PolicyProxy(Echo(tool_tok), tool_tok, os.path.join(path, "proxy.sock")).start()
    try:
        assert os.stat(proxy.socket_path).st_mode & 0o777 == 0o660  # root: nobody's group
        assert os.stat(proxy.socket_path).st_gid == 65534
        assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
        assert _as_user(0, proxy.socket_path) == "answered"  # the trainer's user
        assert _as_user(65534, proxy.socket_path) == "PermissionError"  # nobody, outside
        assert _as_user(4242, proxy.socket_path) == "PermissionError"
    finally:
        proxy.stop()
        remove_socket_dir(path)
    # a careless deployment: everything world-accessible (a directory of its own under /tmp:
    # pytest's base temporary directory is 0700, whatever the test does below it)
    open_dir = Path(tempfile.mkdtemp(prefix="cr-open-", dir="/tmp"))
    try:
        open_dir.chmod(0o777)
        proxy = proxy_of(max_connections=8)
        os.rename(proxy.socket_path, open_dir / "p.sock")
        os.chmod(open_dir / "p.sock", 0o666)
        assert _as_user(4242, str(open_dir / "p.sock")) in (
            "closed",
            "ConnectionResetError",
            "BrokenPipeError",
        )  # closed unheard
        assert proxy.dropped == 1
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


def test_the_sandbox_reaches_the_proxy_in_its_private_directory(tool_tok, tmp_path):
    """The other side of the test above: an agent in the sandbox (``nobody`` when the
    trainer is root) still reaches the proxy through the relay, by the bind the trainer
    stages from the private directory."""
    from composer_replication.agents.sandboxed import AgentRun, run_agent
    from composer_replication.sandbox.sandbox import Sandbox, bindable_dir

    path = private_socket_dir()
    venv, ws = bindable_dir("cr-test-venv-"), tmp_path / "ws"  # (binds cannot be under /tmp)
    ws.mkdir()
    ask = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/v1/models').read())"
    proxy = PolicyProxy(Echo(tool_tok), tool_tok, os.path.join(path, "proxy.sock")).start()
    try:
        res = run_agent(Sandbox(), ws, AgentRun(f'python -I -c "{ask}"', str(venv), timeout_s=60),
                        path, "proxy.sock")  # fmt: skip
    finally:
        proxy.stop()
        remove_socket_dir(path)
        os.rmdir(venv)
    assert res.exit_code == 0 and '"id":"policy"' in res.output, res.output


def test_an_agent_is_not_started_when_its_relay_cannot_listen(tmp_path):
    """A relay that dies (here: a port no socket can have) ends the run with the shell's
    could-not-execute status and says why, and the agent's command never runs: its episode
    is the machine's failure (``not_started``), not a 0 the policy is trained on."""
    from composer_replication.agents.sandboxed import (
        RELAY_FAILED,
        RELAY_FAILED_STATUS,
        AgentRun,
        run_agent,
    )
    from composer_replication.sandbox.sandbox import Sandbox, bindable_dir

    path = private_socket_dir()
    venv, ws = bindable_dir("cr-test-venv-"), tmp_path / "ws"
    ws.mkdir()
    try:
        res = run_agent(Sandbox(), ws, AgentRun("echo ran > /repo/ran", str(venv), port=99999,
                                                timeout_s=60), path, "proxy.sock")  # fmt: skip
    finally:
        remove_socket_dir(path)
        os.rmdir(venv)
    assert res.exit_code == RELAY_FAILED_STATUS and RELAY_FAILED in res.output, res.output
    assert not (ws / "ran").exists()
