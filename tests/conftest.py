"""Shared fixtures: free loopback ports, temporary stores, the committed real captures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import duckdb
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``-n N --dist loadgroup``, every test of a module that has a module-scoped fixture
    goes to one xdist group named after the module, so the fixture (often a whole store built
    by many refreshes) is built once, not once per worker. Runs before xdist names the groups."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(autouse=True, scope="session")
def _one_duckdb_thread_per_xdist_worker() -> Iterator[None]:
    """Under xdist the workers already keep every core busy: a store opened without ``threads``
    gets one DuckDB thread instead of one per core (the same refreshes took 13-15 % less CPU
    measured alone). Stores given ``threads`` keep theirs (set after this)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    from audit import _store

    original = _store._tune

    def tune(con: duckdb.DuckDBPyConnection) -> None:
        original(con)
        con.execute("set threads = 1")

    _store._tune = tune
    try:
        yield
    finally:
        _store._tune = original
