"""Recording stand-ins for the two cloud SDKs, so ``ModalExecutor`` and ``HFJobsExecutor`` run
their real launch/poll/collect code in tests. Everything past the SDK call (the wire, the
remote container) is replaced by a local process: Modal's ``spawn`` runs the function in a
spawned process; an HF job's ``bash -c`` command runs locally with ``python`` = this interpreter
and ``pip`` / ``hf`` replaced by stubs that only record their arguments (nothing is installed).
A real run needs a Modal / Hugging Face account; these fakes need none."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class FakeRemoteError(RuntimeError):
    """What the remote function raised (Modal re-raises it from ``FunctionCall.get``)."""


class FakeImage:
    """``modal.Image``: every build step is recorded and returns a new image."""

    def __init__(self, sdk: FakeModal, steps: tuple = ()):
        self.sdk, self.steps = sdk, steps

    def _add(self, *step: Any) -> FakeImage:
        self.sdk.calls.append(("image", *step))
        return FakeImage(self.sdk, (*self.steps, step))

    def add_local_file(self, local_path: Any, remote_path: str, *, copy: bool = False):
        return self._add("add_local_file", str(local_path), remote_path, copy)

    def add_local_dir(self, local_path: Any, remote_path: str, *, copy: bool = False, ignore=()):
        return self._add("add_local_dir", str(local_path), remote_path, copy, list(ignore))

    def pip_install(self, *packages: str) -> FakeImage:
        return self._add("pip_install", *packages)


def _call_main(fn: Any, args: tuple, conn: Any) -> None:
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as err:  # sent back like Modal sends the remote traceback
        conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


class FakeFunctionCall:
    """``modal.FunctionCall``: ``get(timeout)`` returns the result, re-raises the remote error
    or raises ``TimeoutError``; ``cancel()`` kills the process."""

    def __init__(self, sdk: FakeModal, fn: Any, args: tuple):
        self.sdk = sdk
        self._conn, child = mp.get_context("spawn").Pipe(duplex=False)
        self._proc = mp.get_context("spawn").Process(target=_call_main, args=(fn, args, child))
        self._proc.start()
        self._outcome: tuple[str, Any] | None = None

    def get(self, timeout: float | None = None) -> Any:
        if self._outcome is None:
            if not self._conn.poll(timeout):
                raise TimeoutError("function call still running")
            self._outcome = self._conn.recv()
            self._proc.join(10)
        status, value = self._outcome
        if status == "error":
            raise FakeRemoteError(value)
        return value

    def cancel(self) -> None:
        self.sdk.calls.append(("cancel",))
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join(10)


class FakeFunction:
    def __init__(self, sdk: FakeModal, app: FakeApp, fn: Any, options: dict[str, Any]):
        self.sdk, self.app, self.fn, self.options = sdk, app, fn, options

    def spawn(self, *args: Any) -> FakeFunctionCall:
        if not self.app.running:
            raise RuntimeError("spawn outside `with app.run()` (Modal refuses this too)")
        self.sdk.calls.append(("spawn", args))
        return FakeFunctionCall(self.sdk, self.fn, args)


class FakeApp:
    def __init__(self, sdk: FakeModal, name: str):
        self.sdk, self.name, self.running = sdk, name, False
        sdk.calls.append(("App", name))

    def function(self, **options: Any):
        self.sdk.calls.append(("function", options))
        return lambda fn: FakeFunction(self.sdk, self, fn, options)

    def run(self) -> FakeApp:
        return self

    def __enter__(self) -> FakeApp:
        self.sdk.calls.append(("run_enter",))
        self.running = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sdk.calls.append(("run_exit",))
        self.running = False


class FakeModal:
    """The parts of the ``modal`` module ``ModalExecutor`` uses; ``calls`` records them."""

    def __init__(self, token: bool = True):
        self.calls: list[tuple] = []
        creds = {"token_id": "ak-fake", "token_secret": "as-fake"} if token else {}
        self.config = SimpleNamespace(config=creds)
        self.Image = SimpleNamespace(debian_slim=self._debian_slim)
        self.Secret = SimpleNamespace(from_name=self._secret)
        self.App = lambda name: FakeApp(self, name)

    def _debian_slim(self, python_version: str | None = None) -> FakeImage:
        self.calls.append(("image", "debian_slim", python_version))
        return FakeImage(self, (("debian_slim", python_version),))

    def _secret(self, name: str) -> tuple[str, str]:
        self.calls.append(("secret", name))
        return ("secret", name)


STUB = '#!/bin/sh\necho "$(basename "$0") $*" >> "{log}"\n'


class _Job:
    def __init__(self, command: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stage(self) -> str:
        code = self.proc.poll()
        return "RUNNING" if code is None else "COMPLETED" if code == 0 else "ERROR"


class FakeHfApi:
    """The parts of ``huggingface_hub.HfApi`` ``HFJobsExecutor`` uses; ``calls`` records them
    as ``(method, kwargs)``. ``installs`` lists the ``pip`` / ``hf`` commands jobs ran."""

    def __init__(self, workdir: Path):
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.jobs: dict[str, _Job] = {}
        self.bin = Path(workdir) / "fake-job-bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.install_log = Path(workdir) / "installs.log"
        for name in ("pip", "hf"):
            stub = self.bin / name
            stub.write_text(STUB.format(log=self.install_log))
            stub.chmod(0o755)
        if not (self.bin / "python").exists():
            (self.bin / "python").symlink_to(sys.executable)

    @property
    def installs(self) -> list[str]:
        return self.install_log.read_text().splitlines() if self.install_log.is_file() else []

    def create_repo(self, **kwargs: Any) -> None:
        self.calls.append(("create_repo", kwargs))

    def upload_file(self, **kwargs: Any) -> None:
        self.calls.append(("upload_file", kwargs))

    def run_job(self, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(("run_job", kwargs))
        job_id = f"job-{len(self.jobs)}"
        env = {**os.environ, **kwargs["env"], **(kwargs.get("secrets") or {})}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        self.jobs[job_id] = _Job(kwargs["command"], env)
        return SimpleNamespace(id=job_id, url=f"https://huggingface.co/jobs/fake/{job_id}")

    def inspect_job(self, *, job_id: str, namespace: str | None = None) -> SimpleNamespace:
        self.calls.append(("inspect_job", {"job_id": job_id, "namespace": namespace}))
        return SimpleNamespace(status=SimpleNamespace(stage=self.jobs[job_id].stage()))

    def fetch_job_logs(self, *, job_id: str, namespace: str | None = None):
        self.calls.append(("fetch_job_logs", {"job_id": job_id, "namespace": namespace}))
        job = self.jobs[job_id]
        job.reader.join(30)
        yield from job.lines

    def cancel_job(self, *, job_id: str, namespace: str | None = None) -> None:
        self.calls.append(("cancel_job", {"job_id": job_id, "namespace": namespace}))
        job = self.jobs[job_id]
        if job.proc.poll() is None:
            job.proc.terminate()
        job.proc.wait(10)
