"""Relations over hand-built raw rows whose answers are known by construction."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from audit import semconv
from audit._store import Store

from relation_rows import MS, T0, RawRows, one_request, query


def test_one_trace_all_sides_gives_one_full_request(make_store: Callable[..., Store]) -> None:
    rows = RawRows()
    one_request(rows)
    store = make_store(rows)
    req = query(store, "select * from requests")
    assert req.height == 1
    r = req.row(0, named=True)
    assert r["request_id"] == "req-1"
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

    dec = query(store, "select * from decisions").row(0, named=True)
    assert dec["recorded"] is True and dec["attempt"] == 0
    assert dec["candidate_count"] == 2 and dec["forward_status"] == 200
    assert dec["forward_ms"] == pytest.approx(988.0)
    assert dec["served_by"] == "127.0.0.1:18001"

    cands = query(store, "select * from candidates order by event_index")
    assert cands["replica"].to_list() == ["127.0.0.1:18001", "127.0.0.1:18002"]
    assert cands["chosen"].to_list() == [True, False]
    assert cands["telemetry_age_ms"].to_list() == pytest.approx([250.0, 100.0])
    assert cands["pending"].to_list()[0] == 1

    ex = query(store, "select * from executions").row(0, named=True)
    assert ex["request_id"] == "req-1"
    assert ex["ttft_ms"] == pytest.approx(150) and ex["e2e_ms"] == pytest.approx(980)
    assert ex["cached_tokens"] == 64 and ex["replica"] == "127.0.0.1:18001"


def _times(store: Store) -> dict[str, object]:
    r = query(store, "select * from requests").row(0, named=True)
    d = query(store, "select decided_at, forward_ms from decisions").row(0, named=True)
    return {"r": r, "d": d}


def test_router_clock_five_seconds_ahead_is_corrected(make_store: Callable[..., Store]) -> None:
    plain, skewed = RawRows(), RawRows()
    for n in range(1, 4):
        one_request(plain, n=n, base_ns=T0 + n * 2000 * MS)
        one_request(skewed, n=n, base_ns=T0 + n * 2000 * MS, router_skew_ns=5_000 * MS)
    a = make_store(plain, name="plain.duckdb")
    b = make_store(skewed, name="skewed.duckdb")
    offsets = query(b, "select * from int_clock_offsets order by clock_domain")
    by_domain = {row["clock_domain"]: row for row in offsets.iter_rows(named=True)}
    assert by_domain["client-host"]["clock_status"] == "reference"
    router = by_domain["router-host"]
    assert router["clock_status"] == "bounded"
    assert abs(router["offset_ns"] - 5_000 * MS) <= 5 * MS
    assert router["offset_lower_ns"] <= 5_000 * MS <= router["offset_upper_ns"]
    assert abs(by_domain["replica-host"]["offset_ns"]) <= 5 * MS

    q = "select request_id, decided_at, forward_ms from decisions order by request_id"
    da, db = query(a, q), query(b, q)
    for x, y in zip(da.iter_rows(named=True), db.iter_rows(named=True)):
        assert abs((x["decided_at"] - y["decided_at"]).total_seconds()) < 0.005
        assert x["forward_ms"] == y["forward_ms"]
    cols = "request_id, router_ms, e2e_ms, ttft_ms, tpot_ms, clock_suspect"
    assert query(a, f"select {cols} from requests order by 1").equals(
        query(b, f"select {cols} from requests order by 1")
    )
    assert not any(query(b, "select clock_suspect from requests")["clock_suspect"])


def test_router_clock_jump_is_flagged(make_store: Callable[..., Store]) -> None:
    rows = RawRows()
    one_request(rows, n=1, base_ns=T0)
    one_request(rows, n=2, base_ns=T0 + 10_000 * MS, router_skew_ns=5_000 * MS)
    store = make_store(rows)
    status = query(
        store, "select clock_status from int_clock_offsets where clock_domain = 'router-host'"
    ).item()
    assert status == "inconsistent"
    assert all(query(store, "select clock_suspect from requests")["clock_suspect"])
    assert query(store, "select count(*) as n from requests")["n"].item() == 2


def test_broken_trace_linked_by_request_id(make_store: Callable[..., Store]) -> None:
    """SMG-like router: its own trace per request; client and router share X-Request-Id."""
    rows = RawRows()
    rows.span(
        "c1", "c1", None, semconv.SPAN_CLIENT, kind="client", start_ns=T0, end_ns=T0 + 50 * MS,
        attrs={semconv.COMPONENT: "client", semconv.REQUEST_ID: "client-req-7",
               semconv.HTTP_METHOD: "POST", semconv.REQUEST_ENDPOINT: "/v1/completions",
               semconv.CLIENT_TTFT_MS: 20.0, semconv.CLIENT_E2E_MS: 50.0,
               semconv.USAGE_OUTPUT_TOKENS: 1},
        resource={semconv.HOST_NAME: "client-host"},
    )
    rows.span(
        "5a", "5a", None, "http_request", start_ns=T0 + 2 * MS, end_ns=T0 + 48 * MS,
        scope_name="smg",
        attrs={"method": "POST", "uri": "/v1/completions", "request_id": "client-req-7",
               "status_code": "200", "latency": "46000"},
        resource={semconv.SERVICE_NAME: "smg"},
        events=[(semconv.EVENT_SMG_SENDING, T0 + 3 * MS, {"url": "http://localhost:18002"})],
    )
    rows.span(
        "5a", "5e", "5a", semconv.SPAN_VLLM_REQUEST, kind="server",
        start_ns=T0 + 4 * MS, end_ns=T0 + 46 * MS,
        attrs={semconv.GEN_AI_REQUEST_ID: "cmpl-client-req-7-0",
               semconv.USAGE_PROMPT_TOKENS: 5, semconv.USAGE_COMPLETION_TOKENS: 1,
               semconv.LATENCY_TTFT_S: 0.01},
        resource={semconv.SERVICE_NAME: "vllm", semconv.SERVICE_INSTANCE_ID: "engine-b"},
    )
    store = make_store(rows)
    req = query(store, "select * from requests")
    assert req.height == 1
    r = req.row(0, named=True)
    assert r["request_id"] == "client-req-7"
    assert r["link_method"] == "request_id"
    assert (r["has_client"], r["has_router"], r["has_replica"]) == (True, True, True)
    assert r["chosen_replica"] == "127.0.0.1:18002"
    assert r["served_by"] == "engine-b"
    assert r["tpot_ms"] is None  # one output token
    assert r["ttft_ms"] == 20.0 and r["timing_source"] == "client"
    dec = query(store, "select * from decisions").row(0, named=True)
    assert dec["recorded"] is False and dec["dialect"] == "smg"
    assert dec["execution_span_id"] == "5e".rjust(16, "0")


def test_replica_without_router_span_flags_router_side_missing(
    make_store: Callable[..., Store],
) -> None:
    rows = RawRows()
    rows.span(
        "b1", "c1", None, semconv.SPAN_CLIENT, kind="client", start_ns=T0, end_ns=T0 + 50 * MS,
        attrs={semconv.COMPONENT: "client", semconv.REQUEST_ID: "r-9", semconv.HTTP_METHOD: "POST"},
        resource={semconv.HOST_NAME: "client-host"},
    )
    # parent is the router's forward span, which never arrived
    rows.span(
        "b1", "e1", "f1", semconv.SPAN_VLLM_REQUEST, kind="server",
        start_ns=T0 + 5 * MS, end_ns=T0 + 45 * MS,
        attrs={semconv.GEN_AI_REQUEST_ID: "cmpl-0123abcd-0", semconv.USAGE_COMPLETION_TOKENS: 3,
               semconv.LATENCY_TTFT_S: 0.01, semconv.LATENCY_E2E_S: 0.04},
        resource={semconv.HOST_NAME: "replica-host"},
    )
    store = make_store(rows)
    r = query(store, "select * from requests").row(0, named=True)
    assert r["request_id"] == "r-9" and r["link_method"] == "trace"
    assert r["router_side_missing"] is True
    assert r["timing_source"] == "replica" and r["tpot_ms"] == pytest.approx(15.0)


def test_duplicates_and_reversed_arrival_give_identical_marts(
    make_store: Callable[..., Store],
) -> None:
    rows = RawRows()
    for n in range(1, 4):
        one_request(rows, n=n, base_ns=T0 + n * 2000 * MS, router_skew_ns=1234 * MS)
    forward = make_store(rows, name="fwd.duckdb")
    rev = RawRows(spans=list(reversed(rows.spans)), events=list(reversed(rows.events)))
    halves = [RawRows(spans=rev.spans[i::2], events=rev.events[i::2]) for i in (0, 1)]
    backward = make_store(halves[0], halves[1], rev, rev, name="rev.duckdb")
    for mart in ("requests", "decisions", "candidates", "executions"):
        a = query(forward, f"select * from {mart} order by all")
        b = query(backward, f"select * from {mart} order by all")
        assert a.height > 0
        assert a.equals(b), mart


@pytest.mark.parametrize(
    ("client_status", "outcome", "expected"),
    [("cancelled", "routed", "cancelled"), ("timeout", "routed", "timeout"),
     ("rejected", "rejected", "rejected"), ("error", "routed", "error")],
)
def test_statuses(
    make_store: Callable[..., Store], client_status: str, outcome: str, expected: str
) -> None:
    rows = RawRows()
    one_request(rows, client_status=client_status, decision_outcome=outcome)
    store = make_store(rows)
    r = query(store, "select * from requests").row(0, named=True)
    assert r["status"] == expected
    if outcome == "rejected":
        assert r["has_replica"] is False and r["chosen_replica"] is None
        d = query(store, "select outcome, chosen_replica from decisions").row(0, named=True)
        assert d == {"outcome": "rejected", "chosen_replica": None}


def test_rejected_without_client_status_comes_from_decision(
    make_store: Callable[..., Store],
) -> None:
    rows = RawRows()
    rows.span(
        "d9", "d9", None, semconv.SPAN_DECISION, start_ns=T0, end_ns=T0 + MS,
        attrs={semconv.COMPONENT: "router", semconv.REQUEST_ID: "x",
               semconv.DECISION_OUTCOME: "rejected"},
        resource={semconv.HOST_NAME: "router-host"},
    )
    store = make_store(rows)
    assert query(store, "select status from requests").item() == "rejected"


def test_replica_identity_normalisation(make_store: Callable[..., Store]) -> None:
    rows = RawRows()
    names = {
        "1": ("http://LOCALHOST:18001/v1/chat/completions", None, "127.0.0.1:18001"),
        "2": ("127.0.0.1:18001", None, "127.0.0.1:18001"),
        "3": ("localhost:18001", 0, "127.0.0.1:18001"),
        "4": ("http://127.0.0.1:18001", 2, "127.0.0.1:18001#2"),
        "5": ("engine-uuid-7", None, "engine-uuid-7"),
        "6": ("https://Replica-A.example:8443/x?y=1", None, "replica-a.example:8443"),
    }
    for sid, (name, rank, _) in names.items():
        attrs: dict[str, object] = {semconv.REPLICA_ID: name, semconv.COMPONENT: "replica"}
        if rank is not None:
            attrs[semconv.REPLICA_DP_RANK] = rank
        rows.span("77", sid, None, semconv.SPAN_VLLM_REQUEST, kind="server",
                  start_ns=T0, end_ns=T0 + MS, attrs=attrs)
    store = make_store(rows)
    got = query(store, "select span_id, self_replica from stg_spans")
    mapping = {row[0].lstrip("0"): row[1] for row in got.iter_rows()}
    assert mapping == {k: v[2] for k, v in names.items()}


def test_snapshots_windowed_hit_rate(make_store: Callable[..., Store]) -> None:
    import pyarrow as pa

    from audit.schema import RAW_SNAPSHOTS_SCHEMA

    base = {f.name: None for f in RAW_SNAPSHOTS_SCHEMA}
    snaps = []
    for i, (q, h) in enumerate([(100, 50), (200, 125), (200, 125), (50, 10)]):
        snaps.append(base | dict(target="http://localhost:18001/metrics", replica="localhost:18001",
                                 dp_rank=0, scraped_ns=T0 + i * 1000 * MS, ok=True,
                                 prefix_cache_queries=float(q), prefix_cache_hits=float(h)))
    store = make_store()
    store.append(snapshots=pa.Table.from_pylist(snaps + snaps[:1], schema=RAW_SNAPSHOTS_SCHEMA))
    got = query(store, "select * from snapshots order by scraped_at")
    assert got.height == 4
    assert got["replica"].to_list() == ["127.0.0.1:18001"] * 4
    rates = got["prefix_cache_hit_rate"].to_list()
    assert rates[0] is None and rates[1] == pytest.approx(0.75)
    assert rates[2] is None and rates[3] is None  # no new queries; counter reset
    assert not any(isinstance(x, float) and math.isnan(x) for x in rates if x is not None)
