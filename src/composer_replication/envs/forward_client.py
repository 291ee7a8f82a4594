"""The tests' side of split grading: forward calls of one function to the sandbox that holds
the rebuilt code (sandbox.ModuleServer) and turn its plain-data replies back into values.

Feature Deletion grades a rebuilt function by the repository's tests. Running those tests in
the same interpreter as the rebuilt code would let that code rewrite pytest, the report or
the values the assertions compare (an object whose ``__eq__`` is always true). So the suite
runs on a copy of the tree in which the deleted function forwards its arguments (pickled) to
a second sandbox that imports the submitted file; only plain data comes back (harness.py's
codec: no custom classes, no subclasses, bounded size and depth). The assertions, pytest and
the report never share a process with code the policy wrote.

This file is copied into the test tools directory as ``_cr_forward`` (with harness.py as
``_cr_wire``) and imported by the sandboxed suite; it uses only the standard library. The
forwarding body that calls :func:`call` is written by ``feature_deletion.forward``.

What crosses: arguments that pickle (plain data, instances of the tree's classes, builtin
functions; not lambdas); back, a plain value, an iterator's items (returned as an iterator),
which argument was returned (``return self``), or a raised exception (rebuilt from a builtin
or tree class by name, else a ``RuntimeError``), together with the new state of arguments
that is plain data (a list, dict or set argument, an object's attribute dict: ``self.x = 1``
in a method lands on the suite's own ``self``). A function that takes callables, returns
objects of its own classes or keeps state elsewhere cannot be graded this way; the task
generator keeps only tasks whose original code passes its tests through this path.
"""

import builtins
import os
import pickle
import select
import sys

import _cr_wire

MAX_FRAME_BYTES = 1 << 20
_state = {"fds": None, "root": "", "symbol": None, "dead": ""}


def connect(request_fd, reply_fd, root):
    """Called once by the suite runner before pytest starts."""
    _state.update(fds=(request_fd, reply_fd), root=root)


class ForwardingError(RuntimeError):
    """The rebuilt function's process could not answer (failed to load, died, lied)."""


def call(symbol, module, args, kwargs):
    """Run ``symbol`` of ``module`` in the rebuilt code's process on ``args``/``kwargs``."""
    if _state["dead"]:
        raise ForwardingError(_state["dead"])
    if _state["symbol"] is None:
        _load(module, symbol)
    elif _state["symbol"] != symbol:
        raise ForwardingError(f"only {_state['symbol']} is served, not {symbol}")
    try:
        payload = pickle.dumps(("call", args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError(f"cannot send these arguments to the rebuilt {symbol}: {e}") from None
    _send(payload)
    return _result(_receive(), args)


def _load(module, symbol):
    root = _state["root"]
    path = [("{root}" + p[len(root) :]) if p.startswith(root) else p for p in sys.path]
    _send(pickle.dumps(("load", module, symbol, path)))
    frame = _receive()
    if frame == ("ready",):
        _state["symbol"] = symbol
        return
    why = frame[1] if frame[0] == "load_error" and len(frame) == 2 else "a malformed reply"
    _die(f"the rebuilt {module} could not be loaded: {why}")


def _die(why):
    _state["dead"] = why
    raise ForwardingError(why)


def _send(payload):
    data = len(payload).to_bytes(8, "big") + payload
    try:
        while data:
            data = data[os.write(_state["fds"][0], data) :]
    except OSError:
        _die("the rebuilt code's process is gone (crashed, killed or out of time)")


def _receive():
    fd, buf = _state["fds"][1], b""
    while b"\n" not in buf:
        if len(buf) > MAX_FRAME_BYTES:
            _die(f"the rebuilt code sent a reply of more than {MAX_FRAME_BYTES} bytes")
        select.select([fd], [], [])
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            _die("the rebuilt code's process is gone (crashed, killed or out of time)")
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    if rest:
        _die("the rebuilt code's process sent more than it was asked")
    try:
        return _cr_wire.decode_frame(line, MAX_FRAME_BYTES)
    except ValueError as e:
        _die(f"the rebuilt code's process corrupted its replies ({e})")


def _result(frame, args):
    kind = frame[0]
    if kind in ("value", "iterator", "argument") and len(frame) == 3:
        _apply(frame[2], args)
        if kind == "value":
            return frame[1]
        if kind == "iterator" and type(frame[1]) is list:
            return iter(frame[1])
        if kind == "argument" and type(frame[1]) is int and 0 <= frame[1] < len(args):
            return args[frame[1]]
    if kind == "raised" and len(frame) == 4 and type(frame[3]) is tuple:
        raise _exception(frame[1], frame[2], frame[3])
    _die("the rebuilt code's process sent a malformed reply")


def _apply(effects, args):
    """Bring the arguments' new state (plain data) into the suite's own objects: a list,
    dict or set is updated in place, an object's attributes replaced."""
    if type(effects) is not list:
        _die("the rebuilt code's process sent a malformed reply")
    for effect in effects:
        if type(effect) is not tuple or len(effect) != 2 or type(effect[0]) is not int:
            _die("the rebuilt code's process sent a malformed reply")
        index, state = effect
        target = args[index] if 0 <= index < len(args) else None
        if type(target) is list and type(state) is list:
            target[:] = state
        elif type(target) in (dict, set) and type(state) is type(target):
            target.clear()
            target.update(state)
        elif hasattr(target, "__dict__") and type(state) is dict:
            if all(type(k) is str for k in state) and not isinstance(target, type):
                vars(target).clear()
                vars(target).update(state)


def _exception(module, qualname, args):
    """The exception to raise in the tests: the builtin or tree class of that name (only an
    ``Exception`` subclass already imported here), built from the plain arguments."""
    cls = vars(builtins).get(qualname) if module == "builtins" else sys.modules.get(module)
    if module != "builtins":
        for part in str(qualname).split("."):
            cls = vars(cls).get(part) if hasattr(cls, "__dict__") else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(*args)
        except Exception:
            pass
    return RuntimeError(f"{module}.{qualname}: {', '.join(map(str, args))[:500]}")
