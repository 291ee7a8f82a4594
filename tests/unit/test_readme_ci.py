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
