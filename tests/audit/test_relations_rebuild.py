"""A full rebuild of the same SQL keeps the views it made last time and recomputes the tables
beneath them (audit._relations.refresh): the views then read the new tables' rows, and a store
built by other SQL, or asked for the other form of a cached relation, gets new views."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from audit import _relations
from audit._store import Store
from routeaudit._demo import SAMPLE_DIR

VIEWS_READ = ("attributions", "slow_requests", "slo_summary", "calibration", "herding_episodes")
"""Views over the tables (parametrised relations), compared between stores."""


def _sample() -> dict[str, pa.Table]:
    return {t: pq.read_table(SAMPLE_DIR / f"{t}.parquet")
            for t in ("raw_spans", "raw_span_events", "raw_snapshots")}


def _whole(raw: dict[str, pa.Table]) -> dict[str, Any]:
    return {"spans": raw["raw_spans"], "events": raw["raw_span_events"],
            "snapshots": raw["raw_snapshots"]}


def _runs(raw: dict[str, pa.Table]) -> tuple[dict[str, pa.Table], dict[str, pa.Table]]:
    """The sample split in two: the spans of its first run (by run id) with their events and
    every scrape, then the other spans with theirs."""
    con = duckdb.connect()
    try:
        con.register("s", raw["raw_spans"])
        con.register("e", raw["raw_span_events"])
        con.execute("create table first as select trace_id, span_id from s "
                    "where coalesce(a_run_id, r_run_id) = "
                    "(select min(coalesce(a_run_id, r_run_id)) from s)")
        parts = []
        for op in ("semi", "anti"):
            parts.append({
                "spans": con.sql(f"select * from s {op} join first using (trace_id, span_id)"
                                 ).to_arrow_table(),
                "events": con.sql(f"select * from e {op} join first using (trace_id, span_id)"
                                  ).to_arrow_table(),
                "snapshots": raw["raw_snapshots"] if op == "semi" else None})
    finally:
        con.close()
    assert parts[0]["spans"].num_rows and parts[1]["spans"].num_rows
    return parts[0], parts[1]


def _append(store: Store, part: dict[str, Any]) -> None:
    store.append(spans=part["spans"], events=part["events"], snapshots=part["snapshots"])


def _rebuild(store: Store, cache_defaults: bool | None = False) -> Counter[str]:
    kinds: Counter[str] = Counter()
    _relations.refresh(store._con, on_built=lambda rel, kind, s: kinds.update([kind]),
                       cache_defaults=cache_defaults)
    return kinds


def _rows(store: Store, name: str) -> list[tuple[Any, ...]]:
    return sorted(store._con.execute(f"select * from {name}").fetchall(), key=repr)


def test_other_sql_or_another_form_gets_new_views(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.duckdb")
    try:
        _append(store, _whole(_sample()))
        store.refresh()
        store._con.execute("update routeaudit_meta set value = 'older' "
                           "where key = 'relations_version'")
        kinds = _rebuild(store)
        assert kinds["kept view"] == 0 and kinds["view"] > 0, kinds
        store._con.execute("update routeaudit_meta set value = ? where key = 'relations_version'",
                           [_relations.relations_version()])
        before = _rows(store, "attributions")
        # the cached form (live view, table at the defaults, view picking one) is made, not kept
        kinds = _rebuild(store, cache_defaults=True)
        assert kinds["cached view"] == len(_relations.cached(_relations.load_relations())), kinds
        assert _rows(store, "attributions") == before
        kinds = _rebuild(store, cache_defaults=True)
        assert kinds["cached view"] == 0 and kinds["kept view"] > 0, kinds
        assert _rows(store, "attributions") == before
        # and back to plain views
        kinds = _rebuild(store, cache_defaults=False)
        assert kinds["kept view"] == len(_relations.views(_relations.load_relations())) - len(
            _relations.cached(_relations.load_relations())), kinds
        assert not store._con.execute(
            "select count(*) from information_schema.tables "
            f"where table_name like '%{_relations.CACHE_SUFFIX}'").fetchall()[0][0]
        assert _rows(store, "attributions") == before
    finally:
        store.close()


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """The sample data in one store, built once."""
    store = Store(tmp_path_factory.mktemp("whole") / "whole.duckdb")
    try:
        _append(store, _whole(_sample()))
        store.refresh()
        yield store
    finally:
        store.close()


@pytest.mark.parametrize("cache_defaults", [False, True])
def test_kept_views_read_the_new_tables(tmp_path: Path, whole: Store, cache_defaults: bool) -> None:
    """Rebuilt after the rest of the data arrived, every view kept (a cached relation's table
    at the defaults recomputed), each gives the rows of a store built over all of it."""
    rels = _relations.load_relations()
    first, rest = _runs(_sample())
    store = Store(tmp_path / "a.duckdb")
    try:
        _append(store, first)
        _rebuild(store, cache_defaults)
        _append(store, rest)
        kinds = _rebuild(store, cache_defaults)
        assert kinds["kept view"] == len(_relations.views(rels)), kinds
        assert kinds["view"] == kinds["cached view"] == 0, kinds
        for name in VIEWS_READ:
            assert _rows(store, name) == _rows(whole, name), name
        assert _rows(store, "slow_requests")
    finally:
        store.close()
