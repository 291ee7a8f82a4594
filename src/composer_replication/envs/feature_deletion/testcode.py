"""What in a source tree is test code, decided from what pytest collected and what the
baseline run opened and called (``run_suite(probe=True)``), never from file names alone.

Red-team pass (issue 37): deciding by name let test code in other layouts (``<pkg>/tests.py``,
a root ``test.py``, a ``python_files`` setting) become tasks themselves and stay readable by
the graded function; an assertion helper inside the package (toolz's ``utils.raises``) became
a task that ``return True`` passed; test data outside a test folder stayed in the served tree.

* **Test files**: the files pytest collected items from, the conftests it loaded, the tree's
  files matching its ``python_files`` setting, every ``conftest.py``, and the conventional
  names (``candidates.is_test_path``), whichever says more.
* **Test helpers**: functions of the tree outside the test files that the baseline reached
  only from test code and that call test code back (toolz's ``utils.raises(err, lambda:
  ...)`` runs the test's lambda), with the functions only they reach; not if the package
  exports them (a package's namespace or a module's ``__all__``, or a method of a class that
  is). A profile hook records, per function, the nearest function of the tree up the stack
  that called it. An assertion helper that does not call back (``assert_close(a, b)``) looks
  like a feature of a submodule only tests use (``roman(n)``) to the call graph; the
  triviality screen (``screen.py``) tells them apart by behaviour: ``return None`` passes
  every test of an assertion helper, so it is never a task.
* **Test data**: files (not Python modules) that test code opened during the baseline (an
  audit hook records each open with the nearest frame of the tree and the running test), and
  every file in a test directory (one holding collected test files and no other module).
* **The served tree** (split grading's submission side): the tree's modules that package
  code imported or called into during the baseline (:func:`_needed`), their packages'
  ``__init__.py``, the target file, and the files only that code opened. Nothing else: no
  test, helper module only tests use, configuration or test data. (A module a test imported
  first and package code used only for constants is missed; a task in a module that needs
  it then fails the generator's forwarding check: lost, never served wrongly.)
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from composer_replication.envs.feature_deletion.candidates import is_test_path
from composer_replication.envs.feature_deletion.hidden import def_of_test


@dataclass(frozen=True)
class TestCode:
    """The test code of a tree (module docstring); every path relative and posix."""

    __test__ = False  # a dataclass named Test*: not a pytest test class

    test_files: list[str]
    test_dirs: list[str]
    helpers: list[str]
    """``file::qualname`` of the test helpers."""
    test_data: list[str]
    served: list[str]
    """The files the submission's sandbox gets."""
    data_by_test: dict[str, list[str]] = field(default_factory=dict)
    """Test data file -> the test ids that opened it ('' for opens outside a test)."""
    fixtures_by_test: dict[str, list[str]] = field(default_factory=dict)
    """Test function (``file::Class::name``, parameters merged) -> the fixtures pytest set up
    for it (its closure, as collected: those a plugin's mark or hook adds included, which no
    test file names; and what its request set up, ``request.getfixturevalue`` of a name built
    at run time too)."""

    def to_dict(self) -> dict:
        return asdict(self)

    def is_test_file(self, rel: str) -> bool:
        """A test file, or any file under a directory holding collected test files."""
        return rel in self.test_files or _under(rel, self.test_dirs) or is_test_path(rel)


def kept_fixtures(
    fixtures_by_test: dict[str, list[str]], hidden: list[str]
) -> dict[str, list[str]]:
    """Per test file that loses hidden tests, the fixtures the tests staying in it get
    (:attr:`TestCode.fixtures_by_test`): the workspace keeps their definitions though only
    hidden tests name them (a module's ``anyio_backend`` override that a plugin's mark
    requests for the kept tests; hidden.py cannot see plugins). Also per top-level class
    that loses one (``file::Class``, possibly empty), those its staying tests get: a fixture
    of a class stays for them, not for another class's test of a fixture of the same name."""
    gone = {def_of_test(t) for t in hidden}  # a function is hidden whole (hidden.py)
    files = {t.partition("::")[0] for t in gone}
    out: dict[str, set[str]] = {}
    for t in gone:
        file, _, rest = t.partition("::")
        if "::" in rest:
            out.setdefault(f"{file}::{rest.partition('::')[0]}", set())
    for test, names in fixtures_by_test.items():
        file, _, rest = test.partition("::")
        if file in files and test not in gone:
            out.setdefault(file, set()).update(names)
            if "::" in rest:
                out.setdefault(f"{file}::{rest.partition('::')[0]}", set()).update(names)
    return {f: sorted(v) for f, v in sorted(out.items())}


def _under(rel: str, dirs: list[str]) -> bool:
    return any(rel.startswith(d.rstrip("/") + "/") for d in dirs if d)


def _matches(rel: str, patterns: list[str]) -> bool:
    """pytest's ``python_files`` rule: a pattern with a ``/`` matches the path, else the
    file name (``fnmatch``)."""
    name = PurePosixPath(rel).name
    return any(fnmatch.fnmatch(rel if "/" in p else name, p) for p in patterns)


def classify(root: Path, probe: str) -> TestCode:
    """The :class:`TestCode` of the tree ``root`` from a baseline run's probe (JSON text,
    ``SuiteReport.probe``)."""
    root = Path(root)
    data = json.loads(probe)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)  # fmt: skip
    py = [f for f in files if f.endswith(".py")]
    patterns = [p for p in data["python_files"] if isinstance(p, str)]
    tests = set(data["items"]) | set(data["conftests"])
    tests |= {f for f in py if _matches(f, patterns) or PurePosixPath(f).name == "conftest.py"}
    tests |= {f for f in py if is_test_path(f) and not f.endswith(("setup.py", "_version.py"))}
    dirs = sorted(d for d in {str(PurePosixPath(f).parent) for f in data["items"]} - {"."}
                  if all(f in tests for f in py if _under(f, [d])))  # fmt: skip

    def test_code(rel: str) -> bool:
        return rel in tests or _under(rel, dirs)

    helpers = _helpers(data, test_code)
    served_py = {m for m in data["modules"]
                 if m in py and _needed(m, data["calls"], test_code, helpers)}  # fmt: skip
    for m in list(served_py):  # the packages' own __init__.py
        for parent in PurePosixPath(m).parents:
            init = (parent / "__init__.py").as_posix()
            if str(parent) != "." and init in py and not test_code(init):
                served_py.add(init)
    test_data, pkg_data, by_test = set(), set(), {}
    for rel, openers in data["opens"].items():
        if rel not in files or rel.endswith(".py"):
            continue
        who = {w for w, _ in openers}
        if test_code(rel) or any(test_code(w) for w in who) or not who <= served_py:
            test_data.add(rel)
            by_test[rel] = sorted({t for _, t in openers})
        else:
            pkg_data.add(rel)
    test_data |= {f for f in files if _under(f, dirs) and not f.endswith(".py")}
    closures = data.get("closures", [])  # per test function, each distinct closure once
    fixtures = {test: sorted(n for n in closures[i] if isinstance(n, str))
                for test, i in sorted(data.get("fixtures", {}).items())
                if type(i) is int and 0 <= i < len(closures) and isinstance(closures[i], list)}  # fmt: skip
    return TestCode(sorted(tests), dirs, sorted(helpers), sorted(test_data),
                    sorted(served_py | pkg_data), by_test, fixtures)  # fmt: skip


def _file(key: str) -> str:
    return key.partition("::")[0]


def _needed(module: str, calls: dict[str, list[str]], test_code, helpers: set[str]) -> bool:
    """Whether the package needs ``module``: it is no test code, and another module of the
    package (code that is no test helper) imported it (ran its ``<module>`` code) or called a
    function of it, or it is a top-level package's ``__init__.py``. A module only tests
    import and call (an assertion helper module) is not served."""
    if test_code(module):
        return False
    if module.count("/") == 1 and module.endswith("/__init__.py"):
        return True

    def by_package(callers: list[str]) -> bool:  # another module of the package
        return any(c and _file(c) != module and not test_code(_file(c)) and c not in helpers
                   for c in callers)  # fmt: skip

    prefix = module + "::"
    return any(by_package(v) for k, v in calls.items() if k.startswith(prefix) and k not in helpers)


def _helpers(data: dict, test_code) -> set[str]:
    """Test helpers: functions outside test code, not exported, reached only from test code,
    that call test code back (``raises(err, lambda: ...)`` runs the test's lambda), and the
    functions reached only from such helpers (to a fixed point)."""
    exported = set(data["exported"])
    calls = data["calls"]
    calls_back = {c for k, v in calls.items() if test_code(_file(k)) for c in v if c}
    out: set[str] = set()
    while True:
        more = set()
        for key, callers in calls.items():
            file, _, qual = key.partition("::")
            if key in out or test_code(file) or "<" in qual:
                continue
            known = [c for c in callers if c]
            if not known or not all(test_code(_file(c)) or c in out for c in known):
                continue
            if not (key in calls_back or any(c in out for c in known)):
                continue
            owner = f"{file}::{qual.rsplit('.', 1)[0]}" if "." in qual else None
            if key in exported or (owner is not None and owner in exported):
                continue
            more.add(key)
        if not more:
            return out
        out |= more
