"""A store left to choose (``incremental=None``) keeps refreshing by slices once partitions have
closed, although the DuckDB tables then hold fewer spans than the threshold: a full rebuild would
re-open every closed partition and undo the closing."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from tiled_sample import batches, new_store, relation_rows, tiled_sample

from audit import _closed, _relations, _store
from audit._store import Store


def _closed_spans(store: Store) -> int:
    files = f"{_closed.folder(store.path)}/raw_spans/part=*/*.parquet"
    return int(duckdb.sql(f"select count(*) from read_parquet('{files}')").fetchall()[0][0])


def test_a_store_with_closed_partitions_keeps_refreshing_by_slices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = batches(tiled_sample(6), seed=3, batches=5)
    monkeypatch.setattr(_store, "INCREMENTAL_MIN_SPANS", 1)
    store = new_store(tmp_path / "s.duckdb", incremental=None)
    try:
        kinds = []
        closes: list[tuple[float, float]] = []  # (close, its refresh) when partitions moved
        for batch in parts[:-1]:
            store.append(spans=batch["spans"], events=batch["events"], snapshots=batch["snapshots"])
            before = _closed.closed_until(store._con)
            store.refresh()
            kinds.append(store.last_refresh_kind)
            if _closed.closed_until(store._con) != before:
                assert store.last_close_s is not None
                closes.append((store.last_close_s, store.last_refresh_s))
        assert set(kinds) <= {"slice", "none"}, kinds
        assert _closed.closed_until(store._con) is not None, "partitions closed"
        # how long each move took is told, as part of its refresh
        assert closes and all(0 < c <= r for c, r in closes), closes
        # the store has grown past the threshold, but its DuckDB tables now hold fewer spans
        # than it: only the closed partitions' files have the rest
        last = parts[-1]
        hot = store._con.execute("select count(*) from raw_spans").fetchall()[0][0]
        total = hot + _closed_spans(store)
        threshold = hot + last["spans"].num_rows + 1
        assert threshold <= total, "the whole store is past the threshold"
        monkeypatch.setattr(_store, "INCREMENTAL_MIN_SPANS", threshold)
        store.append(spans=last["spans"], events=last["events"], snapshots=last["snapshots"])
        store.refresh()
        assert store.last_refresh_kind == "slice"
        assert _closed.closed_until(store._con) is not None
    finally:
        store.close()


def test_a_store_refreshed_by_slices_gets_the_tables_at_the_defaults_once_large(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = tiled_sample(2)
    parts = batches(raw, seed=5, batches=4)
    monkeypatch.setattr(_store, "INCREMENTAL_MIN_SPANS", 1)
    monkeypatch.setattr(_store, "SLICED_CACHE_MIN_SPANS", 10**9)
    store = new_store(tmp_path / "s.duckdb", incremental=None)
    one = new_store(tmp_path / "one.duckdb", incremental=False)
    try:
        cached, kinds = [], []
        for i, batch in enumerate(parts):
            if i == 2:  # this batch takes the store past the size the tables are kept from
                monkeypatch.setattr(_store, "SLICED_CACHE_MIN_SPANS", store._spans_stored + 1)
            store.append(spans=batch["spans"], events=batch["events"], snapshots=batch["snapshots"])
            store.refresh()
            kinds.append(store.last_refresh_kind)
            cached.append(_relations.has_cached(store._con))
        assert set(kinds) <= {"slice", "none"} and kinds[2:4] == ["slice", "slice"], kinds
        assert cached == [False, False] + [True] * (len(parts) - 2)
        one.append(spans=raw["raw_spans"], events=raw["raw_span_events"],
                   snapshots=raw["raw_snapshots"])
        monkeypatch.setattr(_relations, "CACHE_MIN_SPANS", 0)  # the one-shot build caches too
        one.refresh()
        assert _relations.has_cached(one._con)
        # made once over what was stored, then kept by the last slice: as a one-shot build's
        for name in _relations.cached():
            table = name + _relations.CACHE_SUFFIX
            assert relation_rows(store, table) == relation_rows(one, table), table
    finally:
        store.close()
        one.close()


def test_relations_of_another_version_are_rebuilt_whole_at_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a slice would read the stored rows of relations whose columns may have changed
    monkeypatch.setattr(_store, "INCREMENTAL_MIN_SPANS", 1)
    raw = tiled_sample(1)
    path = tmp_path / "s.duckdb"
    store = new_store(path, incremental=None)
    store.append(spans=raw["raw_spans"], events=raw["raw_span_events"])
    store.refresh()
    assert store.last_refresh_kind == "slice"
    store._con.execute("update routeaudit_meta set value = 'older' where key = 'relations_version'")
    store.close()
    reopened = Store(path, incremental=None)
    try:
        assert reopened.last_refresh_kind == "full"
        assert reopened._con.execute("select value from routeaudit_meta where key = "
                                     "'relations_version'").fetchall() == [(_relations.relations_version(),)]
    finally:
        reopened.close()


def test_slices_checkpoint_between_them_once_the_wal_is_large(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = batches(tiled_sample(1), seed=7, batches=4)
    monkeypatch.setattr(_store, "INCREMENTAL_MIN_SPANS", 1)
    store = new_store(tmp_path / "s.duckdb", incremental=None)
    wal = Path(f"{store.path}.wal")
    try:
        below, above = [], []
        for i, batch in enumerate(parts):
            # far above the size the first slices leave the WAL at, then 1 byte: every slice's
            large = i >= 2
            monkeypatch.setattr(_store, "SLICED_CHECKPOINT_BYTES", 1 if large else 10**12)
            store.append(spans=batch["spans"], events=batch["events"], snapshots=batch["snapshots"])
            store.last_checkpoint_s = None
            store.refresh()
            if store.last_refresh_kind == "slice":
                (above if large else below).append(
                    (store.last_checkpoint_s, store.last_refresh_s, wal.stat().st_size if wal.exists() else 0))
        assert below and above, (below, above)
        # below the size: no checkpoint, the slices' commits are in the WAL
        assert all(seconds is None and size > 0 for seconds, _, size in below), below
        # from it on: each slice ends with a checkpoint, counted in its refresh, the WAL emptied
        assert all(seconds is not None and 0 < seconds <= refresh and size == 0
                   for seconds, refresh, size in above), above
    finally:
        store.close()
