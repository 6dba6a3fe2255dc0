"""Public parametrised relations are materialised at the defaults and read live otherwise."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from audit import _relations
from audit._store import Store, _tune
from routeaudit._demo import SAMPLE_DIR, write_sample_store


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_sample_store(tmp_path_factory.mktemp("cache") / "sample.duckdb")
    # the sample is smaller than CACHE_MIN_SPANS: build the cached relations explicitly
    con = duckdb.connect(str(path))
    _tune(con)
    _relations.refresh(con, cache_defaults=True)
    con.close()
    return path


def _read(path: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection tuned as a store's readers are."""
    con = duckdb.connect(str(path), read_only=True)
    _tune(con)
    return con


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[str]:
    return sorted(map(repr, con.sql(sql).fetchall()))


def test_cached_relations_equal_their_live_computation(sample_store: Path) -> None:
    con = _read(sample_store)
    assert set(_relations.cached()) == {"attributions", "slow_requests", "slo_summary",
                                        "calibration", "herding_episodes",
                                        "int_attr_requests_placed", "int_attr_calibration_parts",
                                        "int_slo_summary_parts"}
    for name in _relations.cached():
        assert _rows(con, f"select * from {name}") == _rows(con, f"select * from {name}__live"), name
    assert con.sql("select count(*) from attributions").fetchall()[0][0] > 0
    # at the defaults the plan reads the table alone: the live branch is folded away
    plan = con.sql("explain select * from attributions").fetchall()[0][1]
    assert "attributions__cached" in plan and "int_attr_candidates_state" not in plan


@pytest.mark.parametrize("variable, value", [("routeaudit_ttft_slo_ms", 300.0),
                                             ("routeaudit_cause_min_frac", 0.01)])
def test_other_settings_are_computed_live(sample_store: Path, variable: str, value: float) -> None:
    con = _read(sample_store)
    default = _rows(con, "select * from attributions")
    con.execute(f"set variable {variable} = {value}")
    got = _rows(con, "select * from attributions")
    assert got == _rows(con, "select * from attributions__live")
    assert got != default  # the setting matters on this data, so the cache would be wrong
    plan = con.sql("explain select * from attributions").fetchall()[0][1]
    if variable.endswith("_slo_ms"):
        # another SLO re-judges the requests, but each one's placement is read from the table
        # kept at the default thresholds
        assert "int_attr_requests_placed__cached" in plan
        assert "int_attr_candidates_state" not in plan
    else:
        assert "int_attr_candidates_state" in plan


def test_each_cache_follows_only_the_variables_it_reads() -> None:
    reads = _relations.variables_read()
    slo = {"routeaudit_ttft_slo_ms", "routeaudit_tpot_slo_ms"}
    assert reads["slo_summary"] == slo
    assert reads["int_attr_requests_placed"] and not reads["int_attr_requests_placed"] & slo
    assert reads["attributions"] == set(_relations.variable_defaults())
    assert reads["int_attr_candidates_state"] == set()


@pytest.fixture(scope="module")
def uncached_store(sample_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample store rebuilt without the default-SLO tables (read only by its users)."""
    import shutil

    plain = tmp_path_factory.mktemp("uncached") / "plain.duckdb"
    shutil.copyfile(sample_store, plain)
    con = duckdb.connect(str(plain))
    _tune(con)
    _relations.refresh(con, cache_defaults=False)
    con.close()
    return plain


@pytest.mark.parametrize("settings", [
    {"routeaudit_ttft_slo_ms": 200, "routeaudit_tpot_slo_ms": 6},
    {"routeaudit_cause_min_frac": 0.01},
    {"routeaudit_ttft_slo_ms": 300, "routeaudit_lookback_ms": 5000},
], ids=["slo", "threshold", "both"])
def test_a_cached_store_answers_as_an_uncached_one(sample_store: Path, uncached_store: Path,
                                                    settings: dict[str, float]) -> None:
    """Whatever a reader sets, the caches change nothing: every public relation equals the one
    of the same store built without them (everything computed from the tables at query time)."""
    cached, uncached = _read(sample_store), _read(uncached_store)
    assert uncached.sql("select count(*) from information_schema.tables "
                        "where table_name like '%__cached'").fetchall()[0][0] == 0
    for con in (cached, uncached):
        for name, value in settings.items():
            con.execute(f"set variable {name} = {value}")
    for name in _relations.public_relations():
        got = cached.sql(f"select * from {name}").pl()
        want = uncached.sql(f"select * from {name}").pl()
        order = [c for c, t in got.schema.items() if t.is_numeric() or t == pl.String]
        # floats: sums over parallel threads may differ in the last bits
        assert_frame_equal(got.sort(order, nulls_last=True), want.sort(order, nulls_last=True),
                           check_exact=False), name


def test_every_variable_the_sql_reads_has_a_default() -> None:
    # the cache is valid only where every variable is at its default: a variable read without
    # one would be invisible to that check
    # (scope variables excepted: they only narrow rows the cache holds too)
    text = "".join(r.sql for r in _relations.load_relations())
    scoped = sum(text.count(f"getvariable('{v}')") for v in _relations.SCOPE_VARIABLES)
    assert scoped > 0
    assert text.count("getvariable(") - scoped == len(_relations.variable_defaults()) > 10


def test_small_stores_are_not_cached(tmp_path: Path) -> None:
    store = Store(tmp_path / "small.duckdb")
    store.append(spans=pq.read_table(SAMPLE_DIR / "raw_spans.parquet"))
    store.refresh()
    names = set(store.query_arrow("select table_name from information_schema.tables")
                .column(0).to_pylist())
    store.close()
    assert "attributions" in names and "attributions__cached" not in names


def test_a_scope_gives_the_same_live_rows(sample_store: Path) -> None:
    """``routeaudit_scope_run`` / ``routeaudit_scope_request`` limit the live computation to one
    run / one request without changing its rows; the dashboard's one-request query uses the
    request scope, and reads the cache at the defaults."""
    import audit
    from audit import queries

    con = _read(sample_store)
    con.execute("set variable routeaudit_ttft_slo_ms = 300.0")
    runs = [r[0] for r in con.sql("select distinct run_id from requests order by 1").fetchall()]
    assert len(runs) >= 2
    # another SLO (placements read from their table), then other thresholds too (computed)
    for threshold in (None, "routeaudit_lookback_ms"):
        if threshold:
            con.execute(f"set variable {threshold} = 5000")
        for run in runs:
            for name in ("attributions", "slow_requests"):
                con.execute("reset variable routeaudit_scope_run")
                want = _rows(con, f"select * from {name}__live where run_id = '{run}'")
                con.execute(f"set variable routeaudit_scope_run = '{run}'")
                got = _rows(con, f"select * from {name}__live")
                assert got == want and want, (name, run, threshold)
                # the scope did narrow the computation (the judged requests are that run's only)
                for rel in ("int_attr_requests_judged", "int_attr_requests_placed__live"):
                    assert con.sql(f"select list(distinct r.run_id) from {rel} "
                                   "join requests r using (request_key)").fetchall()[0][0] == [run]
        con.execute("reset variable routeaudit_scope_run")
        plan = con.sql("explain select * from attributions").fetchall()[0][1]
        # still live (the SLO is not the default); the placements too once a threshold is not
        assert "attributions__cached" not in plan
        assert ("int_attr_candidates_state" in plan) == bool(threshold)
        if threshold:
            con.execute(f"reset variable {threshold}")
    # one request: every cause of each request explained, plus requests that are not slow
    picked = [r[0] for r in con.sql(
        "(select distinct request_id from attributions__live order by 1 limit 12) "
        "union all (select request_id from requests order by request_id limit 3)").fetchall()]
    for request in picked:
        want = _rows(con, f"select * from attributions__live where request_id = '{request}'")
        con.execute(f"set variable routeaudit_scope_request = '{request}'")
        assert _rows(con, "select * from attributions__live") == want, request
        assert con.sql("select count(*) from int_attr_requests_judged").fetchall()[0][0] == 1
        con.execute("reset variable routeaudit_scope_request")
    slow = con.sql("select request_id from attributions__live where is_primary limit 1").fetchall()[0][0]
    con.execute("reset variable routeaudit_ttft_slo_ms")
    slow_at_default = con.sql("select request_id from attributions where is_primary limit 1").fetchall()[0][0]
    con.close()

    reader = audit.open(sample_store)
    for slo, request in ((audit.SLO(ttft_ms=300.0, tpot_ms=100.0), slow), (None, slow_at_default)):
        (key,) = reader.query("select request_key from requests where request_id = ?",
                              [request])["request_key"]
        got = queries.request_attributions(reader, key, slo)
        live = reader.query("select * from attributions where request_key = ? "
                            "order by is_primary desc, excess_ms desc nulls last", [key],
                            slo=slo)
        assert got.equals(live) and got.height > 0


def test_the_slow_page_query_is_the_two_queries(sample_store: Path) -> None:
    """``queries.slow_page`` (one computation) returns what ``slow_requests`` and
    ``slow_cause_breakdown`` return, live and cached, filtered, limited and empty."""
    import audit
    from audit import queries

    reader = audit.open(sample_store)
    run = reader.query("select min(run_id) as r from requests")["r"][0]
    cases: list[dict[str, object]] = [
        {}, {"run": run}, {"cause": "stale_telemetry"}, {"cause": "no such cause"},
        {"limit": 3}, {"policy": "cache_aware", "run": run},
    ]
    seen_rows = 0
    # every case cached and live; the SLO under which nothing is slow (each live query computes
    # every request's verdict again) for the whole store only
    for slo, slo_cases in ((None, cases), (audit.SLO(ttft_ms=300.0, tpot_ms=100.0), cases),
                           (audit.SLO(ttft_ms=60_000.0, tpot_ms=1e4), cases[:1])):
        for kw in slo_cases:
            page = queries.slow_page(reader, slo, **kw)  # type: ignore[arg-type]
            limit = kw.pop("limit", None)
            rows = queries.slow_requests(reader, slo, **kw,  # type: ignore[arg-type]
                                         **({} if limit is None else {"limit": limit}))
            causes = queries.slow_cause_breakdown(reader, slo, **kw)  # type: ignore[arg-type]
            kw.update({} if limit is None else {"limit": limit})
            assert_frame_equal(page.requests, rows)
            # sums of many doubles may differ in the last bits between two parallel runs
            sums = ["total_excess_ms", "share"]
            assert_frame_equal(page.causes.drop(sums), causes.drop(sums))
            for column in sums:
                assert page.causes[column].to_list() == pytest.approx(
                    causes[column].to_list(), rel=1e-12)
            seen_rows += rows.height
    assert seen_rows > 0


def test_projection_views_are_not_stored_and_change_no_result(
        sample_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relation kept as a view (``PROJECTION_VIEWS``: ``stg_spans``) is not written at a
    refresh, and every table built from it holds what it holds when the relation is stored."""
    # the module's store is built as the relations are by default: its projections are views
    stores = {"view": _read(sample_store)}
    monkeypatch.setattr(_relations, "PROJECTION_VIEWS", ())
    path = write_sample_store(tmp_path / "table.duckdb")
    con = duckdb.connect(str(path))
    _tune(con)
    _relations.refresh(con, cache_defaults=True)
    stores["table"] = con
    try:
        kinds = {form: dict(con.sql(
            "select table_name, table_type from information_schema.tables "
            "where table_schema = 'main'").fetchall()) for form, con in stores.items()}
        assert kinds["view"]["stg_spans"] == "VIEW" and kinds["table"]["stg_spans"] == "BASE TABLE"
        tables = sorted(n for n, k in kinds["view"].items()
                        if k == "BASE TABLE" and not n.startswith(("raw_", "routeaudit_")))
        assert len(tables) > 20 and "int_spans_clock_corrected" in tables
        for name in tables + ["stg_spans"]:
            view_form, table_form = (stores[form].sql(f"select * from {name} order by all").pl()
                                     for form in ("view", "table"))
            # doubles summed in another order differ in the last bits
            assert_frame_equal(view_form, table_form, check_exact=False, rel_tol=1e-9)
        assert stores["view"].sql("select count(*) from requests").fetchall()[0][0] > 0
    finally:
        for con in stores.values():
            con.close()
