"""Pseudo-gradient encodings for the object-store all-reduce: fp32, bf16, int8 with a per-tensor
scale. Pure functions over tensors.

int8 (symmetric, per tensor): ``scale = max|x| / 127``, ``q = round(x / scale)`` clamped to
[-127, 127], decoded as ``q * scale``; the worst-case absolute error per element is
``scale / 2`` (as in 8-bit gradient compression, e.g. Dettmers 2015, arXiv:1511.04561).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

Codec = Literal["none", "bf16", "int8"]
CODECS: tuple[str, ...] = ("none", "bf16", "int8")


def encode(x: torch.Tensor, codec: Codec) -> dict[str, Any]:
    """Encode one float tensor; the result is what goes on the wire (via ``torch.save``), in
    host memory whatever device ``x`` is on (a rank without that device can read it)."""
    x = x.detach().to("cpu", torch.float32)
    if codec == "none":
        return {"codec": "none", "data": x.clone()}
    if codec == "bf16":
        return {"codec": "bf16", "data": x.to(torch.bfloat16)}
    if codec == "int8":
        amax = float(x.abs().max()) if x.numel() else 0.0
        scale = amax / 127.0 if amax != 0 else 1.0  # NaN stays NaN: refused when read
        q = torch.round(x / scale).clamp_(-127, 127).to(torch.int8)
        return {"codec": "int8", "data": q, "scale": scale}
    raise ValueError(f"unknown compression {codec!r}; expected one of {CODECS}")


_DTYPES = {"none": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}


class PayloadError(ValueError):
    """A payload read off the wire is not what :func:`encode` writes (the message says why)."""


def check_payload(payload: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """Decode a payload written by another process, refusing anything :func:`encode` would not
    have written for a tensor of ``shape``: another container or keys, an unknown codec, data of
    another dtype or shape, an int8 scale that is not a finite positive number, non-finite values.
    A replica that diverged (NaN/inf in its pseudo-gradient) is refused here rather than averaged
    into every replica's weights."""
    if not isinstance(payload, dict):
        raise PayloadError(f"a {type(payload).__name__}, not a payload dict")
    codec = payload.get("codec")
    if codec not in _DTYPES:
        raise PayloadError(f"codec {codec!r} is not one of {CODECS}")
    keys = {"codec", "data", "scale"} if codec == "int8" else {"codec", "data"}
    if set(payload) != keys:
        raise PayloadError(f"keys {sorted(payload)}; a {codec} payload has {sorted(keys)}")
    data = payload["data"]
    if type(data) is not torch.Tensor or data.dtype != _DTYPES[codec]:  # noqa: E721 - no subclass
        what = data.dtype if type(data) is torch.Tensor else type(data).__name__  # noqa: E721
        raise PayloadError(f"{codec} data is {what}, expected a {_DTYPES[codec]} tensor")
    if data.layout != torch.strided or data.device.type != "cpu":
        raise PayloadError(f"data is a {data.layout} tensor on {data.device}, not a dense CPU one")
    if tuple(data.shape) != tuple(shape):
        raise PayloadError(f"shape {list(data.shape)}, this rank's tensor is {list(shape)}")
    if codec == "int8":
        scale = payload["scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise PayloadError(f"int8 scale is a {type(scale).__name__}, not a number")
        if not math.isfinite(scale):
            raise PayloadError(
                f"int8 scale {scale!r} (max|x| was NaN or inf: the replica diverged)"
            )
        if scale <= 0:
            raise PayloadError(f"int8 scale {scale!r} is not positive")
        if data.numel() and int(data.min()) < -127:
            raise PayloadError("int8 value -128, which the encoding never writes")
    out = decode(payload)
    if not bool(torch.isfinite(out).all()):
        raise PayloadError("non-finite values (NaN/inf: the replica diverged)")
    return out


def decode(payload: dict[str, Any]) -> torch.Tensor:
    """Back to float32 (trusted input: what this process encoded; see :func:`check_payload`)."""
    codec, data = payload["codec"], payload["data"]
    if codec == "int8":
        return data.to(torch.float32) * payload["scale"]
    if codec in ("none", "bf16"):
        return data.to(torch.float32)
    raise ValueError(f"unknown compression {codec!r} in payload")


def wire_bytes(payload: dict[str, Any]) -> int:
    """Bytes of tensor data in a payload (excluding container overhead)."""
    data = payload["data"]
    return data.numel() * data.element_size() + (4 if payload["codec"] == "int8" else 0)


def relative_error(x_list: list[torch.Tensor], y_list: list[torch.Tensor]) -> float:
    """``||y - x|| / ||x||`` over all tensors together (0 if x is all zeros and y equals it)."""
    num = sum(
        float((y.float() - x.float()).pow(2).sum()) for x, y in zip(x_list, y_list, strict=True)
    )
    den = sum(float(x.float().pow(2).sum()) for x in x_list)
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return (num / den) ** 0.5
