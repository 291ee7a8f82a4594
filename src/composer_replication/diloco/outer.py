"""The DiLoCo outer loop on torchft (``torchft.local_sgd.DiLoCo``).

torchft does the algorithm: it keeps a backup of the global weights, computes the
pseudo-gradient ``theta_initial - theta_local`` after every H inner steps, all-reduces (averages)
it across the live replicas of the quorum, restores the global weights and lets the outer
optimizer take a normal step with the averaged pseudo-gradient as ``.grad``
(DiLoCo, Douillard et al. 2023, arXiv:2311.08105, Algorithm 1; Streaming DiLoCo,
arXiv:2501.18512, for ``fragments > 1``). With SGD, ``p <- p - lr * g`` therefore moves the
global weights *towards* the replicas' average local weights: for lr = 1 and no momentum the
outer step is exactly parameter averaging.

This module only wires that up: fragments, outer optimizers, the torchft ``Manager`` (one per
replica, gloo process group, synchronous quorum as DiLoCo requires) and an observer that reports
every committed sync.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from composer_replication.config.diloco import DilocoConfig

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"


class DilocoSetupError(RuntimeError):
    """The outer loop cannot start (no lighthouse address, bad fragment count, ...)."""


class ParameterFragment(nn.Module):
    """A view of some of a model's parameters as an ``nn.Module`` (no copies).

    torchft's DiLoCo takes a list of modules and only reads their ``named_parameters()``; a
    fragment holds the original ``nn.Parameter`` objects so updates land in the model.
    """

    def __init__(self, named: list[tuple[str, nn.Parameter]]):
        super().__init__()
        self.names = [n for n, _ in named]
        self.params = nn.ParameterList([p for _, p in named])


def split_fragments(model: nn.Module, n: int, trainable_only: bool = True) -> list[nn.Module]:
    """Split ``model``'s parameters into ``n`` contiguous fragments of similar size.

    Order follows ``model.named_parameters()`` so every replica builds the same fragments.
    Frozen parameters are left out when ``trainable_only`` (they have no pseudo-gradient).
    """
    named = [
        (name, p) for name, p in model.named_parameters() if p.requires_grad or not trainable_only
    ]
    if not named:
        raise DilocoSetupError("model has no trainable parameters to synchronize")
    if n < 1 or n > len(named):
        raise DilocoSetupError(
            f"diloco.fragments={n}: must be between 1 and the number of parameter tensors "
            f"({len(named)})"
        )
    if n == 1:
        return [ParameterFragment(named)]
    total = sum(p.numel() for _, p in named)
    groups: list[list[tuple[str, nn.Parameter]]] = [[]]
    seen = 0
    for i, (name, p) in enumerate(named):
        remaining_tensors = len(named) - i
        remaining_groups = n - len(groups)
        boundary = seen >= total * len(groups) / n
        must_split = remaining_tensors <= remaining_groups
        if groups[-1] and remaining_groups > 0 and (boundary or must_split):
            groups.append([])
        groups[-1].append((name, p))
        seen += p.numel()
    return [ParameterFragment(g) for g in groups]


def make_outer_optimizers(
    fragments: list[nn.Module], lr: float, momentum: float, nesterov: bool
) -> list[torch.optim.Optimizer]:
    """One SGD outer optimizer per fragment (DiLoCo's outer optimizer: SGD + Nesterov)."""
    return [
        torch.optim.SGD(
            f.parameters(), lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0
        )
        for f in fragments
    ]


def make_diloco_outer_loop(
    manager: Any,
    model: nn.Module,
    inner_optimizer: torch.optim.Optimizer,
    sync_every: int,
    outer_lr: float = 0.7,
    outer_momentum: float = 0.9,
    nesterov: bool = True,
    fragments: int = 1,
    quantize: bool = False,
) -> Any:
    """A ``torchft.local_sgd.DiLoCo`` around ``inner_optimizer`` (use it as a context manager).

    Inside the ``with`` block every ``inner_optimizer.step()`` counts as one inner step; every
    ``sync_every`` steps (H) torchft averages ``theta_initial - theta_local`` over the quorum
    and the outer SGD steps with it. ``fragments > 1`` is Streaming DiLoCo: one outer optimizer
    per fragment, fragment ``i`` synced every H steps at offset ``(i+1) * H / fragments``.
    ``quantize`` is torchft's quantized all-reduce (needs triton; torchft falls back to a
    full-precision all-reduce without it).
    """
    from torchft.local_sgd import DiLoCo

    if sync_every % fragments != 0:
        raise DilocoSetupError(
            f"sync_every={sync_every} must be a multiple of fragments={fragments}"
        )
    parts = split_fragments(model, fragments)
    outer = make_outer_optimizers(parts, outer_lr, outer_momentum, nesterov)
    return DiLoCo(
        manager,
        parts,
        inner_optimizer,
        outer if fragments > 1 else outer[0],
        sync_every=sync_every,
        backup_device=torch.device("cpu"),
        pin_memory=False,
        should_quantize=quantize,
    )


class _NoNcclNotice(logging.Filter):
    """torchft's manager warns at every quorum that it cannot reset the NCCL flight recorder;
    on CPU (gloo) there is no NCCL and nothing to reset, so the notice is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "NCCL flight recorder" not in record.getMessage()


def _drop_nccl_notice() -> None:
    log = logging.getLogger("torchft.manager")
    if not any(isinstance(f, _NoNcclNotice) for f in log.filters):
        log.addFilter(_NoNcclNotice())


def make_manager(
    replica_id: int,
    state_dict: Callable[[], dict[str, Any]],
    load_state_dict: Callable[[dict[str, Any]], None],
    lighthouse: str | None = None,
    min_replicas: int = 1,
    timeout_s: float = 600.0,
) -> tuple[Any, Any]:
    """A torchft ``Manager`` for one single-process replica group; returns (manager, store).

    The replica group's TCPStore is hosted here (port 0 = any free port); keep the returned
    store alive as long as the manager. Quorums are synchronous (DiLoCo requires it) and
    ``init_sync`` is off: replicas start from identical weights (same checkpoint or seed), and
    a replica that (re)joins late still heals from a peer because its step is behind.
    """
    from torch.distributed import TCPStore
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    address = lighthouse or os.environ.get(LIGHTHOUSE_ENV)
    if not address:
        raise DilocoSetupError(
            f"no torchft lighthouse address: set diloco.lighthouse or ${LIGHTHOUSE_ENV} "
            "(the `composer-replication diloco` launcher starts one for you)"
        )
    if not torch.cuda.is_available():
        _drop_nccl_notice()
    timeout = timedelta(seconds=timeout_s)
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=min_replicas,
        use_async_quorum=False,
        init_sync=False,
        replica_id=f"replica_{replica_id}",
        store_addr="localhost",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=address,
        port=0,
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timedelta(seconds=min(timeout_s, 60.0)),
    )
    return manager, store


def params_checksum(params: Iterable[torch.Tensor]) -> str:
    """sha256 (first 16 hex digits) of the raw bytes of ``params`` in order: equal iff bit-equal."""
    h = hashlib.sha256()
    for p in params:
        t = p.detach().to("cpu").contiguous()
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


@dataclass
class SyncEvent:
    """One committed outer step as seen by this replica."""

    manager_step: int
    inner_step: int
    participants: int
    seconds: float
    checksum: str
    pre_sync: list[torch.Tensor] | None = None
    post_sync: list[torch.Tensor] | None = None

    def row(self) -> dict[str, Any]:
        return {
            "manager_step": self.manager_step,
            "inner_step": self.inner_step,
            "participants": self.participants,
            "seconds": self.seconds,
            "checksum": self.checksum,
        }


@dataclass
class SyncObserver:
    """Watches an optimizer wrapped by DiLoCo and reports each committed sync.

    Hooks are registered around DiLoCo's own: a post-hook registered *before* DiLoCo enters
    snapshots the local weights after the inner step (only on steps that will sync, when
    ``keep_tensors``), and a post-hook registered *after* it notices the manager's step moved.
    """

    manager: Any
    params: list[nn.Parameter]
    sync_every: int
    keep_tensors: bool = False
    on_sync: Callable[[SyncEvent], None] | None = None
    events: list[SyncEvent] = field(default_factory=list)
    inner_steps: int = 0
    _pre: list[torch.Tensor] | None = None
    _last_step: int = 0
    _t0: float = 0.0
    _handles: list[Any] = field(default_factory=list)

    def attach_before(self, optimizer: torch.optim.Optimizer) -> None:
        self._last_step = self.manager.current_step()
        self._t0 = time.monotonic()
        self._handles.append(optimizer.register_step_post_hook(self._before))

    def attach_after(self, optimizer: torch.optim.Optimizer) -> None:
        self._handles.append(optimizer.register_step_post_hook(self._after))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _before(self, *_: Any) -> None:
        self.inner_steps += 1
        if self.keep_tensors:
            self._pre = [p.detach().clone() for p in self.params]

    def _after(self, *_: Any) -> None:
        step = self.manager.current_step()
        if step == self._last_step:
            return
        self._last_step = step
        event = SyncEvent(
            manager_step=step,
            inner_step=self.inner_steps,
            participants=self.manager.num_participants(),
            seconds=time.monotonic() - self._t0,
            checksum=params_checksum(self.params),
            pre_sync=self._pre if self.keep_tensors else None,
            post_sync=[p.detach().clone() for p in self.params] if self.keep_tensors else None,
        )
        self.events.append(event)
        if self.on_sync is not None:
            self.on_sync(event)


class DilocoRuntime:
    """Manager + DiLoCo + observer for one replica, built from a :class:`DilocoConfig`.

    ``with DilocoRuntime(cfg, model, optimizer): ...train...`` — every ``optimizer.step()``
    inside the block is an inner step. ``manager`` may be passed in (e.g. the object-store
    manager of :mod:`composer_replication.diloco.serverless`); otherwise a torchft Manager is
    created against the lighthouse.
    """

    def __init__(
        self,
        cfg: DilocoConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        manager: Any = None,
        keep_tensors: bool = False,
        on_sync: Callable[[SyncEvent], None] | None = None,
    ):
        self.cfg, self.model, self.optimizer = cfg, model, optimizer
        self.store = None
        if manager is None:
            manager, self.store = make_manager(
                cfg.replica_id,
                self._state_dict,
                self._load_state_dict,
                lighthouse=cfg.lighthouse,
                min_replicas=cfg.min_replicas,
                timeout_s=cfg.timeout_s,
            )
        self.manager = manager
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.observer = SyncObserver(
            manager, self.params, cfg.sync_every, keep_tensors=keep_tensors, on_sync=on_sync
        )
        self.diloco = make_diloco_outer_loop(
            manager,
            model,
            optimizer,
            sync_every=cfg.sync_every,
            outer_lr=cfg.outer_lr,
            outer_momentum=cfg.outer_momentum,
            nesterov=cfg.nesterov,
            fragments=cfg.fragments,
            quantize=cfg.quantize,
        )

    def _state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "inner_optim": self.optimizer.state_dict()}

    def _load_state_dict(self, sd: dict[str, Any]) -> None:
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["inner_optim"])

    @property
    def events(self) -> list[SyncEvent]:
        return self.observer.events

    def checksum(self) -> str:
        return params_checksum(self.params)

    def __enter__(self) -> DilocoRuntime:
        self.observer.attach_before(self.optimizer)
        self.diloco.__enter__()
        self.observer.attach_after(self.optimizer)
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.diloco.__exit__(*exc)
        self.observer.detach()
        return False

    def shutdown(self) -> None:
        shutdown = getattr(self.manager, "shutdown", None)
        if shutdown is not None:
            shutdown(wait=False)
