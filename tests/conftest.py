"""Shared fixtures: free loopback ports, temporary stores, the committed real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.routers import free_port  # noqa: F401 - the tests' free loopback port

ROOT = Path(__file__).resolve().parent.parent
CAPTURES = ROOT / "tests" / "testdata"
"""Real emitter captures (``otlp/``, ``client/``, ``metrics/``), described in its README."""


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Path of a store file that does not exist yet."""
    return tmp_path / "audit.duckdb"


@pytest.fixture(scope="session")
def captures() -> Path:
    """The captures folder; part of the repository, so its absence is an error, not a skip."""
    assert (CAPTURES / "otlp").is_dir(), f"captures missing from the repository: {CAPTURES}"
    return CAPTURES
