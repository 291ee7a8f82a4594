"""Helpers of the distillation tests: tiny student/teacher model directories sharing the
embedded tokenizer, one with another tokenizer, and ``composer-replication serve`` run as a
real process on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from support.tiny_run import save_tiny_model


def tiny_student_and_teacher(root: Path) -> tuple[Path, Path]:
    """Two differently seeded 2-layer Llamas over the embedded tokenizer."""
    return save_tiny_model(root / "student", seed=0), save_tiny_model(root / "teacher", seed=1)


def other_tokenizer_model(root: Path) -> Path:
    """A tiny model directory whose tokenizer has one extra token (another vocabulary)."""
    from composer_replication.lm.models import DEFAULT_MODEL, load_tokenizer

    out = save_tiny_model(root / "other", seed=2)
    tok = load_tokenizer(DEFAULT_MODEL)
    tok.add_tokens(["<not-in-the-student>"])
    tok.save_pretrained(out)
    return out


def train_overrides(out: Path, *extra: str) -> list[str]:
    """Two steps of 2 prompts x 2 rollouts of 4 tokens, no evaluation."""
    return [
        f"output_dir={out}",
        "max_steps=2",
        "num_threads=1",
        "optim.warmup_steps=0",
        "optim.learning_rate=1e-3",
        "generation.num_generations=2",
        "generation.prompts_per_step=2",
        "generation.max_completion_length=4",
        "env.num_train=8",
        "eval.before_and_after=false",
        *extra,
    ]


def train_one_step(run_dir: Path, tokenizer, student: Path, *extra: str):
    """Build the trainer for one step of ``train_overrides`` + ``extra`` on the ``student``
    directory, train it, and return ``(trainer, the step's metrics row)``."""
    from composer_replication.config import load_config
    from composer_replication.lm.models import load_model
    from composer_replication.run.train import build_env, build_trainer
    from composer_replication.trainer.callbacks import read_metrics

    cfg = load_config(
        None, train_overrides(run_dir, f"model.name={student}", "max_steps=1", *extra)
    )
    trainer = build_trainer(cfg, load_model(str(student)), tokenizer, build_env(cfg))
    trainer.train()
    return trainer, read_metrics(f"{cfg.output_dir}/metrics.jsonl")[0]


@contextlib.contextmanager
def socket_closed_port():
    """A 127.0.0.1 port nothing listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """``composer-replication serve --model DIR`` in a child process, until the block ends."""

    def __init__(self, model_dir: Path, name: str = "teacher"):
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.cmd = [sys.executable, "-m", "composer_replication.cli", "serve", "--model",
                    str(model_dir), "--port", str(self.port), "--served-model-name", name]  # fmt: skip

    def __enter__(self) -> ServeProcess:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300  # start-up on a loaded 2-core machine
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.proc.stdout.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("serve did not answer within 300 s")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
