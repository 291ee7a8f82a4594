"""Ray's processes on this machine, read with psutil: the services (GCS, raylet) and the
workers, and the actors of the rollout engine among them."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

SERVICES = ("gcs_server", "raylet", "ray::", "default_worker")


def ray_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "name"]):
        text = " ".join(p.info["cmdline"] or []) + " " + (p.info["name"] or "")
        if "ray" in text and any(s in text for s in SERVICES):
            out.append(p)
    return out


def actor_processes(names=("ray::RolloutWorker", "ray::Hub")) -> list[psutil.Process]:
    """Processes of the rollout engine's actors (Ray titles an actor's process ``ray::Class``)."""
    return [p for p in ray_processes()
            if any(" ".join(p.info["cmdline"] or []).startswith(n) for n in names)]  # fmt: skip


def listening_ips() -> list[str]:
    """The addresses Ray's processes listen on (TCP and UDP)."""
    ips = []
    for p in ray_processes():
        try:
            conns = p.net_connections(kind="inet")
        except psutil.Error:
            continue
        ips += [c.laddr.ip for c in conns if c.status in (psutil.CONN_LISTEN, psutil.CONN_NONE)]
    return ips


def wait_gone(find: Callable[[], list], timeout_s: float = 90.0) -> list:
    """``find()`` polled until empty or the deadline; its last answer. 90 s: on this 2-core
    machine at a load of 20, a killed actor's process was still there after 30 s."""
    deadline = time.monotonic() + timeout_s
    while (found := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def own_actor_processes() -> list[psutil.Process]:
    """:func:`actor_processes` started under this process (a test's own Ray, e.g. a
    ``ray.cluster_utils.Cluster`` it runs), not another test run's on the same machine."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    return [p for p in actor_processes() if p.pid in mine]


def started_by(pid: int, found: list[psutil.Process] | None = None) -> list[psutil.Process]:
    """The processes of ``found`` (default: all of Ray's) that descend from process ``pid``
    (a local Ray's services are children of the driver that started it, its workers children
    of its raylet): on a machine where others run Ray at the same time, a given run's own."""
    try:
        mine = {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return []
    return [p for p in (ray_processes() if found is None else found) if p.pid in mine]
