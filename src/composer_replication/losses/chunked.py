"""Chunked, fused-linear generalized JSD: the GKD/OPSD loss without ``[B, T, V]`` tensors.

Computes exactly :func:`~composer_replication.losses.jsd.generalized_jsd_loss` (same beta,
temperature, masking and reduction conventions) from the student's final hidden states
``hidden_NH`` and its lm_head ``weight_VH``, and the teacher's hidden states + head (or a
callable giving teacher logits for a set of rows), ``chunk_size`` tokens at a time.

How (the same idea as Liger-Kernel's fused-linear losses, written from the math): the loss is
a simple function of the two softmaxes, so its gradient w.r.t. the student logits is known in
closed form. With ``s`` the student logits over ``tau``, ``p = softmax(s)``, ``q`` the teacher
distribution and ``m = (1 - beta) p + beta q``::

    beta = 0:      dL/ds = p - q
    beta = 1:      dL/ds = p * (log p - log q - KL(p || q))
    0 < beta < 1:  dL/ds = (1 - beta) * p * (r - KL(p || m)),   r = log p - log m

(``d/dp_j JSD = (1 - beta) log(p_j / m_j)``, pushed through the softmax Jacobian.) Each chunk
computes its logits with one matmul per model into two reusable ``[chunk, V]`` buffers (the
temperature folded into the matmul's ``alpha``), then works through them in sub-blocks of rows
with two ``[sub, V]`` scratch buffers for ``p`` and ``q``; the gradient is left in the student
buffer and folded straight into ``grad_hidden`` (``G @ W``) and ``grad_weight``
(``addmm_(G.T, h)``). The backward pass only scales those stored gradients by the incoming
``grad_output``. Peak extra memory is therefore ``grad_weight`` + ``grad_hidden`` + two
``[chunk, V]`` + two ``[sub, V]`` fp32 buffers, whatever ``T`` is.

Per element, the 0 < beta < 1 case costs two fused softmax/log-softmax pairs, one
``logaddexp`` (``-r = log(m / p) = logaddexp(log q - log p + log beta, log(1 - beta))``) and
a handful of cheap passes; no ``logsumexp`` of a stacked tensor and no ``exp`` of the mixture.
Accuracy: every reduction is over terms without a constant offset (``KL(q||m)`` as
``sum q log(q/m)`` directly, not as ``sum q r + KL(q||p)``), and the gradient's centring
``r - KL(p||m)`` is done in two steps (subtract the first estimate, then the exact residual).
Against a float64 reference at V=49152 this keeps the loss within ~1e-5 and the gradients
within ~3e-5 relative in every regime tried (near-matched peaked distributions, far apart
ones), where TRL's fp32 autograd path is off by up to ~7e-4 on the gradient of confident,
far-apart distributions (``bench/accuracy_losses.py``).

The teacher is a constant (stop-gradient), as in GKD/OPSD where it runs under ``no_grad``:
``teacher_weight`` may be the very tensor the student trains (self-distillation) and it still
only receives the student-path gradient. Masked rows are dropped before any matmul.

On an accelerator (CUDA) the same loss runs a second implementation, ``impl="fused"``, built
for tensor cores rather than for a CPU's caches (see :class:`_FusedLinearGJSDDevice`):

* the four head matmuls run in the inputs' own dtype (bf16/fp16 on tensor cores, which
  accumulate in fp32); nothing upcasts ``weight_VH``. For 16-bit inputs the logits of a chunk
  are rounded once to that dtype (as in TRL's and Liger's bf16 paths) and ``grad_weight``
  accumulates chunk by chunk in the weight's dtype; fp32 inputs stay fp32 throughout (TF32
  only if the caller enabled it);
* the elementwise part of a chunk (both log-softmaxes, the mixture, the two KL row sums and
  the gradient w.r.t. the student logits) is one function in fp32, :func:`gjsd_rows_`,
  compiled with ``torch.compile`` on CUDA (Inductor fuses it into a few row-reduction
  kernels) and run eagerly elsewhere, over sub-blocks of rows so the fp32 intermediates it
  materialises stay small; the gradient is written over the student logits in place;
* the chunk and sub-block sizes come from :func:`fused_chunk_rows`: a byte budget of half the
  head weight's size (at least 64 MiB, at most a quarter of the device's free memory), so the
  extra memory beyond the gradients themselves is at most about half a ``weight_VH``.

FLOP/byte model (H100, bf16): the four matmuls are ``8*T*V*H`` FLOPs (93 ms at T=16384,
V=151936, H=3584 and ~766 TFLOP/s); the elementwise pass moves ~40 bytes per logit element
(two bf16 logits read, a few fp32 intermediates, one bf16 gradient written), ~2.5e9 elements
or ~33 ms at ~3 TB/s, so the matmuls dominate.

Not supported here (use the full-logits function): ``top_k``, the per-vocab-element
``token_clip`` of OPSD, and ``reduction="none"``/``"mean"``. ``token_clip`` in ``"token"``
mode is supported (a clipped token contributes no gradient).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from ._common import check_float, check_unit_interval, resolve_mask

TeacherLogitsFn = Callable[[Tensor], Tensor]
"""Maps a LongTensor of row ids (into the flattened ``[N, ...]`` inputs) to teacher logits
``[len(ids), V]``. Called under ``torch.no_grad``."""

_MAX_BUFFER_ELEMENTS = 32 * 1024 * 1024  # cap of one [chunk, V] fp32 buffer (128 MB)
_SCRATCH_ELEMENTS = 2 * 1024 * 1024  # cap of one [sub, V] scratch buffer (8 MB in fp32)


def default_chunk_size(vocab_size: int, n_rows: int = 2048) -> int:
    """Rows per chunk: ``n_rows / 8`` (the two ``[chunk, V]`` logits buffers together are then
    a quarter of one naive ``[T, V]`` logits tensor; the naive path holds ~14 of those), but
    512 once ``n_rows >= 2048`` (MKL's head matmuls run ~25% faster at M=512 than at M=256 on
    this class of CPU, and the buffers are still <= a quarter of one logits tensor); at least
    32 (small-M matmuls are slow), at most 1024 and at most a 128 MB buffer; a multiple of 8."""
    rows = max(n_rows // 8, 512 if n_rows >= 2048 else 0)
    rows = min(1024, max(32, rows), _MAX_BUFFER_ELEMENTS // max(vocab_size, 1))
    return int(max(8, rows // 8 * 8))


def _scratch_rows(vocab_size: int, chunk: int) -> int:
    """Rows of the two ``[sub, V]`` scratch buffers (p and q of one sub-block of the chunk)."""
    return max(1, min(chunk, _SCRATCH_ELEMENTS // max(vocab_size, 1)))


def _probs_(logits: Tensor, probs: Tensor | None) -> None:
    """In place ``logits <- log_softmax(logits)``; ``probs <- softmax(logits)`` if given.

    Two fused row-wise kernels: cheaper than ``exp(log_softmax)`` (the softmax kernel's
    exponential is faster than ``torch.exp``) and exact for ``log p`` even where ``p``
    underflows.
    """
    if probs is not None:
        torch.softmax(logits, 1, out=probs)
    torch.log_softmax(logits, 1, out=logits)


def _rowsum_of_product(u: Tensor, v: Tensor, out: Tensor) -> Tensor:
    """``sum_j u_ij v_ij`` per row, via ``out`` (overwritten); torch's cascade sum is far more
    accurate than a BLAS dot for the ~0.7-sized terms that appear here."""
    return torch.mul(u, v, out=out).sum(1)


def _center_times_p_(g: Tensor, p: Tensor, mean: Tensor, tmp: Tensor) -> None:
    """In place ``g <- p * (g - sum_j p_j g_j)`` per row, given a first estimate ``mean``.

    The gradients here are small differences of ~0.7-sized terms on peaked distributions;
    subtracting the estimate first and then the (now exact) residual keeps them accurate to
    fp32 rounding of the *difference* (a single fp32 sum left ~3e-4 relative error at
    V=49152 on confident rows, as in the naive autograd path).
    """
    g.sub_(mean.unsqueeze(1))
    g.sub_(_rowsum_of_product(g, p, tmp).unsqueeze(1)).mul_(p)


def _block(a: Tensor, b: Tensor, x: Tensor, y: Tensor | None, beta: float) -> Tensor:
    """Student logits ``a``, teacher logits ``b`` (rows of one sub-block) -> divergence per row.

    Leaves ``G`` in ``a`` (dL/ds = :func:`_grad_coef` * G); ``b`` is clobbered. ``x``/``y``
    are ``[R, V]`` scratch for ``p``/``q``. Every sum below is over terms without a
    constant offset, so it does not cancel (see the module docstring for the formulas).
    """
    _probs_(a, x)
    _probs_(b, y)
    if beta == 1.0:  # KL(p || q); dL/ds = p (log p - log q - KL)
        a.sub_(b)  # log p - log q
        kl = _rowsum_of_product(a, x, b)
        _center_times_p_(a, x, kl, b)
        return kl
    b.sub_(a)  # log q - log p
    if beta == 0.0:  # KL(q || p); dL/ds = p - q
        torch.sub(x, y, out=a)
        return b.mul_(y).sum(1)
    # m = (1 - beta) p + beta q, r = log p - log m, one transcendental pass:
    #   -r = log(m / p) = logaddexp(log q - log p + log beta, log(1 - beta))
    torch.add(b, math.log(beta), out=a)
    torch.logaddexp(a, a.new_tensor(math.log1p(-beta)), out=a)  # -r
    b.sub_(a)  # log q - log m
    kl_qm = b.mul_(y).sum(1)
    kl_pm = -_rowsum_of_product(a, x, b)
    # dL/ds = (1 - beta) p (r - KL(p||m)) = -(1 - beta) p (-r - sum_j p_j (-r_j))
    _center_times_p_(a, x, -kl_pm, b)
    return beta * kl_qm + (1.0 - beta) * kl_pm


def _grad_coef(beta: float) -> float:
    """dL/ds = coef * G for the ``G`` that :func:`_block` leaves in the student buffer."""
    return -(1.0 - beta) if 0.0 < beta < 1.0 else 1.0


def _chunk(a: Tensor, b: Tensor, x_buf: Tensor, y_buf: Tensor | None, beta: float) -> Tensor:
    """All sub-blocks of one chunk (``x_buf.shape[0]`` rows each): divergence per row."""
    sub = x_buf.shape[0]
    toks = []
    for i in range(0, a.shape[0], sub):
        j = min(i + sub, a.shape[0])
        y = y_buf[: j - i] if y_buf is not None else None
        toks.append(_block(a[i:j], b[i:j], x_buf[: j - i], y, beta))
    return torch.cat(toks)


def _finish(
    ctx, loss: Tensor, grad_h: Tensor | None, grad_w: Tensor | None, hidden: Tensor, weight: Tensor
) -> Tensor:
    """Store the gradients (in the inputs' dtypes) for backward; the loss in hidden's dtype."""
    ctx.save_for_backward(
        grad_h.to(hidden.dtype) if grad_h is not None else None,
        grad_w.to(weight.dtype) if grad_w is not None else None,
    )
    return loss.to(hidden.dtype)


class _FusedLinearGJSD(torch.autograd.Function):
    """Forward computes the loss *and* the gradients chunk by chunk; backward rescales them."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        hidden_NH: Tensor,
        weight_VH: Tensor,
        teacher: tuple[Tensor, Tensor] | TeacherLogitsFn,
        row_ids: Tensor,
        beta: float,
        temperature: float,
        chunk_size: int,
        scale: float,
        token_clip: float | None,
    ) -> Tensor:
        n, _ = hidden_NH.shape
        vocab = weight_VH.shape[0]
        want_gh, want_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dt = (
            torch.float32 if hidden_NH.dtype in (torch.float16, torch.bfloat16) else hidden_NH.dtype
        )
        h = hidden_NH.to(dt)
        w = weight_VH.to(dt)
        if isinstance(teacher, tuple):
            teacher = (teacher[0].to(dt), teacher[1].to(dt))
        grad_h = torch.empty_like(h) if want_gh else None
        grad_w = torch.zeros_like(w) if want_gw else None
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        rows = min(chunk_size, max(n, 1))
        a_buf, b_buf = (torch.empty(rows, vocab, dtype=dt, device=h.device) for _ in range(2))
        sub = _scratch_rows(vocab, rows)
        x_buf = torch.empty(sub, vocab, dtype=dt, device=h.device)
        y_buf = torch.empty_like(x_buf) if beta < 1.0 else None  # q: not needed for beta=1
        coef = scale / temperature * _grad_coef(beta)
        inv_t = 1.0 / temperature
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            a, b = a_buf[: stop - start], b_buf[: stop - start]
            hc = h[start:stop]
            torch.addmm(a, hc, w.t(), beta=0.0, alpha=inv_t, out=a)  # s / tau, scale for free
            if isinstance(teacher, tuple):  # teacher hidden rows (already compacted) + head
                torch.addmm(b, teacher[0][start:stop], teacher[1].t(), beta=0.0, alpha=inv_t, out=b)
            else:
                torch.mul(teacher(row_ids[start:stop]), inv_t, out=b)
            tok = _chunk(a, b, x_buf, y_buf, beta)  # leaves G (~ dL/ds) in a
            if token_clip is not None:
                keep = tok <= token_clip
                a.mul_(keep.unsqueeze(1).to(a.dtype))
                tok = tok.clamp(max=token_clip)
            total += tok.sum(dtype=torch.float64)
            if want_gh:
                torch.mm(a, w, out=grad_h[start:stop])
            if want_gw:
                grad_w.addmm_(a.t(), hc, alpha=coef)
        if want_gh:
            grad_h.mul_(coef)
        return _finish(ctx, total * scale, grad_h, grad_w, hidden_NH, weight_VH)

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        grad_h, grad_w = ctx.saved_tensors
        if grad_h is not None and not bool(grad_out == 1):
            grad_h = grad_h * grad_out
        if grad_w is not None and not bool(grad_out == 1):
            grad_w = grad_w * grad_out
        return grad_h, grad_w, None, None, None, None, None, None, None


def chunked_generalized_jsd_loss(
    hidden_NH: Tensor,
    weight_VH: Tensor,
    teacher_hidden_NH: Tensor | None = None,
    teacher_weight_VH: Tensor | None = None,
    mask: Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: Literal["batchmean", "sum"] = "batchmean",
    *,
    teacher_logits_fn: TeacherLogitsFn | None = None,
    labels: Tensor | None = None,
    divisor: float | Tensor | None = None,
    token_clip: float | None = None,
    chunk_size: int | None = None,
    impl: Literal["auto", "blocked", "fused"] = "auto",
    fused_budget_bytes: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Generalized JSD (GKD Eq. 1) from hidden states + lm_head, chunked and fused.

    Equal (value and gradients w.r.t. ``hidden_NH`` and ``weight_VH``) to
    ``generalized_jsd_loss(hidden_NH @ weight_VH.T, teacher_logits, ...)`` with the teacher
    logits under ``no_grad``. Leading dims of ``hidden`` may be ``[B, T, H]`` or ``[N, H]``;
    ``mask``/``labels`` then have the matching leading shape.

    Args:
        hidden_NH: student final hidden states ``[..., H]``.
        weight_VH: student lm_head weight ``[V, H]`` (no bias; tied embeddings are fine).
        teacher_hidden_NH, teacher_weight_VH: the teacher's hidden states ``[..., H_t]`` and
            head ``[V, H_t]``; or give ``teacher_logits_fn`` instead.
        mask / labels: which tokens count (labels: -100 = ignore).
        beta, temperature: as in :func:`generalized_jsd_loss`.
        reduction: ``batchmean`` (sum / kept tokens; with no mask, / ``hidden.shape[0]`` like
            TRL) or ``sum``. ``divisor`` overrides it.
        token_clip: per-token clip of each token's divergence (``token_clip_mode="token"``).
        chunk_size: rows per chunk; default :func:`default_chunk_size` (kept tokens / 8, 32..1024)
            for ``blocked``, :func:`fused_chunk_rows` (from the device's free memory) for ``fused``.
        impl: ``blocked`` (fp32 chunks of sub-blocks, tuned for CPUs), ``fused`` (matmuls in the
            inputs' dtype, fused elementwise, compiled on CUDA; see :class:`_FusedLinearGJSDDevice`)
            or ``auto``: ``blocked`` on the CPU, ``fused`` on any other device.
        fused_budget_bytes: ``fused`` only: the working memory for logits chunks and scratch
            (default: half the head weight's bytes, at least 64 MiB; always at most a quarter
            of the device's free memory). More memory means fewer, larger chunks: at a small
            hidden size, where the default makes many small ones, that is faster
            (docs/gpu.md).

    Returns:
        ``(loss, metrics)``: ``jsd_per_token``, ``num_tokens``.
    """
    check_float("hidden_NH", hidden_NH)
    check_float("weight_VH", weight_VH)
    check_unit_interval("beta", beta)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if weight_VH.dim() != 2 or hidden_NH.shape[-1] != weight_VH.shape[1]:
        raise ValueError(
            f"weight_VH must be [V, H] with H = hidden_NH.shape[-1] = {hidden_NH.shape[-1]}, "
            f"got {tuple(weight_VH.shape)}"
        )
    if reduction not in ("batchmean", "sum"):
        raise ValueError(f"chunked loss supports reduction batchmean or sum, got {reduction!r}")
    lead = hidden_NH.shape[:-1]
    keep = resolve_mask(lead, hidden_NH.device, mask, labels)
    teacher = _resolve_teacher(
        hidden_NH, weight_VH, teacher_hidden_NH, teacher_weight_VH, teacher_logits_fn
    )
    flat = hidden_NH.reshape(-1, hidden_NH.shape[-1])
    if keep is None:
        row_ids = torch.arange(flat.shape[0], device=flat.device)
        n_tok = flat.shape[0]
        h = flat
    else:
        row_ids = keep.reshape(-1).nonzero().squeeze(1)
        n_tok = row_ids.numel()
        h = flat if n_tok == flat.shape[0] else flat.index_select(0, row_ids)
    if isinstance(teacher, tuple) and n_tok != flat.shape[0]:
        teacher = (teacher[0].index_select(0, row_ids), teacher[1])
    denom = _denominator(reduction, divisor, keep, n_tok, lead)
    chunk = chunk_size or default_chunk_size(weight_VH.shape[0], n_tok)
    if impl not in ("auto", "blocked", "fused"):
        raise ValueError(f"impl must be auto, blocked or fused, got {impl!r}")
    if n_tok == 0:
        loss = (flat.sum() + weight_VH.sum()) * 0.0
    elif impl == "fused" or (impl == "auto" and h.device.type != "cpu"):
        args = (h, weight_VH, teacher, row_ids, float(beta), float(temperature))
        loss = _FusedLinearGJSDDevice.apply(
            *args, chunk_size, 1.0 / denom, token_clip, None, fused_budget_bytes
        )
    else:
        loss = _FusedLinearGJSD.apply(
            h,
            weight_VH,
            teacher,
            row_ids,
            float(beta),
            float(temperature),
            int(chunk),
            1.0 / denom,
            token_clip,
        )
    per_tok = loss.detach() * denom / max(n_tok, 1)
    return loss, {
        "jsd_per_token": per_tok,
        "num_tokens": torch.tensor(float(n_tok), device=per_tok.device),
    }


def _resolve_teacher(
    hidden: Tensor,
    weight: Tensor,
    t_hidden: Tensor | None,
    t_weight: Tensor | None,
    t_fn: TeacherLogitsFn | None,
) -> tuple[Tensor, Tensor] | TeacherLogitsFn:
    """The teacher as (flattened hidden, head), both detached, or the user's logits callable."""
    if t_fn is not None:
        if t_hidden is not None or t_weight is not None:
            raise ValueError("give teacher_logits_fn or teacher hidden+weight, not both")
        return t_fn
    if t_hidden is None or t_weight is None:
        raise ValueError("need teacher_hidden_NH and teacher_weight_VH (or teacher_logits_fn)")
    check_float("teacher_hidden_NH", t_hidden)
    check_float("teacher_weight_VH", t_weight)
    if t_hidden.shape[:-1] != hidden.shape[:-1]:
        raise ValueError(
            f"teacher_hidden_NH leading shape {tuple(t_hidden.shape[:-1])} != "
            f"hidden_NH leading shape {tuple(hidden.shape[:-1])}"
        )
    if t_weight.dim() != 2 or t_weight.shape != (weight.shape[0], t_hidden.shape[-1]):
        raise ValueError(
            f"teacher_weight_VH must be [V={weight.shape[0]}, H_t={t_hidden.shape[-1]}], "
            f"got {tuple(t_weight.shape)}"
        )
    th = t_hidden.detach().reshape(-1, t_hidden.shape[-1])
    return th, t_weight.detach()


def _denominator(
    reduction: str,
    divisor: float | Tensor | None,
    keep: Tensor | None,
    n_tok: int,
    lead: torch.Size,
) -> float:
    if divisor is not None:
        return float(divisor)
    if reduction == "sum":
        return 1.0
    if keep is not None:
        return float(max(n_tok, 1))
    return float(max(lead[0], 1))


# ----------------------------------------------------------------------------- device path

_MIN_BUDGET_BYTES = 64 * 1024 * 1024
_SCRATCH_BYTES_PER_ELEMENT = 12
"""fp32 ``[R, V]`` intermediates :func:`gjsd_rows_` materialises per logit (Inductor realises
three: both log-softmaxes and the mixture; eager runs a few more, on small sub-blocks)."""


def fused_chunk_rows(
    n_rows: int,
    vocab: int,
    hidden: int,
    elem_bytes: int,
    free_bytes: int,
    budget_bytes: int | None = None,
) -> tuple[int, int]:
    """``(chunk, sub)``: rows per matmul chunk and per elementwise sub-block of the fused path.

    Budget ``B = clamp(V*H*elem_bytes / 2, 64 MiB, free_bytes / 4)`` (half the head weight's
    size, so the extra memory beyond the returned gradients stays about half a ``weight_VH``);
    a quarter of ``B`` goes to the fp32 scratch of one sub-block (``12*sub*V`` bytes, ``sub``
    a power of two in 8..256), the rest to the two ``[chunk, V]`` logits buffers
    (``2*chunk*V*elem_bytes``); ``chunk`` is a multiple of ``sub`` and at most ``n_rows``
    rounded up to it. ``budget_bytes`` replaces the first two bounds (the free-memory one
    stays).
    """
    if budget_bytes is not None and budget_bytes <= 0:
        raise ValueError(f"fused_budget_bytes must be > 0, got {budget_bytes}")
    budget = budget_bytes or max(vocab * hidden * elem_bytes // 2, _MIN_BUDGET_BYTES)
    budget = max(min(budget, free_bytes // 4), 1)
    sub_rows = budget // 4 // (_SCRATCH_BYTES_PER_ELEMENT * max(vocab, 1))
    sub = 1 << max(3, min(8, int(sub_rows).bit_length() - 1))
    sub = min(sub, 1 << max(0, (max(n_rows, 1) - 1).bit_length()))
    left = budget - _SCRATCH_BYTES_PER_ELEMENT * sub * vocab
    chunk = max(sub, left // (2 * vocab * elem_bytes) // sub * sub)
    chunk = min(chunk, -(-max(n_rows, 1) // sub) * sub)
    return int(chunk), int(sub)


def gjsd_rows_(s_RV: Tensor, t_RV: Tensor, beta: float, inv_t: float) -> Tensor:
    """Generalized JSD per row from raw logits, and its gradient written over ``s_RV``.

    ``s_RV``/``t_RV``: student/teacher logits (any float dtype; computed in fp32). With
    ``ls = log_softmax(s * inv_t)``, ``lt`` likewise, ``p = exp(ls)``, ``q = exp(lt)`` and
    ``log m = logaddexp(ls + log(1 - beta), lt + log beta)`` (GKD Eq. 1, Agarwal et al. 2024)::

        loss = beta * sum q (lt - log m) + (1 - beta) * sum p (ls - log m)
        G    = p * (r - sum p r),  r = ls - log m      (0 < beta < 1; dL/ds = (1-beta) G inv_t)
        G    = p - q                                   (beta = 0: KL(q || p))
        G    = p * (d - sum p d),  d = ls - lt         (beta = 1: KL(p || q))

    (the caller folds ``1 - beta``, ``inv_t`` and the reduction into its matmuls.) Returns the per-row loss (fp32) and
    leaves ``G``, cast to ``s_RV.dtype``, in ``s_RV``.
    """
    kernel, scalars = _row_kernel(beta, inv_t)
    return kernel(s_RV, t_RV, *scalars)


def _row_kernel(beta: float, inv_t: float) -> tuple[Callable[..., Tensor], tuple]:
    """The :func:`gjsd_rows_` body for ``beta`` (one function per case, so a compiled one
    never branches on a value) and its scalar arguments (``inv_t`` first)."""
    if beta == 0.0:
        return _rows_forward_kl_, (inv_t,)
    if beta == 1.0:
        return _rows_reverse_kl_, (inv_t,)
    return _rows_mixed_, (inv_t, math.log1p(-beta), math.log(beta), beta)


def _rows_forward_kl_(s_RV: Tensor, t_RV: Tensor, inv_t: Tensor | float) -> Tensor:
    """:func:`gjsd_rows_` at ``beta = 0``: KL(q || p), ``G = p - q``."""
    ls = torch.log_softmax(s_RV.float() * inv_t, dim=-1)
    lt = torch.log_softmax(t_RV.float() * inv_t, dim=-1)
    q = lt.exp()
    loss = (q * (lt - ls)).sum(-1)
    s_RV.copy_(ls.exp() - q)
    return loss


def _rows_reverse_kl_(s_RV: Tensor, t_RV: Tensor, inv_t: Tensor | float) -> Tensor:
    """:func:`gjsd_rows_` at ``beta = 1``: KL(p || q), ``G = p (d - sum p d)``."""
    ls = torch.log_softmax(s_RV.float() * inv_t, dim=-1)
    lt = torch.log_softmax(t_RV.float() * inv_t, dim=-1)
    p = ls.exp()
    d = ls - lt
    loss = (p * d).sum(-1)
    s_RV.copy_(p * (d - loss.unsqueeze(-1)))
    return loss


def _rows_mixed_(
    s_RV: Tensor,
    t_RV: Tensor,
    inv_t: Tensor | float,
    log_1m_beta: Tensor | float,
    log_beta: Tensor | float,
    beta: Tensor | float,
) -> Tensor:
    """:func:`gjsd_rows_` for ``0 < beta < 1`` (``log(1 - beta)``, ``log beta`` precomputed)."""
    ls = torch.log_softmax(s_RV.float() * inv_t, dim=-1)
    lt = torch.log_softmax(t_RV.float() * inv_t, dim=-1)
    p = ls.exp()
    lm = torch.logaddexp(ls + log_1m_beta, lt + log_beta)
    r = ls - lm
    kl_pm = (p * r).sum(-1)
    kl_qm = (lt.exp() * (lt - lm)).sum(-1)
    s_RV.copy_(p * (r - kl_pm.unsqueeze(-1)))
    return beta * kl_qm + (1.0 - beta) * kl_pm


ROWS_COMPILE: dict[str, object] = {"fn": None, "error": None}
"""The compiled row functions of this process (by name), or the error that made them fall back
to eager (``bench/bench_losses.py`` reports it)."""


def _compiled_rows(s_RV: Tensor, t_RV: Tensor, beta: float, inv_t: float) -> Tensor:
    """:func:`gjsd_rows_` compiled: each case's function once (``fullgraph``), its scalars
    passed as 0-d fp32 tensors on ``s_RV``'s device, so a new ``beta`` or temperature reuses
    the graph (as Python floats each value was a guard, and a process that used more than
    ``torch._dynamo.config.recompile_limit`` of them fell back to eager for good). If
    compiling fails (e.g. no working Triton), warn once and run eagerly from then on: slower,
    same result. ``s_RV`` is only written once the function ran, so a failed compile leaves
    it intact. Running out of memory is no compile failure."""
    kernel, scalars = _row_kernel(beta, inv_t)
    if ROWS_COMPILE["error"] is None:
        compiled = ROWS_COMPILE["fn"] = ROWS_COMPILE["fn"] or {}
        assert isinstance(compiled, dict)
        name = kernel.__name__
        if name not in compiled:
            compiled[name] = torch.compile(kernel, fullgraph=True, dynamic=None)
        args = [_scalar(x, s_RV.device) for x in scalars]
        try:
            return compiled[name](s_RV, t_RV, *args)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - any compiler failure: fall back, say so
            ROWS_COMPILE["error"] = f"{type(err).__name__}: {err}"[:500]
            warnings.warn(
                f"torch.compile of the fused JSD's elementwise part failed; running it eagerly "
                f"(slower): {ROWS_COMPILE['error']}",
                RuntimeWarning,
                stacklevel=2,
            )
    return kernel(s_RV, t_RV, *scalars)


@functools.lru_cache(maxsize=64)
def _scalar(value: float, device: torch.device) -> Tensor:
    """``value`` as a 0-d fp32 tensor on ``device`` (cached: one copy per value and device)."""
    return torch.tensor(value, dtype=torch.float32, device=device)


def _rows_fn(device: torch.device, compile_rows: bool | None) -> Callable[..., Tensor]:
    """:func:`gjsd_rows_`, compiled (once per process) on CUDA or when asked."""
    if compile_rows is None:
        compile_rows = device.type == "cuda"
    return _compiled_rows if compile_rows else gjsd_rows_


def _free_bytes(device: torch.device) -> int:
    """Free memory of ``device`` (CUDA: the driver's count); elsewhere a 16 GiB stand-in."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return 16 * 1024**3


def _matmul_dtype(a: Tensor, b: Tensor) -> torch.dtype:
    """The dtype two matmul operands meet in: the wider of the two (no upcast of 16-bit
    pairs)."""
    return torch.promote_types(a.dtype, b.dtype)


class _FusedLinearGJSDDevice(torch.autograd.Function):
    """The accelerator path: matmuls in the inputs' dtype, fused fp32 elementwise per sub-block.

    Like :class:`_FusedLinearGJSD`, forward computes the loss and both gradients chunk by chunk
    (no logits survive a chunk) and backward only rescales them. Per chunk of ``C`` rows::

        s = h_c @ W.T, t = th_c @ W_t.T        (matmul dtype, fp32 accumulation)
        loss_c, G -> s                         (gjsd_rows_, per sub-block, fp32 inside)
        grad_h_c = G @ W;  grad_W += G.T @ h_c (alpha folds coef / tau / denominator)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        hidden_NH: Tensor,
        weight_VH: Tensor,
        teacher: tuple[Tensor, Tensor] | TeacherLogitsFn,
        row_ids: Tensor,
        beta: float,
        temperature: float,
        chunk_size: int | None,
        scale: float,
        token_clip: float | None,
        compile_rows: bool | None,
        budget_bytes: int | None = None,
    ) -> Tensor:
        n = hidden_NH.shape[0]
        vocab, dev = weight_VH.shape[0], hidden_NH.device
        want_gh, want_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dt = _matmul_dtype(hidden_NH, weight_VH)
        h, w = hidden_NH.to(dt), weight_VH.to(dt)
        if isinstance(teacher, tuple):
            tdt = _matmul_dtype(*teacher)
            teacher = (teacher[0].to(tdt), teacher[1].to(tdt))
        else:
            tdt = dt
        chunk, sub = fused_chunk_rows(
            n, vocab, h.shape[1], max(dt.itemsize, tdt.itemsize), _free_bytes(dev), budget_bytes
        )
        if chunk_size:
            chunk = max(1, min(chunk_size, n))
            sub = min(sub, chunk)
        rows_fn = _rows_fn(dev, compile_rows)
        grad_h = torch.empty_like(h) if want_gh else None
        grad_w = torch.zeros_like(w) if want_gw else None
        total = torch.zeros((), dtype=torch.float64, device=dev)
        s_buf = torch.empty(min(chunk, n), vocab, dtype=dt, device=dev)
        t_buf = torch.empty(min(chunk, n), vocab, dtype=tdt, device=dev)
        coef = scale / temperature * ((1.0 - beta) if 0.0 < beta < 1.0 else 1.0)
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            s, t = s_buf[: stop - start], t_buf[: stop - start]
            hc = h[start:stop]
            torch.mm(hc, w.t(), out=s)
            if isinstance(teacher, tuple):
                torch.mm(teacher[0][start:stop], teacher[1].t(), out=t)
            else:
                t.copy_(teacher(row_ids[start:stop]))
            tok = torch.cat(
                [
                    rows_fn(s[i : i + sub], t[i : i + sub], beta, 1.0 / temperature)
                    for i in range(0, stop - start, sub)
                ]
            )
            if token_clip is not None:
                s.mul_((tok <= token_clip).unsqueeze(1).to(s.dtype))
                tok = tok.clamp(max=token_clip)
            total += tok.sum(dtype=torch.float64)
            if want_gh:
                gh = grad_h[start:stop]
                torch.addmm(gh, s, w, beta=0.0, alpha=coef, out=gh)
            if want_gw:
                grad_w.addmm_(s.t(), hc, alpha=coef)
        del s_buf, t_buf
        return _finish(ctx, total * scale, grad_h, grad_w, hidden_NH, weight_VH)

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        grads = _FusedLinearGJSD.backward(ctx, grad_out)
        return (*grads, None, None)
