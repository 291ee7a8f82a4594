import os

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference relative to the reference's max magnitude (norm-relative)."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
