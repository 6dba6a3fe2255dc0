"""The store's write path, the read-only guard and SLO settings (no collector involved)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import audit
from audit import _span_keys, queries
from audit._errors import QueryError, ReadOnlyError, StoreError
from audit._readonly import check_read_only
from audit._store import MIN_REFRESH_GAP_S, Store
from audit.schema import RAW_SPAN_EVENTS_SCHEMA, RAW_SPANS_SCHEMA, has_primary_key, raw_ddl
from collectors.otlp._decode import decode, parse_protobuf


def _span(span_id: str, name: str = "s") -> dict[str, object]:
    return dict(trace_id="ab" * 16, span_id=span_id, name=name, kind="internal",
                start_ns=1_795_939_000_000_000_000, end_ns=1_795_939_000_100_000_000,
                status_code="unset", received_ns=time.time_ns(), event_count=0)


def _spans(*ids: str) -> pa.Table:
    return pa.Table.from_pylist([_span(i) for i in ids], schema=RAW_SPANS_SCHEMA)


class SteppedClock:
    """Monotonic seconds that move only when the test steps them: pacing and back-off are
    checked just before and just after each boundary, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


def test_duplicates_are_stored_once_within_and_across_batches(store_path: Path) -> None:
    store = Store(store_path)
    assert store.append(_spans("0000000000000001", "0000000000000001", "0000000000000002")) == 2
    assert store.append(_spans("0000000000000002", "0000000000000003")) == 1
    store.close()
    store.close()  # closing twice is harmless
    rows = audit.open(store_path).query("select span_id from raw_spans order by span_id")
    assert rows["span_id"].to_list() == ["0000000000000001", "0000000000000002", "0000000000000003"]


def test_a_store_keyed_on_the_span_ids_loses_that_key_and_keeps_its_spans(store_path: Path) -> None:
    """A store whose raw_spans carries the primary key on (trace_id, span_id) gets the table
    rewritten without it when a writer opens it, and the keys of its spans: a span it held
    and a new one sent together store only the new one, and a reader sees every span once."""
    con = duckdb.connect(str(store_path))
    ddl = raw_ddl("raw_spans")
    end = "verbatim where its raw_span_events rows do not hold it whole, else NULL\n);"
    assert end in ddl
    con.execute(ddl.replace("a_decision_candidates varchar ", "a_decision_candidates varchar, ")
                .replace(end, "\n    primary key (trace_id, span_id)\n);"))
    con.register("old", _spans("0000000000000001", "0000000000000002"))
    con.execute("insert into raw_spans by name select * from old")
    assert has_primary_key(con, "raw_spans")
    con.close()
    store = Store(store_path)
    try:
        assert not has_primary_key(store._con, "raw_spans")
        assert store.append(_spans("0000000000000002", "0000000000000003")) == 1
        keys = store._con.execute(f"select count(*) from {_span_keys.SPAN_KEYS_TABLE}").fetchall()
        assert keys == [(3,)]
    finally:
        store.close()
    rows = audit.open(store_path).query("select span_id from raw_spans order by span_id")
    assert rows["span_id"].to_list() == ["0000000000000001", "0000000000000002", "0000000000000003"]


def _events(*keys: tuple[str, int]) -> pa.Table:
    return pa.Table.from_pylist(
        [dict(trace_id="ab" * 16, span_id=span_id, event_index=i, name="e", time_ns=1) for span_id, i in keys],
        schema=RAW_SPAN_EVENTS_SCHEMA)


@pytest.mark.parametrize("keyed", [False, True], ids=["new store", "store with the events key"])
def test_events_are_stored_once_with_their_spans(store_path: Path, keyed: bool) -> None:
    """raw_span_events has no primary key (it halved ingest); its rows stay unique all the same:
    a retried export's events, a group holding one export twice, and events sent again without
    their span are each stored once. A store created with the old key keeps it and its rule."""
    if keyed:  # the DDL before the key was dropped
        con = duckdb.connect(str(store_path))
        ddl = raw_ddl("raw_span_events")
        assert "c_dp_rank bigint\n" in ddl
        con.execute(ddl.replace(
            "c_dp_rank bigint\n", "c_dp_rank bigint,\n    primary key (trace_id, span_id, event_index)\n"))
        con.close()
    a, b, c = "000000000000000a", "000000000000000b", "000000000000000c"
    store = Store(store_path)
    assert store._events_keyed is keyed
    assert store.append(_spans(a, b), _events((a, 0), (a, 1), (b, 0))) == 2
    # the same export again, merged with a new one in one group (as the writer does)
    assert store.append(_spans(a, b, c, c), _events((a, 0), (a, 1), (b, 0), (c, 0), (c, 0))) == 1
    assert store.append(None, _events((b, 0), (c, 0), (c, 1))) == 0  # events alone
    assert store.append(_spans(), _events((b, 0), (c, 1))) == 0  # with an empty spans table
    store.close()
    rows = audit.open(store_path).query(
        "select span_id, event_index from raw_span_events order by all").rows()
    assert rows == [(a, 0), (a, 1), (b, 0), (c, 0), (c, 1)]


def test_committed_rows_survive_without_close(store_path: Path, tmp_path: Path) -> None:
    # A child process appends, then dies without closing: the WAL must carry the rows.
    import subprocess
    import sys

    code = (
        "import os, sys, time, pyarrow as pa\n"
        "from audit._store import Store\nfrom audit.schema import RAW_SPANS_SCHEMA\n"
        f"s = Store({str(store_path)!r})\n"
        f"row = {_span('00000000000000aa')!r}\n"
        "s.append(pa.Table.from_pylist([row], schema=RAW_SPANS_SCHEMA))\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    assert audit.open(store_path).query("select count(*) as n from raw_spans")["n"][0] == 1


def test_captures_decode_into_raw_tables(store_path: Path, captures: Path) -> None:
    store = Store(store_path)
    total = 0
    for pb in sorted((captures / "otlp").glob("*.pb")):
        batch = decode(parse_protobuf(pb.read_bytes()), time.time_ns())
        assert batch.rejected == []
        total += store.append(batch.spans, batch.events)
    store.close()
    reader = audit.open(store_path)
    assert reader.query("select count(*) as n from raw_spans")["n"][0] == total == 121
    urls = reader.query(
        "select distinct e_url from raw_span_events where name = 'Sending request' order by 1")
    assert urls["e_url"].to_list() == ["http://127.0.0.1:18001", "http://127.0.0.1:18002"]
    # vllm-router sends status codes and ports as strings: typed columns hold integers.
    typed = reader.query("select a_http_status, a_server_port from raw_spans "
                         "where kind = 'client' and service_name = 'vllm-router' limit 1")
    assert typed.row(0) == (200, typed["a_server_port"][0]) and typed["a_server_port"][0] in (18001, 18002)


@pytest.mark.parametrize("sql", [
    "drop table raw_spans", "delete from raw_spans", "insert into raw_spans select * from raw_spans",
    "attach 'x.db' as x", "copy raw_spans to 'x.csv'", "install httpfs", "load httpfs",
    "set enable_external_access = true", "pragma version", "create table t (a int)",
    "select 1; drop table raw_spans", "/* hi */ update raw_spans set name = 'x'",
])
def test_read_only_guard_refuses_writes(sql: str) -> None:
    with pytest.raises(ReadOnlyError):
        check_read_only(sql)


@pytest.mark.parametrize("sql", [
    "select 1", "with a as (select 1) select * from a", "describe raw_spans", "show tables",
    "summarize raw_spans", "explain select 1",
])
def test_read_only_guard_accepts_reads(sql: str) -> None:
    check_read_only(sql)


def test_file_functions_are_refused_inside_select(store_path: Path) -> None:
    Store(store_path).close()
    with pytest.raises(QueryError, match="(?i)not allowed|disabled|permission"):
        audit.open(store_path).query("select * from read_csv('/etc/passwd')")


def test_reader_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no store at"):
        audit.open(tmp_path / "missing.duckdb")
    not_a_store = tmp_path / "junk.duckdb"
    not_a_store.write_bytes(b"this is not duckdb" * 100)
    with pytest.raises(StoreError) as info:
        audit.open(not_a_store).query("select 1")
    assert "\n" not in str(info.value)


def test_slo_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from audit import SLO, load_slo
    from audit._errors import AuditError

    assert load_slo() == SLO()
    monkeypatch.setenv("ROUTEAUDIT_TTFT_SLO_MS", "900")
    assert load_slo().ttft_ms == 900
    cfg = tmp_path / "routeaudit.toml"
    cfg.write_text("[slo]\nttft_ms = 700\ntpot_ms = 40\n")
    assert load_slo(cfg) == SLO(ttft_ms=700, tpot_ms=40)
    assert load_slo(cfg, ttft_ms=300).ttft_ms == 300
    with pytest.raises(AuditError, match="positive"):
        load_slo(ttft_ms=-1)
    cfg.write_text("[slo\n")
    with pytest.raises(AuditError, match="TOML"):
        load_slo(cfg)


def test_slo_reaches_the_relations_as_session_variables(store_path: Path) -> None:
    Store(store_path).close()
    reader = audit.open(store_path, slo=audit.SLO(ttft_ms=1234, tpot_ms=56))
    row = reader.query("select getvariable('routeaudit_ttft_slo_ms') as t, "
                       "getvariable('routeaudit_tpot_slo_ms') as p").row(0)
    assert row == (1234.0, 56.0)


def test_public_surface() -> None:
    assert sorted(audit.__all__) == sorted([
        "open", "Store", "Retained", "Reader", "Reads", "SLO", "load_slo", "sidecar_path", "without_null_columns",
        "QueryLimits", "QueryCancel", "AuditError", "StoreError", "QueryError", "ReadOnlyError",
        "QueryTimeout", "QueryCancelled", "CollectorUnavailable"])
    for name in audit.__all__:
        assert getattr(audit, name) is not None


def test_raw_queries_do_not_wait_for_a_refresh(store_path: Path) -> None:
    store = Store(store_path)
    store.append(_spans("00000000000000b1"))
    assert store.dirty
    assert store.query_arrow("select count(*) as n from raw_spans").to_pylist() == [{"n": 1}]
    assert store.dirty  # raw tables are current without rebuilding the relations
    # with parameters too (DuckDB's get_table_names refuses those): a lookup by id, a CTE
    for sql, params in (("select count(*) as n from raw_spans where span_id = ?", ["00000000000000b1"]),
                        ("with s as (select * from raw_spans where span_id = $1) "
                         "select count(*) as n from s join raw_span_events e using (span_id)",
                         ["00000000000000b1"])):
        assert store.query_arrow(sql, params).num_rows == 1
        assert store.dirty, sql
    # a parametrised read of a relation, or of what cannot be told, still refreshes first
    store.query_arrow("select count(*) as n from requests where request_key <> ?", ["x"])
    assert not store.dirty
    store.append(_spans("00000000000000b2"))
    store.query_arrow("select * from query_table(?)", ["raw_spans"])
    assert not store.dirty
    store.close()


def test_slow_refreshes_are_paced_to_their_share_of_the_time(store_path: Path) -> None:
    clock = SteppedClock()
    store = Store(store_path, refresh_max_share=0.5, clock=clock)
    store.append(_spans("00000000000000c1"))
    store.last_refresh_s = 0.5  # as if the build in Store() was quick, however busy the machine
    assert store.refresh_if_due() and not store.dirty  # a quick refresh is always due
    # as if that refresh had taken 2.5 s: not quick, so the next waits 2.5 × (1 - 0.5) / 0.5
    store.last_refresh_s = 2.5
    assert store.refresh_gap_s == pytest.approx(2.5)
    store.append(_spans("00000000000000c2"))
    assert not store.refresh_if_due() and store.dirty
    store.query_arrow("select count(*) from requests")  # a query does not force it either
    assert store.dirty
    clock.step(2.4)
    assert not store.refresh_if_due() and store.dirty
    clock.step(0.2)
    assert store.refresh_if_due() and not store.dirty
    store.close()
    unpaced = Store(store_path, refresh_interval_s=1.0)
    unpaced.last_refresh_s = 2.5
    assert unpaced.refresh_gap_s == 1.0  # share 1: the interval alone
    unpaced.close()
    for share in (0, -0.5, 1.5):
        with pytest.raises(StoreError, match="refresh_max_share"):
            Store(store_path, refresh_max_share=share)


def test_pacing_applies_only_while_ingest_is_pressed(store_path: Path) -> None:
    clock = SteppedClock()
    store = Store(store_path, refresh_interval_s=2.0, refresh_max_share=0.25, clock=clock)
    pressed = [False]
    store.ingest_pressed = lambda: pressed[0]
    store.append(_spans("00000000000000d1"))
    store.refresh()
    store.last_refresh_s = 6.0  # a slow refresh: paced, it would be followed by 18 s
    # ingest idle: nothing paced, the next follows the slow one after the shortest pause
    assert store.refresh_gap_s == pytest.approx(MIN_REFRESH_GAP_S)
    store.append(_spans("00000000000000d2"))
    clock.step(MIN_REFRESH_GAP_S + 0.01)
    assert store.refresh_if_due() and not store.dirty
    # a refresh shorter than the interval: the next starts the interval after it started
    store.last_refresh_s = 0.5
    assert store.refresh_gap_s == pytest.approx(1.5)
    store.last_refresh_s = 6.0
    pressed[0] = True
    assert store.refresh_gap_s == pytest.approx(18.0)
    store.append(_spans("00000000000000d3"))
    clock.step(17.0)
    assert not store.refresh_if_due() and store.dirty
    clock.step(1.1)
    assert store.refresh_if_due()
    store.close()


def test_threads_sets_duckdbs_workers_and_is_checked(store_path: Path) -> None:
    store = Store(store_path, threads=1)
    assert store._con.execute("select current_setting('threads')").fetchone() == (1,)
    store.close()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(StoreError, match="threads"):
            Store(store_path, threads=bad)  # type: ignore[arg-type]


def test_with_a_background_refresher_queries_never_wait_for_a_slow_refresh(
        store_path: Path) -> None:
    # as if the last rebuild had taken 30 s (a large store) or 5 s; no pacing, the interval is over
    cases = ((False, 30.0, True), (True, 30.0, False), (True, 5.0, True))
    for i, (background, last_s, refreshed_by_query) in enumerate(cases):
        store = Store(store_path, background_refresh=background)
        store.append(_spans(f"00000000000000e{i}"))
        store.last_refresh_s = last_s
        store.query_arrow("select count(*) from requests")
        assert store.dirty is not refreshed_by_query, (background, last_s)
        assert store.refresh_if_due() is not refreshed_by_query  # the refresher's own call
        assert not store.dirty
        store.close()


def test_a_failing_refresh_backs_off_and_says_why(store_path: Path) -> None:
    clock = SteppedClock()
    store = Store(store_path, refresh_interval_s=1.0, clock=clock)
    store._con.execute("alter table raw_snapshots rename to raw_snapshots_gone")  # breaks staging
    store.append(_spans("00000000000000d1"))
    store.last_refresh_s = 0.5  # quick, so the first attempt is due at once
    with pytest.raises(StoreError, match="stg_snapshots"):
        store.refresh_if_due()
    assert "raw_snapshots" in (store.last_refresh_error or "") and store.dirty
    # the attempt was quick, yet neither the next call nor a query retries before the pause
    assert store.refresh_gap_s == pytest.approx(2.0)
    assert not store.refresh_if_due()
    assert store.query_arrow("select count(*) as n from raw_spans").to_pylist() == [{"n": 1}]
    clock.step(1.9)
    assert not store.refresh_if_due()
    clock.step(0.2)
    with pytest.raises(StoreError):
        store.refresh_if_due()
    assert store.refresh_gap_s == pytest.approx(4.0)  # doubled
    store._con.execute("alter table raw_snapshots_gone rename to raw_snapshots")
    clock.step(3.9)
    assert not store.refresh_if_due() and store.dirty
    clock.step(0.2)
    assert store.refresh_if_due() and not store.dirty
    assert store.last_refresh_error is None and store.refresh_gap_s == 1.0
    store._con.execute("alter table raw_snapshots rename to raw_snapshots_gone")
    store.append(_spans("00000000000000d2"))
    with pytest.raises(StoreError):
        store.close()  # the final refresh fails, the file is closed all the same
    with pytest.raises(duckdb.ConnectionException):
        store._con.execute("select 1")
    reopened = duckdb.connect(str(store_path))
    assert reopened.sql("select count(*) from raw_spans").fetchall() == [(2,)]
    reopened.close()


def test_a_store_from_another_sql_version_is_rebuilt_on_first_read(store_path: Path) -> None:
    store = Store(store_path)
    store.append(_spans("00000000000000c1"))
    store.close()
    import duckdb

    con = duckdb.connect(str(store_path))
    con.execute("update routeaudit_meta set value = 'older' where key = 'relations_version'")
    con.close()
    reader = audit.open(store_path)
    assert reader.query("select count(*) as n from raw_spans")["n"][0] == 1
    con = duckdb.connect(str(store_path), read_only=True)
    version = con.sql("select value from routeaudit_meta where key = 'relations_version'").fetchall()
    con.close()
    from audit._relations import relations_version

    assert version == [(relations_version(),)]


def test_the_slo_is_taken_in_one_form(store_path: Path) -> None:
    Store(store_path).close()
    reader = audit.open(store_path)
    assert queries.slow_requests(reader, audit.SLO(ttft_ms=500)).height == 0
    with pytest.raises(AttributeError):  # a mapping is not converted: audit.SLO is the form
        queries.slow_requests(reader, {"ttft_ms": 500.0, "tpot_ms": 20.0})  # type: ignore[arg-type]


def test_store_of_an_older_version_gains_typed_columns_filled_from_json(store_path: Path) -> None:
    # An older store lacks typed columns added since; opening it adds them and fills them from
    # the verbatim JSON, so staging reads old and new rows alike.
    import json

    import duckdb

    row = _span("00000000000000c1")
    row["attributes"] = json.dumps({"code.namespace": "smg::routers::http", "http.status_code": "503",
                                    "http.method": "POST"})
    store = Store(store_path)
    store.append(pa.Table.from_pylist([row], schema=RAW_SPANS_SCHEMA))
    store.close()
    con = duckdb.connect(str(store_path))
    for col in ("a_code_namespace", "a_http_status_legacy", "a_http_method_legacy"):
        con.execute(f"alter table raw_spans drop column {col}")
    con.close()

    store = Store(store_path)
    got = store.query_arrow("select a_code_namespace, a_http_status_legacy, a_http_method_legacy "
                            "from raw_spans").to_pylist()
    assert got == [{"a_code_namespace": "smg::routers::http", "a_http_status_legacy": 503,
                    "a_http_method_legacy": "POST"}]
    # and new rows can be appended by name again
    assert store.append(_spans("00000000000000c2")) == 1
    store.close()


def test_all_null_columns_are_left_out_of_the_insert_and_read_back_as_null(store_path: Path) -> None:
    # A batch of decision spans has none of a replica span's typed columns; they are dropped
    # before the insert (by name), and a column that holds one value is kept whole.
    from audit._store import without_null_columns

    rows = [_span("00000000000000d1"), _span("00000000000000d2")]
    rows[0].update(a_request_id="req-1", a_prefix_hashes=["00ff", "0a0b"])
    rows[1].update(a_attempt=2)
    table = pa.Table.from_pylist(rows, schema=RAW_SPANS_SCHEMA)
    narrow = without_null_columns(table)
    assert narrow is not None
    assert {"a_request_id", "a_prefix_hashes", "a_attempt", "trace_id"} <= set(narrow.column_names)
    assert "a_replica_id" not in narrow.column_names and "parent_span_id" not in narrow.column_names
    assert narrow.num_columns < table.num_columns and narrow.num_rows == 2
    # nothing to drop, no rows, or nothing left: the table as it came
    assert without_null_columns(narrow) is narrow
    assert without_null_columns(table.slice(0, 0)) is not None
    assert without_null_columns(table.slice(0, 0)).num_columns == table.num_columns  # type: ignore[union-attr]
    nulls = pa.table({"x": pa.nulls(3)})
    assert without_null_columns(nulls) is nulls and without_null_columns(None) is None

    store = Store(store_path)
    assert store.append(table) == 2
    got = store.query_arrow("select span_id, a_request_id, a_prefix_hashes, a_attempt, a_replica_id "
                            "from raw_spans order by span_id").to_pylist()
    store.close()
    assert got == [
        {"span_id": "00000000000000d1", "a_request_id": "req-1", "a_prefix_hashes": ["00ff", "0a0b"],
         "a_attempt": None, "a_replica_id": None},
        {"span_id": "00000000000000d2", "a_request_id": None, "a_prefix_hashes": None,
         "a_attempt": 2, "a_replica_id": None}]


def test_a_store_that_cannot_be_rebuilt_is_read_through_relations_of_its_own(
        store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Written by another version of the SQL and not rebuildable now (another process holds it):
    # each read builds this version's relations on its own connection, temporary tables and
    # views shadowing the store's, and answers as a current store would.
    from relation_rows import scenario_rows, scenario_snapshots

    from audit._store import Reader

    spans, events = scenario_rows().tables()
    store = Store(store_path)
    store.append(spans=spans, events=events, snapshots=scenario_snapshots())
    store.close()
    reads = ["select * from requests order by all", "select * from attributions order by all",
             "select * from slow_requests order by all"]
    want = [audit.open(store_path).query(sql) for sql in reads]
    assert want[1].height > 0  # the scenarios have attributed requests
    con = duckdb.connect(str(store_path))
    con.execute("update routeaudit_meta set value = 'older' where key = 'relations_version'")
    con.execute("delete from requests")  # stale: what this version builds must shadow it
    con.close()

    monkeypatch.setattr(Reader, "_rebuild", lambda self: False)
    reader = audit.open(store_path)
    for sql, rows in zip(reads, want, strict=True):
        assert reader.query(sql).equals(rows), sql
    from audit.queries import relation_columns

    assert relation_columns(reader)["requests"] == want[0].columns  # listed once, as read
    con = duckdb.connect(str(store_path), read_only=True)
    assert con.sql("select value from routeaudit_meta where key = 'relations_version'").fetchall() == [("older",)]
    assert con.sql("select count(*) from requests").fetchall() == [(0,)]  # the store's own, untouched
    con.close()


def test_freshness_counts_the_spans_the_relations_lack(store_path: Path) -> None:
    """A live collector's relations lag its raw tables between rebuilds: the spans committed
    since (here written past the store, as the writer does while no rebuild runs) are counted,
    and a rebuild takes them in."""
    store = Store(store_path)
    store.append(_spans("0000000000000001", "0000000000000002"))
    assert store.relations_lag_spans == 2  # built over no spans when the store was created
    before = _utc_us(time.time_ns())
    store.close()  # a writer's close rebuilds
    after = _utc_us(time.time_ns())
    fresh = queries.relations_freshness(audit.open(store_path)).row(0, named=True)
    assert (fresh["spans_in_relations"], fresh["spans_stored"], fresh["spans_pending"]) == (2, 2, 0)
    rebuilt_at = fresh["refreshed_at"]
    assert before <= rebuilt_at <= after + timedelta(microseconds=1)  # the close's rebuild

    con = duckdb.connect(str(store_path))
    con.register("late", _spans("0000000000000003", "0000000000000004", "0000000000000005"))
    con.execute("insert into raw_spans by name select * from late")
    con.close()
    fresh = queries.relations_freshness(audit.open(store_path)).row(0, named=True)
    assert (fresh["spans_in_relations"], fresh["spans_stored"], fresh["spans_pending"]) == (2, 5, 3)
    assert fresh["refreshed_at"] == rebuilt_at

    store = Store(store_path)
    assert store.relations_lag_spans == 3
    store.refresh()
    assert store.relations_lag_spans == 0
    store.close()
    fresh = queries.relations_freshness(audit.open(store_path)).row(0, named=True)
    assert (fresh["spans_in_relations"], fresh["spans_pending"]) == (5, 0)
    assert fresh["refreshed_at"] > rebuilt_at


def test_freshness_is_unknown_after_spans_were_deleted(store_path: Path) -> None:
    """Retention (docs/operations.md) deletes raw spans with the collector stopped: the
    relations still hold them, so the counts cannot say how far behind they are, and the next
    writer rebuilds them."""
    store = Store(store_path)
    store.append(_spans("0000000000000001", "0000000000000002", "0000000000000003"))
    store.close()
    con = duckdb.connect(str(store_path))
    con.execute("delete from raw_spans where span_id <> '0000000000000003'")
    con.close()
    fresh = queries.relations_freshness(audit.open(store_path)).row(0, named=True)
    assert (fresh["spans_in_relations"], fresh["spans_stored"], fresh["spans_pending"]) == (3, 1, None)
    store = Store(store_path)
    assert store.relations_lag_spans is None and store.dirty
    store.close()  # dirty: closing rebuilds
    fresh = queries.relations_freshness(audit.open(store_path)).row(0, named=True)
    assert (fresh["spans_in_relations"], fresh["spans_pending"]) == (1, 0)


def test_freshness_is_unknown_for_relations_that_did_not_count(store_path: Path) -> None:
    Store(store_path).close()
    con = duckdb.connect(str(store_path))
    con.execute("delete from routeaudit_meta where key = 'relations_spans'")  # an older version's
    con.close()
    fresh = queries.relations_freshness(audit.open(store_path)).row(0, named=True)
    assert fresh["spans_stored"] == 0 and fresh["spans_pending"] is None
    store = Store(store_path)
    assert store.relations_lag_spans is None
    store.refresh()
    assert store.relations_lag_spans == 0
    store.close()


def test_lag_is_described_with_its_age() -> None:
    from datetime import UTC, datetime, timedelta

    import polars as pl

    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

    def said(pending: int | None, ago: timedelta | None) -> str | None:
        return queries.describe_lag(pl.DataFrame({
            "refreshed_at": [None if ago is None else now - ago], "spans_in_relations": [10],
            "spans_stored": [10 + (pending or 0)], "spans_pending": [pending]}), now=now)

    assert said(0, timedelta(seconds=5)) is None
    assert said(None, timedelta(seconds=5)) is None
    assert said(5, None) is None
    assert said(1, timedelta(seconds=42)) == (
        "Relations rebuilt 42 s ago: 1 span stored since then is not in them yet.")
    assert said(1_234_567, timedelta(minutes=7)) == (
        "Relations rebuilt 7 min ago: 1,234,567 spans stored since then are not in them yet.")
    assert said(2, timedelta(hours=3)).startswith("Relations rebuilt 3.0 h ago")  # type: ignore[union-attr]


def _utc_us(ns: int) -> datetime:
    """A Unix nanosecond instant as a UTC datetime, cut to the microsecond as DuckDB stores it."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)
