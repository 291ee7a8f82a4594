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
computes its logits with one matmul per model into reusable ``[chunk, V]`` buffers, turns them
into log-probabilities and the gradient in place, then folds the gradient straight into
``grad_hidden`` (``G @ W``) and ``grad_weight`` (``addmm_(G.T, h)``). The backward pass only
scales those stored gradients by the incoming ``grad_output``. Peak extra memory is therefore
``grad_weight`` + ``grad_hidden`` + four ``[chunk, V]`` fp32 buffers, whatever ``T`` is.

The teacher is a constant (stop-gradient), as in GKD/OPSD where it runs under ``no_grad``:
``teacher_weight`` may be the very tensor the student trains (self-distillation) and it still
only receives the student-path gradient. Masked rows are dropped before any matmul.

Not supported here (use the full-logits function): ``top_k``, the per-vocab-element
``token_clip`` of OPSD, and ``reduction="none"``/``"mean"``. ``token_clip`` in ``"token"``
mode is supported (a clipped token contributes no gradient).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from ._common import check_float, check_unit_interval, resolve_mask

TeacherLogitsFn = Callable[[Tensor], Tensor]
"""Maps a LongTensor of row ids (into the flattened ``[N, ...]`` inputs) to teacher logits
``[len(ids), V]``. Called under ``torch.no_grad``."""

_MAX_BUFFER_ELEMENTS = 32 * 1024 * 1024  # cap of one [chunk, V] fp32 buffer (128 MB)
_CACHE_ELEMENTS = 1024 * 1024  # rows per elementwise sub-block: 4 buffers x 4 MB stay in L3


def default_chunk_size(vocab_size: int, n_rows: int = 2048) -> int:
    """Rows per chunk: ``n_rows / 8`` (so the four ``[chunk, V]`` buffers stay ~1/10 of the
    naive path's ``[T, V]`` tensors), at least 32 (small-M matmuls are slow), at most 1024 and
    at most a 128 MB buffer; a multiple of 8."""
    rows = min(1024, max(32, n_rows // 8), _MAX_BUFFER_ELEMENTS // max(vocab_size, 1))
    return int(max(8, rows // 8 * 8))


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot product of two ``[C, V]`` tensors without a ``[C, V]`` temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(a.shape[0])


def _log_softmax_(x: Tensor, scratch: Tensor, want_probs: bool) -> None:
    """In place: ``x <- log_softmax(x)``; ``scratch <- softmax(x)`` if ``want_probs``."""
    x.sub_(x.amax(dim=1, keepdim=True))  # shift first: keeps log p exact near the mode
    torch.exp(x, out=scratch)
    ssum = scratch.sum(dim=1, keepdim=True)
    if want_probs:
        scratch.div_(ssum)
    x.sub_(ssum.log_())


class _Buffers:
    """Four reusable ``[chunk, V]`` fp32 work buffers (A: student, B: teacher, X: p, Y: tmp)."""

    def __init__(self, rows: int, vocab: int, like: Tensor, need_y: bool) -> None:
        def new() -> Tensor:
            return torch.empty(rows, vocab, dtype=like.dtype, device=like.device)

        self.a, self.b, self.x = new(), new(), new()
        self.y = new() if need_y else None

    def views(self, c: int) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        y = self.y[:c] if self.y is not None else None
        return self.a[:c], self.b[:c], self.x[:c], y


def _chunk_grad(a: Tensor, b: Tensor, x: Tensor, y: Tensor | None, beta: float):
    """From log p (a), log q (b), p (x): per-token loss and the buffer holding dL/ds.

    For 0 < beta < 1 the returned buffer is dL/ds divided by -(1 - beta) (folded into the
    matmul coefficient by the caller).
    """
    if beta == 0.0:
        torch.sub(b, a, out=a)  # a = log q - log p
        b.exp_()  # b = q
        tok = _rowdot(b, a)
        return tok, x.sub_(b)  # p - q
    if beta == 1.0:
        a.sub_(b)  # a = log p - log q
        tok = _rowdot(x, a)
        return tok, a.sub_(tok.unsqueeze(1)).mul_(x)
    # With z = log q - log p + log(beta / (1 - beta)):
    #   log p - log m = -log(1 - beta) - softplus(z),  log q - log m = -log(beta) - softplus(-z).
    # Keeping the constants out of the per-element terms avoids cancelling ~0.7-sized numbers.
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    torch.sub(b, a, out=y)
    y.add_(math.log(beta) - math.log1p(-beta))  # y = z
    torch.logaddexp(y, zero, out=a)  # a = softplus(z)
    y.neg_()
    torch.logaddexp(y, zero, out=y)  # y = softplus(-z)
    b.exp_()  # b = q
    kl_q = -math.log(beta) - _rowdot(b, y)
    sp_mean = _rowdot(x, a)
    kl_p = -math.log1p(-beta) - sp_mean
    tok = beta * kl_q + (1.0 - beta) * kl_p
    # dL/ds = (1 - beta) p (r - KL(p||m)) = -(1 - beta) p (softplus(z) - sum_k p_k softplus(z_k))
    return tok, a.sub_(sp_mean.unsqueeze(1)).mul_(x)


def _elementwise(a: Tensor, b: Tensor, x: Tensor, y: Tensor | None, beta: float, rows: int):
    """Logits -> per-token loss and gradient buffer, ``rows`` rows at a time.

    The ~20 elementwise passes then run on cache-resident sub-blocks instead of streaming the
    whole ``[chunk, V]`` buffers through memory each time (measured on an idle 2-core run:
    184 ms -> 48 ms for one 80 x 49152 chunk). Blocks of >= 8 rows keep the op count (and
    the per-op threading overhead, which dominates when the CPU is oversubscribed) low.
    """
    toks, g = [], None
    for i in range(0, a.shape[0], rows):
        j = i + rows
        ai, bi, xi = a[i:j], b[i:j], x[i:j]
        _log_softmax_(bi, xi, want_probs=False)
        _log_softmax_(ai, xi, want_probs=True)
        tok, gi = _chunk_grad(ai, bi, xi, y[i:j] if y is not None else None, beta)
        toks.append(tok)
        g = a if gi.data_ptr() == ai.data_ptr() else x
    return torch.cat(toks), g


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
        buf = _Buffers(rows, vocab, h, need_y=0.0 < beta < 1.0)
        sub_rows = max(8, _CACHE_ELEMENTS // vocab)
        coef = scale / temperature * (-(1.0 - beta) if 0.0 < beta < 1.0 else 1.0)
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            a, b, x, y = buf.views(stop - start)
            hc = h[start:stop]
            torch.mm(hc, w.t(), out=a)
            if isinstance(teacher, tuple):  # teacher hidden rows (already compacted) + head
                torch.mm(teacher[0][start:stop], teacher[1].t(), out=b)
            else:
                b.copy_(teacher(row_ids[start:stop]))
            if temperature != 1.0:
                a.div_(temperature)
                b.div_(temperature)
            tok, g = _elementwise(a, b, x, y, beta, sub_rows)
            if token_clip is not None:
                keep = tok <= token_clip
                g.mul_(keep.unsqueeze(1).to(g.dtype))
                tok = tok.clamp(max=token_clip)
            total += tok.sum(dtype=torch.float64)
            if want_gh:
                torch.mm(g, w, out=grad_h[start:stop])
            if want_gw:
                grad_w.addmm_(g.t(), hc, alpha=coef)
        if want_gh:
            grad_h.mul_(coef)
        ctx.save_for_backward(
            grad_h.to(hidden_NH.dtype) if want_gh else None,
            grad_w.to(weight_VH.dtype) if want_gw else None,
        )
        return (total * scale).to(hidden_NH.dtype)

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
        chunk_size: rows per chunk; default :func:`default_chunk_size` (kept tokens / 8, 32..1024).

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
    if n_tok == 0:
        loss = (flat.sum() + weight_VH.sum()) * 0.0
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
    return loss, {"jsd_per_token": per_tok, "num_tokens": torch.tensor(float(n_tok))}


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
