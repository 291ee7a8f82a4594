"""All-reduce (average) through an object store, for replicas that cannot open sockets to each
other (serverless jobs). Any fsspec filesystem works; file:// and s3:// are tested.

Round ``k`` lives under ``{uri}/round-{k:08d}/``. Each rank encodes its tensors, writes them to
a temporary key and renames it to ``rank-{r:05d}.pt`` (on s3 the rename is a server-side copy,
so a reader sees either nothing or the whole object). Every rank polls the round's listing
until the objects of ranks ``0..world_size-1`` exist, decodes them and sums them in rank order,
so every rank computes bit-identical averages. An object is read as untrusted: it must say which
rank, world size and round wrote it, hold one payload per tensor of this rank's shapes, and hold
only finite numbers (a diverged replica stops every rank with an error naming it, instead of
turning every replica's weights into NaN); a key in the round that is not ``rank-NNNNN.pt`` of a
rank below ``world_size`` is an error naming it (another run's leftovers, or replicas started with
different world sizes). When rank 0 has seen round ``k`` complete, every rank has
already finished reading round ``k-1`` (it wrote round ``k`` after), so rank 0 deletes it.
"""

from __future__ import annotations

import io
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from composer_replication.diloco.serverless.compression import (
    CODECS,
    Codec,
    PayloadError,
    check_payload,
    encode,
    relative_error,
    wire_bytes,
)


class ObjectStoreTimeoutError(TimeoutError):
    """Some ranks did not write their part of a round in time."""

    def __init__(
        self, round_id: int, missing: list[int], world_size: int, url: str, timeout_s: float
    ):
        self.round_id, self.missing = round_id, missing
        super().__init__(
            f"object-store all-reduce round {round_id}: rank(s) {missing} of world_size "
            f"{world_size} did not write to {url} within {timeout_s:g} s"
        )


class ObjectStorePayloadError(ValueError):
    """An object in the store is not a well-formed contribution to this round (names the key)."""

    def __init__(self, round_id: int, key: str, reason: str):
        self.round_id, self.key = round_id, key
        super().__init__(f"object-store all-reduce round {round_id}: {key}: {reason}")


_RANK_KEY = re.compile(r"rank-(\d{5})\.pt")
_OVERHEAD_BYTES = 1 << 20  # torch.save's container per object, far above what it writes
_TENSOR_OVERHEAD_BYTES = 1024  # and per tensor (about 280 bytes measured): an MoE has ~18k


@dataclass
class WireStats:
    """Traffic and compression error of this rank so far."""

    rounds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    tensor_bytes_sent: int = 0
    last_relative_error: float = 0.0
    relative_errors: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "tensor_bytes_sent": self.tensor_bytes_sent,
            "last_relative_error": self.last_relative_error,
            "max_relative_error": max(self.relative_errors, default=0.0),
        }


class ObjectStoreAllReduce:
    """Average lists of tensors across ``world_size`` ranks through ``uri`` (fsspec).

    ``storage_options`` go to ``fsspec.url_to_fs`` (e.g. ``{"endpoint_url": ...}`` for s3fs).
    ``compression`` encodes what each rank writes (``none``/``bf16``/``int8``); the relative
    reconstruction error of this rank's last contribution is in ``stats.last_relative_error``.
    """

    def __init__(
        self,
        uri: str,
        rank: int,
        world_size: int,
        timeout_s: float = 600.0,
        compression: Codec = "none",
        poll_s: float = 0.02,
        storage_options: dict[str, Any] | None = None,
    ):
        import fsspec

        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if compression not in CODECS:
            raise ValueError(f"compression {compression!r} not in {CODECS}")
        self.uri = uri.rstrip("/")
        self.rank, self.world_size = rank, world_size
        self.timeout_s, self.poll_s, self.compression = timeout_s, poll_s, compression
        self.fs, self.root = fsspec.url_to_fs(self.uri, **(storage_options or {}))
        self.round_id = 0
        self.stats = WireStats()
        self.fs.makedirs(self.root, exist_ok=True)

    def _round_dir(self, k: int) -> str:
        return f"{self.root}/round-{k:08d}"

    def _rank_key(self, k: int, r: int) -> str:
        return f"{self._round_dir(k)}/rank-{r:05d}.pt"

    def _write(self, k: int, payloads: list[dict[str, Any]]) -> int:
        buf = io.BytesIO()
        header = {"rank": self.rank, "world_size": self.world_size, "round": k}
        torch.save({**header, "tensors": payloads}, buf)
        data = buf.getvalue()
        tmp = f"{self._round_dir(k)}/.tmp-{self.rank:05d}-{uuid.uuid4().hex}"
        self.fs.makedirs(self._round_dir(k), exist_ok=True)
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, self._rank_key(k, self.rank))
        return len(data)

    def _present(self, k: int) -> set[int]:
        self.fs.invalidate_cache(self._round_dir(k))
        try:
            names = self.fs.ls(self._round_dir(k), detail=False)
        except FileNotFoundError:
            return set()
        out = set()
        for name in names:
            if name.rstrip("/") == self._round_dir(k).rstrip("/"):
                continue  # s3: the directory's own marker object, listed as its child
            base = name.rstrip("/").rsplit("/", 1)[-1]
            if base.startswith(".tmp-"):  # a rank's write in progress
                continue
            match = _RANK_KEY.fullmatch(base)
            if match is None or int(match.group(1)) >= self.world_size:
                raise ObjectStorePayloadError(
                    k,
                    f"{self._round_dir(k)}/{base}",
                    f"not the key of a rank below world_size {self.world_size} (another run's "
                    "leftovers, or replicas started with different world sizes: give each run "
                    "its own empty uri)",
                )
            out.add(int(match.group(1)))
        return out

    def _wait_all(self, k: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            present = self._present(k)
            if set(range(self.world_size)) <= present:
                return
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.world_size)) - present)
                raise ObjectStoreTimeoutError(k, missing, self.world_size, self.uri, self.timeout_s)
            time.sleep(self.poll_s)

    def _read(self, k: int, r: int, shapes: list[tuple[int, ...]]) -> list[Any]:
        """Rank ``r``'s payloads for round ``k``, checked against the header it must carry and
        sized before they are read (fp32 data of ``shapes`` plus the container)."""
        key = self._rank_key(k, r)
        limit = sum(4 * max(1, math.prod(s)) + _TENSOR_OVERHEAD_BYTES for s in shapes)
        limit += _OVERHEAD_BYTES
        size = self.fs.size(key)
        if size is not None and size > limit:
            raise ObjectStorePayloadError(
                k, key, f"{size} bytes, more than fp32 tensors of this round's shapes ({limit})"
            )
        data = self.fs.cat_file(key)
        self.stats.bytes_received += len(data)
        try:
            obj = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable object is the same error, named
            raise ObjectStorePayloadError(k, key, f"unreadable ({type(e).__name__}: {e})") from e
        want = {"rank": r, "world_size": self.world_size, "round": k}
        if not isinstance(obj, dict) or set(obj) != {*want, "tensors"}:
            raise ObjectStorePayloadError(k, key, "not an object this all-reduce writes")
        got = {name: obj[name] for name in want}
        if any(type(v) is not int for v in got.values()) or got != want:  # noqa: E721
            raise ObjectStorePayloadError(
                k, key, f"written as {got}, expected {want} (another run's object?)"
            )
        if not isinstance(obj["tensors"], list) or len(obj["tensors"]) != len(shapes):
            n = len(obj["tensors"]) if isinstance(obj["tensors"], list) else "no list of"
            raise ObjectStorePayloadError(
                k, key, f"{n} tensors, rank {self.rank} has {len(shapes)}"
            )
        return obj["tensors"]

    def _decoded(
        self, k: int, r: int, payloads: list[Any], shapes: list[tuple[int, ...]]
    ) -> list[torch.Tensor]:
        where = self._rank_key(k, r) if self.world_size > 1 else "this rank's own tensors"
        out = []
        for i, (payload, shape) in enumerate(zip(payloads, shapes, strict=True)):
            try:
                out.append(check_payload(payload, shape))
            except PayloadError as e:
                raise ObjectStorePayloadError(k, where, f"tensor {i}: {e}") from e
        return out

    def allreduce(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Average ``tensors`` (same shapes on every rank) over all ranks; returns new fp32
        tensors on their devices (this rank's own contribution is counted in its encoded form, like the others').
        Raises :class:`ObjectStoreTimeoutError` naming the missing ranks and the round."""
        k = self.round_id
        shapes = [tuple(t.shape) for t in tensors]
        payloads = [encode(t, self.compression) for t in tensors]
        if self.world_size > 1:  # written before this rank checks its own, so peers fail fast too
            self.stats.bytes_sent += self._write(k, payloads)
            self.stats.tensor_bytes_sent += sum(wire_bytes(p) for p in payloads)
        mine = [
            d.to(t.device)
            for d, t in zip(self._decoded(k, self.rank, payloads, shapes), tensors, strict=True)
        ]
        self.stats.last_relative_error = relative_error(tensors, mine)
        self.stats.relative_errors.append(self.stats.last_relative_error)
        if self.world_size == 1:
            self.round_id += 1
            self.stats.rounds += 1
            return mine
        self._wait_all(k)
        total = [torch.zeros_like(t) for t in mine]
        for r in range(self.world_size):
            if r == self.rank:
                parts = mine
            else:  # off the wire (host memory) onto this rank's tensors' devices
                peer = self._decoded(k, r, self._read(k, r, shapes), shapes)
                parts = [p.to(a.device) for p, a in zip(peer, total, strict=True)]
            for acc, part in zip(total, parts, strict=True):
                acc.add_(part)
        out = [t / self.world_size for t in total]
        if self.rank == 0 and k > 0:
            self._cleanup(k - 1)
        self.round_id += 1
        self.stats.rounds += 1
        return out

    def _cleanup(self, k: int) -> None:
        try:
            self.fs.rm(self._round_dir(k), recursive=True)
        except FileNotFoundError:
            pass

    def rounds_on_store(self) -> list[int]:
        """Round ids whose directories still exist (for inspection and tests)."""
        return _rounds(self.fs, self.root)


def _rounds(fs: Any, root: str) -> list[int]:
    fs.invalidate_cache(root)
    try:
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    return sorted(
        int(n.rstrip("/").rsplit("-", 1)[-1])
        for n in names
        if "/round-" in f"/{n.rsplit('/', 1)[-1]}"
    )


def rounds_at(uri: str, storage_options: dict[str, Any] | None = None) -> list[int]:
    """Round ids already under ``uri`` (a launcher refuses a store left over from another run:
    its round 0 would be read as this run's)."""
    import fsspec

    fs, root = fsspec.url_to_fs(uri.rstrip("/"), **(storage_options or {}))
    return _rounds(fs, root)


class _Work:
    """What torchft's DiLoCo expects back from ``manager.allreduce``: something to ``wait()`` on."""

    def __init__(self, manager: ObjectStoreManager):
        self._manager = manager

    def wait(self, timeout: Any = None) -> bool:
        self._manager.flush()
        return True


class ObjectStoreManager:
    """Stands in for ``torchft.Manager`` under ``torchft.local_sgd.DiLoCo`` with a fixed set of
    replicas that meet only through an :class:`ObjectStoreAllReduce`.

    DiLoCo calls ``allreduce`` once per parameter and then ``wait`` on each; the tensors are
    collected and sent as one object per round on the first ``wait``, and the averages are
    copied back in place. There is no quorum and no live recovery: membership is fixed and a
    missing replica fails the round with :class:`ObjectStoreTimeoutError`.
    """

    _use_async_quorum = False

    def __init__(self, reducer: ObjectStoreAllReduce):
        self.reducer = reducer
        self._pending: list[torch.Tensor] = []
        self._step = 0
        self._state_fns: dict[str, Any] = {}

    def start_quorum(self, *args: Any, **kwargs: Any) -> None:
        self._pending = []

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False, **_: Any) -> _Work:
        self._pending.append(tensor)
        return _Work(self)

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for dst, avg in zip(pending, self.reducer.allreduce(pending), strict=True):
            dst.copy_(avg.to(dst.dtype))

    def should_commit(self, timeout: Any = None) -> bool:
        self.flush()
        self._step += 1
        return True

    def current_step(self) -> int:
        return self._step

    def num_participants(self) -> int:
        return self.reducer.world_size

    def register_state_dict_fn(self, key: str, load_fn: Any, save_fn: Any) -> None:
        self._state_fns[key] = (load_fn, save_fn)

    def allow_state_dict_read(self) -> None:
        pass

    def disallow_state_dict_read(self) -> None:
        pass

    def errored(self) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return self.reducer.stats.as_dict()

    def shutdown(self, wait: bool = True) -> None:
        pass
