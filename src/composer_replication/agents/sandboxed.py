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
  sockets are out of reach too. The agent starts once the relay listens; a relay that dies or
  does not listen in time ends the run with exit 126 before the agent starts (the machine's
  failure, not the policy's: :data:`RELAY_FAILED_STATUS`).
* **The harness's virtual environment** is bound read-only at its own path (staged for
  ``nobody`` when it lives under ``/root``); its ``bin`` comes after the sandbox's ``python``
  on ``PATH``. Bytecode is read from the venv (trusted, read-only), written nowhere.
* **A limit on the agent's own time** (``timeout_s``): its wall time less the time it waited
  for the policy (``max_wait_s`` at most), after which it is killed.

**Why own time.** The agent's requests wait for the run's one generator: queued behind other
episodes' batches, then generated in a batch that runs until its longest row ends. How long
depends on the other episodes and the machine, not on the agent; a wall limit killed agents
for their siblings' work (8 agents at once under load). The credit is the time at least one
of the episode's requests was in the policy (the proxy measures it as it accrues:
``PolicyProxy.policy_wait``), queue and generation alike: the generator's batches are
static, so a request's generation also waits for the other rows of its batch. Concurrent
requests of one episode are credited once (the union of their waits), so sending several at
once gains nothing; the credit is bounded by what the proxy serves (``max_requests`` answers)
and by ``max_wait_s``. An agent may compute in a background process while a request of its
own is in the policy: that time is credited too (at most the policy's time for its
requests). The limit is enforced inside the sandbox by an own-time watchdog (``SIGKILL`` to
the agent's process group; what it left in ``/repo`` comes back, as after a plain
``timeout``) and on the host by the sandbox's deadline, which moves by the same credit: an
agent that kills the watchdog still dies with its PID namespace (sandbox/shell.py
``WaitCredit``). Resolution: about 0.25 s. The watchdog is a shell loop as the agent's user:
an agent that kills it, or that holds every process its limit allows (the loop's ``sleep``
then cannot start and the loop ends), is killed by the host's deadline instead, at the limit
plus the credit plus ``COPY_MARGIN_S`` (30 s), and what it left in ``/repo`` is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from composer_replication.sandbox.sandbox import Sandbox
from composer_replication.sandbox.shell import ShellExtras, ShellResult, WaitCredit, run_shell

RELAY_READY = "/tmp/.cr-relay-ready"

RELAY_POLL_S = 0.05
"""How often the agent's command looks whether the relay listens."""

RELAY_START_S = 60.0
"""How long the agent's command waits for the relay to listen (polled every
:data:`RELAY_POLL_S`; it takes well under a second on an idle machine, but 8 sandboxes starting
their harnesses at once on 2 loaded cores are slower). An agent started before the relay would
see its first request refused and end with 0 turns, graded as the policy's failure."""

RELAY_FAILED = "composer-replication: the proxy relay did not start; the agent was not run"
RELAY_FAILED_STATUS = 126
"""The exit status when the relay died or did not listen within :data:`RELAY_START_S`: the
shell's "could not execute", so the episode is the machine's failure, not the policy's
(agents/episodes.py ``not_started``)."""

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
    """The agent's own time limit (wall less the credited wait for the policy)."""
    max_wait_s: float = 3600.0
    """Most seconds of waiting for the policy credited (past it, waiting counts)."""
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
    policy_wait: Callable[[], tuple[float, bool]] | None = None,
) -> ShellResult:
    """Run ``run.command`` on a sandboxed copy of ``workspace`` with the proxy at
    ``http://127.0.0.1:{run.port}/v1`` (module docstring); the workspace gets what the agent
    left in ``/repo``. ``box``'s memory limit applies per process (a harness importing
    litellm needs ~1-2 GB of address space). ``policy_wait``: the episode's wait for the
    policy so far and whether one is in progress (``PolicyProxy.policy_wait``), not counted
    against ``run.timeout_s``; without it ``timeout_s`` is a wall limit."""
    sock = f"{socket_dir}/{socket_name}"
    polls = int(RELAY_START_S / RELAY_POLL_S)
    script = (
        f'python -I -S -c "$PROXY_RELAY_SOURCE" 127.0.0.1 {run.port} {sock} {RELAY_READY} '
        ">/dev/null 2>&1 &\n"
        f"relay=$!; i=0; while [ ! -e {RELAY_READY} ]; do\n"
        f'  if [ $i -ge {polls} ] || ! kill -0 "$relay" 2>/dev/null; then\n'
        f'    echo "{RELAY_FAILED}" >&2; exit {RELAY_FAILED_STATUS}\n'
        f"  fi; sleep {RELAY_POLL_S}; i=$((i+1))\n"
        "done\n" + run.command
    )
    env = {
        "PATH": f"/cr-bin:{run.venv}/bin:/usr/bin:/bin",
        "PYTHONPYCACHEPREFIX": "",  # the venv's own bytecode (read-only, trusted)
        "PROXY_RELAY_SOURCE": RELAY,
        "OPENAI_BASE_URL": f"http://127.0.0.1:{run.port}/v1",
        "OPENAI_API_BASE": f"http://127.0.0.1:{run.port}/v1",
    } | dict(run.env)
    extra = ShellExtras(env=tuple(env.items()), binds=(run.venv, socket_dir))
    credit = WaitCredit(policy_wait, run.max_wait_s) if policy_wait is not None else None
    try:
        return run_shell(box, workspace, script, run.timeout_s,
                         max_output_chars=run.max_output_chars, repo_mb=run.repo_mb,
                         python_path=python_path, max_processes=run.max_processes, extra=extra,
                         credit=credit)  # fmt: skip
    finally:
        if credit is not None:
            credit.close()
