"""Every dashboard page under Streamlit's AppTest: empty store, synthetic marts, raw spans.

Numbers the pages show are checked against SQL written here, independently of
``audit.queries``.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from _stores import empty_store, mart_store, raw_store
from streamlit.testing.v1 import AppTest

import audit
from audit import queries
from dashboards import _ui

APP = str(Path(__file__).resolve().parents[2] / "dashboards" / "app.py")
PAGES = {
    "overview": "Overview",
    "slow": "Slow requests",
    "request": "Request drill-down",
    "cache": "Cache",
    "telemetry": "Telemetry",
    "policies": "Policies",
    "sql": "SQL",
}
TIMEOUT = 60


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return empty_store(tmp_path_factory.mktemp("empty") / "audit.duckdb")


@pytest.fixture(scope="session")
def mart_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mart_store(tmp_path_factory.mktemp("marts") / "audit.duckdb", n=400)


@pytest.fixture(scope="session")
def bare_mart_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Marts filled, but no attribution relations installed."""
    return mart_store(tmp_path_factory.mktemp("bare") / "audit.duckdb", n=120,
                      attribution=False)


@pytest.fixture(scope="session")
def raw_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return raw_store(tmp_path_factory.mktemp("raw") / "audit.duckdb", n=12)


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    # Streamlit caches are process-global; each test starts from a clean slate.
    _ui._cached.clear()
    _ui._open.clear()
    yield


def sql(db: Path, text: str, params: list[Any] | None = None) -> Any:
    """Independent check: one value straight from the store file."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(text, params).fetchone()[0]  # type: ignore[index]
    finally:
        con.close()


def open_page(monkeypatch: pytest.MonkeyPatch, db: Path, page: str,
              query_params: dict[str, str] | None = None) -> AppTest:
    monkeypatch.setenv(_ui.ENV_DB, str(db))
    monkeypatch.delenv(_ui.ENV_TOKEN, raising=False)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    for k, v in (query_params or {}).items():
        at.query_params[k] = v
    at.switch_page(f"app_pages/{page}.py").run()
    assert_clean(at)
    assert [t.value for t in at.title] == [PAGES[page]]
    return at


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def metric(at: AppTest, label: str) -> str:
    found = [m.value for m in at.metric if m.label == label]
    assert found, f"no metric {label!r}; have {[m.label for m in at.metric]}"
    return found[0]


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("info", "success", "warning", "markdown", "caption")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


# --------------------------------------------------------------------------------------------
# Empty store: every page renders an explanation, never a traceback
# --------------------------------------------------------------------------------------------
EMPTY_SAYS = {
    "overview": "No requests in this store yet",
    "slow": "No requests in this store yet",
    "request": "Pick a request on the Slow requests page",
    "cache": "No requests with both predicted and actual cached tokens",
    "telemetry": "No decision records yet: is the router instrumented?",
    "policies": "Nothing to compare in this store",
    "sql": "Read-only",
}


@pytest.mark.parametrize("page", list(PAGES))
def test_page_on_empty_store(monkeypatch: pytest.MonkeyPatch, empty_db: Path, page: str) -> None:
    at = open_page(monkeypatch, empty_db, page)
    assert EMPTY_SAYS[page] in texts(at)


def test_drilldown_of_unknown_request(monkeypatch: pytest.MonkeyPatch, empty_db: Path) -> None:
    at = open_page(monkeypatch, empty_db, "request", {"request_id": "nope"})
    assert "No request `nope`" in "\n".join(w.value for w in at.warning)


def test_missing_store_explains(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(_ui.ENV_DB, str(tmp_path / "absent.duckdb"))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert any("No store at" in e.value for e in at.error)


def test_token_gate(monkeypatch: pytest.MonkeyPatch, mart_db: Path) -> None:
    monkeypatch.setenv(_ui.ENV_DB, str(mart_db))
    monkeypatch.setenv(_ui.ENV_TOKEN, "s3cret")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception and not at.title[1:] and not at.metric
    box = at.text_input(key="token_input")
    assert box.proto.type == box.proto.PASSWORD
    box.set_value("wrong").run()
    assert any("Wrong token" in e.value for e in at.error) and not at.metric
    at.text_input(key="token_input").set_value("s3cret").run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Overview"]
    assert metric(at, "Requests") == "400"


# --------------------------------------------------------------------------------------------
# Synthetic marts: the numbers shown match SQL computed here
# --------------------------------------------------------------------------------------------
GOOD = ("coalesce(status, 'ok') = 'ok' and ttft_ms <= {t} "
        "and coalesce(tpot_ms <= {p}, true)")
SLOW = ("coalesce(status, 'ok') = 'ok' and (ttft_ms > {t} "
        "or coalesce(tpot_ms > {p}, false))")


def test_overview_numbers(monkeypatch: pytest.MonkeyPatch, mart_db: Path) -> None:
    at = open_page(monkeypatch, mart_db, "overview")
    n = sql(mart_db, "select count(*) from requests")
    good = sql(mart_db, f"select count(*) from requests where {GOOD.format(t=2000, p=100)}")
    failed = sql(mart_db, "select count(*) from requests where status <> 'ok'")
    p99 = sql(mart_db, "select quantile_cont(ttft_ms, 0.99) from requests where status = 'ok'")
    assert metric(at, "Requests") == f"{n:,}"
    assert metric(at, "SLO attainment") == f"{100 * good / n:.1f} %"
    assert metric(at, "Failed") == f"{failed:,}"
    assert metric(at, "TTFT p99") == _ui.fmt_ms(p99)
    assert len(at.get("vega_lite_chart")) >= 4


def test_sidebar_slo_changes_counts(monkeypatch: pytest.MonkeyPatch, mart_db: Path) -> None:
    at = open_page(monkeypatch, mart_db, "overview")
    before = sql(mart_db, f"select count(*) from requests where {SLOW.format(t=2000, p=100)}")
    assert metric(at, "Slow") == f"{before:,}"
    at.number_input(key="slo_ttft_ms").set_value(1000.0).run()
    at.number_input(key="slo_tpot_ms").set_value(60.0).run()
    assert_clean(at)
    after = sql(mart_db, f"select count(*) from requests where {SLOW.format(t=1000, p=60)}")
    assert after != before
    assert metric(at, "Slow") == f"{after:,}"


def test_slow_requests_table_breakdown_and_filters(monkeypatch: pytest.MonkeyPatch,
                                                   mart_db: Path) -> None:
    at = open_page(monkeypatch, mart_db, "slow")
    slow = SLOW.format(t=2000, p=100)
    n = sql(mart_db, f"select count(*) from requests where {slow}")
    top = sql(mart_db, f"""
        select a.cause from requests r join attributions a using (request_id, run_id)
        where {slow.replace('status', 'r.status')} and a.is_primary
        group by a.cause order by sum(a.excess_ms) desc limit 1""")
    assert metric(at, "Slow requests") == f"{n:,}"
    assert metric(at, "Top cause") == top
    table = at.dataframe[0].value
    assert len(table) == n and {"cause", "excess_ms", "evidence"} <= set(table.columns)
    assert set(table["cause"]) <= {"stale_telemetry", "cache_miss", "herding"}

    at.selectbox(key="slow_Policy").set_value("cache_aware").run()
    assert_clean(at)
    n_ca = sql(mart_db, f"select count(*) from requests where {slow} and policy = 'cache_aware'")
    assert metric(at, "Slow requests") == f"{n_ca:,}"

    at.selectbox(key="slow_Cause").set_value("herding").run()
    n_h = sql(mart_db, f"""
        select count(*) from requests r join attributions a using (request_id, run_id)
        where {slow.replace('status', 'r.status')} and r.policy = 'cache_aware'
            and a.is_primary and a.cause = 'herding'""")
    assert metric(at, "Slow requests") == f"{n_h:,}"
    # the drill-down link carries the request id
    link = at.get("page_link")[0]
    assert "request_id" in str(link.proto.query_string)


def test_slow_requests_without_attribution(monkeypatch: pytest.MonkeyPatch,
                                           bare_mart_db: Path) -> None:
    at = open_page(monkeypatch, bare_mart_db, "slow")
    assert "attribution relations (`attributions`) are not in this store" in texts(at)
    n = sql(bare_mart_db, f"select count(*) from requests where {SLOW.format(t=2000, p=100)}")
    assert metric(at, "Slow requests") == f"{n:,}"
    assert metric(at, "Top cause") == "unattributed"


def test_request_drilldown(monkeypatch: pytest.MonkeyPatch, mart_db: Path) -> None:
    rid = sql(mart_db, "select request_id from requests where attempts = 2 and status = 'ok' "
                       "and ttft_ms > 2000 order by request_id limit 1")
    assert rid, "fixture has a slow retried request"
    at = open_page(monkeypatch, mart_db, "request", {"request_id": rid})
    ttft = sql(mart_db, "select ttft_ms from requests where request_id = ?", [rid])
    cause = sql(mart_db, "select cause from attributions where request_id = ? and is_primary",
                [rid])
    cands = sql(mart_db, "select count(*) from candidates where request_id = ?", [rid])
    assert metric(at, "TTFT") == _ui.fmt_ms(ttft)
    assert f"Primary cause: {cause}" in texts(at)
    assert "Attempt 0" in texts(at) and "Attempt 1" in texts(at)
    frames = [df.value for df in at.dataframe]
    cand = next(f for f in frames if "true_in_flight" in f.columns)
    assert len(cand) == cands == 6
    assert cand["chosen"].sum() == 2  # one chosen candidate per attempt
    assert len(at.get("vega_lite_chart")) == 1  # the waterfall


def test_request_drilldown_of_a_repeated_request_id(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """Two requests (one per run) share each id: the page says so, lets the user pick, and
    shows only the picked request, also when the slow page's link names its key."""
    db = mart_store(tmp_path / "repeated.duckdb", n=200, repeat_ids=True)
    both = sql(db, "select list(request_key order by client_start desc) from requests "
                   "where request_id = 'req-000004'")
    assert len(both) == 2
    at = open_page(monkeypatch, db, "request", {"request_id": "req-000004"})
    assert "2 requests carry the id `req-000004`" in texts(at)
    for key in both:
        at.selectbox(key="drill_request_key").set_value(key).run()
        assert_clean(at)
        ttft, run = sql(db, "select [ttft_ms::varchar, run_id] from requests "
                            "where request_key = ?", [key])
        assert metric(at, "TTFT") == _ui.fmt_ms(float(ttft))
        assert f"run `{run}`" in texts(at)
        frames = [df.value for df in at.dataframe]
        cand = next(f for f in frames if "true_in_flight" in f.columns)
        assert len(cand) == sql(db, "select count(*) from candidates where request_key = ?", [key])
    # the slow page links with the key: the page opens on that request
    at = open_page(monkeypatch, db, "request", {"request_id": "req-000004",
                                                 "request_key": both[1]})
    assert at.selectbox(key="drill_request_key").value == both[1]
    # however many requests share the id, the linked one is listed (first)
    one = queries.request_matches(audit.open(db), "req-000004", limit=1, prefer=both[1])
    assert one["request_key"].to_list() == [both[1]] and one["matching"][0] == 2


def test_cache_numbers(monkeypatch: pytest.MonkeyPatch, mart_db: Path) -> None:
    at = open_page(monkeypatch, mart_db, "cache")
    both = "predicted_cached_tokens is not null and actual_cached_tokens is not null"
    n = sql(mart_db, f"select count(*) from requests where {both}")
    over = sql(mart_db, f"select count(*) from requests where {both} "
                        "and predicted_cached_tokens > actual_cached_tokens")
    assert metric(at, "Requests with both") == f"{n:,}"
    assert metric(at, "Over-predicted") == f"{over:,}"
    assert len(at.get("vega_lite_chart")) == 4


def test_telemetry_numbers(monkeypatch: pytest.MonkeyPatch, mart_db: Path) -> None:
    at = open_page(monkeypatch, mart_db, "telemetry")
    p99 = sql(mart_db, """
        select quantile_cont(c.telemetry_age_ms, 0.99) from candidates c
        join decisions d using (request_id, attempt) where d.router_id = 'router-b'""")
    assert metric(at, "router-b age p99") == _ui.fmt_ms(p99)
    episodes = [df.value for df in at.dataframe if "routers" in df.value.columns]
    assert len(episodes) == 1 and list(episodes[0]["decisions"]) == [14, 11, 9]
    assert "episodes_total" not in episodes[0].columns
    assert not [c.value for c in at.caption if "largest of" in c.value]


def test_telemetry_says_when_herding_episodes_are_cut(monkeypatch: pytest.MonkeyPatch,
                                                      mart_db: Path) -> None:
    """Past the table's cap the page keeps the largest episodes and says how many there are:
    an arbitrary subset (the relation has no order) would hide the worst herding."""
    monkeypatch.setattr(_ui, "TABLE_ROWS", 2)
    at = open_page(monkeypatch, mart_db, "telemetry")
    episodes = [df.value for df in at.dataframe if "routers" in df.value.columns]
    assert list(episodes[0]["decisions"]) == [14, 11]
    assert [c.value for c in at.caption if "largest of" in c.value] == [
        "The 2 largest of 3 episodes: most decisions on one telemetry sample first."]


@pytest.mark.parametrize(("ms", "shown"), [
    (None, "–"), (0.5, "0.5 ms"), (59.04, "59.0 ms"), (395.2, "395 ms"), (999.4, "999 ms"),
    (1669.86, "1.67 s"), (5379.5, "5.38 s"), (19319.4, "19.3 s"), (1_234_000, "1,234 s"),
    (-1669.86, "-1.67 s")])
def test_tile_times_keep_three_digits(ms: float | None, shown: str) -> None:
    assert _ui.fmt_ms(ms) == shown


def _temporal_encodings(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(channel, definition) of every temporal field a Vega-Lite spec encodes, layers included."""
    for channel, enc in (spec.get("encoding") or {}).items():
        for item in enc if isinstance(enc, list) else [enc]:
            if isinstance(item, dict) and item.get("type") == "temporal":
                yield channel, item
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for sub in spec.get(key, []):
            yield from _temporal_encodings(sub)


@pytest.mark.parametrize("page", ["overview", "cache", "telemetry"])
def test_times_are_drawn_in_utc(monkeypatch: pytest.MonkeyPatch, mart_db: Path, page: str) -> None:
    """Axes and tooltips titled UTC are drawn in UTC: Vega-Lite's default is the browser's zone,
    so a person in Tokyo read 09:00 "UTC" for a midnight episode (seen in Chromium)."""
    at = open_page(monkeypatch, mart_db, page)
    found = [(ch, enc) for chart in at.get("vega_lite_chart")
             for ch, enc in _temporal_encodings(json.loads(chart.proto.spec))]
    assert {ch for ch, _ in found} >= {"x", "tooltip"}, found
    for channel, enc in found:
        if channel == "tooltip":
            assert enc.get("formatType") == "utc", (channel, enc)
        elif channel == "x":
            assert enc.get("scale", {}).get("type") == "utc", (channel, enc)


def test_policies_numbers(monkeypatch: pytest.MonkeyPatch, mart_db: Path) -> None:
    at = open_page(monkeypatch, mart_db, "policies")
    cmp = at.dataframe[0].value.set_index("run_id")
    for run in ("run-rr", "run-ca"):
        failed = sql(mart_db, "select count(*) from requests where run_id = ? and status <> 'ok'",
                     [run])
        p90 = sql(mart_db, "select quantile_cont(tpot_ms, 0.9) from requests "
                           "where run_id = ? and status = 'ok'", [run])
        assert cmp.loc[run, "failed"] == failed
        assert cmp.loc[run, "tpot_p90"] == pytest.approx(p90)


def test_sql_box_reads_and_refuses_writes(monkeypatch: pytest.MonkeyPatch, mart_db: Path) -> None:
    at = open_page(monkeypatch, mart_db, "sql")
    at.text_area(key="sql_text").set_value("select count(*) as n from requests").run()
    at.button(key="sql_run").click().run()
    assert_clean(at)
    assert at.dataframe[0].value["n"][0] == sql(mart_db, "select count(*) from requests")
    assert at.get("download_button")

    for stmt, says in [("delete from requests", "refused"),
                       ("attach '/tmp/other.duckdb' as o", "refused"),
                       ("copy requests to '/tmp/out.csv'", "refused"),
                       ("install httpfs", "refused"),
                       ("select * from read_csv('/etc/passwd')", "refused")]:
        at.text_area(key="sql_text").set_value(stmt).run()
        at.button(key="sql_run").click().run()
        assert not at.exception, stmt
        assert any(says in e.value for e in at.error), (stmt, [e.value for e in at.error])
    assert sql(mart_db, "select count(*) from requests") == 400


def test_sql_examples_run(monkeypatch: pytest.MonkeyPatch, raw_db: Path) -> None:
    """On a store built from raw spans by the real relations, so raw tables and marts both hold
    rows."""
    at = open_page(monkeypatch, raw_db, "sql")
    for name in queries.EXAMPLE_QUERIES:
        at.selectbox(key="sql_example").set_value(name).run()
        at.button(key="sql_run").click().run()
        assert_clean(at)
        assert len(at.dataframe[0].value) > 0, name


# --------------------------------------------------------------------------------------------
# Raw spans through the real relations (staging → intermediate → marts)
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def raw_requests(raw_db: Path) -> int:
    """Rows the marts derive from the raw spans."""
    return int(audit.open(raw_db).query("select count(*) as n from requests")["n"][0])


# The path a user follows: p99 is bad → slow requests → the one decision.
@pytest.mark.parametrize("page", ["overview", "slow", "request"])
def test_page_on_raw_spans(monkeypatch: pytest.MonkeyPatch, raw_db: Path, raw_requests: int,
                           page: str) -> None:
    assert raw_requests == 12
    reader = audit.open(raw_db)
    at = open_page(monkeypatch, raw_db, page,
                   {"request_id": "req-0003"} if page == "request" else None)
    if page == "overview":
        assert metric(at, "Requests") == f"{raw_requests:,}"
    if page == "slow":
        slow = reader.query(f"select count(*) as n from requests "
                            f"where {SLOW.format(t=2000, p=100)}")["n"][0]
        assert slow == 3  # the fixture makes every 4th request 2.5 s slower
        assert metric(at, "Slow requests") == f"{slow:,}"
    if page == "request":
        ttft = reader.query("select ttft_ms from requests where request_id = 'req-0003'")
        assert metric(at, "TTFT") == _ui.fmt_ms(ttft["ttft_ms"][0])
        frames = [df.value for df in at.dataframe]
        cand = next(f for f in frames if "true_in_flight" in f.columns)
        assert len(cand) == 3 and cand["chosen"].sum() == 1
        spans = next(f for f in frames if "parent_span_id" in f.columns)
        attrs = [json.loads(a) for a in spans["attributes"]]
        assert attrs and all(a.get("routeaudit.request.id") == "req-0003" for a in attrs)


def test_sidebar_says_when_the_relations_lag(monkeypatch: pytest.MonkeyPatch, raw_db: Path,
                                              tmp_path: Path) -> None:
    """Spans a live collector committed since its last rebuild are in the raw tables, not yet
    in the pages: the sidebar says how many, on every page; a current store says nothing."""
    at = open_page(monkeypatch, raw_db, "overview")
    assert not at.sidebar.warning
    lagging = tmp_path / "lagging.duckdb"
    shutil.copyfile(raw_db, lagging)
    con = duckdb.connect(str(lagging))
    con.execute("insert into raw_spans select * replace (span_id || 'x' as span_id) from raw_spans "
                "where a_component = 'client'")  # as the writer does between two rebuilds
    con.close()
    for page in ("overview", "cache"):
        at = open_page(monkeypatch, lagging, page)
        notes = [w.value for w in at.sidebar.warning]
        assert len(notes) == 1 and "12 spans stored since then are not in them yet. These pages" in notes[0], notes
        assert re.search(r"Relations rebuilt \d+ (s|min) ago", notes[0]), notes
    assert metric(open_page(monkeypatch, lagging, "overview"), "Requests") == "12"


# --------------------------------------------------------------------------------------------
# The bundled sample data (what `routeaudit dashboard` opens without --db)
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def sample_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from routeaudit._demo import write_sample_store

    return write_sample_store(tmp_path_factory.mktemp("sample") / "demo.duckdb")


@pytest.mark.parametrize("page", list(PAGES))
def test_page_on_sample_data(monkeypatch: pytest.MonkeyPatch, sample_db: Path, page: str) -> None:
    at = open_page(monkeypatch, sample_db, page)
    if page == "overview":
        assert metric(at, "Requests") == f"{sql(sample_db, 'select count(*) from requests'):,}"
    if page == "slow":
        slow = sql(sample_db, f"select count(*) from requests where {SLOW.format(t=2000, p=100)}")
        assert slow > 0 and metric(at, "Slow requests") == f"{slow:,}"
