"""Fixtures for the SQL relation tests (helpers live in relation_rows.py)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import pytest
from relation_rows import RawRows, all_marts, scenario_rows, scenario_snapshots, store_from_pb

from audit._store import Store


@pytest.fixture(scope="session")
def empty_store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new store, closed: its relations built over empty tables (what every new store does
    first, about 2 s), to be copied rather than rebuilt."""
    path = tmp_path_factory.mktemp("empty") / "audit.duckdb"
    Store(path).close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == [path.name], files
    return path


@pytest.fixture
def make_store(tmp_path: Path, empty_store_file: Path) -> Iterator[Callable[..., Store]]:
    """Build a store from RawRows (optionally appended in several batches), each a copy of the
    new empty store, with the partitioning given (else a new store's)."""
    stores: list[Store] = []

    def build(*batches: RawRows, name: str = "audit.duckdb",
              partitioning: dict[str, float] | None = None) -> Store:
        if not (tmp_path / name).exists():
            shutil.copyfile(empty_store_file, tmp_path / name)
        store = Store(tmp_path / name, partitioning=partitioning)
        stores.append(store)
        for rows in batches:
            spans, events = rows.tables()
            store.append(spans=spans, events=events)
        return store

    yield build
    for store in stores:
        store.close()


@pytest.fixture(scope="session")
def all_captures_store(captures: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One store holding every OTLP capture."""
    store = store_from_pb(
        tmp_path_factory.mktemp("captures") / "all.duckdb",
        sorted((captures / "otlp").glob("*.pb")),
    )
    yield store
    store.close()


@pytest.fixture(scope="session")
def scenario_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One store holding every hand-built scenario of relation_rows.scenario_rows()."""
    store = Store(tmp_path_factory.mktemp("scenarios") / "scenarios.duckdb")
    spans, events = scenario_rows().tables()
    store.append(spans=spans, events=events, snapshots=scenario_snapshots())
    yield store
    store.close()


@pytest.fixture(scope="session")
def scenario(scenario_store: Store) -> dict[str, pl.DataFrame]:
    return all_marts(scenario_store)
