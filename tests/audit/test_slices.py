"""The slice property: rows computed from a slice of event time (raw rows within its margins)
equal a one-shot build's rows with the same anchors, relation by relation."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest

from audit._errors import QueryError
from audit._slices import Slice, install_slice, owned_rows_sql, partition_of
from audit._store import _tune
from routeaudit._demo import write_sample_store

SLICE_NS = 60 * 10**9
MARGIN_NS = 20 * 10**9
"""Margins much narrower than the sample store's 150 s of requests: a relation that reads
beyond them shows up as differences."""

PARTITION_S = 60
"""The sample store's partition width here: its 150 s of requests span three partitions, so
windowed summaries differ from one partition to the next (slices are partition-aligned)."""

HOLDING = ["requests", "decisions", "candidates", "executions"]
"""Relations whose rows depend only on raw rows near their request."""

WINDOWED = ["attributions", "slow_requests"]
"""Relations that read summaries over a window of partitions (fits, client gaps, fleet medians:
docs/architecture.md, "Always-on analysis"): a slice reads the window's partitions before it,
and still only MARGIN_NS after it (a summary that read later partitions shows up as
differences)."""


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[str]:
    return sorted(repr(r) for r in con.execute(sql).fetchall())


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    path = tmp_path_factory.mktemp("slices") / "sample.duckdb"
    con = duckdb.connect(str(path))
    con.execute("create table routeaudit_meta (key varchar primary key, value varchar)")
    # windows of two partitions: the sample's partitions have windows that differ
    con.execute("insert into routeaudit_meta values ('partition_s', ?), ('window_partitions', '2')",
                [str(PARTITION_S)])
    con.close()
    write_sample_store(path)
    con = duckdb.connect(str(path), read_only=True)
    _tune(con)  # as every store connection is (the ASOF joins' plans)
    yield con
    con.close()


def _slices(con: duckdb.DuckDBPyConnection, width: int, before: int, after: int) -> list[Slice]:
    lo, hi = con.execute("select min(epoch_ns(first_seen_at)), max(epoch_ns(first_seen_at)) "
                         "from requests").fetchall()[0]
    start = lo - lo % width
    return [Slice(t, t + width, before, after) for t in range(start, hi + 1, width)]


def _compare(con: duckdb.DuckDBPyConnection, relations: list[str], slices: list[Slice]) -> dict[str, tuple[int, int]]:
    """For each relation: (one-shot rows, rows that differ between one-shot and slices)."""
    out: dict[str, tuple[int, int]] = {}
    sliced: dict[str, list[str]] = {r: [] for r in relations}
    for sl in slices:
        cur = con.cursor()
        try:
            install_slice(cur, sl)
            for rel in relations:
                cols = [r[0] for r in cur.execute(f"describe {rel}").fetchall()]
                sliced[rel] += _rows(cur, owned_rows_sql(rel, sl, cols))
        finally:
            cur.close()
    for rel in relations:
        whole = _rows(con, f"select * from {rel}")
        a, b = sorted(whole), sorted(sliced[rel])
        diff = len(set(a) ^ set(b)) + abs(len(a) - len(b))
        out[rel] = (len(whole), diff)
    return out


@pytest.fixture(scope="module")
def compared(sample_store: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, int]]:
    return _compare(sample_store, HOLDING, _slices(sample_store, SLICE_NS, MARGIN_NS, MARGIN_NS))


@pytest.fixture(scope="module")
def compared_windowed(sample_store: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, int]]:
    partition_ns, window = sample_store.execute(
        "select partition_ns, window_partitions from stg_partitioning").fetchall()[0]
    parts = sample_store.execute("select count(distinct part) from requests").fetchall()[0][0]
    assert partition_ns == PARTITION_S * 10**9 and parts >= 3, "the windows should differ"
    assert SLICE_NS % partition_ns == 0, "slices own whole partitions"
    before = (window + 1) * partition_ns + MARGIN_NS
    return _compare(sample_store, WINDOWED, _slices(sample_store, SLICE_NS, before, MARGIN_NS))


@pytest.mark.parametrize("relation", HOLDING)
def test_slices_give_the_one_shot_rows(compared: dict[str, tuple[int, int]], relation: str) -> None:
    rows, differ = compared[relation]
    assert rows > 100, "the sample store should exercise the relation"
    assert differ == 0


@pytest.mark.parametrize("relation", WINDOWED)
def test_slices_reading_their_windows_give_the_one_shot_rows(
        compared_windowed: dict[str, tuple[int, int]], relation: str) -> None:
    rows, differ = compared_windowed[relation]
    assert rows > 100, "the sample store should exercise the relation"
    assert differ == 0


def test_slice_and_partition_arguments() -> None:
    with pytest.raises(QueryError, match="end after"):
        Slice(10, 10)
    with pytest.raises(QueryError, match="negative"):
        Slice(0, 10, -1, 0)
    assert partition_of(299 * 10**9, 300) == 0 and partition_of(300 * 10**9, 300) == 1
    with pytest.raises(QueryError, match="positive"):
        partition_of(1, 0)
    with pytest.raises(QueryError, match="no anchor"):
        owned_rows_sql("calibration", Slice(0, 1), ["replica"])
