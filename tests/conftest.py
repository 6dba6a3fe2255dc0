"""Shared fixtures: free loopback ports, temporary stores, paths to shared captures."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
CAPTURES = SHARED / "captures"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Path of a store file that does not exist yet."""
    return tmp_path / "audit.duckdb"


@pytest.fixture(scope="session")
def captures() -> Path:
    if not CAPTURES.is_dir():
        pytest.skip(f"shared captures not found at {CAPTURES}")
    return CAPTURES
