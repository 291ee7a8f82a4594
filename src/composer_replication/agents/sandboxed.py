"""An agent process run on an episode's workspace inside the bubblewrap sandbox, with the
policy proxy as the only thing it can reach.

The sandbox is the shell tool's (sandbox/shell.py): the workspace is copied into a
size-capped ``/repo`` inside, the command runs there under ``timeout -s KILL`` with no network
namespace of the host (``--unshare-net``: only its own loopback), a PID namespace killed when
the run ends, memory, process and file-size limits, ``nobody`` when the trainer is root, no
site-packages or project sources, no task data; what it leaves in ``/repo`` comes back as
regular files only (``apply_tree``). On top of that:

* **The proxy, and nothing else.** The proxy's unix socket directory (private to the
  trainer: agents/proxy.py ``private_socket_dir``) is bound read-only at its own path,
  staged by the trainer before it drops to ``nobody``; a relay (stdlib Python, :data:`RELAY`) listens on ``127.0.0.1:PORT`` inside
  the sandbox's own network namespace and pipes each connection to that socket, so the agent
  uses a plain ``http://127.0.0.1:PORT/v1`` base URL. No other host socket is bound in, and the
  abstract unix socket namespace belongs to the network namespace, so the host's abstract
  sockets are out of reach too.
* **The harness's virtual environment** is bound read-only at its own path (staged for
  ``nobody`` when it lives under ``/root``); its ``bin`` comes after the sandbox's ``python``
  on ``PATH``. Bytecode is read from the venv (trusted, read-only), written nowhere.
* **A wall limit** for the whole agent (``timeout_s``), after which the namespace is killed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from composer_replication.sandbox.sandbox import Sandbox
from composer_replication.sandbox.shell import ShellExtras, ShellResult, run_shell

RELAY_READY = "/tmp/.cr-relay-ready"

RELAY = r"""
import asyncio, sys
host, port, path, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()

async def handle(reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(path)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

async def main():
    server = await asyncio.start_server(handle, host, port)
    open(ready, "w").close()
    await server.serve_forever()

asyncio.run(main())
"""
"""The relay: ``127.0.0.1:PORT`` inside the sandbox -> the proxy's unix socket."""


@dataclass(frozen=True)
class AgentRun:
    """How to start the agent: ``command`` runs with ``sh -c`` in ``/repo`` after the relay
    is up; ``env`` is added to its environment (``OPENAI_API_KEY`` and the harness's
    settings); ``venv`` is bound read-only."""

    command: str
    venv: str
    env: tuple[tuple[str, str], ...] = ()
    port: int = 8000
    timeout_s: float = 300.0
    max_processes: int = 128
    repo_mb: int = 64
    max_output_chars: int = 20_000


def run_agent(
    box: Sandbox,
    workspace: Path,
    run: AgentRun,
    socket_dir: str,
    socket_name: str,
    python_path: tuple[str, ...] = (),
) -> ShellResult:
    """Run ``run.command`` on a sandboxed copy of ``workspace`` with the proxy at
    ``http://127.0.0.1:{run.port}/v1`` (module docstring); the workspace gets what the agent
    left in ``/repo``. ``box``'s memory limit applies per process (a harness importing
    litellm needs ~1-2 GB of address space)."""
    sock = f"{socket_dir}/{socket_name}"
    script = (
        f'python -I -S -c "$PROXY_RELAY_SOURCE" 127.0.0.1 {run.port} {sock} {RELAY_READY} '
        ">/dev/null 2>&1 &\n"
        f"i=0; while [ ! -e {RELAY_READY} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n"
        + run.command
    )
    env = {
        "PATH": f"/cr-bin:{run.venv}/bin:/usr/bin:/bin",
        "PYTHONPYCACHEPREFIX": "",  # the venv's own bytecode (read-only, trusted)
        "PROXY_RELAY_SOURCE": RELAY,
        "OPENAI_BASE_URL": f"http://127.0.0.1:{run.port}/v1",
        "OPENAI_API_BASE": f"http://127.0.0.1:{run.port}/v1",
    } | dict(run.env)
    extra = ShellExtras(env=tuple(env.items()), binds=(run.venv, socket_dir))
    return run_shell(box, workspace, script, run.timeout_s, max_output_chars=run.max_output_chars,
                     repo_mb=run.repo_mb, python_path=python_path,
                     max_processes=run.max_processes, extra=extra)  # fmt: skip
