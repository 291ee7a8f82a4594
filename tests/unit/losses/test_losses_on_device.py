"""Every loss of the library on a non-CPU device (the ``devcheck`` device of
tests/support/device_check.py): no CPU tensor may meet the data, every returned tensor
(loss, metrics, gradients) lives on the data's device, and the numbers equal the CPU run's.
Plus the control: the check trips on the line that crashed issue 35's first CUDA run."""

from __future__ import annotations

import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support.device_check import DeviceMixError, ensure_backend, on_check_device, to_cpu, to_device

from composer_replication import losses as L
from composer_replication.losses import chunked

B, T, V, H = 2, 5, 13, 8


def _logits_pair(g: torch.Generator) -> dict[str, Any]:
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :2] = False
    return {
        "student_logits": torch.randn(B, T, V, generator=g),
        "teacher_logits": torch.randn(B, T, V, generator=g),
        "mask": mask,
    }


def _hidden_pair(g: torch.Generator) -> dict[str, Any]:
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :2] = -100
    return {
        "hidden_NH": torch.randn(B, T, H, generator=g),
        "weight_VH": 0.5 * torch.randn(V, H, generator=g),
        "teacher_hidden_NH": torch.randn(B, T, H, generator=g),
        "teacher_weight_VH": 0.5 * torch.randn(V, H, generator=g),
        "labels": labels,
    }


def _tokens(g: torch.Generator, *names: str) -> dict[str, Any]:
    out: dict[str, Any] = {n: -torch.rand(B, T, generator=g) for n in names}
    out["mask"] = torch.rand(B, T, generator=g) > 0.3
    return out


def _pairs(g: torch.Generator, *names: str) -> dict[str, Any]:
    return {n: -3 * torch.rand(4, generator=g) for n in names}


_SIMPO = ("policy_chosen_avg_logps", "policy_rejected_avg_logps")
_DPO = ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps")

# name -> (loss function, inputs from a generator, fixed keyword arguments, inputs that get grads)
CASES: dict[str, tuple[Callable, Callable, dict[str, Any], tuple[str, ...]]] = {
    **{
        f"jsd_beta{b}": (L.generalized_jsd_loss, _logits_pair, {"beta": b}, ("student_logits",))
        for b in (0.0, 0.5, 1.0)
    },
    "jsd_clip_topk": (
        L.generalized_jsd_loss,
        _logits_pair,
        {"token_clip": 0.05, "top_k": 4, "temperature": 0.7},
        ("student_logits",),
    ),
    "jsd_token_clip_nomask": (
        lambda mask, **kw: L.generalized_jsd_loss(**kw),
        _logits_pair,
        {"token_clip": 0.5, "token_clip_mode": "token"},
        ("student_logits",),
    ),
    **{  # both implementations, each against itself on the CPU ("auto" picks "fused" off it)
        f"chunked_{impl}_beta{b}": (
            L.chunked_generalized_jsd_loss,
            _hidden_pair,
            {"beta": b, "chunk_size": 3, "impl": impl},
            ("hidden_NH", "weight_VH"),
        )
        for b in (0.0, 0.5, 1.0)
        for impl in ("blocked", "fused")
    },
    **{
        f"chunked_{impl}_clip_nomask": (
            lambda labels, **kw: L.chunked_generalized_jsd_loss(**kw),
            _hidden_pair,
            {"token_clip": 0.3, "temperature": 0.8, "impl": impl},
            ("hidden_NH", "weight_VH"),
        )
        for impl in ("blocked", "fused")
    },
    "taid": (L.taid_loss, _logits_pair, {"t": 0.6}, ("student_logits",)),
    "taid_nomask": (
        lambda mask, **kw: L.taid_loss(**kw),
        _logits_pair,
        {"t": 0.6},
        ("student_logits",),
    ),
    "entropy_opd": (L.entropy_aware_opd_loss, _logits_pair, {}, ("student_logits",)),
    "entropy_opd_nomask": (
        lambda mask, **kw: L.entropy_aware_opd_loss(**kw),
        _logits_pair,
        {},
        ("student_logits",),
    ),
    "dpo": (L.dpo_loss, lambda g: _pairs(g, *_DPO), {"label_smoothing": 0.1}, _DPO[:2]),
    "dpo_pair_mask": (
        L.dpo_loss,
        lambda g: {**_pairs(g, *_DPO), "pair_mask": torch.tensor([1, 0, 1, 1])},
        {},
        _DPO[:2],
    ),
    "simpo": (L.simpo_loss, lambda g: _pairs(g, *_SIMPO), {}, _SIMPO),
    "sequence_logps": (
        lambda **kw: (L.sequence_logps(**kw, reduction="mean"), {}),
        lambda g: {
            "logits_BTV": torch.randn(B, T, V, generator=g),
            "labels_BT": torch.randint(0, V, (B, T), generator=g),
            "mask_BT": torch.rand(B, T, generator=g) > 0.3,
        },
        {},
        ("logits_BTV",),
    ),
    "prime_rl_policy": (
        L.prime_rl_policy_loss,
        lambda g: {
            "trainer_logprobs": -torch.rand(B, T, generator=g),
            "inference_logprobs": -torch.rand(B, T, generator=g),
            "advantages": torch.randn(B, generator=g),
            "loss_mask": torch.rand(B, T, generator=g) > 0.3,
        },
        {},
        ("trainer_logprobs",),
    ),
    "dapo_clip": (
        lambda mask, **kw: L.dapo_clip_loss(**kw, mask=mask, loss_weights=mask.float()),
        lambda g: {**_tokens(g, "logp", "old_logp"), "advantages": torch.randn(B, T, generator=g)},
        {},
        ("logp",),
    ),
    "sampled_reverse_kl": (
        L.sampled_reverse_kl_loss,
        lambda g: _tokens(g, "logp", "teacher_logp", "behaviour_logp"),
        {},
        ("logp",),
    ),
    "contrast_teacher_jsd": (
        lambda s, w, h, p, **kw: L.chunked_generalized_jsd_loss(
            s, w, *L.contrast_teacher_states(s, w, h, p, w, 0.5), **kw
        ),
        lambda g: {x: torch.randn(6 if x != "w" else V, H, generator=g) for x in "shpw"},
        {"impl": "fused"},  # the implementation a GPU runs, on both devices
        ("s", "w"),
    ),
}


def _run(fn, inputs: dict[str, Any], kwargs: dict[str, Any], grad_keys: tuple[str, ...]):
    """(loss, metrics, gradients of the ``grad_keys`` inputs) of one call."""
    leaves = {k: inputs[k].detach().requires_grad_() for k in grad_keys}
    loss, metrics = fn(**{**inputs, **leaves}, **kwargs)
    grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
    return loss.detach(), {k: v for k, v in metrics.items() if torch.is_tensor(v)}, list(grads)


def _on_device(x: Any, device: torch.device) -> None:
    for t in x if isinstance(x, list) else x.values() if isinstance(x, dict) else [x]:
        assert t.device == device, f"{t.shape} {t.dtype} on {t.device}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
@on_check_device
def test_loss_on_device_equals_cpu(name, dtype):
    fn, make, kwargs, grad_keys = CASES[name]
    inputs = {
        k: v.to(dtype) if v.is_floating_point() else v
        for k, v in make(torch.Generator().manual_seed(0)).items()
    }
    cpu = _run(fn, inputs, kwargs, grad_keys)
    dev = ensure_backend()
    on_dev = _run(fn, to_device(inputs), kwargs, grad_keys)
    for part in on_dev:
        _on_device(part, dev)
    torch.testing.assert_close(to_cpu(on_dev), cpu)


def _old_log1m_beta(a: torch.Tensor, beta: float) -> None:
    """The line of ``chunked._block`` that crashed on CUDA (issue 35), verbatim."""
    torch.logaddexp(a, torch.tensor(math.log1p(-beta), dtype=a.dtype), out=a)  # -r


@on_check_device
def test_check_trips_on_the_old_line_and_passes_its_fix():
    dev = ensure_backend()
    a = torch.randn(3, 4, device=dev)
    with pytest.raises(DeviceMixError, match=r"logaddexp.*cpu tensor \(shape \(\)"):
        _old_log1m_beta(a, 0.5)
    torch.logaddexp(a, a.new_tensor(math.log1p(-0.5)), out=a)  # the fixed form: no error


_OLD_LINE = "torch.logaddexp(a, torch.tensor(math.log1p(-beta), dtype=a.dtype), out=a)"


def _chunked_with_old_line():
    """``losses/chunked.py`` as it is, but with its ``logaddexp(a, <log(1 - beta)>, out=a)``
    call planted back to issue 35's form (a CPU 0-dim tensor), loaded as a separate module."""
    source = inspect.getsource(chunked)
    planted, n = re.subn(r"torch\.logaddexp\(a, .+?, out=a\)", lambda _: _OLD_LINE, source)
    assert n == 1, "chunked.py no longer has one logaddexp(a, ..., out=a): update this control"
    spec = importlib.util.spec_from_loader("composer_replication.losses._chunked_old", None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    exec(compile(planted, chunked.__file__, "exec"), module.__dict__)
    return module


@on_check_device
def test_check_fails_on_todays_chunked_line_and_passes_on_the_fix():
    """The acceptance control of issue 35: the whole chunked loss under the check, once with
    the old line planted (raises, naming logaddexp and the file), once as shipped (runs)."""
    inputs = to_device(_hidden_pair(torch.Generator().manual_seed(0)))
    old = _chunked_with_old_line()
    with pytest.raises(DeviceMixError, match=r"aten\.logaddexp\.out.*chunked\.py"):
        old.chunked_generalized_jsd_loss(**inputs, beta=0.5, impl="blocked")  # the line's path
    loss, _ = chunked.chunked_generalized_jsd_loss(**inputs, beta=0.5, impl="blocked")
    assert loss.device.type == "devcheck" and math.isfinite(float(loss))
