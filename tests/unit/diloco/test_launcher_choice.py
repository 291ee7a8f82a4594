"""``diloco --launcher``: unknown launchers and conflicting options fail with one line, before
any replica starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from composer_replication.cli import app


@pytest.mark.parametrize(
    "args, message",
    [
        (["--launcher", "ray"], "expected 'subprocess' or 'monarch'"),
        (["--launcher", "monarch", "--executor", "local"], "drop --executor"),
        (["--launcher", "monarch", "--replica-ids", "0"], "drop --executor"),
    ],
)
def test_bad_launcher_choices_fail_fast(args, message, tmp_path):
    r = CliRunner().invoke(app, ["diloco", *args, f"output_dir={tmp_path}/run"])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())
    assert not (tmp_path / "run").exists()


def test_sigterm_during_an_executor_launch_stops_the_replicas(tmp_path):
    """SIGTERM (``timeout``, a job scheduler) while ``launch_with_executor`` waits: it becomes
    the interrupt the executor's ``collect`` already handles by terminating every replica.
    Before, SIGTERM's default action ended the launcher at once and left the replicas running
    (and, here, would have ended the test process)."""
    import os
    import signal
    import time

    from composer_replication.diloco.launcher import launch_with_executor

    class Waiting:
        terminated = False

        def launch_replicas(self, n, entrypoint, args):
            return list(range(n))

        def collect(self, handles, timeout=None):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            except BaseException:
                self.terminated = True
                raise
            return [None for _ in handles]

    ex = Waiting()
    before = signal.getsignal(signal.SIGTERM)
    over = ["diloco.backend=object_store", f"diloco.store_uri=file://{tmp_path / 'store'}",
            f"output_dir={tmp_path / 'run'}"]  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        launch_with_executor(None, over, 2, executor=ex, echo=lambda s: None)
    assert ex.terminated
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
