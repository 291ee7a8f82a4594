"""A teacher or scoring server whose answer never ends (or declares terabytes) is read only up to a
bound derived from the request and then refused as ``malformed``; an answer cut short is a
retryable ``transport`` failure. Before, both clients read whole bodies into memory."""

from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.scripted_openai import ask_teacher

from composer_replication.config import RemoteTeacherConfig
from composer_replication.teachers.chat import answer_byte_limit
from composer_replication.teachers.edge import ERROR_BODY_BYTES, TeacherError
from composer_replication.teachers.scoring import RemoteScorer, scoring_byte_limit


class _Oversized(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sent: dict[str, int] = {}
    """Bytes the endless answer of each call (``/<mode>/<call>/v1``) sent before the client
    closed; written when the handler stops, which may be after the client has returned."""
    finished: dict[str, threading.Event] = {}

    def log_message(self, *a) -> None:
        pass

    def do_GET(self) -> None:  # /v1/models, for a scorer without a model name
        if self.path.startswith("/nomodel/"):
            self._send(b'{"object": "list", "data": []}')
            return
        self._send(b'{"object": "list", "data": [{"id": "m", "object": "model"}]}')

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.path.split("/")[1]
        self.send_response(500 if mode == "err500" else 200)
        self.send_header("Content-Type", "application/json")
        self.close_connection = True
        if mode in ("endless", "err500"):  # chunked, no length: a body that does not end
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b'{"choices": [' + b" " * 65536
            sent = 0
            try:
                while sent < 256 << 20:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    sent += len(chunk)
            except OSError:  # the client stopped reading and closed
                pass
            call = "/".join(self.path.split("/")[1:3])
            _Oversized.sent[call] = sent
            _Oversized.finished.setdefault(call, threading.Event()).set()
            return
        declared = 10**12 if mode == "declared" else 1000  # "cut": 1000 declared, 10 sent
        self.send_header("Content-Length", str(declared))
        self.end_headers()
        self.wfile.write(b'{"choices"')
        self.connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def oversized():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Oversized)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


async def _no_sleep(_s: float) -> None:
    return None


def _complete(url: str) -> TeacherError:
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=16, max_retries=0)
    with pytest.raises(TeacherError) as info:
        ask_teacher(spec, sleep=_no_sleep)
    return info.value


@pytest.mark.parametrize(
    "mode, kind, says",
    [
        ("endless", "malformed", f"longer than {answer_byte_limit(16)} bytes"),
        ("declared", "malformed", "declares 1000000000000 bytes"),
        ("cut", "transport", ""),
        # the SDK reads an error answer's body itself, before our code: cut by the transport
        ("err500", "transport", f"longer than {ERROR_BODY_BYTES} bytes"),
    ],
)
def test_a_chat_teachers_answer_is_read_up_to_a_bound(oversized, mode, kind, says):
    call = f"{mode}/bound"
    err = _complete(f"{oversized}/{call}/v1")
    assert err.kind == kind and says in err.message
    if mode in ("endless", "err500"):  # stopped near the bound, not after the server's 256 MiB
        # the handler records what it sent when its write fails, after the client closed
        # (under load later than the client's return: CI read the record before it existed)
        done = _Oversized.finished.setdefault(call, threading.Event())
        assert done.wait(120), "the server is still writing: the client never closed"
        assert _Oversized.sent[call] < 64 << 20
    if kind == "transport":
        assert err.retryable


@pytest.mark.parametrize("mode", ["endless", "declared"])
def test_a_scorers_oversized_answer_fails_its_rows_and_is_billed(oversized, mode):
    spec = RemoteTeacherConfig(
        name="t",
        base_url=f"{oversized}/{mode}/v1",
        model="m",
        top_k=2,
        max_retries=0,
        price_in_per_mtok=1.0,
    )
    scorer = RemoteScorer(spec, sleep=_no_sleep)
    rows = asyncio.run(scorer.ascore([[1, 2, 3]] * 2, [1, 1], 2, 0))
    limit = scoring_byte_limit([[1, 2, 3]] * 2, 2)
    for row in rows:
        assert isinstance(row, TeacherError) and row.kind == "malformed"
        assert (f"longer than {limit}" if mode == "endless" else "declares") in str(row)
    assert scorer.stats.failed_rows == 2 and scorer.stats.scored_tokens == 6
    assert scorer.stats.cost_usd == pytest.approx(6 / 1e6)


def test_rows_never_sent_are_not_billed(oversized):
    """The server lists no model, so no scoring request is sent: nothing is billed (the
    refusal is ``malformed`` too, but no answer arrived)."""
    spec = RemoteTeacherConfig(
        name="t", base_url=f"{oversized}/nomodel/v1", top_k=2, max_retries=0, price_in_per_mtok=1.0
    )
    scorer = RemoteScorer(spec, sleep=_no_sleep)
    rows = asyncio.run(scorer.ascore([[1, 2, 3]] * 2, [1, 1], 2, 0))
    assert all(isinstance(r, TeacherError) and "lists no model" in str(r) for r in rows)
    assert scorer.stats.scored_tokens == 0 and scorer.stats.cost_usd == 0
