"""The dashboard's time window: every page shows the hour ending at the newest request by
default, the sidebar's picker widens or narrows it (one state for every page, kept in the URL),
and the query functions read only the window's requests.

The store here spans five hours (300 requests a minute apart), so the default window holds
the last 61 of them; the numbers shown are checked against SQL written here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import duckdb
import polars as pl
import pytest
from _stores import mart_store
from polars.testing import assert_frame_equal
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import DateTimeInput
from test_pages import APP, PAGES, TIMEOUT, assert_clean, metric, sql, texts

import audit
from audit import queries
from audit.queries import TimeWindow
from dashboards import _ui

N = 300
SPACING = timedelta(minutes=1)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NEWEST = T0 + (N - 1) * SPACING
LAST_HOUR = TimeWindow(NEWEST - timedelta(hours=1), NEWEST)
IN_LAST_HOUR = 61  # minutes 239..299, both ends included


@pytest.fixture(scope="module")
def long_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mart_store(tmp_path_factory.mktemp("long") / "audit.duckdb", n=N,
                      spacing_ms=int(SPACING.total_seconds() * 1000))


@pytest.fixture(scope="module")
def final_db(tmp_path_factory: pytest.TempPathFactory, long_db: Path) -> Path:
    """The long store with the finality column the partitioned requests carry: the requests
    of the last 20 minutes are still provisional."""
    path = tmp_path_factory.mktemp("final") / "audit.duckdb"
    path.write_bytes(long_db.read_bytes())
    con = duckdb.connect(str(path))
    con.execute("alter table requests add column verdict_final boolean")
    con.execute("update requests set verdict_final = first_seen_at < ?",
                [NEWEST - timedelta(minutes=20)])
    con.execute("checkpoint")
    con.close()
    return path


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    _ui._cached.clear()
    _ui._open.clear()
    yield


def between(db: Path, start: datetime, end: datetime, where: str = "true") -> int:
    return int(sql(db, f"select count(*) from requests where first_seen_at between ? and ? "
                       f"and {where}", [start, end]))


def open_app(monkeypatch: pytest.MonkeyPatch, db: Path, page: str,
             url: Mapping[str, str] | None = None) -> AppTest:
    """``page`` opened from a link carrying ``url``'s query parameters."""
    monkeypatch.setenv(_ui.ENV_DB, str(db))
    monkeypatch.delenv(_ui.ENV_TOKEN, raising=False)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for k, v in (url or {}).items():
        at.query_params[k] = v
    at.run()
    if page != "overview":
        at.switch_page(f"app_pages/{page}.py").run()
    assert_clean(at)
    assert [t.value for t in at.title] == [PAGES[page]]
    return at


def sidebar(at: AppTest) -> str:
    return "\n".join(str(e.value) for kind in ("caption", "warning", "markdown")
                     for e in getattr(at.sidebar, kind))


# --------------------------------------------------------------------------------------------
# The query functions
# --------------------------------------------------------------------------------------------
def test_time_window_bounds() -> None:
    naive = TimeWindow(datetime(2026, 1, 1), None)
    assert naive.start == T0 and naive.end is None and not naive.is_all
    assert TimeWindow().is_all
    assert TimeWindow.ending_at(NEWEST, timedelta(hours=1)) == LAST_HOUR
    assert LAST_HOUR.contains(NEWEST) and LAST_HOUR.contains(NEWEST - timedelta(hours=1))
    assert not LAST_HOUR.contains(NEWEST - timedelta(hours=1, seconds=1))
    with pytest.raises(ValueError, match="starts after it ends"):
        TimeWindow(NEWEST, T0)


def test_store_range_and_window_counts(long_db: Path, final_db: Path) -> None:
    reader = audit.open(long_db)
    span = queries.store_range(reader).row(0, named=True)
    assert span == {"requests": N, "first_at": T0, "last_at": NEWEST}
    counts = queries.window_counts(reader, LAST_HOUR).row(0, named=True)
    assert counts["requests"] == IN_LAST_HOUR and counts["final"] is None
    assert counts["first_at"] == NEWEST - timedelta(hours=1) and counts["last_at"] == NEWEST
    final = queries.window_counts(audit.open(final_db), LAST_HOUR).row(0, named=True)
    provisional = between(final_db, NEWEST - timedelta(minutes=20), NEWEST)
    assert (final["final"], final["provisional"]) == (IN_LAST_HOUR - provisional, provisional)


@pytest.mark.parametrize("column", ["verdict_final", "is_final"])
def test_either_finality_column_splits_the_window(tmp_path: Path, long_db: Path,
                                                  column: str) -> None:
    path = tmp_path / "final.duckdb"
    path.write_bytes(long_db.read_bytes())
    con = duckdb.connect(str(path))
    con.execute(f"alter table requests add column {column} boolean")
    con.execute(f"update requests set {column} = request_id < 'req-000250'")
    con.close()
    counts = queries.window_counts(audit.open(path), LAST_HOUR).row(0, named=True)
    assert (counts["final"], counts["provisional"]) == (250 - 239, 300 - 250)


def _same(a: Any, b: Any) -> bool:
    """Equal answers (floats to 1e-9: parallel sums differ in the last bits)."""
    if isinstance(a, queries.SlowPage):
        return _same(a.requests, b.requests) and _same(a.causes, b.causes)
    if isinstance(a, pl.DataFrame):
        try:
            assert_frame_equal(a, b, rel_tol=1e-9)
        except AssertionError:
            return False
        return True
    return bool(a == b)


QUERIES: dict[str, Any] = {
    "overview_totals": lambda r, w: queries.overview_totals(r, window=w),
    "requests_over_time": lambda r, w: queries.requests_over_time(r, window=w),
    "replica_load_over_time": lambda r, w: queries.replica_load_over_time(r, window=w),
    "failures_by_kind": lambda r, w: queries.failures_by_kind(r, window=w),
    "filter_options": lambda r, w: queries.filter_options(r, window=w),
    "slow_page": lambda r, w: queries.slow_page(r, window=w),
    "slow_requests": lambda r, w: queries.slow_requests(r, window=w),
    "slow_cause_breakdown": lambda r, w: queries.slow_cause_breakdown(r, window=w),
    "request_matches": lambda r, w: queries.request_matches(r, "req-000010", window=w),
    "cache_by_replica": lambda r, w: queries.cache_by_replica(r, window=w),
    "cache_scatter": lambda r, w: queries.cache_scatter(r, window=w),
    "cache_confusion": lambda r, w: queries.cache_confusion(r, window=w),
    "cache_misses_over_time": lambda r, w: queries.cache_misses_over_time(r, window=w),
    "cache_hit_rate_over_time": lambda r, w: queries.cache_hit_rate_over_time(r, window=w),
    "telemetry_age_by_router": lambda r, w: queries.telemetry_age_by_router(r, window=w),
    "telemetry_age_over_time": lambda r, w: queries.telemetry_age_over_time(r, window=w),
    "herding_episodes": lambda r, w: queries.herding_episodes(r, window=w),
    "run_list": lambda r, w: queries.run_list(r, window=w),
    "run_summaries": lambda r, w: queries.run_summaries(r, ["run-rr", "run-ca"], window=w),
    "run_failures": lambda r, w: queries.run_failures(r, ["run-rr", "run-ca"], window=w),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_every_page_query_reads_only_its_window(long_db: Path, name: str) -> None:
    """Each query behind a page answers differently for the last hour than for the whole
    store (None and ``TimeWindow()`` both meaning the whole store)."""
    reader = audit.open(long_db)
    run = QUERIES[name]
    everything = run(reader, None)
    assert _same(everything, run(reader, TimeWindow()))
    assert not _same(everything, run(reader, LAST_HOUR)), name


@pytest.mark.parametrize("window", [LAST_HOUR, TimeWindow(T0 + timedelta(minutes=100), None),
                                    TimeWindow(None, T0 + timedelta(minutes=10))])
def test_window_totals_match_sql(long_db: Path, window: TimeWindow) -> None:
    reader = audit.open(long_db)
    totals = queries.overview_totals(reader, window=window).row(0, named=True)
    expected = between(long_db, window.start or T0, window.end or NEWEST)
    assert totals["requests"] == expected
    failed = between(long_db, window.start or T0, window.end or NEWEST, "status <> 'ok'")
    assert totals["failed"] == failed
    assert queries.slow_requests(reader, window=window, limit=10_000)["started_at"].map_elements(
        window.contains, return_dtype=pl.Boolean).all()


class _PlanReader:
    """Runs a query function's SQL under EXPLAIN ANALYZE on one connection and keeps the plan:
    which row groups each scan read."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.plans: list[str] = []

    def query(self, sql: str, params: Sequence[Any] | None = None, *, slo: Any = None,
              variables: Mapping[str, float | str] | None = None) -> pl.DataFrame:
        del slo, variables
        if sql.lstrip().lower().startswith("select table_name"):  # relation_columns
            frame: pl.DataFrame = pl.from_pandas(self.con.execute(sql, params).df())
            return frame
        rows = self.con.execute("explain analyze " + sql, params).fetchall()
        self.plans.append("\n".join(str(r[1]) for r in rows))
        return pl.DataFrame()


def test_the_window_prunes_row_groups(tmp_path: Path) -> None:
    """A window's predicate reaches the scan of ``requests`` as a filter on its start, so
    DuckDB skips the row groups (122,880 rows each) outside the window: the page's cost
    follows the window, not the store."""
    con = duckdb.connect(str(tmp_path / "wide.duckdb"))
    con.execute("""
        create table requests as
        select 'req-' || i as request_id, 'k' || i as request_key, 'run-' || (i % 2) as run_id,
            'p' as policy, 'router-a' as router_id, 'replica-0' as chosen_replica,
            'replica-0' as served_by, 'ok' as status, 100.0 as ttft_ms,
            timestamptz '2026-01-01 00:00:00+00' + to_milliseconds(i * 100) as first_seen_at,
            10 as predicted_cached_tokens, 10 as actual_cached_tokens, 500 as input_tokens
        from range(3 * 122880 + 40000) as t(i)""")  # the last hour in the last row group
    newest = con.execute("select max(first_seen_at) from requests").fetchall()[0][0]
    reader = _PlanReader(con)
    window = TimeWindow.ending_at(newest, timedelta(hours=1))
    calls: list[Callable[[TimeWindow | None], object]] = [
        lambda w: queries.run_list(reader, window=w),
        lambda w: queries.cache_by_replica(reader, window=w),
        lambda w: queries.window_counts(reader, w),
    ]
    for call in calls:
        call(window)
        assert _scanned(reader.plans[-1]) == 1, reader.plans[-1]
        call(None)
        assert _scanned(reader.plans[-1]) == 4, reader.plans[-1]
    queries.request_matches(reader, "req-400000", window=window)
    assert _scanned(reader.plans[-1]) == 1, reader.plans[-1]
    con.close()


def _scanned(plan: str) -> int:
    """Row groups the plan's scans of ``requests`` (the one table here) read, at most: all 4
    when the plan names no pruning."""
    found = [int(n) for n in re.findall(r"Row Groups Scanned: (\d+) / 4", plan)]
    return max(found) if found else 4


# --------------------------------------------------------------------------------------------
# The pages
# --------------------------------------------------------------------------------------------
def test_default_window_is_the_hour_up_to_the_newest_request(monkeypatch: pytest.MonkeyPatch,
                                                             long_db: Path) -> None:
    at = open_app(monkeypatch, long_db, "overview")
    assert metric(at, "Requests") == f"{IN_LAST_HOUR:,}"
    assert IN_LAST_HOUR == between(long_db, NEWEST - timedelta(hours=1), NEWEST)
    assert at.selectbox(key=_ui.WINDOW_KEY).value == _ui.DEFAULT_WINDOW == "last 1 h"
    side = sidebar(at)
    assert "Showing requests between 2026-01-01 03:59:00 and 2026-01-01 04:59:00 UTC." in side
    assert "The store covers 2026-01-01 00:00:00 to 2026-01-01 04:59:00 UTC (300 requests)." in side
    assert "final" not in side  # no finality column in this store


def test_all_shows_every_request_on_every_page(monkeypatch: pytest.MonkeyPatch,
                                               long_db: Path) -> None:
    """Picked once, the window holds across pages."""
    at = open_app(monkeypatch, long_db, "overview")
    at.selectbox(key=_ui.WINDOW_KEY).set_value(_ui.WINDOW_ALL).run()
    assert_clean(at)
    assert metric(at, "Requests") == f"{N:,}"
    assert "Showing requests over the whole store." in sidebar(at)
    at.switch_page("app_pages/slow.py").run()
    assert_clean(at)
    slow = sql(long_db, "select count(*) from requests where status = 'ok' and "
                        "(ttft_ms > 2000 or coalesce(tpot_ms > 100, false))")
    assert metric(at, "Slow requests") == f"{slow:,}"


def test_a_link_keeps_the_window(monkeypatch: pytest.MonkeyPatch, long_db: Path) -> None:
    at = open_app(monkeypatch, long_db, "policies", {"window": _ui.WINDOW_ALL})
    cmp = at.dataframe[0].value.set_index("run_id")
    assert cmp["requests"].sum() == N
    at = open_app(monkeypatch, long_db, "overview", {"window": "last 15 min"})
    assert metric(at, "Requests") == f"{between(long_db, NEWEST - timedelta(minutes=15), NEWEST)}"


def test_custom_range(monkeypatch: pytest.MonkeyPatch, long_db: Path) -> None:
    at = open_app(monkeypatch, long_db, "overview", {
        "window": _ui.WINDOW_CUSTOM, "window_from": "2026-01-01T01:00", "window_to": "2026-01-01T01:30"})
    start, end = T0 + timedelta(hours=1), T0 + timedelta(hours=1, minutes=30)
    assert metric(at, "Requests") == f"{between(long_db, start, end)}" == "31"
    assert "between 2026-01-01 01:00:00 and 2026-01-01 01:30:00 UTC" in sidebar(at)
    # picked in the sidebar: the range starts as the window shown until then
    at = open_app(monkeypatch, long_db, "overview")
    at.selectbox(key=_ui.WINDOW_KEY).set_value(_ui.WINDOW_CUSTOM).run()
    assert_clean(at)
    since, until = (cast(DateTimeInput, e) for e in at.get("date_time_input"))
    assert since.value == datetime(2026, 1, 1, 3, 59)
    until.set_value(datetime(2026, 1, 1, 4, 9)).run()
    assert metric(at, "Requests") == "11"


def test_a_custom_range_that_ends_before_it_starts(monkeypatch: pytest.MonkeyPatch,
                                                   long_db: Path) -> None:
    at = open_app(monkeypatch, long_db, "overview", {
        "window": _ui.WINDOW_CUSTOM, "window_from": "2026-01-01T02:00", "window_to": "2026-01-01T01:00"})
    assert "ends before it starts: showing the last hour" in sidebar(at)
    assert metric(at, "Requests") == f"{IN_LAST_HOUR:,}"


@pytest.mark.parametrize("page", ["overview", "slow", "cache", "telemetry", "policies"])
def test_an_empty_window_says_so(monkeypatch: pytest.MonkeyPatch, long_db: Path,
                                 page: str) -> None:
    at = open_app(monkeypatch, long_db, page, {
        "window": _ui.WINDOW_CUSTOM, "window_from": "2025-12-31T10:00", "window_to": "2025-12-31T11:00"})
    assert ("No requests between 2025-12-31 10:00:00 and 2025-12-31 11:00:00 UTC; the store "
            "covers 2026-01-01 00:00:00 to 2026-01-01 04:59:00 UTC.") in texts(at)
    assert not at.metric


def test_herding_episodes_follow_the_window(monkeypatch: pytest.MonkeyPatch,
                                            long_db: Path) -> None:
    """The fixture's episodes are in the store's first seconds: out of the default window."""
    at = open_app(monkeypatch, long_db, "telemetry")
    assert "No herding episodes detected." in texts(at)
    at = open_app(monkeypatch, long_db, "telemetry", {"window": _ui.WINDOW_ALL})
    episodes = [df.value for df in at.dataframe if "routers" in df.value.columns]
    assert list(episodes[0]["decisions"]) == [14, 11, 9]


def test_a_request_outside_the_window_still_opens(monkeypatch: pytest.MonkeyPatch,
                                                  long_db: Path) -> None:
    at = open_app(monkeypatch, long_db, "request", {"request_id": "req-000003"})
    assert "No request `req-000003` started between" in texts(at)
    assert "listed from the whole store" in texts(at)
    ttft = sql(long_db, "select ttft_ms from requests where request_id = 'req-000003'")
    assert metric(at, "TTFT") == _ui.fmt_ms(ttft)


def test_sidebar_splits_final_and_provisional(monkeypatch: pytest.MonkeyPatch,
                                              final_db: Path) -> None:
    at = open_app(monkeypatch, final_db, "overview")
    provisional = between(final_db, NEWEST - timedelta(minutes=20), NEWEST)
    assert (f"In the window: {IN_LAST_HOUR - provisional:,} final, {provisional:,} provisional."
            in sidebar(at))


def test_the_sql_page_says_it_reads_everything(monkeypatch: pytest.MonkeyPatch,
                                               long_db: Path) -> None:
    at = open_app(monkeypatch, long_db, "sql")
    assert "The SQL page reads the whole store" in sidebar(at)
