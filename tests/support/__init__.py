"""Test harnesses shared by unit and integration tests (not part of the package)."""
