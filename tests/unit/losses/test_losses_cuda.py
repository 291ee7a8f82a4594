"""Every loss on a real CUDA GPU against the CPU result (``pytest -m gpu``; skipped with a
reason where there is no GPU). The cases are the device check's
(test_losses_on_device.py)."""

from __future__ import annotations

import pytest
import torch

from .test_losses_on_device import CASES, _run

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.float32: (2e-4, 2e-5), torch.bfloat16: (3e-2, 3e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_on_cuda_equals_cpu(name, dtype):
    fn, make, kwargs, grad_keys = CASES[name]
    inputs = {
        k: v.to(dtype) if v.is_floating_point() else v
        for k, v in make(torch.Generator().manual_seed(0)).items()
    }
    cpu = _run(fn, inputs, kwargs, grad_keys)
    cuda = _run(fn, {k: v.cuda() for k, v in inputs.items()}, kwargs, grad_keys)
    loss, metrics, grads = cuda
    assert loss.is_cuda and all(g.is_cuda for g in grads)
    assert all(m.is_cuda for m in metrics.values()), {k: m.device for k, m in metrics.items()}
    rtol, atol = TOLERANCE[dtype]
    back = (loss.cpu(), {k: m.cpu() for k, m in metrics.items()}, [g.cpu() for g in grads])
    torch.testing.assert_close(back, cpu, rtol=rtol, atol=atol)
