"""Fragments, checksums and setup errors of the torchft outer loop (no processes needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from composer_replication.diloco.outer import (
    DilocoSetupError,
    make_manager,
    params_checksum,
    split_fragments,
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 4))


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_fragments_cover_every_parameter_once_in_order(n):
    m = _model()
    frags = split_fragments(m, n)
    assert len(frags) == n
    flat = [p for f in frags for p in f.parameters()]
    assert [id(p) for p in flat] == [id(p) for p in m.parameters()]  # same objects, no copies


def test_fragments_are_balanced_by_size():
    m = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)])
    sizes = [sum(p.numel() for p in f.parameters()) for f in split_fragments(m, 2)]
    assert sizes == [2 * (32 * 32 + 32)] * 2


def test_frozen_parameters_left_out():
    m = _model()
    m[0].weight.requires_grad_(False)
    names = [n for f in split_fragments(m, 1) for n in f.names]
    assert "0.weight" not in names and "0.bias" in names


def test_too_many_fragments():
    with pytest.raises(DilocoSetupError, match="fragments=7"):
        split_fragments(_model(), 7)


def test_checksum_is_bitwise():
    a = [torch.tensor([1.0, 2.0])]
    b = [torch.tensor([1.0, 2.0])]
    c = [torch.tensor([1.0, 2.0 + 2**-22])]
    assert params_checksum(a) == params_checksum(b)
    assert params_checksum(a) != params_checksum(c)


def test_manager_needs_a_lighthouse(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(DilocoSetupError, match="lighthouse"):
        make_manager(0, dict, lambda sd: None, lighthouse=None)
