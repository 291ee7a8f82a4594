"""Pseudo-gradient codecs: exact round trips where they must be exact, bounded error otherwise.

int8 hand check: x = (-1.27, 0.5, 0.0, 1.27): scale = 1.27/127 = 0.01, q = (-127, 50, 0, 127),
decoded exactly back to x up to fp32 rounding of the scale.
"""

from __future__ import annotations

import pytest
import torch

from composer_replication.diloco.serverless.compression import (
    decode,
    encode,
    relative_error,
    wire_bytes,
)


def test_none_is_exact_and_fp32_sized():
    x = torch.randn(10, 3)
    p = encode(x, "none")
    assert torch.equal(decode(p), x)
    assert wire_bytes(p) == 30 * 4


def test_bf16_halves_bytes_with_bf16_precision():
    x = torch.randn(1000)
    p = encode(x, "bf16")
    assert wire_bytes(p) == 2000
    err = relative_error([x], [decode(p)])
    assert 0 < err < 2**-8  # bf16 has 8 bits of mantissa precision


def test_int8_hand_example():
    x = torch.tensor([-1.27, 0.5, 0.0, 1.27])
    p = encode(x, "int8")
    assert p["data"].tolist() == [-127, 50, 0, 127]
    assert p["scale"] == pytest.approx(0.01)
    assert torch.allclose(decode(p), x, atol=1e-6)
    assert wire_bytes(p) == 4 + 4


def test_int8_error_bounded_by_half_scale():
    torch.manual_seed(0)
    x = torch.randn(5000) * 3
    p = encode(x, "int8")
    err = (decode(p) - x).abs().max()
    assert err <= p["scale"] / 2 + 1e-6
    assert 0 < relative_error([x], [decode(p)]) < 0.02


def test_int8_all_zero_tensor():
    x = torch.zeros(7)
    assert torch.equal(decode(encode(x, "int8")), x)


def test_unknown_codec():
    with pytest.raises(ValueError, match="unknown compression"):
        encode(torch.ones(2), "fp4")  # type: ignore[arg-type]
