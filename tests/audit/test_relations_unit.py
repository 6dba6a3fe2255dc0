"""Relations over hand-built raw rows whose answers are known by construction.

Most scenarios share one store (``scenario`` fixture, see relation_rows.scenario_rows); clock
skew, a clock jump and reversed arrival need stores of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import polars as pl
import pytest
from relation_rows import MS, REPLICA_NAMES, STATUS_CASES, T0, RawRows, one_request, query

import semconv
from audit._store import Store

Marts = dict[str, pl.DataFrame]


def _request(scenario: Marts, request_id: str) -> dict[str, Any]:
    rows = scenario["requests"].filter(pl.col("request_id") == request_id)
    assert rows.height == 1, rows
    return rows.row(0, named=True)


def test_one_trace_all_sides_gives_one_full_request(scenario: Marts) -> None:
    r = _request(scenario, "req-1")
    assert r["run_id"] == "run-1"
    assert r["endpoint"] == "/v1/chat/completions"
    assert (r["has_client"], r["has_router"], r["has_replica"]) == (True, True, True)
    assert r["router_side_missing"] is False
    assert r["link_method"] == "trace"
    assert r["clock_suspect"] is False
    assert r["ttft_ms"] == 200.0 and r["e2e_ms"] == 1000.0
    assert r["tpot_ms"] == pytest.approx((1000 - 200) / 10)
    assert (r["input_tokens"], r["output_tokens"]) == (100, 11)
    assert (r["predicted_cached_tokens"], r["actual_cached_tokens"]) == (64, 64)
    assert r["chosen_replica"] == "127.0.0.1:18001"
    assert r["served_by"] == "127.0.0.1:18001"
    assert r["attempts"] == 1 and r["policy"] == "qp_cost" and r["router_id"] == "r1"
    assert r["status"] == "ok" and r["http_status"] == 200
    assert r["queue_ms"] == pytest.approx(10) and r["prefill_ms"] == pytest.approx(50)
    assert r["decode_ms"] == pytest.approx(800) and r["replica_ttft_ms"] == pytest.approx(150)
    assert r["router_ms"] == pytest.approx(2.0)
    assert r["finish_reason"] == "stop" and r["stream"] is True

    key = r["request_key"]
    dec = scenario["decisions"].filter(pl.col("request_key") == key)
    assert dec.height == 1
    d = dec.row(0, named=True)
    assert d["recorded"] is True and d["attempt"] == 0
    assert d["candidate_count"] == 2 and d["forward_status"] == 200
    assert d["forward_ms"] == pytest.approx(988.0)
    assert d["served_by"] == "127.0.0.1:18001"

    cands = scenario["candidates"].filter(pl.col("request_key") == key).sort("event_index")
    assert cands["replica"].to_list() == ["127.0.0.1:18001", "127.0.0.1:18002"]
    assert cands["chosen"].to_list() == [True, False]
    assert cands["telemetry_age_ms"].to_list() == pytest.approx([250.0, 100.0])
    assert cands["pending"].to_list()[0] == 1

    ex = scenario["executions"].filter(pl.col("request_key") == key).row(0, named=True)
    assert ex["request_id"] == "req-1"
    assert ex["ttft_ms"] == pytest.approx(150) and ex["e2e_ms"] == pytest.approx(980)
    assert ex["cached_tokens"] == 64 and ex["replica"] == "127.0.0.1:18001"


def test_broken_trace_linked_by_request_id(scenario: Marts) -> None:
    """SMG-like router: its own trace per request; client and router share X-Request-Id."""
    r = _request(scenario, "client-req-7")
    assert r["link_method"] == "request_id"
    assert (r["has_client"], r["has_router"], r["has_replica"]) == (True, True, True)
    assert r["chosen_replica"] == "127.0.0.1:18002"
    assert r["served_by"] == "engine-b"
    assert r["tpot_ms"] is None  # one output token
    assert r["ttft_ms"] == 20.0 and r["timing_source"] == "client"
    d = scenario["decisions"].filter(pl.col("request_key") == r["request_key"])
    assert d["recorded"].to_list() == [False] and d["dialect"].to_list() == ["smg"]
    assert d["execution_span_id"].to_list() == ["5e".rjust(16, "0")]


def test_replica_without_router_span_flags_router_side_missing(scenario: Marts) -> None:
    r = _request(scenario, "r-9")
    assert r["link_method"] == "trace"
    assert r["router_side_missing"] is True
    assert r["timing_source"] == "replica" and r["tpot_ms"] == pytest.approx(15.0)


@pytest.mark.parametrize("n", sorted(STATUS_CASES))
def test_statuses(scenario: Marts, n: int) -> None:
    _, outcome, expected = STATUS_CASES[n]
    r = _request(scenario, f"req-{n}")
    assert r["status"] == expected
    if outcome == "rejected":
        assert r["has_replica"] is False and r["chosen_replica"] is None
        d = scenario["decisions"].filter(pl.col("request_key") == r["request_key"])
        assert d.select("outcome", "chosen_replica").rows() == [("rejected", None)]


def test_rejected_without_client_status_comes_from_decision(scenario: Marts) -> None:
    assert _request(scenario, "x")["status"] == "rejected"


def test_replica_identity_normalisation(scenario: Marts) -> None:
    got = scenario["stg_spans"].filter(pl.col("trace_id") == "77".rjust(32, "0"))
    mapping = {sid.lstrip("0"): rep for sid, rep in got.select("span_id", "self_replica").rows()}
    assert mapping == {k: v[2] for k, v in REPLICA_NAMES.items()}


def test_snapshots_windowed_hit_rate(scenario: Marts) -> None:
    got = scenario["snapshots"].sort("scraped_at")
    assert got.height == 4  # the repeated scrape is kept once
    assert got["replica"].to_list() == ["127.0.0.1:18001"] * 4
    rates = got["prefix_cache_hit_rate"].to_list()
    assert rates[0] is None and rates[1] == pytest.approx(0.75)
    assert rates[2] is None and rates[3] is None  # no new queries; counter reset
    assert not any(isinstance(x, float) and math.isnan(x) for x in rates if x is not None)


def test_probe_spans_are_not_requests(scenario: Marts) -> None:
    assert scenario["requests"].filter(pl.col("endpoint").str.contains("health")).height == 0


@pytest.fixture(scope="module")
def skewed_rows() -> RawRows:
    rows = RawRows()
    for n in range(1, 4):
        one_request(rows, n=n, base_ns=T0 + n * 2000 * MS, router_skew_ns=5_000 * MS)
    return rows


@pytest.fixture(scope="module")
def skewed(skewed_rows: RawRows, tmp_path_factory: pytest.TempPathFactory) -> Marts:
    store = Store(tmp_path_factory.mktemp("skew") / "skewed.duckdb")
    try:
        spans, events = skewed_rows.tables()
        store.append(spans=spans, events=events)
        return {
            "offsets": query(store, "select * from int_clock_offsets"),
            "requests": query(store, "select * from requests"),
            "decisions": query(store, "select * from decisions"),
            "candidates": query(store, "select * from candidates"),
            "executions": query(store, "select * from executions"),
        }
    finally:
        store.close()


def test_router_clock_five_seconds_ahead_is_corrected(scenario: Marts, skewed: Marts) -> None:
    by_domain = {row["clock_domain"]: row for row in skewed["offsets"].iter_rows(named=True)}
    assert by_domain["client-host"]["clock_status"] == "reference"
    router = by_domain["router-host"]
    assert router["clock_status"] == "bounded"
    assert abs(router["offset_ns"] - 5_000 * MS) <= 5 * MS
    assert router["offset_lower_ns"] <= 5_000 * MS <= router["offset_upper_ns"]
    assert abs(by_domain["replica-host"]["offset_ns"]) <= 5 * MS

    ids = ["req-1", "req-2", "req-3"]
    cols = ["request_id", "router_ms", "e2e_ms", "ttft_ms", "tpot_ms", "clock_suspect"]
    plain = scenario["requests"].filter(pl.col("request_id").is_in(ids)).select(cols).sort("request_id")
    skew = skewed["requests"].select(cols).sort("request_id")
    assert plain.equals(skew)  # durations unaffected, nothing flagged
    q = ["request_id", "decided_at", "forward_ms"]
    a = scenario["decisions"].filter(pl.col("request_id").is_in(ids)).select(q).sort("request_id")
    b = skewed["decisions"].select(q).sort("request_id")
    for x, y in zip(a.iter_rows(named=True), b.iter_rows(named=True), strict=True):
        assert abs((x["decided_at"] - y["decided_at"]).total_seconds()) < 0.005
        assert x["forward_ms"] == y["forward_ms"]


def test_duplicates_and_reversed_arrival_give_identical_marts(
    skewed_rows: RawRows, skewed: Marts, make_store: Callable[..., Store]
) -> None:
    rev = RawRows(spans=list(reversed(skewed_rows.spans)),
                  events=list(reversed(skewed_rows.events)))
    halves = [RawRows(spans=rev.spans[i::2], events=rev.events[i::2]) for i in (0, 1)]
    backward = make_store(halves[0], halves[1], rev, rev)
    for mart in ("requests", "decisions", "candidates", "executions"):
        a = skewed[mart].sort(skewed[mart].columns)
        b = query(backward, f"select * from {mart}")
        b = b.sort(b.columns)
        assert a.height > 0
        assert a.equals(b), mart


def test_router_clock_jump_is_flagged(make_store: Callable[..., Store]) -> None:
    rows = RawRows()
    one_request(rows, n=1, base_ns=T0)
    one_request(rows, n=2, base_ns=T0 + 10_000 * MS, router_skew_ns=5_000 * MS)
    store = make_store(rows)
    got = query(store, "select request_id, clock_suspect from requests")
    status = query(
        store, "select clock_status from int_clock_offsets where clock_domain = 'router-host'"
    ).item()
    assert status == "inconsistent"
    assert got.height == 2 and all(got["clock_suspect"])


def test_a_probe_ancestor_never_anchors(make_store: Callable[..., Store]) -> None:
    """A replica span under a router health probe is its own request's side, not the probe's:
    the parent-chain walk passes through a probe but never takes it as the anchor."""
    rows = RawRows()
    rows.span(
        "p1", "aa", None, "http_request", kind="server", start_ns=T0, end_ns=T0 + 5 * MS,
        attrs={semconv.COMPONENT: "router", semconv.HTTP_METHOD: "GET",
               semconv.REQUEST_ENDPOINT: "/health"},
        resource={semconv.HOST_NAME: "router-host"},
    )
    rows.span(
        "p1", "bb", "aa", semconv.SPAN_VLLM_REQUEST, kind="server",
        start_ns=T0 + MS, end_ns=T0 + 4 * MS,
        attrs={semconv.COMPONENT: "replica", semconv.REQUEST_ID: "under-probe"},
        resource={semconv.HOST_NAME: "replica-host"},
    )
    got = query(make_store(rows), "select span_id, span_role, anchor_span_id, anchor_role "
                                  "from int_spans_anchored_by_trace")
    assert got.rows(named=True) == [{
        "span_id": "bb".rjust(16, "0"), "span_role": "replica",
        "anchor_span_id": "bb".rjust(16, "0"), "anchor_role": "replica",
    }]


def test_a_decisions_key_depends_on_it_alone(make_store: Callable[..., Store]) -> None:
    """The candidate relations join on decision_key: a new decision (here one whose request key
    sorts before every other) leaves the other decisions' keys as they were, so an incremental
    refresh would not have to rewrite them (docs/architecture.md, "Always-on analysis")."""
    old = RawRows()
    for n in (5, 6, 7):
        one_request(old, n=n, base_ns=T0 + n * 2000 * MS)
    store = make_store(old)
    sql = "select request_key, decision_key from int_attr_decisions_resolved order by request_key"
    before = query(store, sql)
    assert before.height == 3 and before["decision_key"].n_unique() == 3
    new = RawRows()
    one_request(new, n=1, base_ns=T0)
    spans, events = new.tables()
    store.append(spans=spans, events=events)
    after = query(store, sql)
    assert after.height == 4 and after["decision_key"].n_unique() == 4
    assert after["request_key"][0] < before["request_key"][0]  # the new one sorts first
    assert after.slice(1).equals(before)
    # what a reader gets through Arrow is the stored value (a uhugeint above 10^38 was not)
    shown = query(store, "select decision_key, cast(decision_key as varchar) as stored "
                         "from int_attr_decisions_resolved")
    assert [str(k) for k in shown["decision_key"]] == shown["stored"].to_list()
