"""Harnesses shared by tests and benchmarks, kept out of the library: a toy DiLoCo replica
(`support.diloco_toy`), a scripted OpenAI-compatible server with synthetic trace states
(`support.scripted_openai`) and recording fake Modal / HF Jobs SDKs. ``tests/`` is on
``sys.path`` under pytest (``pythonpath`` in pyproject.toml); benchmarks add it themselves."""
