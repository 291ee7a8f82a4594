"""The offline GPU kit (bench/gpu_kit, docs/gpu.md): its entry script end to end in CPU smoke
mode against this environment, and the offline parts of the builder (no downloads here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu_kit"))
import build  # noqa: E402 - bench/gpu_kit/build.py


@pytest.mark.timeout(3600)  # ~3 min on an idle 2-core machine; stages slow down under load
def test_smoke_run_writes_every_result(tmp_path):
    """``run.sh OUT --smoke``: every stage (env, tests, losses, step) exits 0 within its
    limit, at most 8 files come back, and both benchmarks' JSON hold real measurements."""
    out = tmp_path / "out"
    env = {**os.environ, **{f"KIT_T_{k}": "1500" for k in ("ENV", "TESTS", "LOSSES", "STEP")}}
    # run.sh's stages use $PYTHON (default: `python3` on PATH): the interpreter running this
    # test, also from a virtual environment that is not activated (issue 55)
    env["PYTHON"] = sys.executable
    proc = subprocess.run(
        ["bash", str(REPO / "bench/gpu_kit/run.sh"), str(out), "--smoke"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3500,
    )
    summary = (out / "summary.txt").read_text()
    logs = {p.name: p.read_text()[-3000:] for p in out.glob("*.log")}
    assert proc.returncode == 0, (summary, logs)
    assert [line.split()[0] for line in summary.splitlines()] == ["env", "tests", "losses", "step"]
    assert len(list(out.iterdir())) <= 8
    losses = json.loads((out / "losses.json").read_text())
    assert {tuple(s["cfg"]) for s in losses["sizes"]} == {(64, 512, 32), (96, 1024, 48)}
    for size in losses["sizes"]:
        assert size["res"]["ours"]["median_ms"] > 0
        assert size["res"]["trl"]["median_ms"] > 0
    fp32 = [a for a in losses["accuracy"] if a["variant"] == "ours" and a["dtype"] == "float32"]
    assert fp32[0]["vs_trl_gw"] < 1e-5
    step = json.loads((out / "step.json").read_text())
    assert set(step["results"]) == {"grpo", "composer"}
    assert all(r[0]["step_s"][0] > 0 for r in step["results"].values())


def test_builder_reads_requirements_and_the_image():
    """What the builder would download: our missing requirements (trl, pydantic, liger-kernel),
    never what the image has (torch, transformers), pinned to the versions tested here."""
    present = build.image_packages()
    assert {"torch", "transformers", "accelerate", "peft", "triton"} <= present
    names = {r.name for r in build.project_requirements()}
    assert {"trl", "pydantic", "datasets", "liger-kernel"} <= names
    assert "composer-replication" not in names
    env = build.target_env("3.12")
    assert build.applies(Requirement("hyperscan>=0.7; platform_machine == 'x86_64'"), env)
    assert not build.applies(Requirement("pywin32; sys_platform == 'win32'"), env)
    import trl

    assert build.pin(Requirement("trl>=1.16,<1.17")) == f"trl=={trl.__version__}"
    assert build.pin(Requirement("trl>=99")) == "trl>=99"


def test_checkout_leaves_room_for_the_kit():
    """The device tool carries checkout + kit in 64 MiB; the kit is ~15 MiB: keep the
    checkout under half of the limit."""
    assert build.checkout_bytes() < build.LIMIT_BYTES // 2


def test_the_kit_runs_the_interpreter_of_its_caller_not_python3_on_path(tmp_path):
    """Issue 55: from a virtual environment that is not activated, ``python3`` on PATH is
    another interpreter (without this environment's packages). With ``PYTHON`` set, as the
    smoke test sets it, the env stage runs ``sys.executable`` even when ``python3`` on PATH
    is broken."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 'not this python' >&2\nexit 3\n")
    (fake / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PYTHON": sys.executable,
           "KIT_SKIP": "tests losses step", "KIT_T_ENV": "500"}  # fmt: skip
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(REPO / "bench/gpu_kit/run.sh"), str(out), "--smoke"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    log = (out / "env.log").read_text()
    assert proc.returncode == 0 and "env rc=0" in (out / "summary.txt").read_text(), log[-2000:]
    assert "composer_replication at" in log and "not this python" not in log


@pytest.mark.parametrize("script", ["run.sh"])
def test_entry_script_parses(script):
    assert subprocess.run(["bash", "-n", str(REPO / "bench/gpu_kit" / script)]).returncode == 0
