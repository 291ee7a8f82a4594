"""Every module path the README and docs/ give resolves: ``python -m X`` runs (a module, or a
package with a ``__main__``), ``from X import A, B`` imports, and a ``module:function``
entry point names a function. Migration tables (old paths on purpose) are left out."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = r"composer_replication(?:\.\w+)*"
RUN = re.compile(rf"python -m ({PKG})")
FROM = re.compile(rf"from ({PKG}) import (\([^)]*\)|[\w, ]+)")
ENTRY = re.compile(rf"({PKG}):(\w+)")


def doc_texts() -> dict[str, str]:
    """README.md and docs/*.md, each without its migration sections."""
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return {p.relative_to(REPO).as_posix(): without_migrations(p.read_text()) for p in paths}


def without_migrations(text: str) -> str:
    """``text`` less every section whose heading names a migration (to the next heading of
    the same or a higher level)."""
    out, skip_level = [], 0
    for line in text.splitlines():
        heading = re.match(r"(#+) ", line)
        if heading and skip_level and len(heading.group(1)) <= skip_level:
            skip_level = 0
        if heading and "migration" in line.lower():
            skip_level = len(heading.group(1))
        if not skip_level:
            out.append(line)
    return "\n".join(out)


def _runnable(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    if spec is None:
        return False
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        return importlib.util.find_spec(module + ".__main__") is not None
    return True


def _missing_names(module: str, names: str) -> list[str]:
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return [f"({e})"]
    wanted = [n.strip() for n in names.strip("()").replace("\n", ",").split(",")]
    return [n for n in wanted if n and not n.startswith("#") and not hasattr(mod, n)]


def test_the_migration_sections_are_left_out():
    text = "# A\nkeep\n## Migration from x\nold\n### detail\nold too\n## B\nkept\n"
    assert without_migrations(text) == "# A\nkeep\n## B\nkept"


def test_every_module_the_docs_run_or_import_resolves():
    bad = []
    for doc, text in doc_texts().items():
        for module in sorted(set(RUN.findall(text))):
            if not _runnable(module):
                bad.append(f"{doc}: python -m {module} does not run")
        for module, names in sorted(set(FROM.findall(text))):
            if missing := _missing_names(module, names):
                bad.append(f"{doc}: from {module} import {', '.join(missing)}: not there")
        for module, name in sorted(set(ENTRY.findall(text))):
            if missing := _missing_names(module, name):
                bad.append(f"{doc}: entry point {module}:{name} is not there")
    assert bad == []
