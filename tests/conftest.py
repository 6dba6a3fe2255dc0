"""Shared fixtures: free loopback ports, temporary stores, paths to shared captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.routers import free_port  # noqa: F401 - the tests' free loopback port

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
CAPTURES = SHARED / "captures"


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Path of a store file that does not exist yet."""
    return tmp_path / "audit.duckdb"


@pytest.fixture(scope="session")
def captures() -> Path:
    if not CAPTURES.is_dir():
        pytest.skip(f"shared captures not found at {CAPTURES}")
    return CAPTURES
