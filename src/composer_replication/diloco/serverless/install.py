"""Where a remote replica installs composer-replication from: a wheel or a project directory on
this machine, or a pip-installable URL the user gives (``https://.../x.whl``,
``git+https://...``). Never a bare package name: the remote gets this project, the version
the user chose, as a PEP 508 direct reference (``composer-replication[...] @ URL``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DIST_NAME = "composer-replication"
EXTRAS = "diloco,serverless"
REMOTE_DIR = "/opt/composer-replication"


@dataclass(frozen=True)
class ProjectSource:
    """``kind`` is ``wheel`` / ``dir`` (``local`` is set) or ``url`` (``url`` is set)."""

    kind: str
    local: Path | None = None
    url: str | None = None

    def remote_path(self) -> str:
        """Where a local wheel or directory lands on the remote machine."""
        assert self.local is not None
        return f"{REMOTE_DIR}/{self.local.name if self.kind == 'wheel' else 'project'}"

    def requirement(self, remote_path: str | None = None) -> str:
        """The pip requirement that installs this project with its serverless extras."""
        where = self.url if self.kind == "url" else f"file://{remote_path or self.remote_path()}"
        return f"{DIST_NAME}[{EXTRAS}] @ {where}"


def project_source(project: str | Path) -> ProjectSource:
    """Check and classify what the user gave as ``project`` (a clear error otherwise)."""
    text = str(project)
    if "://" in text:
        return ProjectSource("url", url=text)
    path = Path(text).expanduser().resolve()
    if path.is_file() and path.suffix == ".whl":
        return ProjectSource("wheel", local=path)
    if path.is_dir() and (path / "pyproject.toml").is_file():
        return ProjectSource("dir", local=path)
    raise ValueError(
        f"project={text!r}: expected a wheel file (.whl, e.g. from `python -m pip wheel "
        "--no-deps -w dist .`), a project directory with pyproject.toml, or a pip URL "
        "(https://.../x.whl, git+https://...)"
    )
