"""Hidden tests that are hidden: the agent's workspace holds the visible target tests, and the
hidden ones exist only in the grading copy.

Before (issue 37's red-team pass) every test was in the workspace, hidden ones included, so a
lookup table built from them scored 1.0. Now:

* **The split is by test function**, not by test id: the parameters of one ``def`` share its
  code and its data, so a function is visible or hidden as a whole (:func:`split_visible`).
  A task with more than one target function keeps at least one hidden.
* **The workspace loses the hidden functions** (:func:`hide_tests`): each is replaced by
  ``pass`` (decorators included), then what only the removed code used goes too (the
  ``CASES = [...]`` table a parametrize read, private helpers, fixtures, a class's tables and
  helper methods), unless the tests that stay, the task's other test files or the conftests
  above reach it, or pytest calls it by name (``setUp``); test data that only hidden tests
  opened in the baseline run is left out of the workspace.
* A hidden test whose code cannot be located as a ``def`` (generated, inherited, a doctest),
  that a test staying calls, or that a class inherits (here or in another test module)
  becomes visible: the task records the real split (``visible_tests``/``hidden_tests``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from composer_replication.envs.base import unit_hash
from composer_replication.sandbox import pyast

_PARAMS = re.compile(r"\[.*\]$", re.S)


def def_of_test(test_id: str) -> str:
    """The test function of a test id: ``file::Class::name`` without parameters."""
    return _PARAMS.sub("", test_id)


def split_visible(failing: list[str], visible_defs: int) -> tuple[list[str], list[str]]:
    """(visible, hidden) test ids: ``visible_defs`` test functions chosen by a stable hash,
    at most all but one when there are several."""
    defs = sorted({def_of_test(t) for t in failing}, key=lambda d: unit_hash("visible:" + d))
    n = min(visible_defs, len(defs) - 1) if len(defs) > 1 else 1
    shown = set(defs[:n])
    visible = sorted(t for t in failing if def_of_test(t) in shown)
    return visible, sorted(set(failing) - set(visible))


def _locate(tree: ast.Module, parts: list[str]) -> ast.stmt | None:
    scope: list[ast.stmt] = tree.body
    node = None
    for i, name in enumerate(parts):
        last = i == len(parts) - 1
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        node = next((n for n in scope if isinstance(n, kinds) and n.name == name), None)
        if node is None:
            return None
        scope = getattr(node, "body", [])
    return node


def _names_loaded(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }


def hide_in_file(
    text: str,
    defs: Iterable[str],
    used_elsewhere: Iterable[str] = (),
    keep: Iterable[str] = (),
    class_keep: dict[str, set[str]] | None = None,
) -> tuple[str, list[str]]:
    """``text`` (a test module) without the test functions ``defs`` (``Class::name`` or
    ``name``) and what only they used: module-level assignments, helper functions and
    fixtures (named as parameters), and in a class that lost a test its attributes and helper
    methods (``self.CASES``); returns the new text and the defs that could not be found or
    stay because a test that stays calls them or a class inherits them (here, or elsewhere:
    a class ``used_elsewhere`` names keeps its tests) (``missing``: they are visible tests).
    ``used_elsewhere``: names other files reach (:func:`_names_used` of a conftest whose
    fixture requests this module's override, of a module subclassing a class here): they
    stay. Never removed either: what pytest or unittest call by name (``setUp``,
    ``setup_method``, ``pytestmark``, dunders), since they run for the tests that stay.
    ``keep``: fixture names the tests staying in the file got in the baseline run (they stay);
    ``class_keep``: the same per top-level class (testcode.kept_fixtures): when given, a
    fixture of a class stays only if the class, its bases or subclasses, the module's code
    outside the other classes or another file reach it (another class's fixture of the same
    name, ``cases``, would keep the hidden test's expected values)."""
    tree = pyast.parse(text)
    lines = text.splitlines()
    missing, found = [], {}
    for d in defs:
        node = _locate(tree, d.split("::"))
        if node is None:
            missing.append(d)
        else:
            found[d] = node
    while True:  # a hidden test sharing a table, helper or fixture that stays: visible
        out = _hide_found(tree, lines, found, missing, used_elsewhere, keep, class_keep)
        shared = _sharing(found, pyast.parse("\n".join(out)))
        if not shared:
            return "\n".join(out) + ("\n" if text.endswith("\n") else ""), missing
        missing += shared
        found = {d: n for d, n in found.items() if d not in shared}


def _hide_found(tree, lines, found, missing, used_elsewhere, keep, class_keep) -> list[str]:
    """The lines of the module without the defs ``found`` and what only they used
    (:func:`hide_in_file`); those a test staying calls or a class inherits move from
    ``found`` to ``missing`` (both changed in place)."""
    inherited, elsewhere = _inherited(tree), set(used_elsewhere) | set(keep)
    while True:  # a test that a test staying calls (toolz: test_is_partial calls test_is_valid)
        spans = [(_first_line(n), n.end_lineno or n.lineno, n.col_offset) for n in found.values()]
        out = _blank(lines, spans)
        kept = pyast.parse("\n".join(out))
        used = _names_used(kept, loads_only=True) | elsewhere
        called = [
            d
            for d, n in found.items()
            if n.name in used or d in inherited or d.partition("::")[0] in elsewhere
        ]  # a class another module subclasses
        if not called:
            break
        missing += called  # stays, and is visible (generate.py's unremovable)
        for d in called:
            del found[d]  # in place: the caller's view
    removed = list(found.values())
    owners = {d.split("::")[0] for d in found if "::" in d}
    used_by_removed = set().union(*(_names_used(n) for n in removed)) if removed else set()
    for _ in range(5):  # a table another table (or a helper) was built from goes in a next round
        kept = pyast.parse("\n".join(out))
        used = _names_used(kept, loads_only=True) | elsewhere
        extra = []
        scopes = [(kept.body, None)] + [(n.body, n.name) for n in kept.body
                                        if isinstance(n, ast.ClassDef) and n.name in owners]  # fmt: skip
        for node, cls in ((n, c) for scope, c in scopes for n in scope):
            names = {n for n in _assigned(node) | _helper_name(node, cls is not None)
                     if not _implicit(n)}  # fmt: skip
            reach = used
            if cls is not None and class_keep is not None and _is_fixture(node):
                reach = _class_reach(kept, cls, set(used_elsewhere), class_keep)
            if names and names & used_by_removed and not names & reach:
                extra.append((_first_line(node), node.end_lineno or node.lineno, node.col_offset))
                used_by_removed |= _names_used(node)
        if not extra:
            break
        out = _blank(out, extra)
    return out


def _sharing(found: dict[str, ast.stmt], kept: ast.Module) -> list[str]:
    """The hidden defs of ``found`` whose code or ``parametrize`` arguments reach data the
    workspace keeps (issue 55: a lookup table copied from a table a visible test is
    parametrized over too scored 1.0): a module-level assignment of data (a literal
    collection or comprehension, a string or a number: ``CASES = [...]``), one of the def's
    class (or a base or subclass: ``self.CASES``), or a kept helper, fixture or class there
    that reaches such data or returns a literal collection. Imports, marks and setup values
    (``np = pytest.importorskip(...)``, a fixture returning a client) do not count."""
    classes = {n.name: n for n in kept.body if isinstance(n, ast.ClassDef)}
    out = []
    for d, node in found.items():
        owner = d.split("::")[0] if "::" in d else None
        scopes = [kept.body] + [classes[c].body for c in _related(classes, owner)]
        if _reached_by_test(node) & _data_names([n for scope in scopes for n in scope]):
            out.append(d)
    return sorted(out)


def _data_names(nodes: list[ast.stmt]) -> set[str]:
    """The names of ``nodes`` (a scope's statements) that hold data (:func:`_sharing`)."""
    data = {name for n in nodes if _holds_data(getattr(n, "value", None))
            for name in _assigned(n) if not _implicit(name)}  # fmt: skip
    callables = [n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                 ast.ClassDef)) and not n.name.lower().startswith("test")]  # fmt: skip
    for _ in range(3):  # a helper calling a helper that reads a table
        data |= {n.name for n in callables if _names_used(n, loads_only=True) & data
                 or (_is_fixture(n) and _returns_collection(n))}  # fmt: skip
    return data


def _returns_collection(node: ast.AST) -> bool:
    kinds = (ast.Return, ast.Yield)
    return any(isinstance(n, kinds) and _holds_data(n.value) and not isinstance(n.value,
               ast.Constant) for n in ast.walk(node))  # fmt: skip


def _related(classes: dict[str, ast.ClassDef], cls: str | None) -> set[str]:
    """``cls`` with its bases and subclasses among ``classes`` (by name), if it is one."""
    if cls not in classes:
        return set()
    bases = {c: {b.id for b in n.bases if isinstance(b, ast.Name) and b.id in classes}
             for c, n in classes.items()}  # fmt: skip
    related = {cls}
    for step in (lambda c: bases[c], lambda c: {s for s, b in bases.items() if c in b}):
        todo = [cls]
        while todo:  # ancestors, then descendants
            more = step(todo.pop()) - related
            related |= more
            todo += more
    return related


def _holds_data(value: ast.AST | None) -> bool:
    """A literal collection or comprehension anywhere in ``value``, or ``value`` itself a
    string, bytes or number constant."""
    if value is None:
        return False
    if isinstance(value, ast.Constant):
        return isinstance(value.value, (str, bytes, int, float, complex))
    kinds = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp,
             ast.GeneratorExp)  # fmt: skip
    return any(isinstance(n, kinds) for n in ast.walk(value))


def _reached_by_test(node: ast.stmt) -> set[str]:
    """What a test def reaches from its body and its ``parametrize`` arguments (not from
    other decorators: a ``skipif`` mark is no data)."""
    out: set[str] = set()
    for stmt in getattr(node, "body", []):
        out |= _names_used(stmt, loads_only=True)
    local = {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    out -= local  # a local variable named like a kept fixture is not that fixture
    for d in getattr(node, "decorator_list", []):
        func = d.func if isinstance(d, ast.Call) else d
        if (
            isinstance(d, ast.Call)
            and getattr(func, "attr", getattr(func, "id", "")) == "parametrize"
        ):
            for arg in [*d.args, *(k.value for k in d.keywords)]:
                out |= _names_used(arg)
    return out


def _is_fixture(node: ast.stmt) -> bool:
    return any("fixture" in _names_loaded(d) for d in getattr(node, "decorator_list", []))


def _class_reach(
    tree: ast.Module, cls: str, elsewhere: set[str], class_keep: dict[str, set[str]]
) -> set[str]:
    """The names that may request a fixture of the top-level class ``cls``: the module's code
    but the bodies of unrelated classes (a fixture of a class serves the tests of the class,
    of its bases' tests it inherits and of its subclasses) and the module's fixtures (one
    requesting ``cases`` gets this class's only for a test of the class, whose closure then
    holds it), the other files' names, and the fixtures the kept tests of those classes got
    (``class_keep``: each test's whole closure)."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    related = _related(classes, cls) or {cls}
    out = set(elsewhere)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name not in related or _is_fixture(node):
            continue
        out |= _names_used(node, loads_only=True)
    for c in related:
        out |= class_keep.get(c, set())
    return out


def _inherited(tree: ast.Module) -> set[str]:
    """``Base::test_x`` for each test a class of this module inherits from a base class here
    without defining it (toolz's ``TestCustomMapping(TestDict)``): removing the base's test
    would remove the subclass's too, which may be a visible test."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out: set[str] = set()
    for cls in classes.values():
        own = {m.name for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        bases = [b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in classes]
        seen = {cls.name}
        while bases:
            base = classes[bases.pop()]
            if base.name in seen:
                continue
            seen.add(base.name)
            out |= {f"{base.name}::{m.name}" for m in base.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and m.name not in own}  # fmt: skip
            bases += [b.id for b in base.bases if isinstance(b, ast.Name) and b.id in classes]
    return out


def _names_used(tree: ast.AST, loads_only: bool = False) -> set[str]:
    """Names ``tree`` may reach: names (loaded only, with ``loads_only``), attributes,
    parameter names (a fixture is named as one) and string constants (``usefixtures("x")``,
    ``getattr(self, "x")``)."""
    out = _names_loaded(tree) if not loads_only else set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) < 200:
            out.add(n.value)
    return out


def _helper_name(node: ast.stmt, in_class: bool) -> set[str]:
    """The names of a helper that may go with the hidden tests, else nothing: never a test or
    an autouse fixture (it runs for the tests that stay); at module level only a fixture or
    a private helper (``_expect``), since a public one may be imported by another test
    module, which this file does not see. A fixture renamed by ``name="x"`` has both names
    (a test that stays requests it as ``x``)."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return set()
    if node.name.lower().startswith("test"):
        return set()
    keywords = [k for d in node.decorator_list for k in ast.walk(d) if isinstance(k, ast.keyword)]
    if any(k.arg == "autouse" for k in keywords):
        return set()
    if not (in_class or _is_fixture(node) or node.name.startswith("_")):
        return set()
    renamed = {k.value.value for k in keywords if k.arg == "name"
               and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)}  # fmt: skip
    return {node.name} | renamed


_CALLED_BY_NAME = {"setUp", "tearDown", "setUpClass", "tearDownClass", "asyncSetUp",
                   "asyncTearDown", "setup_method", "teardown_method", "setup_class",
                   "teardown_class", "setup", "teardown", "setup_module", "teardown_module",
                   "setup_function", "teardown_function", "setUpModule", "tearDownModule",
                   "pytestmark", "maxDiff", "longMessage"}  # fmt: skip


def _implicit(name: str) -> bool:
    """A name pytest or unittest reaches without the tests naming it (a hook, a mark)."""
    return (name in _CALLED_BY_NAME or name.startswith("pytest_")
            or (name.startswith("__") and name.endswith("__")))  # fmt: skip


def _first_line(node: ast.stmt) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _assigned(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    else:
        return set()
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _blank(lines: list[str], spans: list[tuple[int, int, int]]) -> list[str]:
    """``lines`` with each span (1-based, inclusive) replaced by one ``pass`` at its
    indentation (a class body or an ``if`` block stays valid)."""
    out = list(lines)
    for first, last, col in sorted(spans, reverse=True):
        out[first - 1 : last] = [" " * col + "pass"]
    return out


def hide_tests(
    read, hidden: list[str], others: Iterable[str] = (), keep: dict[str, list[str]] | None = None
) -> tuple[dict[str, str], list[str]]:
    """Per test file, its text without the hidden test functions; ``read(rel)`` gives a file's
    text. ``others`` (the task's ``test_files``) and the ``conftest.py`` files above a test
    file are read for the names they reach, which stay in that file (:func:`hide_in_file`);
    ``keep``: per file, names that stay too (the fixtures the tests staying there got in the
    baseline run, testcode.kept_fixtures: a plugin's mark requests a fixture no file names),
    and per ``file::Class`` those of the class's staying tests (a class's fixtures then stay
    only for the tests that can get them; a set without these keys keeps them by name).
    Returns ({file: new text}, hidden test ids that could not be removed)."""
    by_file: dict[str, set[str]] = {}
    for t in hidden:
        file, _, rest = def_of_test(t).partition("::")
        by_file.setdefault(file, set()).add(rest)
    texts, missing = {}, []
    names: dict[str, set[str]] = {}  # each other file's names, read once for every file

    def reached(rel: str) -> set[str]:
        if rel not in names:
            names[rel] = _used_by(read, [rel], by_file)
        return names[rel]

    for file, defs in sorted(by_file.items()):
        try:
            elsewhere = set().union(
                *(reached(rel) for rel in sorted({*others, *_conftests_above(file)} - {file}))
            )
            scoped = {k[len(file) + 2 :]: set(v) for k, v in (keep or {}).items()
                      if k.startswith(file + "::")}  # fmt: skip
            new, lost = hide_in_file(read(file), sorted(defs), elsewhere,
                                     (keep or {}).get(file, ()), scoped or None)  # fmt: skip
        except (OSError, SyntaxError, ValueError):
            new, lost = None, sorted(defs)
        if new is not None:
            texts[file] = new
        missing += [t for t in hidden if t.startswith(file + "::") and
                    def_of_test(t).partition("::")[2] in lost]  # fmt: skip
    return texts, sorted(missing)


def _conftests_above(file: str) -> list[str]:
    parts = file.split("/")[:-1]
    return ["/".join([*parts[:i], "conftest.py"]) for i in range(len(parts) + 1)]


def _used_by(read, files: Iterable[str], by_file: dict[str, set[str]]) -> set[str]:
    """The names ``files`` reach as the workspace holds them (less their own hidden tests);
    a file that cannot be read or parsed adds nothing."""
    out: set[str] = set()
    for rel in sorted(files):
        try:
            text = read(rel)
            if rel in by_file:
                text = hide_in_file(text, sorted(by_file[rel]))[0]
            out |= _names_used(pyast.parse(text), loads_only=True)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            continue
    return out
