"""ObjectStoreAllReduce on file:// with ranks as threads (the multi-process runs are in
tests/integration/test_diloco_serverless.py)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from composer_replication.diloco.serverless import (
    ObjectStoreAllReduce,
    ObjectStoreManager,
    ObjectStoreTimeoutError,
)


def _run_ranks(fn, world: int) -> list:
    out, errs = [None] * world, [None] * world

    def target(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errs[r] = e

    # daemon: after Ctrl-C the interpreter would otherwise wait for a rank still polling
    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out, errs


def test_average_of_three_ranks_exact_and_identical(tmp_path):
    """rank r sends (r, 2r) and (10r,): the average of r = 0, 1, 2 is 1 -> (1, 2), (10,)."""
    uri = f"file://{tmp_path}/store"

    def fn(r):
        red = ObjectStoreAllReduce(uri, r, 3, timeout_s=20)
        return red.allreduce([torch.tensor([r, 2.0 * r]), torch.tensor([10.0 * r])])

    out, errs = _run_ranks(fn, 3)
    assert errs == [None] * 3
    for res in out:
        assert res[0].tolist() == [1.0, 2.0] and res[1].tolist() == [10.0]


def test_results_bit_equal_across_ranks_for_random_values(tmp_path):
    uri = f"file://{tmp_path}/s"

    def fn(r):
        torch.manual_seed(r)
        red = ObjectStoreAllReduce(uri, r, 3, timeout_s=20, compression="int8")
        return [red.allreduce([torch.randn(100)])[0] for _ in range(3)]

    out, errs = _run_ranks(fn, 3)
    assert errs == [None] * 3
    for k in range(3):
        assert torch.equal(out[0][k], out[1][k]) and torch.equal(out[0][k], out[2][k])


def test_old_rounds_are_cleaned(tmp_path):
    uri = f"file://{tmp_path}/s"
    reducers = [ObjectStoreAllReduce(uri, r, 2, timeout_s=20) for r in range(2)]

    def fn(r):
        for _ in range(4):
            reducers[r].allreduce([torch.ones(3) * r])

    _, errs = _run_ranks(fn, 2)
    assert errs == [None, None]
    assert reducers[0].rounds_on_store() == [3]  # rounds 0..2 deleted, the last one kept


def test_missing_rank_times_out_naming_rank_and_round(tmp_path):
    red = ObjectStoreAllReduce(f"file://{tmp_path}/s", 0, 3, timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(ObjectStoreTimeoutError, match=r"round 0: rank\(s\) \[1, 2\]") as info:
        red.allreduce([torch.ones(2)])
    assert info.value.missing == [1, 2] and info.value.round_id == 0
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rank": 2, "world_size": 2}, "rank 2 out of range"),
        ({"rank": -1, "world_size": 2}, "out of range"),
        ({"rank": 0, "world_size": 0}, "world_size"),
        ({"rank": 0, "world_size": 2, "timeout_s": 0}, "timeout_s"),
        ({"rank": 0, "world_size": 2, "compression": "fp8"}, "compression"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ObjectStoreAllReduce(f"file://{tmp_path}/s", **kwargs)


def test_world_size_one_passes_through_without_io(tmp_path):
    red = ObjectStoreAllReduce(f"file://{tmp_path}/s", 0, 1)
    x = torch.tensor([1.5, -2.0])
    assert torch.equal(red.allreduce([x])[0], x)
    assert red.stats.bytes_sent == 0


def test_diloco_sign_convention_through_object_store(tmp_path):
    """torchft's DiLoCo on the object-store manager, two ranks as threads.

    theta0 = (1, 2), constant grads g0 = (0.5, -0.25), g1 = (0.25, 0.75), inner SGD lr 1, H = 2:
    pseudo-grads 2*g_r = (1, -0.5), (0.5, 1.5), average (0.75, 0.5); outer SGD lr 0.5 without
    momentum: theta1 = theta0 - 0.5 * (0.75, 0.5) = (0.625, 1.75)   (wrong sign: (1.375, 2.25)).
    """
    from torchft.local_sgd import DiLoCo

    grads = [(0.5, -0.25), (0.25, 0.75)]
    uri = f"file://{tmp_path}/s"

    def fn(r):
        theta = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        module = torch.nn.Module()
        module.theta = theta
        inner = torch.optim.SGD([theta], lr=1.0)
        outer = torch.optim.SGD([theta], lr=0.5)
        mgr = ObjectStoreManager(ObjectStoreAllReduce(uri, r, 2, timeout_s=20))
        with DiLoCo(mgr, [module], inner, outer, sync_every=2, pin_memory=False):
            for _ in range(2):
                inner.zero_grad()
                (torch.tensor(grads[r]) * theta).sum().backward()
                inner.step()
        return theta.detach().clone(), mgr.current_step()

    out, errs = _run_ranks(fn, 2)
    assert errs == [None, None]
    for theta, step in out:
        assert theta.tolist() == [0.625, 1.75]
        assert step == 1
