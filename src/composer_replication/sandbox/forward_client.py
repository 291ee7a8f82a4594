"""The tests' side of split grading: forward calls of one function to the sandbox that holds
the rebuilt code (sandbox.ModuleServer) and turn its plain-data replies back into values.

Feature Deletion grades a rebuilt function by the repository's tests. Running those tests in
the same interpreter as the rebuilt code would let that code rewrite pytest, the report or
the values the assertions compare (an object whose ``__eq__`` is always true). So the suite
runs on a copy of the tree in which the deleted function forwards its arguments (pickled) to
a second sandbox that imports the submitted file; only plain data comes back (wire.py's
codec: no custom classes, no subclasses, bounded size and depth). The assertions, pytest and
the report never share a process with code the policy wrote.

This file is copied into the test tools directory as ``_cr_forward`` (with wire.py as
``_cr_wire``) and imported by the sandboxed suite; it uses only the standard library. The
forwarding body that calls :func:`call` is written by ``feature_deletion.forward``.

What crosses:
* To the rebuilt code: arguments by pickle (plain data, instances of the tree's classes,
  module-level functions by reference), except lambdas and nested functions, bound methods
  and iterators, which cross as handles: the rebuilt code gets a proxy, and calling it (or
  ``next``) asks this process to run the original on plain arguments (wire.py's module
  mode).
* Back: a plain value; which argument was returned (``return self``); a handle for a
  callable or iterator it returned (a :class:`RemoteFunction` / :class:`RemoteIterator`
  here, whose calls go back over); or a raised exception, rebuilt from a builtin or tree
  class by name, else a ``RuntimeError``. With it, the new state of arguments that is plain
  data (a list, dict or set argument, an object's attribute dict: ``self.x = 1`` in a
  method lands on the suite's own ``self``).
A function that returns objects of its own classes (other than callables), or keeps state
elsewhere, cannot be graded this way; the task generator keeps only tasks whose original
code passes its tests through this path.
"""

import builtins
import io
import os
import pickle
import select
import sys
import time
import types

import _cr_wire

MAX_FRAME_BYTES = 1 << 20
_state = {
    "fds": None,
    "root": "",
    "hidden": frozenset(),
    "symbol": None,
    "dead": "",
    "deadline_s": None,
}
_OURS = {}  # handle -> a callable or iterator of this process the other side holds a proxy for


def connect(request_fd, reply_fd, root, hidden=(), deadline_s=None):
    """Called once by the suite runner before pytest starts; ``hidden``: the files (relative
    to ``root``) the other side's tree leaves out (the tests); ``deadline_s``: the longest
    wait for any one frame of the other side (a body that loops fails that call, and every
    later call at once, instead of holding both sandboxes for the suite's whole timeout)."""
    _state.update(
        fds=(request_fd, reply_fd), root=root, hidden=frozenset(hidden), deadline_s=deadline_s
    )


def _call_id():
    """A fresh random id for one exchange: the other side must echo it on every frame it
    sends for that exchange, so a reply sent early, late or twice answers no call."""
    return int.from_bytes(os.urandom(8), "big")


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
    return _exchange(("call", None, args, kwargs), args, symbol)


class RemoteFunction:
    """A callable the rebuilt code returned (``compose(f, g)``); it stays over there."""

    def __init__(self, handle):
        self.handle = handle

    def __call__(self, *args, **kwargs):
        return _exchange(("call", self.handle, args, kwargs), args, "function")


class RemoteIterator:
    """An iterator the rebuilt code returned (a generator); each ``next`` is one exchange."""

    def __init__(self, handle):
        self.handle = handle

    def __iter__(self):
        return self

    def __next__(self):
        return _exchange(("next", self.handle), (), "iterator")


class _Pickler(pickle.Pickler):
    """Lambdas, nested functions, functions of the test files, bound methods and iterators
    cross as handles (the other side calls back); proxies of the other side's objects as
    their handles; other module-level functions and classes by reference (the other side
    imports its own); the rest by value."""

    def persistent_id(self, obj):
        if isinstance(obj, (RemoteFunction, RemoteIterator)):
            return ("theirs", obj.handle)
        if (
            _by_handle(obj)
            or isinstance(obj, types.MethodType)
            or (hasattr(type(obj), "__next__") and not isinstance(obj, type))
        ):
            _OURS[len(_OURS)] = obj
            if hasattr(type(obj), "__next__"):
                return ("it", len(_OURS) - 1)
            names = (getattr(obj, "__name__", ""), getattr(obj, "__qualname__", ""))
            doc = obj.__doc__ if isinstance(obj.__doc__, str) else None
            return ("fn", len(_OURS) - 1, (*map(str, names), doc))
        return None


def _by_handle(obj):
    """A function the other side cannot import by name: a lambda or nested function, or one
    defined in a file its tree leaves out (a test module's helper)."""
    if not isinstance(obj, types.FunctionType):
        return False
    if "<" in obj.__qualname__:
        return True
    return _tree_relative(sys.modules.get(obj.__module__)) in _state["hidden"]


def _dumps(message):
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    return buf.getvalue()


def _exchange(message, args, what):
    """Send a call or ``next``; run the other side's callbacks until its answer."""
    if _state["dead"]:
        raise ForwardingError(_state["dead"])
    cid = _call_id()
    message = (message[0], cid, *message[1:])
    try:
        payload = _dumps(message)
    except Exception as e:
        raise TypeError(f"cannot send these arguments to the rebuilt {what}: {e}") from None
    _send(payload, cid)
    while True:
        frame = _receive(cid)
        if frame[0] != "callback":
            ends = what == "iterator" or what.rsplit(".", 1)[-1] == "__next__"
            return _result(frame, args, ends)
        _callback(frame)


def _callback(frame):
    """Run one of this side's functions (or advance an iterator) for the other side, on the
    plain arguments it sent, and send back the value or the exception."""
    ok = len(frame) == 5 and type(frame[1]) is int and frame[1] in _OURS
    if not ok or frame[2] not in ("call", "next"):
        _die("the rebuilt code's process sent a malformed callback")
    obj = _OURS[frame[1]]
    try:
        value = obj(*frame[3], **frame[4]) if frame[2] == "call" else next(obj)
        reply = ("reply", "value", value)
    except Exception as e:
        reply = ("reply", "raised", e)
    try:
        payload = _dumps(reply)
    except Exception as e:
        payload = _dumps(("reply", "raised", RuntimeError(f"cannot send the reply back: {e}")))
    _send(payload)


def _load(module, symbol):
    root = _state["root"]
    path = [("{root}" + p[len(root) :]) if p.startswith(root) else p for p in sys.path]
    cid = _call_id()
    _send(pickle.dumps(("load", cid, module, symbol, path)), cid)
    frame = _receive(cid)
    if frame == ("ready",):
        _state["symbol"] = symbol
        return
    why = frame[1] if frame[0] == "load_error" and len(frame) == 2 else "a malformed reply"
    _die(f"the rebuilt {module} could not be loaded: {why}")


def _die(why):
    _state["dead"] = why
    raise ForwardingError(why)


def _send(payload, cid=0):
    data = len(payload).to_bytes(8, "big") + cid.to_bytes(8, "big") + payload
    try:
        while data:
            data = data[os.write(_state["fds"][0], data) :]
    except OSError:
        _die("the rebuilt code's process is gone (crashed, killed or out of time)")


def _receive(cid):
    """The next frame of exchange ``cid``, without its id; any frame carrying another id (or
    none) ends the served side (``_die``), as does no frame within ``deadline_s``."""
    frame = _read_frame()
    if len(frame) < 2 or type(frame[1]) is not int or frame[1] != cid:
        _die("the rebuilt code's process sent a reply that answers no call (wrong call id)")
    return (frame[0], *frame[2:])


def _read_frame():
    fd, buf = _state["fds"][1], b""
    limit = _state["deadline_s"]
    deadline = None if limit is None else time.monotonic() + limit
    while b"\n" not in buf:
        if len(buf) > MAX_FRAME_BYTES:
            _die(f"the rebuilt code sent a reply of more than {MAX_FRAME_BYTES} bytes")
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([fd], [], [], wait)[0]:
            _die(f"the rebuilt code did not answer within {limit:g} s (per-call deadline)")
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


def _result(frame, args, ends_iteration=False):
    kind = frame[0]
    if kind in ("value", "argument", "function", "iterator", "theirs") and len(frame) == 3:
        _apply(frame[2], args)
        if kind == "value":
            return frame[1]
        if type(frame[1]) is int and kind == "argument" and 0 <= frame[1] < len(args):
            return args[frame[1]]
        if type(frame[1]) is int and kind == "function":
            return RemoteFunction(frame[1])
        if type(frame[1]) is int and kind == "iterator":
            return RemoteIterator(frame[1])
        if type(frame[1]) is int and kind == "theirs" and frame[1] in _OURS:
            return _OURS[frame[1]]
    if kind == "raised" and len(frame) == 4 and type(frame[3]) is tuple:
        raise _exception(frame[1], frame[2], frame[3], ends_iteration)
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


def _exception(module, qualname, args, ends_iteration=False):
    """The exception to raise in the tests, rebuilt only from classes whose meaning cannot
    be borrowed: a builtin one, or one defined in the tree under test (an ``Exception``
    subclass that a non-test module of the suite's tree defines under exactly that name,
    found by stepping through classes only: never through a module's imports, which would
    reach unittest's or pytest's classes). Anything else (a class a runner may treat as
    success or skip) and ``StopIteration`` outside an iterator's ``next`` (it would silently
    end a ``map`` in the test) become a ``RuntimeError`` naming the original."""
    cls = None
    if type(module) is str and type(qualname) is str:
        cls = (
            vars(builtins).get(qualname) if module == "builtins" else _tree_class(module, qualname)
        )
    ends = isinstance(cls, type) and issubclass(cls, (StopIteration, StopAsyncIteration))
    if isinstance(cls, type) and issubclass(cls, Exception) and (ends_iteration or not ends):
        try:
            return cls(*args)
        except Exception:
            pass
    return RuntimeError(f"{module}.{qualname}: {', '.join(map(str, args))[:500]}")


def _tree_class(module, qualname):
    """The class ``module.qualname`` if a module of the tree that is no test file defines it
    (its ``__module__`` and ``__qualname__`` are those names), else None."""
    mod = sys.modules.get(module)
    where = _tree_relative(mod)
    if where is None or where in _state["hidden"]:
        return None
    obj = mod
    for part in qualname.split("."):
        obj = vars(obj).get(part)
        if not isinstance(obj, type):
            return None
    if obj.__module__ != module or obj.__qualname__ != qualname:
        return None
    return obj


def _tree_relative(mod):
    """The path of module ``mod``'s file relative to the suite's tree, or None outside it."""
    path = getattr(mod, "__file__", None)
    root = _state["root"].rstrip("/") + "/"
    if not isinstance(path, str) or not os.path.realpath(path).startswith(root):
        return None
    return os.path.realpath(path)[len(root) :]
