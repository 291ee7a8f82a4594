"""DiLoCo's object-store all-reduce on a non-CPU device (tests/support/device_check.py): the
wire carries host tensors, the average comes back on the ranks' device and equals the CPU's."""

from __future__ import annotations

import threading

import pytest
import torch
from support.device_check import on_check_device, to_cpu, to_device

from composer_replication.diloco.serverless import ObjectStoreAllReduce


def _average(uri: str, per_rank: list[list[torch.Tensor]], codec: str) -> list:
    out, errs = [None] * len(per_rank), []

    def rank(r: int) -> None:
        try:
            red = ObjectStoreAllReduce(uri, r, len(per_rank), timeout_s=60, compression=codec)
            out[r] = red.allreduce(per_rank[r])
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errs.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(per_rank))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errs:
        raise errs[0]
    return out


@pytest.mark.parametrize("codec", ["none", "int8"])
@on_check_device
def test_object_store_allreduce_on_device_equals_cpu(tmp_path, codec):
    g = torch.Generator().manual_seed(0)
    per_rank = [[torch.randn(5, 3, generator=g), torch.randn(7, generator=g)] for _ in range(2)]
    cpu = _average(f"file://{tmp_path}/cpu", per_rank, codec)
    dev = _average(f"file://{tmp_path}/dev", to_device(per_rank), codec)
    for rank in dev:
        assert all(t.device.type == "devcheck" for t in rank)
    torch.testing.assert_close(to_cpu(dev), cpu)
