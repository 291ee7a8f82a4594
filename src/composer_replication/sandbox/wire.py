"""Both halves of the grading wire: the script that serves a candidate function inside the
sandbox, and the plain-data codec the trusted grader uses to read what it sends back.

The sandboxed process never sees a test. It loads the candidate program, then answers calls:
the grader sends the arguments, this script calls the candidate and sends back the value. The
grader runs the dataset's own assertions on those values in its own process (envs/humaneval.py),
so nothing the candidate does (exit codes, ``atexit``, signal handlers, printing "passed",
redefining ``check``, objects whose ``__eq__`` is always true) can produce a pass: only values
equal to the expected ones can.

Wire format: one frame per line, each the ``repr`` of a tuple of plain data. The trusted side
parses frames with :func:`literal` (``ast.literal_eval``'s grammar; never ``eval``, ``pickle``
or ``marshal``), which can only build ``None``, bools, numbers, strings, bytes, tuples, lists,
dicts and sets, and refuses a set or dict whose keys share one hash (hash flooding: building it
would take the grader quadratic time after the sandbox's deadline). Both sides refuse, in
:func:`check_plain`, subclasses of those types (an ``int`` subclass with a custom ``__eq__``),
NaN, recursion deeper than ``MAX_DEPTH`` and ints wider than ``MAX_INT_BITS`` (``str()`` of
one past CPython's 4300-digit limit raises ``ValueError`` in whoever prints it). Text made
from candidate data on the trusted side goes through :func:`preview` (bounded, never raises).
Frames from the grader are trusted, so this script reads them with ``eval`` in an empty
namespace.

This file runs inside the sandbox as ``python -I -S -B -c <this source> <limits>``: it imports
only builtin modules (``os``, ``sys``, ``resource``) because every other import would be
compiled from source under the sandbox's empty pycache prefix (~80 ms for ``json``).
"""

import _thread
import os
import sys

PARSE_LOCK = _thread.allocate_lock()
"""Held around every ``ast.parse`` of the process (sandbox/pyast.py takes the same lock):
CPython 3.11 and 3.12 fail concurrent parses with a SystemError. ``_thread``, a builtin
module, because this file runs in the sandbox too."""

MAX_DEPTH = 64
MAX_INT_BITS = 14_000  # 4215 decimal digits at most: under CPython's 4300-digit str() limit
MAX_EQUAL_HASHES = 16  # per set or dict; distinct plain values collide only when made to
INF = float("inf")
PLAIN_ATOMS = (type(None), bool, int, float, complex, str, bytes)
PLAIN_CONTAINERS = (list, tuple, dict, set)


class NotPlainData(TypeError):
    """A value that is not plain data (a custom object, a subclass, NaN, a deep structure)."""


def check_plain(value, depth=0):
    """Raise ``NotPlainData`` unless ``value`` is built only from exact builtin plain types."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH}")
    if kind in PLAIN_ATOMS:
        if kind is float and (value != value or value in (INF, -INF)):
            raise NotPlainData(f"{value} is not supported")
        if kind is int and value.bit_length() > MAX_INT_BITS:  # before anything prints it
            raise NotPlainData(f"an int of {value.bit_length()} bits exceeds {MAX_INT_BITS}")
        return
    if kind not in PLAIN_CONTAINERS:
        raise NotPlainData(f"{kind.__name__} is not plain data")
    items = value.items() if kind is dict else ((v, None) for v in value)
    for a, b in items:
        check_plain(a, depth + 1)
        check_plain(b, depth + 1)


def encode(value):
    """The literal text of a plain value (``repr`` is the builtin one for checked values)."""
    check_plain(value)
    return repr(value)


def decode_frame(line, max_bytes):
    """Parse one frame sent by the sandbox; untrusted input, plain data out or ``ValueError``."""
    if len(line) > max_bytes:
        raise ValueError(f"frame of {len(line)} bytes exceeds {max_bytes}")
    try:
        frame = literal(line.decode("utf-8"))
        check_plain(frame)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, UnicodeError) as e:
        raise ValueError(f"malformed frame: {type(e).__name__}: {str(e)[:200]}") from None
    if type(frame) is not tuple or not frame or type(frame[0]) is not str:
        raise ValueError("malformed frame: not a tagged tuple")
    return frame


def literal(text: str) -> object:
    """``ast.literal_eval(text)`` for untrusted text, except that a set or dict whose keys share
    one hash is refused (``ValueError``) before it is built: inserting n colliding keys costs
    n**2 / 2 comparisons (~11 s of grader CPU for a 1 MB frame of ``k * (2**61 - 1)``)."""
    import ast

    def build(node):
        kind = type(node)
        if kind is ast.Constant:
            return node.value
        if kind is ast.Tuple or kind is ast.List:
            items = [build(e) for e in node.elts]
            return tuple(items) if kind is ast.Tuple else items
        if kind is ast.Set:
            return set(_few_equal_hashes([build(e) for e in node.elts]))
        if kind is ast.Dict:
            if None in node.keys:
                raise ValueError("malformed node: ** in a dict")
            keys = _few_equal_hashes([build(k) for k in node.keys])
            return dict(zip(keys, [build(v) for v in node.values], strict=True))
        return ast.literal_eval(node)  # signed and complex numbers, set(): no keys inside

    _precheck(text)
    with PARSE_LOCK:
        tree = ast.parse(text.lstrip(" \t"), mode="eval")
    return build(tree.body)


MAX_ITEMS = 100_000
"""Most containers and separators a frame may hold: the parser builds about a kilobyte of
syntax tree per item, and frames are parsed in the trusted process (a 1 MB frame of empty
lists cost ~480 MB there)."""


def _precheck(text: str) -> None:
    """Refuse, in linear time and before any parsing, text nested deeper than ``MAX_DEPTH``
    or holding more than ``MAX_ITEMS`` items (``ValueError``). Brackets inside string
    literals do not count; text that fools this scan only makes it count more."""
    import re

    strings = r"'(?:[^'\\\n]|\\.)*'" + r'|"(?:[^"\\\n]|\\.)*"'
    code = re.sub(strings, "''", text)
    items = sum(code.count(c) for c in "[({,")
    if items > MAX_ITEMS:
        raise ValueError(f"more than {MAX_ITEMS} items")
    depth = 0
    for c in re.findall(r"[\[\](){}]", code):
        depth += 1 if c in "[({" else -1
        if depth > MAX_DEPTH + 2:  # + the frame's own tuple and its payload's list
            raise ValueError(f"nested deeper than {MAX_DEPTH}")


def _few_equal_hashes(keys: list) -> list:
    """``keys``, or ``ValueError`` if more than ``MAX_EQUAL_HASHES`` of them share a hash
    (``TypeError`` for an unhashable key, as building the set or dict would raise)."""
    counts = {}
    for key in keys:
        h = hash(key)
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > MAX_EQUAL_HASHES:
            raise ValueError(f"more than {MAX_EQUAL_HASHES} keys share one hash (hash flooding)")
    return keys


def preview(value: object, limit: int = 300, show=repr) -> str:
    """``show(value)`` (``repr`` or ``str``) cut to ``limit`` characters; never raises, for
    text the trusted side makes from candidate data (feedback, error messages)."""
    try:
        text = show(value)
    except Exception:  # an int past the str() digit limit, a failing __str__
        text = f"<unprintable {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


# ---- sandbox side (runs as __main__ inside the sandbox) ---------------------------------------


def _apply_limits(limits):
    import resource

    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _install_audit_hook(root):
    """Second layer only (OS isolation is the first): refuse sockets, new processes, native
    code and writes outside ``root``. State lives in this closure, not in module globals."""
    realpath, sep, fsdecode = os.path.realpath, os.sep, os.fsdecode
    blocked = frozenset(
        "socket.__new__ socket.connect socket.bind subprocess.Popen os.system os.exec "
        "os.posix_spawn os.spawn os.fork os.forkpty pty.spawn ctypes.dlopen ctypes.dlsym "
        "ctypes.cdata os.kill os.killpg sqlite3.connect gc.get_objects gc.get_referrers "
        "gc.get_referents".split()
    )
    path_events = frozenset(
        "os.remove os.rename os.rmdir os.mkdir os.chmod os.chown os.symlink os.link "
        "os.truncate shutil.rmtree os.utime shutil.copyfile".split()
    )
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND

    def inside(p):
        if isinstance(p, int):
            return True
        try:
            real = realpath(fsdecode(p))
        except Exception:
            return False
        return real == root or real.startswith(root + sep) or real == "/dev/null"

    def hook(event, args):
        if event in blocked:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags
            )
            if writing and not inside(path):
                raise PermissionError(f"sandbox: write outside the work dir: {path!r}")
        elif event in path_events:
            for a in args[:2]:
                if isinstance(a, (str, bytes, os.PathLike)) and not inside(a):
                    raise PermissionError(f"sandbox: {event} outside the work dir: {a!r}")

    sys.addaudithook(hook)


class _Channel:
    """Line frames over the grader's pipes (kept on private fds; fd 0 becomes /dev/null and
    fd 1 points at stderr, so the candidate's prints never reach the wire by accident)."""

    def __init__(self):
        self.rfd, self.wfd = os.dup(0), os.dup(1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(2, 1)
        os.close(null)
        self.buf = b""

    def recv(self):
        while b"\n" not in self.buf:
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return eval(line.decode("utf-8"), {"__builtins__": {}})  # trusted: the grader's frame

    def send(self, *frame):
        data = (encode(frame) + "\n").encode("utf-8")
        while data:
            data = data[os.write(self.wfd, data) :]


def _describe(exc, source_lines):
    """``Type: message`` plus the candidate's line where it was raised, if any."""
    text = f"{type(exc).__name__}: {exc}"[:500]
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "candidate.py":
            line = tb.tb_lineno
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.filename == "candidate.py":
        line = exc.lineno
    if line and 0 < line <= len(source_lines):
        text += f" (line {line}: {source_lines[line - 1].strip()[:120]})"
    return text


def _load(program, entry):
    """Run the candidate program; return its entry-point function or raise."""
    namespace = {"__name__": "__main__", "__file__": "candidate.py", "__builtins__": __builtins__}
    exec(compile(program, "candidate.py", "exec"), namespace)
    fn = namespace.get(entry)
    if not callable(fn):
        raise NameError(f"the program defines no function {entry!r}")
    return fn


def _serve(channel, fn, source_lines):
    while True:
        frame = channel.recv()
        if frame is None:
            return
        try:
            value = fn(*frame[1])
        except BaseException as e:  # SystemExit/KeyboardInterrupt in the function fail the call
            channel.send("raised", _describe(e, source_lines))
            continue
        try:
            channel.send("value", value)
        except (NotPlainData, ValueError, RecursionError) as e:
            channel.send("raised", f"returned a value that is not plain data: {e}")


def _read_exactly(n, fd=0):
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(1 << 16, n - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _script(audit):
    """Script mode (``run_python``): stdin holds an 8-byte length, the code, then bytes the
    code may read itself from fd 0 (a secret it takes before any untrusted import); run the
    code with normal stdout/stderr."""
    size = int.from_bytes(_read_exactly(8), "big")
    code = _read_exactly(size).decode("utf-8")
    if audit:
        _install_audit_hook(os.path.realpath(os.getcwd()))
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
    exec(compile(code, "main.py", "exec"), namespace)


# ---- module mode: Feature Deletion's split grading (sandbox.ModuleServer) -------------------
#
# The suite's process (sandbox/forward_client.py) sends length-prefixed pickles on fd 0: ("load",
# module, symbol, sys_path), ("call", handle, args, kwargs), ("next", handle), and ("reply",
# "value"|"raised", payload) answering a callback. This side answers on fd 1 with plain-data
# frames only. Callables and iterators cross as handles, never as code: a test's lambda
# arrives as _TheirFunction (calling it asks the suite to run it on plain arguments), and a
# function or iterator this side returns stays here, named by a number.

_MINE = {}  # handle -> a callable or iterator of this side the suite holds a proxy for
_IO = {"ids": []}  # "rfd", "channel", "ids": the call ids of the exchanges in progress


class _TheirFunction:
    """A callable of the suite's process (a test's lambda); calling it runs it there. It
    carries the original's name, qualified name and docstring (code inspects them)."""

    def __init__(self, handle, names=("", "", None)):
        self.handle = handle
        self.__name__, self.__qualname__, self.__doc__ = names

    def __call__(self, *args, **kwargs):
        return _ask(("callback", self.handle, "call", args, kwargs))


class _TheirIterator(_TheirFunction):
    """An iterator of the suite's process; each ``next`` is one exchange."""

    def __iter__(self):
        return self

    def __next__(self):
        return _ask(("callback", self.handle, "next", (), {}))


def _unpickler():
    """The unpickler class for the suite's messages (built once): handles in them become
    proxies (``_TheirFunction``) or this side's own objects again."""
    if "unpickler" not in _IO:
        import pickle

        class Unpickler(pickle.Unpickler):
            def persistent_load(self, pid):
                kind, handle = pid[:2]
                if kind == "fn":
                    return _TheirFunction(handle, pid[2])
                if kind == "it":
                    return _TheirIterator(handle)
                return _MINE[handle]

        _IO["unpickler"] = Unpickler
    return _IO["unpickler"]


def _recv_pickle(fd):
    """One pickle from the suite's process (``_unpickler``), after an 8-byte length and the
    8-byte call id of its exchange; None at EOF; ``("unreadable", call id, why)`` if it does
    not unpickle (so the answer still carries the id)."""
    import io

    head = _read_exactly(16, fd)
    if len(head) < 16:
        return None
    data = _read_exactly(int.from_bytes(head[:8], "big"), fd)
    try:
        return _unpickler()(io.BytesIO(data)).load()
    except Exception as e:  # read whole, so the stream stays in step: answer, do not die
        why = f"{type(e).__name__}: {preview(e, 500, str)}"
        return ("unreadable", int.from_bytes(head[8:], "big"), why)


def _send_reply(kind, *rest):
    """A frame for the exchange in progress: its call id echoed after the kind."""
    _IO["channel"].send(kind, _IO["ids"][-1], *rest)


def _ask(frame):
    """Send a callback request and serve the suite's nested calls until its reply."""
    try:
        _send_reply(*frame)
    except (NotPlainData, ValueError, RecursionError) as e:
        raise TypeError(f"cannot pass these arguments to the tests' function: {e}") from None
    while True:
        msg = _recv_pickle(_IO["rfd"])
        if msg is None:
            raise SystemExit(0)  # the suite is gone
        if msg[0] == "unreadable":  # taken as the reply (a nested call would be pickled alike)
            raise TypeError(f"cannot receive the reply: {msg[2]}")
        if msg[0] != "reply":
            _answer(msg)
            continue
        if msg[1] == "value":
            return msg[2]
        raise msg[2]


def _resolve(module, symbol):
    """The function the ``def`` of ``symbol`` (``f`` or ``Class.f``) in ``module`` made, under
    whatever wraps it there (classmethod, staticmethod, property, ``functools.wraps``, a
    partial or curry object's ``func``): the suite's process applies the wrappers to its own
    forwarding function, so this side must call the bare function."""
    import importlib

    obj = importlib.import_module(module)
    for part in symbol.split("."):
        space = vars(obj) if hasattr(obj, "__dict__") else {}
        obj = space[part] if part in space else getattr(obj, part)
    seen, todo = [], [obj]
    while todo and len(seen) < 64:
        cand = todo.pop(0)
        seen.append(cand)
        if getattr(cand, "__qualname__", None) == symbol and type(cand).__name__ == "function":
            return cand
        for name in ("__wrapped__", "__func__", "fget", "func"):
            inner = getattr(cand, name, None)
            if inner is not None and not any(inner is s for s in seen):
                todo.append(inner)
    return obj


def _answer(msg):
    """Run one call or ``next`` the suite asked for and send the reply frame."""
    if msg[0] == "unreadable":
        _IO["ids"].append(msg[1])
        reply = ("raised", "builtins", "TypeError", (f"cannot receive the arguments: {msg[2]}",))
    elif msg[0] == "call":
        _IO["ids"].append(msg[1])
        fn = _MINE.get(msg[2]) if msg[2] is not None else _IO["fn"]
        reply = _reply(lambda: fn(*msg[3], **msg[4]), msg[3])
    else:
        _IO["ids"].append(msg[1])
        reply = _reply(lambda: next(_MINE[msg[2]]), ())
    try:
        _send_reply(*reply)
    except (NotPlainData, ValueError, RecursionError) as e:
        why = f"returned a value that cannot cross to the tests' process: {e}"[:500]
        _send_reply("raised", "builtins", "TypeError", (why,))
    finally:
        _IO["ids"].pop()


def _reply(run, args):
    """The frame answering one call: its plain value; which argument it returned (``return
    self``); a handle for a callable or iterator it returned; or the raised exception's
    module, name and arguments. With the new state of the arguments (``_effects``)."""
    try:
        value = run()
        effects = _effects(args)
        same = [i for i, a in enumerate(args) if a is value and type(a) not in PLAIN_ATOMS]
        if same:
            return ("argument", same[0], effects)
        if isinstance(value, _TheirFunction):
            return ("theirs", value.handle, effects)
        plain = type(value) in PLAIN_ATOMS or type(value) in PLAIN_CONTAINERS
        if not plain and (callable(value) or hasattr(value, "__next__")):
            _MINE[len(_MINE)] = value
            kind = "iterator" if hasattr(value, "__next__") else "function"
            return (kind, len(_MINE) - 1, effects)
        return ("value", value, effects)
    except Exception as e:
        kind = type(e)
        return ("raised", str(kind.__module__), str(kind.__qualname__), _plain_args(e))
    except BaseException as e:  # SystemExit, KeyboardInterrupt: a failed call, nothing more
        return (
            "raised",
            "builtins",
            "RuntimeError",
            (f"{type(e).__name__}: {preview(e, 500, str)}",),
        )


def _effects(args):
    """``[(index, state)]`` for each positional argument whose state is plain data after the
    call: a list, dict or set itself, or an object's attribute dict (``self.counts = {}``)."""
    out = []
    for i, a in enumerate(args):
        state = a if type(a) in (list, dict, set) else getattr(a, "__dict__", None)
        if type(state) not in (list, dict, set):
            continue
        try:
            check_plain(state)
        except (NotPlainData, RecursionError):
            continue
        out.append((i, state))
    return out


def _plain_args(exc):
    """An exception's arguments if they are plain data, else its message."""
    try:
        check_plain(exc.args)
        encode(exc.args)
        return exc.args
    except Exception:
        return (preview(exc, 500, str),)


def _serve_module(root, audit):
    """Serve the symbol the suite's first message names (see the section comment). Its
    ``sys_path`` entries starting with ``{root}`` are rebased onto this tree. Nothing of the
    tree's output reaches anyone: fds 1 and 2 point at /dev/null once the channel is set up."""
    channel = _Channel()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    _IO.update(channel=channel, rfd=channel.rfd)
    load = _recv_pickle(channel.rfd)
    if load is None:
        return
    _, cid, module, symbol, path = load
    sys.path[:0] = [p.replace("{root}", root, 1) for p in path]
    if audit:
        _install_audit_hook(os.path.realpath(os.getcwd()))
    os.chdir(root)
    try:
        _IO["fn"] = _resolve(module, symbol)
    except BaseException as e:
        channel.send("load_error", cid, f"{type(e).__name__}: {preview(e, 500, str)}")
        return
    channel.send("ready", cid)
    while True:
        msg = _recv_pickle(channel.rfd)
        if msg is None:
            return
        _answer(msg)


def main(argv):
    limits, audit, mode, root = eval(argv[1], {"__builtins__": {}})
    _apply_limits(limits)
    if mode == "script":
        _script(audit)
        return
    if mode == "module":
        _serve_module(root, audit)
        return
    channel = _Channel()
    frame = channel.recv()
    if frame is None:
        return
    _, program, entry = frame
    source_lines = program.splitlines()
    if audit:
        _install_audit_hook(os.path.realpath(os.getcwd()))
    try:
        fn = _load(program, entry)
    except BaseException as e:  # a SyntaxError, NameError or SystemExit while loading
        channel.send("load_error", _describe(e, source_lines))
        return
    channel.send("ready")
    _serve(channel, fn, source_lines)


if __name__ == "__main__":
    main(sys.argv)
