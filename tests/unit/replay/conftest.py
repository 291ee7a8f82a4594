"""Fixtures for replay tests: the scripted server from `support.scripted_openai`."""

from __future__ import annotations

import pytest
from support.scripted_openai import (  # noqa: F401  (re-exported for tests)
    Script,
    ServerThread,
    digest,
    make_app,
)
from support.scripted_openai import synthetic_states as make_states  # noqa: F401


@pytest.fixture
def scripted():
    """Yield ``(script, base_url)``; mutate ``script`` to inject faults."""
    script = Script()
    with ServerThread(make_app(script)) as srv:
        yield script, srv.base_url
