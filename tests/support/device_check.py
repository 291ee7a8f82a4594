"""The device check: run CPU code "on a GPU" without one, and fail on any device mix-up.

CI has no GPU, yet a device bug (a tensor created without ``device=`` that later meets the
data) only shows on one: issue 35's ``torch.tensor(math.log1p(-beta), dtype=a.dtype)`` handed
to ``torch.logaddexp(..., out=a)`` crashed the trainer's first self-distillation step on CUDA
while every CPU test passed. This module gives the CPU suite a second device that really
computes and is stricter than CUDA:

* **a real non-CPU device type**. torch's PrivateUse1 backend, renamed ``devcheck`` and set up
  as a Python backend (``torch.utils.backend_registration._setup_privateuseone_for_python_backend``:
  a device guard and hooks, so autograd, ``torch.device("devcheck")``, ``tensor.to("devcheck")``,
  ``module.to("devcheck")``, ``nn.Parameter`` and accelerate's ``ACCELERATE_TORCH_DEVICE`` all
  work unchanged). Its tensors are :class:`CheckTensor`: wrapper subclasses that report device
  ``devcheck:0`` and hold a CPU tensor; every op unwraps, computes on the CPU, and wraps the
  results (views stay views of the same CPU memory, in-place and ``out=`` ops write through).
  Factory functions with ``device="devcheck"`` reach a PrivateUse1 fallback that builds the
  tensor on the CPU and wraps it. So a whole train (generation, losses, backward, AdamW,
  checkpoints) runs to the end, with the same numbers as on the CPU.
* **a strict rule**: any op that gets a CPU tensor (0-dim included) and a ``devcheck`` tensor
  raises :class:`DeviceMixError`, naming the op, the CPU operand and the first frame outside
  torch. Only transfers (``copy_``, ``_to_copy``, ``_copy_from``) may cross devices. CUDA
  itself lets CPU 0-dim tensors into many element-wise ops but not all (``logaddexp`` with
  ``out=``, the issue-35 crash, is one it refuses), so the only rule that catches the whole
  class without listing kernels is "never".

Why not the alternatives: ``FakeTensorMode`` with a CUDA device and the ``meta`` device both
accept that 0-dim CPU tensor and compute nothing (a train cannot run past the first
data-dependent branch); setting the default device to a sentinel breaks the legitimate CPU
tensors (token ids, collation) the code builds before moving them. A dispatch-mode check over
plain CPU tensors cannot tell "meant for the device" from "meant for the host"; here every
tensor carries the device its code gave it.

Registering the backend is process-wide and cannot be undone (``torch.accelerator`` then
reports ``devcheck``), and autograd sizes its per-device worker pool at its first backward,
so the backend must exist before any autograd runs: tests marked :func:`on_check_device` run
in one child pytest process per test file, which registers the backend as it starts; the
test process reports each test's child outcome. Our own code (the package and the tests)
gets the strict rule; other libraries' code gets what CUDA accepts (CPU 0-dim scalars, CPU
index tensors: :data:`THIRD_PARTY_MIXES` lists them), since a mix there is theirs to fix.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

NAME = "devcheck"
# ops that move data between devices by design
_TRANSFERS = {"aten::copy_", "aten::_to_copy", "aten::_copy_from", "aten::_copy_from_and_resize"}
_TORCH_DIR = str(Path(torch.__file__).parent)
_HERE = str(Path(__file__).resolve())
_TESTS_DIR = str(Path(__file__).resolve().parents[1])


class DeviceMixError(RuntimeError):
    """A CPU tensor met a ``devcheck`` tensor in one op (on a GPU: a crash or a silent sync)."""


class CheckTensor(torch.Tensor):
    """A tensor on ``devcheck:0`` whose data is the CPU tensor ``inner``."""

    inner: torch.Tensor
    __slots__ = ("inner",)

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> CheckTensor:
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.size(),
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=torch.device(NAME, 0),
            requires_grad=False,
        )
        out.inner = inner
        return out

    def __repr__(self, *, tensor_contents=None) -> str:  # type: ignore[override]
        return f"CheckTensor({self.inner!r}, device='{NAME}:0')"

    __torch_function__ = torch._C._disabled_torch_function_impl

    def tolist(self):  # as for CUDA tensors: a copy to the host (torch refuses it for subclasses)
        return self.inner.tolist()

    def untyped_storage(self):  # checkpoint code reads storage pointers (tied weights)
        return self.inner.untyped_storage()

    def data_ptr(self) -> int:
        return self.inner.data_ptr()

    def __deepcopy__(self, memo: dict) -> CheckTensor:  # a model copy (EMA teacher) stays here
        out = _rewrap(copy.deepcopy(self.inner, memo), self.requires_grad)
        if getattr(self, "_is_param", False):
            out._is_param = True
        memo[id(self)] = out
        return out

    def __reduce_ex__(self, protocol):  # torch.save / deepcopy: the data, back on the device
        return (_rewrap, (self.inner, self.requires_grad))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _check_mix(func, args, kwargs)
        to_cpu = _targets_cpu(func, kwargs)
        raw = func(*tree_map(_unwrap, args), **tree_map(_unwrap, _cpu_device(kwargs)))
        if to_cpu:
            return raw
        return _rewrap_outputs(raw, args, kwargs)


def _rewrap(inner: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    out = CheckTensor(inner.detach())
    return out.requires_grad_(requires_grad) if requires_grad else out


def _unwrap(x: Any) -> Any:
    if isinstance(x, CheckTensor):
        return x.inner
    if isinstance(x, torch.device) and x.type == NAME:
        return torch.device("cpu")
    return x


def _cpu_device(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (torch.device("cpu") if k == "device" and v is not None else v)
        for k, v in kwargs.items()
    }


def _targets_cpu(func, kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "cpu"


def _rewrap_outputs(raw: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Wrap fresh results; a result that *is* an input's CPU tensor (in place, ``out=``)
    returns that input's wrapper, so identity and later metadata stay right."""
    owners: dict[int, CheckTensor] = {}
    for x in [*args, *kwargs.values()]:
        for t in x if isinstance(x, (list, tuple)) else (x,):
            if isinstance(t, CheckTensor):
                owners[id(t.inner)] = t

    def wrap(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or isinstance(t, CheckTensor):
            return t
        owner = owners.get(id(t))
        return owner if owner is not None else CheckTensor(t)

    return tree_map(wrap, raw)


def _check_mix(func, args: tuple, kwargs: dict[str, Any]) -> None:
    if func._schema.name in _TRANSFERS:
        return
    cpu: list[torch.Tensor] = []

    def visit(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, CheckTensor):
            cpu.append(x)
        return x

    tree_map(visit, (args, kwargs))
    if not cpu:
        return
    frame = _caller_frame()
    where = "<unknown>" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"
    if frame is not None and not _ours(frame.f_code.co_filename) and _cuda_accepts(func, cpu):
        THIRD_PARTY_MIXES.append(f"{func} at {where}")
        return
    t = cpu[0]
    raise DeviceMixError(
        f"{func}: a {t.device} tensor (shape {tuple(t.shape)}, {t.dtype}) meets {NAME} "
        f"tensors, at {where}"
    )


THIRD_PARTY_MIXES: list[str] = []
"""Mixes tolerated in other libraries' code (see :func:`_cuda_accepts`), for inspection."""
_INDEXING = {"aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_"}


def _cuda_accepts(func, cpu: list[torch.Tensor]) -> bool:
    """What CUDA lets other libraries do: CPU 0-dim tensors as scalars of element-wise ops,
    CPU index tensors in advanced indexing. Our own code gets no such leeway."""
    return func._schema.name in _INDEXING or all(t.dim() == 0 for t in cpu)


def _caller_frame():
    """The innermost Python frame outside torch and this module (the code that ran the op)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_TORCH_DIR) and path != _HERE:
            return frame
        frame = frame.f_back
    return None


def _ours(path: str) -> bool:
    """Code of this project (the package, its tests): held to the strict rule."""
    import composer_replication

    package = str(Path(composer_replication.__file__).parent)
    return path.startswith((package, _TESTS_DIR))


def _factory_fallback(op, *args, **kwargs):
    """PrivateUse1 kernels for ops no ``CheckTensor`` reaches: factories with
    ``device="devcheck"`` (empty, randn, arange, ...); built on the CPU, then wrapped."""
    _check_mix(op, args, kwargs)
    raw = op(*tree_map(_unwrap, args), **tree_map(_unwrap, _cpu_device(kwargs)))
    return tree_map(lambda t: CheckTensor(t) if isinstance(t, torch.Tensor) else t, raw)


def _copy_kernel(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``copy_`` as the PrivateUse1 kernel: torch's own host-to-device paths (``torch.tensor(...,
    device=)``) run it with the Python key excluded, so ``__torch_dispatch__`` is skipped."""
    _unwrap(dst).copy_(_unwrap(src), non_blocking)
    return dst


class _DeviceModule:
    """``torch.devcheck``: what torch's generic device code asks of a backend module. Its
    random numbers are the CPU generator's (the kernels run there), so its RNG state is the
    CPU's; it has one device and no mixed-precision kernels of its own (autocast stays off)."""

    class device:  # noqa: N801 (torch's name for the device context manager)
        def __init__(self, index: Any) -> None:
            self.index = index

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: Any) -> None:
            return None

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        return None

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        return None

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]


_LIB: torch.library.Library | None = None
_OPS: torch.library.Library | None = None


def ensure_backend() -> torch.device:
    """Register ``devcheck`` in this process (once); its device."""
    global _LIB, _OPS
    if _LIB is None:
        if not in_child():
            raise RuntimeError("devcheck registers only in a device-check child (on_check_device)")
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(NAME, backend_module=_DeviceModule())
        _LIB = torch.library.Library("_", "IMPL")  # noqa: TOR901
        _LIB.fallback(_factory_fallback, "PrivateUse1")
        _OPS = torch.library.Library("aten", "IMPL")  # noqa: TOR901
        _OPS.impl("copy_", _copy_kernel, "PrivateUse1")
        # accelerate >= 1.16 frees memory through torch.accelerator for any backend it does
        # not know, and torch.accelerator.empty_cache asserts on a backend without a caching
        # allocator (ours holds CPU tensors): nothing to free, so a no-op, in this child only
        torch.accelerator.empty_cache = _no_cache_to_free
    return torch.device(NAME, 0)


def _no_cache_to_free() -> None:
    return None


def to_device(x: Any) -> Any:
    """``x`` (a tensor, or a structure of them) moved to ``devcheck``."""
    dev = ensure_backend()
    return tree_map(lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t, x)


def to_cpu(x: Any) -> Any:
    """``x`` with every tensor moved back to plain CPU tensors (detached)."""
    return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, x)


@contextlib.contextmanager
def accelerate_on_device() -> Iterator[torch.device]:
    """Trainers built inside put their model and batches on ``devcheck``: accelerate's
    ``ACCELERATE_TORCH_DEVICE`` names it, and TRL's ``GRPOConfig`` gets ``use_cpu=False``
    (``build_grpo_args`` asks for the CPU when CUDA is missing; on a GPU it does not)."""
    import trl

    dev = ensure_backend()
    config_cls = trl.GRPOConfig

    class on_device(config_cls):  # noqa: N801 (stands in for the class)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "use_cpu": False})
            self.__class__ = config_cls  # checkpoints pickle the args: TRL's own class

    old = os.environ.get("ACCELERATE_TORCH_DEVICE")
    os.environ["ACCELERATE_TORCH_DEVICE"] = str(dev)
    trl.GRPOConfig = on_device
    try:
        yield dev
    finally:
        trl.GRPOConfig = config_cls
        if old is None:
            os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
        else:
            os.environ["ACCELERATE_TORCH_DEVICE"] = old


CHILD_ENV = "DEVICE_CHECK_CHILD"
REPORT_ENV = "DEVICE_CHECK_REPORT"
_REPO = Path(__file__).resolve().parents[2]
_CHILD_RUNS: dict[str, dict[str, dict[str, str]]] = {}


def in_child() -> bool:
    """True in the pytest process that runs device-check tests (the backend lives there)."""
    return os.environ.get(CHILD_ENV) == "1"


def on_check_device(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run the test ``fn`` in a child pytest process where ``devcheck`` is registered.

    In the test process, the first such test of a module starts one child ``pytest`` on that
    module's selected device-check tests (their fixtures are set up there) and every test
    reports its own child outcome: a failure carries the child's traceback, a skip its
    reason. The child registers the backend when it imports this module, before any autograd
    runs (autograd sizes its per-device worker pool once, at its first backward)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        if in_child():
            ensure_backend()
            fn(*args, **kwargs)
            return
        import pytest

        nodeid = os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]
        outcome = _child_outcome(nodeid)
        if outcome["outcome"] == "skipped":
            pytest.skip(outcome["longrepr"])
        if outcome["outcome"] != "passed":
            pytest.fail(f"in the devcheck child process:\n{outcome['longrepr']}", pytrace=False)

    run.on_check_device = True  # type: ignore[attr-defined]
    return run


def _child_outcome(nodeid: str) -> dict[str, str]:
    path = nodeid.split("::", 1)[0]
    if path not in _CHILD_RUNS:
        _CHILD_RUNS[path] = _run_child(path, [n for n in SELECTED if n.startswith(path + "::")])
    found = _CHILD_RUNS[path].get(nodeid)
    if found is None:
        raise RuntimeError(f"the devcheck child ran no test {nodeid}; see its output above")
    return found


SELECTED: list[str] = []
"""Node ids of the device-check tests this session selected (tests/conftest.py fills it)."""


def _run_child(path: str, nodeids: list[str]) -> dict[str, dict[str, str]]:
    """Run the device-check tests ``nodeids`` of one test file in a child pytest; their
    outcomes by node id."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {**os.environ, CHILD_ENV: "1", REPORT_ENV: str(report)}
        env.pop("PYTEST_CURRENT_TEST", None)
        cmd = [sys.executable, "-m", "pytest", *(nodeids or [path]), "-q", "-p", "no:cacheprovider"]
        cmd.append(f"--basetemp={tmp}/base")  # its own: other pytest runs prune the shared one
        r = subprocess.run(cmd, cwd=_REPO, env=env, capture_output=True, text=True)
        rows = (
            [json.loads(line) for line in report.read_text().splitlines()]
            if report.exists()
            else []
        )
    if not rows:
        raise RuntimeError(
            f"devcheck child failed to run {path}:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        )
    out: dict[str, dict[str, str]] = {}
    for row in rows:  # setup / call / teardown: the first that did not pass decides
        if row["nodeid"] not in out or out[row["nodeid"]]["outcome"] == "passed":
            out[row["nodeid"]] = row
    return out


def report_to_parent(report: Any) -> None:
    """pytest_runtest_logreport in the child (tests/conftest.py): one JSON line per phase."""
    path = os.environ.get(REPORT_ENV)
    if not path or not in_child():
        return
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple):
        text = str(longrepr[2])
    else:
        text = str(longrepr) if longrepr else ""
    row = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "longrepr": text,
    }
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


if in_child():
    ensure_backend()
