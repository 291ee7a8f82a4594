"""Issue 55, class 2: nothing a task source brings runs on the host.

A PyPI source used to be fetched with ``pip download --no-binary :all:``, which prepares the
sdist's metadata: its build backend ran on the host. ``test_requirements`` went to ``pip
install`` on the host: an sdist's build ran, and a string starting with ``-`` was a pip
option. Here a local package index (a real HTTP server, PEP 691 JSON) serves an sdist whose
in-tree build backend and ``setup.py`` append to a marker file when imported or run: the
marker must never appear, whatever the door (fetching the source; a requirement by name, as
an option, as a path, as a URL)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion.generate import (
    GENERATOR_VERSION,
    TaskSetError,
    load_tasks,
)
from composer_replication.envs.feature_deletion.source import SourceError, resolve_source
from composer_replication.sandbox.pytest_suite import pytest_tools
from composer_replication.sandbox.sandbox import SandboxUnavailableError


def _sdist(marker: Path) -> bytes:
    """evilpkg-1.0.tar.gz: an in-tree build backend and a setup.py that write ``marker``."""
    touch = f"open({str(marker)!r}, 'a').write('ran\\n')\n"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
        'backend-path = ["."]\n[project]\nname = "evilpkg"\nversion = "1.0"\n',
        "backend.py": touch + "def get_requires_for_build_wheel(c=None):\n    return []\n",
        "setup.py": touch,
        "evilpkg/__init__.py": "def double(x):\n    y = x + x\n    return y\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in files.items():
            info = tarfile.TarInfo(f"evilpkg-1.0/{name}")
            info.size = len(text.encode())
            tf.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A package index on 127.0.0.1 serving evilpkg 1.0 (sdist only) and badhash 1.0 (an
    sdist whose listed sha256 is wrong); yields (marker, sdist path)."""
    marker = tmp_path / "ran"
    data = _sdist(marker)
    sdist = tmp_path / "evilpkg-1.0.tar.gz"
    sdist.write_bytes(data)
    good = hashlib.sha256(data).hexdigest()

    class Index(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            name = self.path.strip("/").split("/")[-1]
            if self.path.startswith("/simple/"):
                sha = good if name == "evilpkg" else "0" * 64
                files = [{"filename": f"{name}-1.0.tar.gz", "url": "/files/evilpkg-1.0.tar.gz",
                          "hashes": {"sha256": sha}}]  # fmt: skip
                body = json.dumps({"meta": {"api-version": "1.0"}, "name": name,
                                   "files": files}).encode()  # fmt: skip
                kind = "application/vnd.pypi.simple.v1+json"
            elif self.path.startswith("/files/"):
                body, kind = data, "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    yield marker, sdist
    server.shutdown()


def test_a_pypi_source_is_fetched_without_running_its_build(tmp_path, index):
    """The index's file, checked against its sha256, unpacked: the backend never ran."""
    marker, _ = index
    try:
        tree = resolve_source("evilpkg==1.0", cache=tmp_path / "cache")
    finally:
        assert not marker.exists(), "the sdist's build backend ran on the host"
    assert (tree.root / "evilpkg" / "__init__.py").is_file() and len(tree.digest) == 64
    with pytest.raises(SourceError, match="sha256 .* is not the index's 0000"):
        resolve_source("badhash==1.0", cache=tmp_path / "cache")
    with pytest.raises(SourceError, match="lists no sdist of evilpkg==2.0"):
        resolve_source("evilpkg==2.0", cache=tmp_path / "cache")


def _requirements(sdist: Path) -> list[str]:
    unpacked = sdist.parent / "unpacked"
    if not unpacked.exists():
        with tarfile.open(sdist) as tf:
            tf.extractall(unpacked, filter="data")
    return ["evilpkg==1.0", f"-e{unpacked / 'evilpkg-1.0'}", str(sdist),
            f"evilpkg @ file://{sdist}"]  # fmt: skip


@pytest.mark.parametrize("n", range(4))
def test_a_test_requirement_never_builds_on_the_host(index, n):
    """By name (the index has only an sdist: wheels only, so pip finds nothing), as a pip
    option, as a path, as a URL: refused or not installable, and nothing ran."""
    marker, sdist = index
    req = _requirements(sdist)[n]
    with pytest.raises(SandboxUnavailableError, match="test requirement"):
        pytest_tools.__wrapped__((req,))
    assert not marker.exists(), f"{req}: the sdist's build ran on the host"


@pytest.mark.parametrize("req", ["-r /etc/passwd", "--index-url=http://x", "pkg @ file:///x",
                                 "a b c", " -e ."])  # fmt: skip
def test_a_test_requirement_that_is_not_pep_508_by_name_is_refused(tmp_path, req):
    """In the config (before anything loads) and in a task record (at load, with its line)."""
    with pytest.raises(ValidationError, match="test_requirements"):
        TaskGenConfig(test_requirements=[req])
    assert TaskGenConfig(test_requirements=["freezegun>=1.2; python_version > '3'"])
    (tmp_path / "manifest.json").write_text(json.dumps({"generator_version": GENERATOR_VERSION}))
    row = {"task_id": "t", "symbol": "f", "file": "m.py", "failing_tests": [],
           "visible_tests": [], "passing_tests": [], "served": [], "test_requirements": [req]}  # fmt: skip
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskSetError, match=":1: not a task: field 'test_requirements'"):
        load_tasks(tmp_path)
