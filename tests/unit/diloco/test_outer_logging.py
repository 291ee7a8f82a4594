"""On CPU the torchft manager's NCCL flight-recorder notice is filtered; other warnings pass."""

from __future__ import annotations

import logging

from composer_replication.diloco.outer import _NoNcclNotice


def test_only_the_nccl_notice_is_dropped(caplog):
    log = logging.getLogger("torchft.manager.test")
    log.addFilter(_NoNcclNotice())
    with caplog.at_level(logging.WARNING, logger="torchft.manager.test"):
        log.warning("[replica_0 - step 0] Unable to reset NCCL flight recorder recording so traces")
        log.warning("quorum timed out")
    assert [r.getMessage() for r in caplog.records] == ["quorum timed out"]
