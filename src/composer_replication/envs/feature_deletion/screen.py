"""The triviality screen: a deletion is a task only if some of its failing tests fail for
every trivial body, and those tests are what ``fraction`` pays for.

Each trivial body (:data:`TRIVIAL_BODIES`: return ``None``, ``True``, ``False``, ``0``, an
empty string or container, the first argument; raise ``ValueError``, ``TypeError`` or
``KeyError``) replaces the deleted body and runs the deletion's failing tests in the
sandbox (the bodies are ours, so they need not be kept apart from the tests as submissions
are). A test some trivial body passes (``raises(...)``
helpers, ``assert f(x) is None``, ``pytest.raises(TypeError)``) does not measure the feature:
it stays required by ``all_or_nothing`` but is no *strong* target. A deletion with no strong
target is dropped (``trivial``); one with strong targets scores 0 for every trivial body under
either reward, and for any mix of them (``if x: return None`` ... passes only tests some
trivial body passes). The per-body counts are recorded in the task (``screen``).
"""

from __future__ import annotations

from composer_replication.envs.feature_deletion.candidates import STUB, Candidate
from composer_replication.sandbox import pyast

TRIVIAL_BODIES: tuple[str, ...] = (
    "return None",
    "return True",
    "return False",
    "return 0",
    "return ''",
    "return []",
    "return {}",
    "return ()",
    "raise ValueError",
    "raise TypeError",
    "raise KeyError",
)
"""Bodies any policy can write without reading the tests (plus the first argument(s):
:func:`trivial_bodies`)."""


def trivial_bodies(deleted_text: str, cand: Candidate) -> list[str]:
    """:data:`TRIVIAL_BODIES` and ``return <first parameter>`` (for a method also the one after
    ``self``/``cls``)."""
    from composer_replication.envs.feature_deletion.forward import function_at

    node = function_at(pyast.parse(deleted_text), cand)
    params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
    firsts = [f"return {p}" for p in params[: 2 if "." in cand.symbol else 1]]
    return [*TRIVIAL_BODIES, *firsts]


def with_body(deleted_text: str, cand: Candidate, body: str) -> str:
    """The target file at the task's state with the stub replaced by one line ``body``."""
    lines = deleted_text.splitlines()
    line = cand.body_start - 1
    if line >= len(lines) or lines[line] != cand.indent + STUB:
        raise ValueError(f"{cand.key}: no deletion stub at line {cand.body_start}")
    lines[line] = cand.indent + body
    return "\n".join(lines) + ("\n" if deleted_text.endswith("\n") else "")


def dispatch_text(deleted_text: str, cand: Candidate, bodies: list[str]) -> str:
    """The target file with the stub replaced by every body, chosen at call time by
    ``_cr_screen.BODY[0]`` (``run_suite(screen=len(bodies))`` runs each test once per body)."""
    lines = ["_cr_b = __import__('_cr_screen').BODY[0]"]
    lines += [f"if _cr_b == {i}: {body}" for i, body in enumerate(bodies)]
    return with_body(deleted_text, cand, ("\n" + cand.indent).join(lines))


SCREEN_CHUNK = 40
"""Failing tests per screening run (each runs once per body: a long parametrized suite in one
run could pass the suite's timeout)."""


def run_screen(run, deleted_text: str, cand: Candidate, failing: list[str]) -> dict | None:
    """``{"bodies": {body: tests it passed}, "strong": [...]}``, or None if a screening run
    did not finish (the deletion is then no task: ``screen_failed``, never taken for trivial).
    ``run(text, tests, n)`` runs ``tests`` once per body on the target file ``text`` and
    returns test id -> bits (``SuiteReport.screened``), or None for a broken run."""
    bodies = trivial_bodies(deleted_text, cand)
    text = dispatch_text(deleted_text, cand, bodies)
    bits: dict[str, str] = {}
    for i in range(0, len(failing), SCREEN_CHUNK):
        got = run(text, failing[i : i + SCREEN_CHUNK], len(bodies))
        if got is None:
            return None
        bits.update(got)
    # a test the screening run did not report proves nothing: taken as passed by every body
    passed = {b: sorted(t for t in failing if bits.get(t, "1" * len(bodies))[i] != "0")
              for i, b in enumerate(bodies)}  # fmt: skip
    strong = [t for t in failing if not any(t in p for p in passed.values())]
    return {"bodies": passed, "strong": strong}
