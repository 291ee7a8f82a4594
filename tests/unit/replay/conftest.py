"""Names replay tests import from the scripted server (`support.scripted_openai`); its
`scripted` fixture is in tests/conftest.py."""

from __future__ import annotations

from support.scripted_openai import (  # noqa: F401  (re-exported for tests)
    Script,
    ServerThread,
    digest,
    make_app,
)
from support.scripted_openai import synthetic_states as make_states  # noqa: F401
