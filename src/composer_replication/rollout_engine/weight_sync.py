"""What a weight push carries to the rollout workers (``ray.weight_sync``), and how a worker
applies it.

* ``full``: the whole state dict (each tied tensor once) at every push.
* ``lora``: with ``peft.enabled``, the first push carries the whole PEFT model (the frozen base
  and the initial adapter); every later push only the adapter's tensors (the learner's
  trainable parameters). Workers hold the same PEFT model as the learner, unmerged: their
  behaviour log-probs then come from the computation the learner's ``pi_old`` forward runs
  (base plus the low-rank branch), so the staleness-0 ratio stays a float-rounding matter;
  merging into the base would change the rounding and cost a full copy of each adapted layer.
* ``delta``: the first push is the whole state; every later one the difference from what the
  workers hold, through a lossy codec (``ray.delta_codec``: ``int8``, per-tensor absmax scale,
  or ``bf16``) with error feedback (Seide et al. 2014, 1-bit SGD; Karimireddy et al. 2019, EF-SGD).
  The learner keeps a *mirror* of the workers' weights: each push encodes ``current - mirror``
  and adds the *decoded* delta to the mirror with the same function the workers run, so a
  worker's weights equal the mirror bit for bit (a checksum says so), and what the codec
  dropped is sent again at the next push. After a push, each tensor of the mirror is within
  the codec's bound of the learner's weights (int8: half a step, ``max|delta| / 254``; bf16:
  half a bf16 ulp of the delta).

A published version is a :class:`Push`: the object-store references of a whole state
(``full``; in ``delta`` mode the mirror's snapshot, fetched only by a worker that does not
hold the version the update applies to: a new one, a replacement, a forced-staleness jump) and
of the update (``update``: the adapter, or the encoded delta, with ``after``: the version it
applies to). No Ray here: the learner puts the parts (rollout_engine/learner.py), a worker
fetches the ones :meth:`Push.needs` names and :func:`apply_push` applies them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

Mode = Literal["full", "lora", "delta"]
Codec = Literal["int8", "bf16"]


def state_checksum(state: dict[str, Any]) -> str:
    """SHA-256 over a state dict's names and tensor bytes (sorted by name): equal on the
    learner and a worker iff every weight is bit-identical."""
    h = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(tensor.view(-1).view(dtype=_byte_dtype()).numpy().tobytes())
    return h.hexdigest()


def distinct_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the entries that alias an earlier one (a tied embedding and LM head
    are one tensor under two names): what a weight push needs to send once."""
    seen: set[tuple[Any, ...]] = set()
    out = {}
    for name, tensor in state.items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
               tuple(tensor.shape), tuple(tensor.stride()))  # fmt: skip
        if key not in seen:
            seen.add(key)
            out[name] = tensor
    return out


def load_distinct(model: Any, state: dict[str, Any]) -> None:
    """Load a :func:`distinct_tensors` state: the names it lacks must be ``model``'s own
    aliases (tied weights, filled through the tie), anything else is an error."""
    own = model.state_dict()
    aliases = set(own) - set(distinct_tensors(own))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) - aliases or unexpected:
        raise ValueError(f"weights do not fit the worker's model: missing "
                         f"{sorted(set(missing) - aliases)[:3]}, unexpected {unexpected[:3]}")  # fmt: skip


def _byte_dtype():
    import torch

    return torch.uint8


@dataclass(frozen=True)
class Push:
    """One published version: references (or, in tests, the parts themselves)."""

    mode: Mode
    full: Any
    """A whole state dict (``full``: this version's; ``lora``: the first push's; ``delta``:
    this version's mirror)."""
    update: Any = None
    """The adapter's tensors (``lora``) or the encoded delta (``delta``); None: none."""
    after: int | None = None
    """``delta``: the version the update applies to."""

    def needs(self, held: int) -> list[str]:
        """Which parts a worker holding version ``held`` (-1: none) fetches, in order."""
        if self.update is None or self.mode == "full":
            return ["full"]
        if self.mode == "lora":
            return ["update"] if held >= 0 else ["full", "update"]
        return ["update"] if held == self.after else ["full"]


def encode_delta(delta: Any, codec: Codec) -> dict[str, Any]:
    """``delta`` (a float tensor) in the codec: ``int8`` (values and one float32 scale,
    ``max|delta| / 127``) or ``bf16``; a non-float tensor travels as it is."""
    import torch

    if not delta.is_floating_point():
        return {"codec": "raw", "q": delta}
    if codec == "bf16":
        return {"codec": "bf16", "q": delta.to(torch.bfloat16)}
    scale = float(delta.abs().max()) / 127.0
    q = torch.zeros_like(delta, dtype=torch.int8) if scale == 0 else (
        (delta / scale).round().clamp(-127, 127).to(torch.int8))  # fmt: skip
    return {"codec": "int8", "q": q, "scale": scale}


def decode_delta(payload: dict[str, Any]) -> Any:
    """The float32 delta an :func:`encode_delta` payload stands for (raw: the tensor)."""
    import torch

    q = payload["q"]
    if payload["codec"] == "raw":
        return q
    if payload["codec"] == "bf16":
        return q.to(torch.float32)
    return q.to(torch.float32) * payload["scale"]


def add_decoded(tensor: Any, payload: dict[str, Any]) -> None:
    """``tensor += decode(payload)`` in place, rounded to ``tensor``'s dtype: the one function
    the learner's mirror and every worker run, so they stay bit-identical."""
    import torch

    with torch.no_grad():
        if payload["codec"] == "raw":
            tensor.copy_(payload["q"])
        else:
            tensor.copy_((tensor.to(torch.float32) + decode_delta(payload)).to(tensor.dtype))


def payload_bytes(part: dict[str, Any]) -> int:
    """Bytes of a part's tensors (a state dict, or an encoded delta's values)."""
    total = 0
    for value in part.values():
        t = value["q"] if isinstance(value, dict) else value
        total += t.numel() * t.element_size()
    return total


class Publisher:
    """The learner's side: :meth:`parts` turns the model into a version's parts and keeps
    the mirror (``delta``) or the first push (``lora``)."""

    def __init__(self, mode: Mode = "full", codec: Codec = "int8"):
        self.mode = mode
        self.codec = codec
        self.mirror: dict[str, Any] | None = None
        """``delta``: what the workers hold (each tied tensor once), updated at each push."""
        self.last: int | None = None
        """The version of the last push."""

    def parts(self, model: Any, version: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``(full, update)`` of ``version`` (``full`` None in ``lora`` mode after the first
        push: the first push's stays published); the mirror moves in ``delta`` mode."""
        state = {k: v.detach().cpu() for k, v in distinct_tensors(model.state_dict()).items()}
        first, after = self.last is None, self.last
        self.last = version
        if self.mode == "full" or first:
            if self.mode == "delta":
                self.mirror = {k: v.clone() for k, v in state.items()}
            return state, None
        if self.mode == "lora":
            trainable = {n for n, p in model.named_parameters() if p.requires_grad}
            return None, {k: v.clone() for k, v in state.items() if k in trainable}
        assert self.mirror is not None and after is not None
        update = {}
        for name, tensor in state.items():
            mirror = self.mirror[name]
            diff = tensor.float() - mirror.float() if tensor.is_floating_point() else tensor
            update[name] = encode_delta(diff, self.codec)
            add_decoded(mirror, update[name])
        return {k: v.clone() for k, v in self.mirror.items()}, update


def apply_push(model: Any, push: Push, parts: dict[str, Any], held: int) -> None:
    """Apply the parts :meth:`Push.needs` named for a worker holding ``held`` to ``model``."""
    if "full" in parts:
        load_distinct(model, parts["full"])
    if "update" not in parts:
        return
    if push.mode == "lora":
        _load_subset(model, parts["update"])
        return
    own = model.state_dict()
    for name, payload in parts["update"].items():
        add_decoded(own[name], payload)


def _load_subset(model: Any, state: dict[str, Any]) -> None:
    """Load ``state``, a subset of ``model``'s tensors (the adapter): a name the model lacks
    is an error."""
    _, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"adapter tensors the worker's model lacks: {unexpected[:3]}")
