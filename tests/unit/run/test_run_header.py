"""The run header's channel list (run/train.py: run_header): what trains, with its weights."""

import pytest

from composer_replication.config import load_config
from composer_replication.run.train import run_header


@pytest.mark.parametrize(
    ("overrides", "channels"),
    [
        ([], "grpo (dapo)"),
        (["sdpo.weight=0.5"], "grpo (dapo) + sdpo 0.5"),
        (["grpo.weight=0.5", "sdpo.weight=0.1"], "grpo (dapo) 0.5 + sdpo 0.1"),
        (["grpo.weight=0", "sdpo.weight=1"], "sdpo 1"),
    ],
)
def test_header_names_the_channels_that_train(overrides, channels):
    rows = dict(run_header(load_config(None, overrides)))
    assert rows["channels"] == channels
