"""Shared validation and masking helpers for the loss functions (internal)."""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE_INDEX = -100


def check_float(name: str, x: Tensor) -> None:
    """Raise a clear error unless ``x`` is a floating-point tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")


def check_same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    """Raise a clear error unless ``a`` and ``b`` have the same shape."""
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} has shape {tuple(a.shape)} but {name_b} has shape {tuple(b.shape)}; "
            "they must match"
        )


def check_unit_interval(name: str, value: float) -> None:
    """Raise unless ``0 <= value <= 1``."""
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def resolve_mask(
    lead_shape: torch.Size,
    device: torch.device,
    mask: Tensor | None,
    labels: Tensor | None,
    ignore_index: int = IGNORE_INDEX,
) -> Tensor | None:
    """Return a bool mask of shape ``lead_shape`` from ``mask`` or ``labels`` (or None).

    ``mask`` is a bool / 0-1 tensor (True = token counts); ``labels`` marks ignored
    positions with ``ignore_index`` (-100, the Hugging Face convention). Give at most one.
    """
    if mask is not None and labels is not None:
        raise ValueError("pass either mask or labels, not both")
    if labels is not None:
        if labels.shape != lead_shape:
            raise ValueError(
                f"labels has shape {tuple(labels.shape)}, expected {tuple(lead_shape)} "
                "(the logits' shape without the vocabulary dimension)"
            )
        return (labels != ignore_index).to(device)
    if mask is None:
        return None
    if mask.shape != lead_shape:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected {tuple(lead_shape)} "
            "(the logits' shape without the vocabulary dimension)"
        )
    if mask.is_floating_point():
        bad = (mask != 0) & (mask != 1)
        if bool(bad.any()):
            raise ValueError("mask must be boolean or contain only 0/1 values")
    return mask.to(device=device, dtype=torch.bool)
