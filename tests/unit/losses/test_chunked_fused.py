"""The accelerator path of the chunked generalized JSD (``impl="fused"``), run on CPU tensors.

The same Python code runs on CUDA, where :func:`gjsd_rows_` is compiled; here it runs eagerly
(and once compiled by Inductor's CPU backend), so the device-independent logic (chunking,
sub-blocks, gradient folding, dtypes) is checked without a GPU.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from trl.experimental.gkd import GKDTrainer

from composer_replication.losses import chunked, chunked_generalized_jsd_loss
from composer_replication.losses.chunked import _rows_fn, fused_chunk_rows, gjsd_rows_

from .conftest import rel_err


def _inputs(N=40, H=16, V=300, dtype=torch.float32, spread=3.0):
    h = torch.randn(N, H, dtype=torch.float64)
    w = spread * torch.randn(V, H, dtype=torch.float64) / H**0.5
    th = torch.randn(N, H, dtype=torch.float64)
    tw = spread * torch.randn(V, H, dtype=torch.float64) / H**0.5
    return [x.to(dtype) for x in (h, w, th, tw)]


def _trl(h, w, th, tw, labels=None, **kw):
    with torch.no_grad():
        t_logits = th @ tw.t()
    if labels is None:  # every token counts: TRL's batchmean is then the per-token mean
        labels = torch.zeros(h.shape[0], dtype=torch.long)
    return GKDTrainer.generalized_jsd_loss(
        (h @ w.t()).unsqueeze(0), t_logits.unsqueeze(0), labels=labels.unsqueeze(0), **kw
    )


def _loss_and_grads(fn, h, w, th, tw, **kw):
    h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
    loss = fn(h, w, th, tw, **kw)
    return (loss.detach(), *torch.autograd.grad(loss, (h, w)))


def _fused(h, w, th, tw, **kw):
    return chunked_generalized_jsd_loss(h, w, th, tw, impl="fused", **kw)[0]


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [None, 7])
def test_fused_fp32_matches_trl(beta, temperature, chunk):
    """fp32: loss and both gradients within 1e-5 of TRL's full-logits loss (masked rows too)."""
    h, w, th, tw = _inputs()
    labels = torch.randint(0, w.shape[0], (h.shape[0],))
    labels[:5] = -100
    kw = {"beta": beta, "temperature": temperature}
    ref = _loss_and_grads(_trl, h, w, th, tw, labels=labels, **kw)
    ours = _loss_and_grads(_fused, h, w, th, tw, labels=labels, chunk_size=chunk, **kw)
    assert ours[0].item() == pytest.approx(ref[0].item(), rel=1e-5)
    assert rel_err(ours[1], ref[1]) < 1e-5
    assert rel_err(ours[2], ref[2]) < 1e-5
    assert torch.all(ours[1][:5] == 0)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_bf16_is_as_accurate_as_trl_bf16(beta):
    """bf16 in, bf16 grads out; against a float64 reference the fused path's error in the loss
    and both gradients is at most TRL's own bf16 error (+1e-3 slack for rounding luck).
    Measured here: TRL 1e-3..3e-3 (loss), 1e-2..7e-2 (grads); ours 5e-4..1.4e-3, ~1e-2."""
    x64 = _inputs(dtype=torch.float64)
    ref = _loss_and_grads(_trl, *x64, beta=beta)
    x16 = [x.to(torch.bfloat16) for x in x64]
    trl = _loss_and_grads(_trl, *x16, beta=beta)
    ours = _loss_and_grads(_fused, *x16, beta=beta, labels=torch.zeros(40, dtype=torch.long))
    assert ours[1].dtype == ours[2].dtype == torch.bfloat16
    for i in range(3):
        err_trl = rel_err(trl[i].double(), ref[i])
        err_ours = rel_err(ours[i].double(), ref[i])
        assert err_ours <= err_trl + 1e-3, (i, err_ours, err_trl)


def test_fused_agrees_with_blocked_on_every_option():
    """teacher_logits_fn, token_clip, sum reduction, divisor and [B, T, H] inputs: the fused
    path gives the CPU (blocked) path's loss and gradients."""
    B, T, H, V = 2, 9, 8, 37
    h = torch.randn(B, T, H)
    w = 0.5 * torch.randn(V, H)
    th, tw = torch.randn(B, T, 6), 0.5 * torch.randn(V, 6)
    mask = torch.rand(B, T) > 0.3
    t_logits = (th @ tw.t()).reshape(-1, V)
    for kw in (
        {"reduction": "sum", "token_clip": 0.05},
        {"divisor": 5.0, "temperature": 0.5, "beta": 0.2},
        {"teacher_logits_fn": lambda ids: t_logits[ids], "chunk_size": 3},
    ):
        t_args = () if "teacher_logits_fn" in kw else (th, tw)
        out = {}
        for impl in ("blocked", "fused"):
            hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
            loss, _ = chunked_generalized_jsd_loss(hh, ww, *t_args, mask=mask, impl=impl, **kw)
            out[impl] = (loss.detach(), *torch.autograd.grad(loss, (hh, ww)))
        for a, b in zip(out["fused"], out["blocked"], strict=True):
            assert rel_err(a, b) < 1e-5, kw


class _MatmulDtypes(TorchDispatchMode):
    """Records the dtypes of every matmul's operands."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("mm", "addmm", "bmm"):
            self.seen += [(func.__name__, a.dtype) for a in args if isinstance(a, torch.Tensor)]
        return func(*args, **(kwargs or {}))


def test_fused_bf16_matmuls_stay_bf16():
    """No fp32 upcast of the head weights: all four head matmuls run on bf16 operands."""
    h, w, th, tw = (x.to(torch.bfloat16) for x in _inputs())
    h.requires_grad_()
    w.requires_grad_()
    with _MatmulDtypes() as rec:
        loss = _fused(h, w, th, tw)
        loss.backward()
    assert rec.seen and {dt for _, dt in rec.seen} == {torch.bfloat16}, rec.seen
    assert w.grad.dtype == h.grad.dtype == torch.bfloat16


def test_fused_chunk_rows_follow_the_budget():
    """Budget = half the head's bytes (>= 64 MiB, <= free/4): the two logits buffers plus the
    fp32 scratch fit it at the issue's sizes, and less free memory gives smaller chunks."""
    V = 151936
    for T, H in ((4096, 896), (4096, 3584), (16384, 3584)):
        chunk, sub = fused_chunk_rows(T, V, H, 2, 70 * 1024**3)
        used = 2 * chunk * V * 2 + 12 * sub * V
        assert chunk % sub == 0 and 8 <= sub <= 256
        assert used <= max(V * H * 2 // 2, 64 * 1024**2)
        assert used >= 0.5 * V * H * 2 // 2  # not needlessly small either
    big, _ = fused_chunk_rows(16384, V, 3584, 2, 70 * 1024**3)
    small, _ = fused_chunk_rows(16384, V, 3584, 2, 1024**3)
    assert small < big
    assert fused_chunk_rows(5, V, 896, 2, 70 * 1024**3)[0] == 8  # n_rows rounded up to sub


def test_a_larger_fused_budget_makes_fewer_larger_chunks_and_the_same_loss():
    """``fused_budget_bytes``: at H=896 the default budget (half the head, 136 MB) makes
    16-row sub-blocks; 512 MiB makes them 4x larger and the chunks too, within the budget,
    still capped by free memory. The loss and gradients do not depend on it."""
    V, MiB = 151936, 2**20
    chunk, sub = fused_chunk_rows(4096, V, 896, 2, 70 * 1024**3)
    chunk2, sub2 = fused_chunk_rows(4096, V, 896, 2, 70 * 1024**3, budget_bytes=512 * MiB)
    assert sub2 == 4 * sub and chunk2 >= 3 * chunk
    assert 2 * chunk2 * V * 2 + 12 * sub2 * V <= 512 * MiB
    assert fused_chunk_rows(4096, V, 896, 2, 1024**3, budget_bytes=512 * MiB)[0] < chunk2
    h, w, th, tw = _inputs(N=40, H=16, V=300, dtype=torch.float32)
    small = _loss_and_grads(_fused, h, w, th, tw, fused_budget_bytes=12 * 300 * 8 + 1)
    default = _loss_and_grads(_fused, h, w, th, tw)
    for a, b in zip(small, default, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.fixture
def fresh_compile(monkeypatch):
    """A process-fresh compile state for the fused path's elementwise function."""
    monkeypatch.setattr(chunked, "ROWS_COMPILE", {"fn": None, "error": None})
    return chunked.ROWS_COMPILE


def test_compile_failure_falls_back_to_eager(fresh_compile, monkeypatch):
    """A compiler that fails (no working Triton, say) costs speed, not the step: one warning,
    the eager result, and the error kept for the benchmark's report."""

    def broken(*args, **kwargs):
        raise RuntimeError("no triton")

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: broken)
    s, t = torch.randn(4, 50), torch.randn(4, 50)
    s_ref = s.clone()
    with pytest.warns(RuntimeWarning, match="no triton"):
        got = _rows_fn(torch.device("cpu"), compile_rows=True)(s, t, 0.5, 1.0)
    assert torch.equal(got, gjsd_rows_(s_ref, t, 0.5, 1.0)) and torch.equal(s, s_ref)
    assert "no triton" in fresh_compile["error"]


def test_compiled_rows_match_eager(fresh_compile):
    """``torch.compile`` (fullgraph) of the per-sub-block function, on views into a larger
    buffer and a ragged last block, writes the same gradient and returns the same losses."""
    s = torch.randn(20, 300, dtype=torch.bfloat16)
    t = torch.randn(20, 300, dtype=torch.bfloat16)
    s_ref = s.clone()
    fn = _rows_fn(torch.device("cpu"), compile_rows=True)
    got = torch.cat([fn(s[i : i + 8], t[i : i + 8], 0.5, 0.5) for i in range(0, 20, 8)])
    ref = torch.cat([gjsd_rows_(s_ref[i : i + 8], t[i : i + 8], 0.5, 0.5) for i in range(0, 20, 8)])
    assert fresh_compile["error"] is None and fresh_compile["fn"] is not None  # it compiled
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-7)
    assert torch.equal(s, s_ref)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (docs/gpu.md: the kit)")
def test_fused_on_cuda_compiles_and_matches(fresh_compile):
    """On CUDA (``impl="auto"``): Inductor compiles the elementwise part (no eager fallback);
    fp32 equals the CPU path to 1e-5; bf16 is as accurate as TRL's bf16 on the same GPU; the
    extra memory is the two gradients plus the chunk budget."""
    T, V, H = 512, 32768, 256
    cpu64 = _inputs(N=T, H=H, V=V, dtype=torch.float64)
    kw = {"labels": torch.zeros(T, dtype=torch.long)}
    ref_cpu = _loss_and_grads(_fused_cpu_blocked, *[x.float() for x in cpu64], **kw)
    cuda32 = [x.float().cuda() for x in cpu64]
    got = _loss_and_grads(_auto, *cuda32, labels=kw["labels"].cuda())
    assert fresh_compile["error"] is None and fresh_compile["fn"] is not None
    for a, b in zip(got, ref_cpu, strict=True):
        assert rel_err(a.cpu(), b) < 1e-5
    x64 = [x.cuda() for x in cpu64]
    ref = _loss_and_grads(_trl, *x64, labels=kw["labels"].cuda())
    x16 = [x.to(torch.bfloat16) for x in x64]
    trl = _loss_and_grads(_trl, *x16, labels=kw["labels"].cuda())
    ours = _loss_and_grads(_auto, *x16, labels=kw["labels"].cuda())
    for i in range(3):
        assert rel_err(ours[i].double(), ref[i]) <= rel_err(trl[i].double(), ref[i]) + 1e-3
    h, w = x16[0].detach().requires_grad_(), x16[1].detach().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    _auto(h, w, x16[2], x16[3]).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    budget = max(V * H * 2 // 2, 64 * 2**20)
    assert extra <= V * H * 2 + T * H * 2 + 1.6 * budget, extra


def _auto(h, w, th, tw, **kw):
    return chunked_generalized_jsd_loss(h, w, th, tw, **kw)[0]


def _fused_cpu_blocked(h, w, th, tw, **kw):
    return chunked_generalized_jsd_loss(h, w, th, tw, impl="blocked", **kw)[0]


def test_new_beta_and_temperature_reuse_the_compiled_graph(fresh_compile):
    """After the first call, new (beta, temperature) values of the same case, shape and dtype
    run the compiled graph without recompiling (``error_on_recompile``): the scalars are
    tensors, not guards. As Python floats each value was a guard, and on the H100 the loss
    tests' many values hit ``recompile_limit`` and fell back to eager (docs/gpu.md)."""
    import torch._dynamo.config as dynamo_config

    fn = _rows_fn(torch.device("cpu"), compile_rows=True)
    values = [(0.2, 1.0), (0.4, 0.5), (0.6, 2.0), (0.8, 1.5)]
    for i, (beta, inv_t) in enumerate(values):
        s, t = torch.randn(6, 64), torch.randn(6, 64)
        ref = gjsd_rows_(s.clone(), t, beta, inv_t)
        with dynamo_config.patch(error_on_recompile=i > 0):
            got = fn(s, t, beta, inv_t)
        assert fresh_compile["error"] is None, fresh_compile["error"]
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert list(fresh_compile["fn"]) == ["_rows_mixed_"]
