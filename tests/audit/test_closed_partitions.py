"""Closed partitions: a store refreshed by slices moves old partitions to Parquet beside the file,
and still answers every relation as a one-shot build over the same rows; a late request re-opens
the partitions it reaches; readers of the file, polars and retention see the same partitions.

The sample is tiled over minutes of traffic (partitions of 60 s), long enough for partitions to
pass the final horizon by more than a slice can reach (audit._closed.reach_ns).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal
from tiled_sample import SETTINGS, assert_span_keys_match, batches, new_store, relation_rows, tiled_sample

import audit
from audit import _closed, _incremental, _relations, queries
from audit._store import Store
from audit.queries import _common
from audit.queries._common import _unix_ns

COPIES = 6
BATCHES = 5
COMPARED = [r for r in _relations.public_relations() if r not in {"raw_span_attributes", "slo_targets"}]
KEPT_INTERNAL = [t for t in _closed.KEY_TABLES if t not in _relations.public_relations()]
"""Internal tables kept for closed partitions: read back from Parquet by the next slice's plan
and key sets, so their keys (a 125-bit ``decision_key`` among them) must come back exactly."""


def _late_request(raw: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """One request of the first copy sent again under new ids (a new trace, a new request id)
    at the end of the traffic: it lands in a partition closed long before."""
    con = duckdb.connect()
    try:
        con.register("s", raw["raw_spans"])
        con.register("e", raw["raw_span_events"])
        trace = con.execute("select trace_id from s where a_request_id is not null "
                            "order by start_ns, trace_id limit 1 offset 40").fetchall()[0][0]
        spans = con.sql("select * replace (md5(trace_id || '-late') as trace_id, "
                        "a_request_id || '-late' as a_request_id) from s where trace_id = ?",
                        params=[trace]).to_arrow_table()
        events = con.sql("select * replace (md5(trace_id || '-late') as trace_id) from e "
                         "where trace_id = ?", params=[trace]).to_arrow_table()
    finally:
        con.close()
    return {"spans": spans, "events": events, "snapshots": raw["raw_snapshots"].slice(0, 0)}


STRADDLE_NS = 2_000_000
"""How much later than its request's start the straddling request's replica span starts."""


def _with_straddling_request(raw: dict[str, pa.Table], partition_ns: int) -> dict[str, pa.Table]:
    """``raw`` and one more request (a copy of one under new ids) that starts 1 ms before the
    end of the first partition, its replica span 2 ms after that: in the next partition, as
    a replica's spans are when the router forwards a request just before a partition ends."""
    con = duckdb.connect()
    try:
        con.register("s", raw["raw_spans"])
        con.register("e", raw["raw_span_events"])
        trace, start = con.execute(
            "select trace_id, start_ns from s where a_component = 'client' "
            "order by start_ns, trace_id limit 1 offset 20").fetchall()[0]
        t0 = con.execute("select min(start_ns) from s").fetchall()[0][0]
        shift = (t0 // partition_ns + 1) * partition_ns - 1_000_000 - start
        extra = f"(case when a_component = 'replica' then {STRADDLE_NS} else 0 end)"
        con.execute(f"create table k as select span_id, {shift} + {extra} as d from s "
                    "where trace_id = ?", [trace])
        spans = con.sql(
            "select s.* replace (md5(trace_id || '-straddling') as trace_id, "
            "a_request_id || '-straddling' as a_request_id, start_ns + k.d as start_ns, "
            "end_ns + k.d as end_ns, received_ns + k.d as received_ns, "
            "a_decision_time_ns + k.d as a_decision_time_ns) "
            "from s join k using (span_id) where trace_id = ?", params=[trace]).to_arrow_table()
        events = con.sql(
            "select e.* replace (md5(trace_id || '-straddling') as trace_id, "
            "time_ns + k.d as time_ns, c_telemetry_ts_ns + k.d as c_telemetry_ts_ns) "
            "from e join k using (span_id) where trace_id = ?", params=[trace]).to_arrow_table()
    finally:
        con.close()
    return {**raw, "raw_spans": pa.concat_tables([raw["raw_spans"], spans]),
            "raw_span_events": pa.concat_tables([raw["raw_span_events"], events])}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    patch = pytest.MonkeyPatch()
    patch.setattr(_relations, "CACHE_MIN_SPANS", 0)
    d = tmp_path_factory.mktemp("closed")
    raw = _with_straddling_request(tiled_sample(COPIES), int(SETTINGS["partition_s"]) * 10**9)
    late = _late_request(raw)
    one = new_store(d / "one.duckdb", incremental=False)
    one.append(spans=raw["raw_spans"], events=raw["raw_span_events"], snapshots=raw["raw_snapshots"])
    one.append(spans=late["spans"], events=late["events"])
    one.refresh()
    inc = new_store(d / "inc.duckdb", incremental=True)
    closed_after: list[int | None] = []
    for batch in batches(raw, seed=11, batches=BATCHES):
        inc.append(spans=batch["spans"], events=batch["events"], snapshots=batch["snapshots"])
        inc.refresh()
        closed_after.append(_closed.closed_until(inc._con))
    before_late = {
        "closed_until": closed_after[-1],
        "hot_spans": inc._con.execute("select count(*) from raw_spans").fetchall()[0][0],
        "relations_lag": inc.relations_lag_spans,
    }
    inc.append(spans=late["spans"], events=late["events"])
    reopened = _closed.Moved()
    original = _closed.reopen

    def counting(*args: Any, **kwargs: Any) -> _closed.Moved:
        moved = original(*args, **kwargs)
        reopened.partitions += moved.partitions
        return moved

    patch.setattr(_closed, "reopen", counting)
    inc.refresh()
    patch.setattr(_closed, "reopen", original)
    try:
        yield {"one": one, "inc": inc, "closed_after": closed_after, "before_late": before_late,
               "reopened": reopened, "raw": raw, "dir": d}
    finally:
        one.close()
        inc.close()
        patch.undo()


def test_old_partitions_leave_the_duckdb_file(built: dict[str, Any]) -> None:
    inc, raw = built["inc"], built["raw"]
    until = built["before_late"]["closed_until"]
    assert until is not None and until > 0, built["closed_after"]
    # the one-shot store (full rebuilds) keeps every row in DuckDB
    assert _closed.closed_until(built["one"]._con) is None
    assert built["before_late"]["hot_spans"] < raw["raw_spans"].num_rows
    # the lag of the relations still reads 0: moved spans left both counts
    assert built["before_late"]["relations_lag"] == 0
    root = _closed.folder(inc.path)
    parts = sorted(p.name for p in (root / "requests").iterdir())
    assert parts and all(p.startswith("part=") for p in parts)
    assert sorted((root / "raw_spans").glob("part=*/*.parquet"))
    # the steps between raw rows and the marts are not kept for closed partitions
    assert not (root / "int_requests_linked").exists()
    # nor the corrected spans (a near copy of the raw ones): their keys are enough
    assert not (root / "int_spans_clock_corrected").exists()
    assert sorted((root / "int_request_spans").glob("part=*/*.parquet"))
    marker = json.loads((root / _closed.MARKER).read_text())
    assert marker["closed_until_part"] == _closed.closed_until(inc._con)


@pytest.mark.parametrize("relation", COMPARED + KEPT_INTERNAL)
def test_closed_and_open_partitions_give_the_one_shot_relations(built: dict[str, Any], relation: str) -> None:
    a, b = relation_rows(built["one"], relation), relation_rows(built["inc"], relation)
    only_one = sorted(set(a) - set(b))[:2]
    only_inc = sorted(set(b) - set(a))[:2]
    assert len(a) == len(b) and not only_one and not only_inc, (
        f"{relation}: one-shot {len(a)} rows, with closed partitions {len(b)}\n"
        f"only one-shot: {only_one}\nonly with closed partitions: {only_inc}")


def test_a_late_request_reopens_its_partitions_and_they_close_again(built: dict[str, Any]) -> None:
    inc = built["inc"]
    assert built["reopened"].partitions, "the late request's slice re-opened closed partitions"
    late = inc.query_arrow("select count(*) as n from requests where request_id like '%-late'")
    assert late.column("n")[0].as_py() == 1
    # closed again after the refresh, up to the same horizon
    assert _closed.closed_until(inc._con) == built["before_late"]["closed_until"]
    assert inc.closed_until_ns == _closed.closed_until_ns(inc._con)
    root = _closed.folder(inc.path)
    until = _closed.closed_until(inc._con)
    assert until is not None
    stray = [p for p in root.glob("*/part=*") if int(p.name[5:]) >= until]
    assert not stray, stray


def test_the_span_keys_leave_and_come_back_with_their_spans(built: dict[str, Any]) -> None:
    """Closes, the late request's re-open and the close after it moved spans out of the DuckDB
    file and back: their keys (what a resent span is found by) moved with them."""
    assert built["reopened"].partitions
    assert_span_keys_match(built["inc"])


def _copy_store(store: Store, path: Path) -> Path:
    """A copy of ``store``'s file and its folder of closed partitions at ``path``."""
    store.checkpoint()
    path.write_bytes(store.path.read_bytes())
    shutil.copytree(_closed.folder(store.path), _closed.folder(path))
    return path


def test_a_span_resent_after_its_partition_closed_is_kept_once(built: dict[str, Any],
                                                               tmp_path: Path) -> None:
    """The oldest span sent again: stored in the DuckDB file beside its closed copy, it
    re-opens its partition, whose copy from Parquet is then left out."""
    raw = built["raw"]
    oldest = raw["raw_spans"].sort_by("start_ns").slice(0, 1)
    trace, span = oldest.column("trace_id")[0].as_py(), oldest.column("span_id")[0].as_py()
    store = Store(_copy_store(built["inc"], tmp_path / "resent.duckdb"), incremental=True)
    try:
        count = f"select count(*) as n from raw_spans where trace_id = '{trace}' and span_id = '{span}'"
        assert store.query_arrow(count).column("n")[0].as_py() == 1
        assert store.append(spans=oldest) == 1  # its copy is in Parquet, not in the DuckDB file
        store.refresh()
        assert store.query_arrow(count).column("n")[0].as_py() == 1
        assert_span_keys_match(store)
    finally:
        store.close()


def test_a_reader_of_the_file_and_polars_see_every_partition(built: dict[str, Any], tmp_path: Path) -> None:
    inc, one = built["inc"], built["one"]
    n = one.query_arrow("select count(*) as n from requests").column("n")[0].as_py()
    # a reader of the file (no collector holds it), as another process opens it
    path = _copy_store(inc, tmp_path / "copy.duckdb")
    reader = audit.open(path)
    assert reader.query("select count(*) as n from requests")["n"][0] == n
    assert reader.query("select count(*) as n from slow_requests")["n"][0] == \
        one.query_arrow("select count(*) as n from slow_requests").column("n")[0].as_py()
    # polars reads the closed partitions without routeaudit; DuckDB holds the rest
    root = _closed.folder(path)
    until = json.loads((root / _closed.MARKER).read_text())["closed_until_part"]
    closed = (pl.scan_parquet(root / "requests" / "**" / "*.parquet", hive_partitioning=True)
              .filter(pl.col("part") < until).select(pl.len()).collect().item())
    hot = inc._con.execute("select count(*) from main.requests").fetchall()[0][0]
    assert closed > 0 and closed + hot == n


def test_files_of_a_close_that_did_not_commit_are_not_read(built: dict[str, Any], tmp_path: Path) -> None:
    inc = built["inc"]
    until = _closed.closed_until(inc._con)
    assert until is not None
    root = _closed.folder(inc.path)
    before = inc.query_arrow("select count(*) as n from requests").column("n")[0].as_py()
    stray = root / "requests" / f"part={until + 3}"
    stray.mkdir(parents=True)
    src = next((root / "requests").glob(f"part={until - 1}/*.parquet"))
    (stray / "data_0.parquet").write_bytes(src.read_bytes())
    try:
        assert inc.query_arrow("select count(*) as n from requests").column("n")[0].as_py() == before
    finally:
        stray.joinpath("data_0.parquet").unlink()
        stray.rmdir()


def test_retention_deletes_closed_partitions(built: dict[str, Any], tmp_path: Path) -> None:
    inc = built["inc"]
    path = _copy_store(inc, tmp_path / "kept.duckdb")
    store = Store(path, incremental=True)
    try:
        newest = store._con.execute("select max(start_ns) from raw_spans").fetchall()[0][0]
        w = _incremental_partition_ns(store)
        oldest = min(int(p.name[5:]) for p in (_closed.folder(path) / "raw_spans").iterdir())
        keep_s = (newest - (oldest + 2) * w) / 1e9
        before = [store.query_arrow(f"select count(*) from {t}").column(0)[0].as_py()
                  for t in ("raw_spans", "requests")]
        done = store.retain(raw_s=keep_s, verdicts_s=keep_s)
        after = [store.query_arrow(f"select count(*) from {t}").column(0)[0].as_py()
                 for t in ("raw_spans", "requests")]
        # what it says it deleted is what readers no longer see, the closed folders' rows too
        assert (done.spans_deleted, done.requests_deleted) == (before[0] - after[0],
                                                               before[1] - after[1]), (before, after)
        assert done.spans_deleted > 0 and done.requests_deleted > 0
        assert done.raw_from_ns is not None
        cut = done.raw_from_ns // w
        left = [int(p.name[5:]) for p in (_closed.folder(path) / "raw_spans").iterdir()]
        assert left and min(left) >= cut
        gone = [int(p.name[5:]) for p in (_closed.folder(path) / "requests").iterdir()]
        assert min(gone) >= cut
        counted = store.query_arrow("select min(part) as p from requests").column("p")[0].as_py()
        assert counted >= cut
    finally:
        store.close()


def _incremental_partition_ns(store: Store) -> int:
    from audit._incremental import Partitioning
    return Partitioning.read(store._con).partition_ns


def test_a_cursor_reused_for_the_next_query_forgets_its_slo(built: dict[str, Any]) -> None:
    inc = built["inc"]
    sql = "select getvariable('routeaudit_ttft_slo_ms') as v"
    assert inc.query_arrow(sql, variables={"routeaudit_ttft_slo_ms": 5.0}).column("v")[0].as_py() == 5.0
    for _ in range(3):
        assert inc.query_arrow(sql).column("v")[0].as_py() is None


def test_an_upgrade_adding_a_raw_column_reopens_closed_partitions(built: dict[str, Any],
                                                                tmp_path: Path) -> None:
    # a store written before a raw column existed: its Parquet files lack it
    path = _copy_store(built["inc"], tmp_path / "old.duckdb")
    con = duckdb.connect(str(path))
    con.execute("alter table raw_spans drop column a_finish_reasons")
    con.close()
    n = built["one"].query_arrow("select count(*) as n from raw_spans").column("n")[0].as_py()
    store = Store(path, incremental=True)
    try:
        assert _closed.closed_until(store._con) is None
        store.refresh()
        assert store.closed_until_ns == _closed.closed_until_ns(store._con)
        assert store.query_arrow("select count(*) as n from raw_spans").column("n")[0].as_py() == n
        assert store.relations_lag_spans == 0
    finally:
        store.close()


class _Reads:
    """The dashboard's reads through a writer's store, as a running collector answers them."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def query(self, sql: str, params: Any = None, *, slo: Any = None,
              variables: Any = None) -> pl.DataFrame:
        merged = {**(slo or audit.load_slo()).variables(), **(variables or {})}
        return pl.from_arrow(self.store.query_arrow(sql, params, variables=merged))  # type: ignore[return-value]


def _page_queries(store: Store, window: queries.TimeWindow) -> dict[str, Any]:
    reader = _Reads(store)
    strict = audit.load_slo(ttft_ms=150, tpot_ms=5)  # computed live, not from the tables
    runs = queries.run_list(reader, window=window)["run_id"].to_list()[:2]
    return {
        "window_counts": queries.window_counts(reader, window),
        "overview_totals": queries.overview_totals(reader, window=window),
        "overview_totals strict": queries.overview_totals(reader, strict, window=window),
        "requests_over_time": queries.requests_over_time(reader, window=window),
        "replica_load_over_time": queries.replica_load_over_time(reader, window=window),
        "failures_by_kind": queries.failures_by_kind(reader, window=window),
        "slow_page": queries.slow_page(reader, window=window),
        "slow_page strict": queries.slow_page(reader, strict, window=window),
        "cache_by_replica": queries.cache_by_replica(reader, window=window),
        "cache_misses_over_time": queries.cache_misses_over_time(reader, window=window),
        "telemetry_age_by_router": queries.telemetry_age_by_router(reader, window=window),
        "herding_episodes": queries.herding_episodes(reader, window=window),
        "run_summaries strict": queries.run_summaries(reader, runs, strict, window=window),
    }


def _assert_pages_equal(inc: Store, one: Store, window: queries.TimeWindow) -> None:
    """Every page query of ``window`` on ``inc`` gives ``one``'s rows (sums over the same rows
    in another order: floats within 1e-9), and each has rows but the two that may be empty."""
    got, want = _page_queries(inc, window), _page_queries(one, window)
    for name in want:
        a, b = want[name], got[name]
        pairs = [(a.requests, b.requests), (a.causes, b.causes)] \
            if isinstance(a, queries.SlowPage) else [(a, b)]
        for x, y in pairs:
            assert x.height > 0 or name in ("failures_by_kind", "herding_episodes"), name
            assert_frame_equal(x, y, rel_tol=1e-9, abs_tol=1e-9), name


def test_a_window_reads_only_the_closed_partitions_it_can_reach_and_answers_the_same(
        built: dict[str, Any]) -> None:
    one, inc = built["one"], built["inc"]
    parts = _incremental.Partitioning.read(inc._con)
    until = _closed.closed_until(inc._con)
    newest = inc._con.execute("select max(anchor_ns) from requests").fetchall()[0][0]
    assert until is not None and newest is not None
    lowest = min(int(p.name[5:]) for p in (_closed.folder(inc.path) / "requests").iterdir())
    for back_s in (200, 700):
        start_ns = int(newest) - back_s * 10**9
        window = queries.TimeWindow(datetime.fromtimestamp(start_ns / 1e9, UTC))
        if back_s == 200:
            # the bound leaves out closed partitions: the pruning is exercised, not only allowed
            bound = (start_ns - _closed.reach_ns(parts)) // parts.partition_ns
            assert lowest < bound < until, (lowest, bound, until)
        _assert_pages_equal(inc, one, window)


def _bounds(window: queries.TimeWindow, parts: _incremental.Partitioning) -> tuple[int, int]:
    """The partitions [lo, hi) a reader of ``window`` needs (``closed_until`` aside)."""
    variables = _common.window_variables(window) or {}
    reach, w = _closed.reach_ns(parts), parts.partition_ns
    lo = variables.get(_closed.WINDOW_FROM_VARIABLE)
    hi = variables.get(_closed.WINDOW_TO_VARIABLE)
    return (-(2**63) if lo is None else (int(lo) - reach) // w,
            2**63 if hi is None else (int(hi) + reach) // w + 1)


def test_a_window_lists_only_the_folders_of_the_partitions_it_reads(built: dict[str, Any]) -> None:
    inc = built["inc"]
    parts = _incremental.Partitioning.read(inc._con)
    until = _closed.closed_until(inc._con)
    newest = inc._con.execute("select max(anchor_ns) from requests").fetchall()[0][0]
    assert until is not None and newest is not None
    root = _closed.folder(inc.path)
    start = datetime.fromtimestamp((int(newest) - 200 * 10**9) / 1e9, UTC)
    con = duckdb.connect()
    try:
        lo_sql, hi_sql = _closed.window_bounds(parts, until)
        for table in ("requests", "raw_spans", "executions"):
            existing = sorted(int(p.name[5:]) for p in (root / table).glob("part=*"))
            runs = _closed._parts_below(root / table, until)
            files = _closed._files(root, table, runs, lo_sql, hi_sql)
            for window, want in (
                    (queries.TimeWindow(start),
                     [p for p in existing if _bounds(queries.TimeWindow(start), parts)[0] <= p
                      < until]),
                    # nothing of the window closed: the newest folder stands in (its rows are
                    # filtered out), as read_parquet needs a file
                    (queries.TimeWindow(datetime.fromtimestamp(
                        (until * parts.partition_ns + _closed.reach_ns(parts)) / 1e9, UTC)),
                     [max(p for p in existing if p < until)])):
                for name in (_closed.WINDOW_FROM_VARIABLE, _closed.WINDOW_TO_VARIABLE):
                    con.execute(f"reset variable {name}")
                for name, value in (_common.window_variables(window) or {}).items():
                    con.execute(f"set variable {name} = {int(value)}")
                listed = con.execute(f"select {files}").fetchall()[0][0]
                assert listed == [f"{root / table}/part={p}/*.parquet" for p in want], table
            # the window leaves closed partitions out: the pruning is exercised
            assert min(existing) < _bounds(queries.TimeWindow(start), parts)[0], table
            for name in (_closed.WINDOW_FROM_VARIABLE, _closed.WINDOW_TO_VARIABLE):
                con.execute(f"reset variable {name}")
            assert con.execute(f"select {files}").fetchall()[0][0] == [
                f"{root / table}/part=*/*.parquet"]
    finally:
        con.close()


def test_a_window_closed_at_both_ends_answers_the_same(built: dict[str, Any]) -> None:
    """A window inside the closed partitions (both variables set) against the one-shot store.
    The fixture's closed partitions span less than the reach, so this pins the answers; the
    listing test above pins what is skipped."""
    one, inc = built["one"], built["inc"]
    parts = _incremental.Partitioning.read(inc._con)
    until = _closed.closed_until(inc._con)
    assert until is not None
    end_ns = (until - 3) * parts.partition_ns
    window = queries.TimeWindow(datetime.fromtimestamp((end_ns - 240 * 10**9) / 1e9, UTC),
                                datetime.fromtimestamp(end_ns / 1e9, UTC))
    _assert_pages_equal(inc, one, window)


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    """Rows in one order (the functions' own orders leave ties)."""
    keys = [c for c, t in df.schema.items() if not t.is_nested()]
    return df.sort(keys, nulls_last=True) if keys and df.height else df


def _drilled_requests(inc: Store, until: int, w: int,
                      skip: int) -> dict[str, tuple[str, datetime]]:
    """Requests the drill-down is checked on: in closed partitions the oldest, one whose spans
    run into the next partition, closed too (a raw span's start, else its execution's end), the one
    started nearest a partition's start and the late one (re-opened, closed again); and the
    first of an open partition after ``skip``, whose reach leaves closed partitions out."""
    reader = _Reads(inc)
    picks = {
        "oldest": "select request_key, first_seen_at from requests "
                  "order by first_seen_at, request_key limit 1",
        "straddling": f"""
            select r.request_key, r.first_seen_at from requests as r
            join int_request_spans as s using (request_key)
            join executions as e using (request_key)
            where r.part < {until} - 1
                and (s.start_ns // {w} > r.part or epoch_ns(e.end_at) // {w} > r.part)
            order by s.start_ns // {w} > r.part desc, r.first_seen_at desc, r.request_key
            limit 1""",
        "at a partition's start": f"""
            select request_key, first_seen_at from requests where part < {until}
            order by epoch_ns(first_seen_at) % {w}, request_key limit 1""",
        "late": "select request_key, first_seen_at from requests "
                "where request_id like '%-late' limit 1",
        "open": f"select request_key, first_seen_at from requests where part > {skip} "
                "order by first_seen_at, request_key limit 1",
    }
    out = {}
    for name, sql in picks.items():
        rows = reader.query(sql)
        assert rows.height == 1, name
        out[name] = (str(rows["request_key"][0]), rows["first_seen_at"][0])
    return out


def test_the_drill_down_reads_near_its_request_and_answers_the_same(
        built: dict[str, Any]) -> None:
    one, inc = built["one"], built["inc"]
    parts = _incremental.Partitioning.read(inc._con)
    until = _closed.closed_until(inc._con)
    assert until is not None
    lowest = min(int(p.name[5:]) for p in (_closed.folder(inc.path) / "requests").iterdir())
    strict = audit.load_slo(ttft_ms=150, tpot_ms=5)
    skip = lowest + _closed.reach_ns(parts) // parts.partition_ns + 1
    drilled = _drilled_requests(inc, until, parts.partition_ns, skip)
    open_at = drilled["open"][1]
    assert lowest < _bounds(queries.TimeWindow(open_at, open_at), parts)[0] < until
    for name, (key, at) in drilled.items():
        want_reader, got_reader = _Reads(one), _Reads(inc)
        for fn, args in ((queries.request_detail, ()), (queries.request_waterfall, ()),
                         (queries.request_spans, ()), (queries.request_decisions, ()),
                         (queries.request_candidates, ()), (queries.request_attributions, ()),
                         (queries.request_attributions, (strict,))):
            want = fn(want_reader, key, *args)  # type: ignore[operator]
            got = fn(got_reader, key, *args, at=at)  # type: ignore[operator]
            assert want.height > 0 or fn is queries.request_attributions, (name, fn.__name__)
            assert_frame_equal(_sorted(want), _sorted(got), rel_tol=1e-9, abs_tol=1e-9)


def test_making_the_views_leaves_the_window_variables_as_they_were(
        built: dict[str, Any], tmp_path: Path) -> None:
    """The views are bound to a window of their own while they are made (a window of none
    would list every folder); a caller's window must come out of it unchanged."""
    path = _copy_store(built["inc"], tmp_path / "copy.duckdb")
    con = duckdb.connect(str(path), read_only=True)
    try:
        every = con.execute("select count(*) from main.requests").fetchall()[0][0]
        con.execute(f"set variable {_closed.WINDOW_FROM_VARIABLE} = ?", [12345])
        assert _closed.install_views(con, path) > 0
        assert con.execute(f"select getvariable('{_closed.WINDOW_FROM_VARIABLE}'), "
                           f"getvariable('{_closed.WINDOW_TO_VARIABLE}')").fetchall() == [(12345, None)]
        con.execute(f"reset variable {_closed.WINDOW_FROM_VARIABLE}")
        # no window: every partition, the closed ones too
        assert con.execute("select count(*) from requests").fetchall()[0][0] > every
        con.execute(f"set variable {_closed.WINDOW_TO_VARIABLE} = ?", [12345])
        assert _closed.install_views(con, path) > 0
        assert con.execute(f"select getvariable('{_closed.WINDOW_FROM_VARIABLE}'), "
                           f"getvariable('{_closed.WINDOW_TO_VARIABLE}')").fetchall() == [(None, 12345)]
    finally:
        con.close()


def _span(reader: Any) -> tuple[Any, ...]:
    return tuple(queries.store_range(reader).row(0))


def _retained(store_path: Path, keep_s: float, incremental: bool) -> None:
    store = Store(store_path, incremental=incremental)
    try:
        done = store.retain(raw_s=keep_s, verdicts_s=keep_s)
        # the rows of closed partitions are not counted: only the DuckDB rows are
        assert done.verdicts_from_ns is not None and (incremental or done.requests_deleted > 0)
    finally:
        store.close()


def _copy_one(one: Store, path: Path) -> Path:
    one.checkpoint()
    path.write_bytes(one.path.read_bytes())
    return path


def test_the_store_range_opens_no_closed_partition(built: dict[str, Any], tmp_path: Path) -> None:
    """The range comes from each closed partition's summary, written as it closed (after a
    re-open and a close again in the fixture): the one-shot store's answer, with every closed
    ``requests`` file but the newest unreadable."""
    one, inc = built["one"], built["inc"]
    want = _span(_Reads(one))
    assert want[0] > 0 and _closed.closed_until(one._con) is None
    assert _span(_Reads(inc)) == want
    path = _copy_store(inc, tmp_path / "copy.duckdb")
    reader = audit.open(path)
    assert _span(reader) == want
    folders = sorted((_closed.folder(path) / "requests").glob("part=*"), key=lambda p: int(p.name[5:]))
    assert len(folders) > 2
    for f in folders[:-1]:  # the newest stands in while the views are made
        for file in f.glob("*.parquet"):
            file.write_bytes(b"not parquet")
    assert _span(reader) == want
    with pytest.raises(audit.QueryError):
        reader.query("select count(*) from requests")


def _reopened_copy(inc: Store, tmp_path: Path, *, then: str | None = None) -> tuple[Path, Any, int]:
    """A copy of ``inc`` whose last three closed partitions are re-opened (``then``, with
    ``{part}`` the first of them, runs in the same transaction), a reader opened on it before,
    and where its closed partitions ended."""
    path = _copy_store(inc, tmp_path / "copy.duckdb")
    reader = audit.open(path)
    until = _closed.closed_until(inc._con)
    assert until is not None
    con = duckdb.connect(str(path))
    try:
        con.execute("begin transaction")
        moved = _closed.reopen(con, path, until - 3)
        if then is not None:
            con.execute(then.format(part=until - 3))
        con.execute("commit")
        _closed.forget(path, moved, until - 3, _incremental_partition_ns(inc))
        assert moved.partitions
    finally:
        con.close()
    return path, reader, until


def test_the_store_range_follows_reopens_closes_and_retention(built: dict[str, Any],
                                                              tmp_path: Path) -> None:
    one, inc = built["one"], built["inc"]
    want = _span(_Reads(one))
    w = _incremental_partition_ns(inc)
    path, reader, until = _reopened_copy(inc, tmp_path)
    assert _span(reader) == want
    con = duckdb.connect(str(path))
    try:
        assert _closed.close(con, path, _incremental.horizon(con)[0]).partitions
        assert _closed.closed_until(con) == until
    finally:
        con.close()
    assert _span(reader) == want

    # retention inside the closed partitions, against the one-shot store's same retention
    newest = inc._con.execute("select max(start_ns) from raw_spans").fetchall()[0][0]
    oldest = min(int(p.name[5:]) for p in (_closed.folder(path) / "requests").iterdir())
    keep_s = (newest - (oldest + 2) * w) / 1e9
    early = queries.TimeWindow(datetime.fromtimestamp(oldest * w / 1e9, UTC))
    # a windowed read lists the folders the retention deletes next
    assert queries.window_counts(reader, early)["requests"][0] == want[0]
    _retained(path, keep_s, incremental=True)
    kept = _copy_one(one, tmp_path / "one.duckdb")
    _retained(kept, keep_s, incremental=False)
    after = _span(audit.open(kept))
    assert after[0] < want[0]
    assert _span(reader) == after
    assert queries.window_counts(reader, early)["requests"][0] == after[0]

    con = duckdb.connect(str(path))
    try:
        _closed.reopen_all(con, path)
        assert _closed.closed_until(con) is None
    finally:
        con.close()
    assert _span(reader) == after


def test_a_store_closed_without_summaries_gets_them_at_its_next_close(
        built: dict[str, Any], tmp_path: Path) -> None:
    one, inc = built["one"], built["inc"]
    want = _span(_Reads(one))
    path = _copy_store(inc, tmp_path / "copy.duckdb")
    until = _closed.closed_until(inc._con)
    assert until is not None
    con = duckdb.connect(str(path))
    try:  # as an earlier version left it
        con.execute(f"drop table {_closed.SUMMARY_TABLE}")
        con.execute("delete from routeaudit_meta where key = ?", [_closed.GENERATION])
    finally:
        con.close()
    reader = audit.open(path)
    assert _span(reader) == want
    with pytest.raises(audit.QueryError):
        reader.query(f"select * from {_closed.RANGE_VIEW}")
    con = duckdb.connect(str(path))
    try:  # nothing to close: the summaries are made all the same
        assert not _closed.close(con, path, _incremental.horizon(con)[0]).partitions
    finally:
        con.close()
    assert tuple(reader.query(f"select * from {_closed.RANGE_VIEW}").row(0)) == want
    assert _span(reader) == want


def test_a_reader_lists_the_folders_again_when_the_generation_changes(
        built: dict[str, Any], tmp_path: Path) -> None:
    """The folder listing is kept between queries while the generation stays; a change of
    the closed partitions comes with a new generation, and the next query lists again."""
    inc = built["inc"]
    path = _copy_store(inc, tmp_path / "copy.duckdb")
    reader = audit.open(path)
    root = _closed.folder(path)
    oldest = min((root / "requests").glob("part=*"), key=lambda p: int(p.name[5:]))
    w = _incremental_partition_ns(inc)
    every = queries.TimeWindow(datetime.fromtimestamp(int(oldest.name[5:]) * w / 1e9, UTC))
    before = queries.window_counts(reader, every)["requests"][0]
    gone = pl.scan_parquet(oldest / "*.parquet").select(pl.len()).collect().item()
    assert gone > 0
    shutil.rmtree(oldest)
    con = duckdb.connect(str(path))
    try:
        _closed._bump_generation(con)
    finally:
        con.close()
    assert queries.window_counts(reader, every)["requests"][0] == before - gone


def test_a_partition_closed_again_without_requests_leaves_the_range(built: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    """A re-opened partition's recomputation may leave it no request (they join others): its
    summary goes with the re-open, not only when a close writes it again."""
    path, reader, until = _reopened_copy(
        built["inc"], tmp_path, then="delete from main.requests where part = {part}")
    con = duckdb.connect(str(path))
    try:
        assert _closed.close(con, path, _incremental.horizon(con)[0]).partitions
        assert _closed.closed_until(con) == until
    finally:
        con.close()
    counted = reader.query("select count(*), min(first_seen_at), max(first_seen_at) from requests")
    assert _span(reader) == tuple(counted.row(0))


class _Counting(_Reads):
    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.queries = 0

    def query(self, sql: str, params: Any = None, *, slo: Any = None,
              variables: Any = None) -> pl.DataFrame:
        self.queries += 1
        return super().query(sql, params, slo=slo, variables=variables)


def test_the_drill_down_given_the_request_id_and_the_relations_runs_one_query_each(
        built: dict[str, Any]) -> None:
    """The page has the request's row and the relations (cached): passed on, the verdict and
    the raw spans are one query each, with the same rows."""
    one, inc = built["one"], built["inc"]
    until = _closed.closed_until(inc._con)
    assert until is not None
    strict = audit.load_slo(ttft_ms=150, tpot_ms=5)
    drilled = _drilled_requests(inc, until, _incremental_partition_ns(inc), until)
    known = queries.relation_columns(_Reads(inc))
    attributed = 0
    for key, at in drilled.values():
        ident = str(queries.request_detail(_Reads(inc), key, at=at)["request_id"][0])
        for slo in (None, strict):
            want = queries.request_attributions(_Reads(one), key, slo)
            counting = _Counting(inc)
            got = queries.request_attributions(counting, key, slo, at=at, request_id=ident,
                                               known=known)
            assert counting.queries == 1
            assert_frame_equal(_sorted(want), _sorted(got), rel_tol=1e-9, abs_tol=1e-9)
            attributed += want.height
        counting = _Counting(inc)
        got = queries.request_spans(counting, key, at=at, known=known)
        assert counting.queries == 1 and got.height > 0
        assert_frame_equal(_sorted(queries.request_spans(_Reads(one), key)), _sorted(got))
    assert attributed > 0


def test_a_request_near_its_partitions_end_reads_its_spans_of_the_next(
        built: dict[str, Any]) -> None:
    """The window's upper margin: the straddling request's replica span, closed in the partition
    after its request's, is read through the window of the request's start alone (the
    drill-down's), as the one-shot store gives it."""
    one, inc = built["one"], built["inc"]
    parts = _incremental.Partitioning.read(inc._con)
    until = _closed.closed_until(inc._con)
    assert until is not None
    w = parts.partition_ns
    reader = _Reads(inc)
    row = reader.query("select request_key, first_seen_at, part from requests "
                       "where request_id like '%-straddling'")
    assert row.height == 1
    key, at, part = str(row["request_key"][0]), row["first_seen_at"][0], int(row["part"][0])
    # both partitions are closed, and the window of ``at`` alone ends in the first
    assert part + 1 < until and _unix_ns(at) // w == part
    raw = pl.read_parquet(_closed.folder(inc.path) / "raw_spans" / f"part={part + 1}")
    replica = raw.filter(pl.col("a_request_id").str.ends_with("-straddling"))
    assert replica["a_component"].to_list() == ["replica"]
    want = queries.request_spans(_Reads(one), key)
    got = queries.request_spans(reader, key, at=at)
    assert replica["span_id"][0] in got["span_id"].to_list()
    assert_frame_equal(_sorted(want), _sorted(got))
