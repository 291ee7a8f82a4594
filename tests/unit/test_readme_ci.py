"""The README's two commands are what CI and users run: keep them in sync with .ci/run."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, re.DOTALL)]


def test_ci_runs_the_readme_test_command_verbatim():
    blocks = _bash_blocks((REPO / "README.md").read_text())
    test_cmd = blocks[1]
    assert "pytest" in test_cmd and "pip install" in test_cmd
    ci_lines = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    assert test_cmd in ci_lines


def test_readme_run_command_installs_and_trains():
    run_cmd = _bash_blocks((REPO / "README.md").read_text())[0]
    assert run_cmd.startswith("pip install torch==2.13.0")
    assert run_cmd.endswith("composer-replication train")


def test_both_installs_use_the_constraints_and_the_pins_fit_the_project():
    """Both README installs go through constraints.txt (one resolution, one transformers for
    both), every line of it is an exact pin, and each pin satisfies what pyproject.toml asks
    of that package (a pin the project excludes would make pip fail to resolve)."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    train_cmd, test_cmd = _bash_blocks((REPO / "README.md").read_text())[:2]
    assert 'pip install -c constraints.txt -e ".[dev]"' in test_cmd
    assert "pip install -c constraints.txt -e . " in train_cmd
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pins = [Requirement(ln) for ln in lines if ln.strip() and not ln.startswith("#")]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in pins)
    pinned = {canonicalize_name(r.name): next(iter(r.specifier)).version for r in pins}
    assert "transformers" in pinned and "boto3" in pinned and "aiobotocore" in pinned
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    dev = [Requirement(r) for r in extras["dev"]]
    installed = {"dev"} | next(r.extras for r in dev if r.name == "composer-replication")
    assert "feature-deletion" in installed and "verl" not in installed  # verl: its own venv
    wanted = [*project["dependencies"], *(r for e in sorted(installed) for r in extras[e])]
    checked = 0
    for req in map(Requirement, wanted):
        name = canonicalize_name(req.name)
        if name in pinned:
            assert req.specifier.contains(pinned[name], prereleases=True), (req, pinned[name])
            checked += 1
    assert checked >= 5  # transformers, trl, s3fs, fsspec, huggingface_hub, moto...
