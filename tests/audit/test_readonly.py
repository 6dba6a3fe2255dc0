"""Read-only queries cannot write, whatever wraps the write, on every path a user reaches
(``audit.open`` on a file, ``Store.query_arrow`` as the collector runs it, the collector's HTTP
endpoint), and runaway queries are bounded and can be stopped."""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from relation_rows import scenario_rows

import audit
from audit._errors import QueryCancelled, QueryError, QueryTimeout, ReadOnlyError
from audit._readonly import QueryCancel, QueryLimits, check_read_only, run_read_only
from audit._store import Store
from collectors.otlp import Collector, CollectorConfig

BYPASSES = [
    # EXPLAIN ANALYZE executes what it wraps
    "explain analyze delete from raw_spans",
    "EXPLAIN /* comment */ ANALYZE DROP TABLE raw_span_events",
    "explain analyze insert into raw_spans select * from raw_spans",
    "explain (format json) delete from raw_spans",
    "explain analyze update raw_spans set name = 'x'",
    "explain analyze create table stolen as select * from raw_spans",
    "explain analyze checkpoint",
    "explain analyze copy raw_spans to 'x.csv'",
    # statements and functions that write or reach outside
    "checkpoint", "force checkpoint", "pragma force_checkpoint", "call checkpoint()",
    "select * from checkpoint()", "select * from force_checkpoint()",
    "with c as (select * from checkpoint()) select 1 from c",
    "select 1 where exists (select * from checkpoint())",
    "select * from query('select * from checkpoint()')",
    "select * from json_execute_serialized_sql('{}')",
    "select * from enable_logging()", "select * from truncate_duckdb_logs()",
    "select nextval('s')", "select setval('s', 1)", "select setseed(0.5)",
    "pivot raw_spans on name",  # a dynamic pivot creates an enum type first
    "delete from raw_spans", "drop table raw_spans", "truncate raw_spans",
    "insert into raw_spans select * from raw_spans", "update raw_spans set name = 'x'",
    "merge into raw_spans using raw_spans s on true when matched then delete",
    "create temp table t as select 1", "create view v as select 1", "alter table raw_spans add column z int",
    "comment on table raw_spans is 'x'", "attach ':memory:' as m", "detach database x", "use memory",
    "copy raw_spans to 'x.csv'", "export database 'x'", "import database 'x'",
    "install httpfs", "load httpfs", "set enable_external_access = true", "reset threads",
    "set variable x = 1", "prepare p as delete from raw_spans", "execute p", "vacuum", "analyze",
    "begin", "commit", "rollback", "select 1; delete from raw_spans",
    "select 1; explain analyze delete from raw_spans",
    "/* select */ delete from raw_spans", "select * from read_csv('/etc/passwd')",
    "select * from read_parquet('x.parquet')", "select * from glob('*')",
]

READS = [
    "select count(*) from raw_spans", "with a as (select 1 as x) select * from a", "from raw_spans limit 1",
    "describe raw_spans", "show tables", "summarize raw_spans", "explain select 1",
    "explain analyze select count(*) from raw_spans", "pivot raw_spans on kind in (1, 2) using count(*)",
    "select * from range(3)", "select * from duckdb_tables()", "select * from query_table('raw_spans')",
    "select getvariable('routeaudit_ttft_slo_ms')",
]


@pytest.fixture(scope="module")
def _filled_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("filled") / "audit.duckdb"
    store = Store(path)
    spans, events = scenario_rows().tables()
    store.append(spans=spans, events=events)
    store.close()
    return path


@pytest.fixture
def filled_store(_filled_template: Path, tmp_path: Path) -> Path:
    """A closed store holding the scenario rows, each test's own copy (tests try to write)."""
    files = sorted(_filled_template.parent.iterdir())
    assert [f.name for f in files] == [_filled_template.name], files
    path = tmp_path / _filled_template.name
    shutil.copyfile(_filled_template, path)
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fingerprint(reader: audit.Reader) -> tuple[object, ...]:
    """What a write would change: the tables and the raw rows (order-independent)."""
    tables = reader.query("select table_name from duckdb_tables() order by 1")["table_name"].to_list()
    rows = []
    for table in ("raw_spans", "raw_span_events", "raw_snapshots"):
        got = reader.query(f"select count(*) as n, sum(hash(t)) as h from {table} as t")
        rows.append((table, got["n"][0], got["h"][0]))
    return tuple(tables), tuple(rows)


@pytest.mark.parametrize("sql", BYPASSES)
def test_guard_refuses_every_bypass(sql: str) -> None:
    with pytest.raises(QueryError):  # ReadOnlyError, or a parse error for what DuckDB cannot parse
        check_read_only(sql)


@pytest.mark.parametrize("sql", READS)
def test_guard_accepts_reads(sql: str) -> None:
    check_read_only(sql)


def test_explain_analyze_write_is_named_as_refused() -> None:
    with pytest.raises(ReadOnlyError, match="delete statements are not allowed"):
        check_read_only("explain analyze delete from raw_spans")


def test_file_reader_refuses_bypasses_and_leaves_the_file_byte_for_byte(filled_store: Path) -> None:
    before = _sha256(filled_store)
    reader = audit.open(filled_store)
    for sql in READS:
        reader.query(sql)
    for sql in BYPASSES:
        with pytest.raises(QueryError):
            reader.query(sql)
    assert _sha256(filled_store) == before


def test_store_refuses_bypasses_and_keeps_every_row(filled_store: Path) -> None:
    store = Store(filled_store)
    try:
        before = store.query_arrow("select count(*) as n from raw_spans")["n"][0].as_py()
        assert before > 0
        for sql in BYPASSES:
            with pytest.raises(QueryError):
                store.query_arrow(sql)
        assert store.query_arrow("select count(*) as n from raw_spans")["n"][0].as_py() == before
    finally:
        store.close()


def test_second_wall_rolls_back_a_write_that_passed_the_first(filled_store: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Were the statement check ever wrong, the collector's transaction is rolled back."""
    import audit._readonly as readonly
    import audit._store as store_module

    monkeypatch.setattr(readonly, "check_read_only", lambda sql: None)
    monkeypatch.setattr(store_module, "check_read_only", lambda sql: None)
    store = Store(filled_store)
    try:
        n = store.query_arrow("select count(*) as n from raw_spans")["n"][0].as_py()
        store.query_arrow("explain analyze delete from raw_spans")
        store.query_arrow("delete from raw_span_events returning 1")
        assert store.query_arrow("select count(*) as n from raw_spans")["n"][0].as_py() == n
    finally:
        store.close()
    # and a reader of the file opens it read-only: the write fails outright
    with pytest.raises(QueryError, match="(?i)read.only"):
        audit.open(filled_store).query("delete from raw_spans returning 1")


@pytest.fixture
def live_collector(filled_store: Path) -> Iterator[Collector]:
    cfg = CollectorConfig(db_path=filled_store, http_port=0, grpc_port=None)
    with Collector(cfg) as collector:
        yield collector


def test_collector_refuses_bypasses_and_keeps_the_store(live_collector: Collector, filled_store: Path) -> None:
    reader = audit.open(filled_store)  # finds the live collector through its sidecar
    before = _fingerprint(reader)
    for sql in BYPASSES:
        with pytest.raises(QueryError):
            reader.query(sql)
    assert _fingerprint(reader) == before


def test_time_limit_interrupts_a_runaway_query(filled_store: Path) -> None:
    reader = audit.open(filled_store, limits=QueryLimits(timeout_s=0.5))
    with pytest.raises(QueryTimeout, match="longer than 0.5 s"):
        reader.query("select count(*) from range(4000000000) a, range(4000000000) b")


def test_row_and_byte_limits(filled_store: Path) -> None:
    with pytest.raises(QueryError, match="more than 1,000 rows"):
        audit.open(filled_store, limits=QueryLimits(max_rows=1000)).query("select * from range(100000)")
    with pytest.raises(QueryError, match="larger than"):
        audit.open(filled_store, limits=QueryLimits(max_bytes=1 << 20)).query(
            "select repeat('x', 1000) as s from range(100000)")
    assert audit.open(filled_store, limits=QueryLimits(max_rows=1000)).query(
        "select * from range(1000)").height == 1000


def test_cancel_stops_a_running_query_from_another_thread(filled_store: Path) -> None:
    import duckdb

    con = duckdb.connect(str(filled_store), read_only=True)
    cancel = QueryCancel()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_read_only(con, "select count(*) from range(4000000000) a, range(4000000000) b",
                          limits=QueryLimits(timeout_s=None), cancel=cancel, rollback=False)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    cancel.cancel("client went away")
    worker.join(60)
    con.close()
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], QueryCancelled)
    assert "client went away" in str(errors[0])


def test_close_stops_running_queries(filled_store: Path) -> None:
    store = Store(filled_store, query_limits=QueryLimits(timeout_s=None))
    started = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        started.set()
        try:
            store.query_arrow("select count(*) from range(4000000000) a, range(4000000000) b")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    started.wait(10)
    while worker.is_alive() and not store._active:  # the query registered itself
        worker.join(0.01)
    store.close()
    worker.join(60)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], QueryCancelled)


def test_stop_work_interrupts_a_running_rebuild(filled_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large store's rebuild does not hold a stop: it is interrupted and rolled back, and the
    next writer knows the relations lag."""
    from audit import _relations

    store = Store(filled_store)
    spans, events = scenario_rows().tables()
    more = spans.set_column(spans.schema.get_field_index("span_id"), "span_id",
                            pa.array([f"{i:016x}" for i in range(spans.num_rows)]))
    store.append(spans=more)
    started = threading.Event()

    def slow_refresh(con: duckdb.DuckDBPyConnection, **_: object) -> int:
        started.set()
        con.execute("select count(*) from range(4000000000) a, range(4000000000) b").fetchall()
        return 0

    monkeypatch.setattr(_relations, "refresh", slow_refresh)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            store.refresh()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(30)
    store.stop_work()
    worker.join(60)
    assert not worker.is_alive() and len(errors) == 1
    store.close()  # does not rebuild while stopping
    monkeypatch.undo()
    reopened = Store(filled_store)
    try:
        assert reopened.dirty  # the relations lag the stored spans: this writer rebuilds them
    finally:
        reopened.close()
