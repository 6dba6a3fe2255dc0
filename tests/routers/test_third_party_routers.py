"""Real third-party routers (SMG, vllm-router) in front of live testbed replicas, traced into a
real collector, checked in the marts.

Each test: 2 live replicas (vLLM-format ``llm_request`` spans over OTLP/HTTP, /metrics scraped
by the collector) → router as a child process (OTLP/gRPC to the collector) → 20 shared-prefix
requests from the instrumented client, every one with an ``X-Request-Id``, some streaming.
Ground truth for "who served it" is the replica's own raw span, not the marts.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from audit._slo import SLO
from collectors.client import ClientResult
from collectors.routers import (
    smg_available,
    start_smg,
    start_vllm_router,
    vllm_router_available,
)

if TYPE_CHECKING:
    from conftest import Stack  # tests/routers/conftest.py

pytestmark = pytest.mark.routers

_SMG_SKIP = smg_available()
_VR_SKIP = vllm_router_available()
needs_smg = pytest.mark.skipif(bool(_SMG_SKIP), reason=f"SMG unavailable: {_SMG_SKIP}")
needs_vllm_router = pytest.mark.skipif(bool(_VR_SKIP),
                                       reason=f"vllm-router unavailable: {_VR_SKIP}")

REQUEST_COLUMNS = (
    "request_key, request_id, trace_id, run_id, endpoint, stream, input_tokens, ttft_ms, e2e_ms, "
    "timing_source, output_tokens, finish_reason, status, http_status, router_id, policy, "
    "attempts, chosen_replica, served_by, actual_cached_tokens, predicted_cached_tokens, "
    "router_ms, router_ttfb_ms, replica_ttft_ms, has_client, has_router, has_replica, "
    "router_side_missing, "
    "link_method"
)


def _ok(results: list[ClientResult], n: int) -> dict[str, ClientResult]:
    assert len(results) == n
    bad = [(r.request_id, r.status, r.http_status, r.error) for r in results if r.status != "ok"]
    assert not bad, bad
    return {r.request_id: r for r in results}


def _requests(stack: Stack, ids: list[str]) -> dict[str, dict[str, Any]]:
    rows = stack.query(f"select {REQUEST_COLUMNS} from requests "
                       "where request_id in (select unnest(?::varchar[]))", [ids])
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["request_id"]] = counts.get(r["request_id"], 0) + 1
    assert {i: c for i, c in counts.items() if c != 1} == {}, "request present more than once"
    assert sorted(counts) == sorted(ids), "client requests missing from `requests`"
    return {r["request_id"]: r for r in rows}


def _check_client_replica_consistency(row: dict[str, Any], res: ClientResult,
                                      served: str) -> None:
    rid = row["request_id"]
    assert row["has_client"] and row["has_replica"], rid
    assert row["served_by"] == served, rid
    assert row["status"] == "ok" and row["http_status"] == 200, rid
    assert row["stream"] == res.stream, rid
    # the replica's own TTFT happens inside the client's (same host clock, loopback)
    assert row["replica_ttft_ms"] is not None and row["replica_ttft_ms"] >= 0, rid
    if res.ttft_ms is not None:  # streamed: the client saw its first token
        assert row["timing_source"] == "client", rid
        assert math.isclose(row["ttft_ms"], res.ttft_ms, abs_tol=0.01), rid
        assert math.isclose(row["e2e_ms"], res.e2e_ms, abs_tol=0.01), rid
        assert row["replica_ttft_ms"] <= row["ttft_ms"] + 1, rid
    else:  # one JSON body: no client TTFT, the replica's figures stand in
        assert not res.stream, rid
        assert row["timing_source"] == "replica", rid
        assert math.isclose(row["ttft_ms"], row["replica_ttft_ms"], abs_tol=0.01), rid
        assert row["e2e_ms"] <= res.e2e_ms + 1, rid
    assert row["output_tokens"] == res.output_tokens == 16 or (
        row["output_tokens"] == res.output_tokens and res.finish_reason == "stop"), rid
    assert row["input_tokens"] == res.prompt_tokens, rid
    assert row["actual_cached_tokens"] == (res.cached_tokens or 0) or (
        row["actual_cached_tokens"] == res.cached_tokens), rid
    assert row["finish_reason"] == res.finish_reason, rid


def _check_router_side(row: dict[str, Any], res: ClientResult, served: str) -> None:
    rid = row["request_id"]
    assert row["has_router"] and not row["router_side_missing"], rid
    assert row["chosen_replica"] == served, (rid, row["chosen_replica"], served)
    assert row["attempts"] == 1, rid
    # router latency on the router's clock: present, positive, within the client's e2e
    assert row["router_ms"] is not None and 0 < row["router_ms"] <= res.e2e_ms + 5, rid
    assert row["policy"] is None, rid  # neither router records its policy
    assert row["predicted_cached_tokens"] is None, rid
    assert row["router_ttfb_ms"] is None, rid  # neither marks its first byte
    assert row["link_method"] in ("trace", "request_id"), rid


def _check_decisions(stack: Stack, rows: dict[str, dict[str, Any]], dialect: str) -> None:
    routed = [rid for rid, r in rows.items() if r["has_router"]]
    dec = stack.query(
        "select request_id, request_key, attempt, dialect, recorded, chosen_replica, served_by, "
        "candidate_count, policy, outcome from decisions "
        "where request_key in (select unnest(?::varchar[]))",
        [[rows[r]["request_key"] for r in rows]])
    assert sorted(d["request_key"] for d in dec) == sorted(rows[r]["request_key"] for r in routed)
    for d in dec:
        assert d["dialect"] == dialect
        assert d["recorded"] is False
        assert d["attempt"] == 0
        assert d["candidate_count"] == 0
        assert d["policy"] is None
        assert d["chosen_replica"] == d["served_by"] is not None


def _check_reconstructed(stack: Stack, rows: dict[str, dict[str, Any]],
                         routed_only: bool = True, router_target: str | None = None) -> None:
    """No decision inputs recorded: the telemetry view is rebuilt, one candidate per replica of
    the run, each flagged ``reconstructed``. With the router's /metrics scraped
    (``router_target``), a candidate's view is the router's latest row about the worker at or
    before the decision (its in-flight count as ``seen_pending``), else the engines' scrape."""
    ids = [rid for rid, r in rows.items() if r["has_router"] or not routed_only]
    reader = stack.reader(SLO(ttft_ms=0.001, tpot_ms=0.001))  # every request is slow
    cands = reader.query(
        "select c.request_id, c.replica, c.chosen, c.seen_waiting, c.seen_running, "
        "c.seen_pending, c.telemetry_ts, c.telemetry_age_ms, c.evidence_source, "
        "d.decided_at, v.view_source, v.view_target, v.view_ts, v.router_in_flight, "
        "v.router_healthy, v.waiting as v_waiting, v.running as v_running "
        "from int_attr_candidates_assessed as c "
        "inner join int_attr_decisions_resolved as d on d.request_key = c.request_key "
        "and d.is_final "
        "left join int_attr_candidates_router_view as v "
        "on v.decision_key = d.decision_key and v.replica = c.replica "
        "where c.request_id in (select unnest(?::varchar[]))", [ids]).rows(named=True)
    per: dict[str, list[dict[str, Any]]] = {}
    for c in cands:
        per.setdefault(c["request_id"], []).append(c)
    assert sorted(per) == sorted(ids)
    for rid, cs in per.items():
        assert {c["evidence_source"] for c in cs} == {"reconstructed"}, rid
        assert sorted(c["replica"] for c in cs) == sorted(stack.replica_ids), rid
        assert [c["replica"] for c in cs if c["chosen"]] == [rows[rid]["chosen_replica"]], rid
        for c in cs:
            assert c["telemetry_ts"] is not None and c["telemetry_age_ms"] >= 0, (rid, c)
            if c["view_source"] is None:  # the engines' scrape
                assert c["seen_waiting"] is not None and c["seen_running"] is not None, (rid, c)
                continue
            # the router's own row: read at or before the decision, never the engine's state
            assert c["view_source"] == "router_metrics" and c["view_target"] == router_target
            assert c["telemetry_ts"] == c["view_ts"] <= c["decided_at"], (rid, c)
            assert c["router_healthy"] is not False, (rid, c)
            # engine load only where the router re-exports it (neither does for these replicas)
            assert (c["seen_waiting"], c["seen_running"]) == (c["v_waiting"], c["v_running"])
            assert c["seen_pending"] == (None if c["router_in_flight"] is None
                                         else round(c["router_in_flight"])), (rid, c)
    if router_target is not None:
        _check_router_view_coverage(stack, router_target, per)
    attr = reader.query(
        "select request_id, cause, evidence_source from attributions "
        "where request_id in (select unnest(?::varchar[]))", [ids]).rows(named=True)
    assert {a["request_id"] for a in attr} == set(ids)
    assert {a["evidence_source"] for a in attr} == {"reconstructed"}



def _check_router_view_coverage(stack: Stack, target: str,
                                per: dict[str, list[dict[str, Any]]]) -> None:
    """A candidate has the router's view exactly when the router's latest scrape at or before
    its decision answered with workers' rows and one of them, then or earlier, named its replica.
    Recomputed here from the snapshots in Python, so how many requests get a view depends on
    the scrapes (a loaded host fails some), never on the relation's own joins."""
    scrapes = stack.query(
        "select scraped_at, replica, ok and source = 'router' as router_row from snapshots "
        "where target = ? order by scraped_at", [target])
    assert scrapes, target
    viewed = 0
    for cs in per.values():
        for c in cs:
            before = [s for s in scrapes if s["scraped_at"] <= c["decided_at"]]
            latest = max((s["scraped_at"] for s in before), default=None)
            answered = any(s["router_row"] for s in before if s["scraped_at"] == latest)
            named = any(s["router_row"] and s["replica"] == c["replica"] for s in before)
            assert (c["view_source"] is not None) == (answered and named), (c, before[-3:])
            viewed += c["view_source"] is not None
    # the router's /metrics is scraped every 0.2 s while the requests take about 2 s
    assert viewed, per

# ------------------------------------------------------------------------------------------ SMG
@needs_smg
@pytest.mark.parametrize("policy", ["round_robin", "cache_aware", "power_of_two"])
def test_smg_requests_link_to_the_replica_that_served_them(scraped_stack: Stack,
                                                           policy: str) -> None:
    stack = scraped_stack
    stack.wait_for_scrapes()
    ids: list[str]
    with start_smg(stack.worker_urls, policy=policy, otlp_traces_endpoint=stack.grpc_endpoint,
                   prometheus_port=stack.router_metrics_port) as router:
        results = stack.drive(router.url, f"smg-{policy}")
        by_id = _ok(results, 20)
        ids = sorted(by_id)
        routed = stack.wait_for_requests(ids)
        assert router.metrics_url is not None
        _check_router_view(stack, router.metrics_url, ids)
    assert routed == len(ids), f"SMG spans of {len(ids) - routed} requests never arrived"
    truth = stack.truth(ids)
    rows = _requests(stack, ids)
    for rid, row in rows.items():
        _check_client_replica_consistency(row, by_id[rid], truth[rid])
        _check_router_side(row, by_id[rid], truth[rid])
    if policy == "round_robin":
        assert set(truth.values()) == set(stack.replica_ids)
    _check_decisions(stack, rows, "smg")
    _check_reconstructed(stack, rows, router_target=router.metrics_url)


@needs_smg
def test_smg_probes_are_not_requests(stack: Stack) -> None:
    """The readiness probes (``/health``) SMG traces are not client requests."""
    with start_smg(stack.worker_urls, policy="round_robin",
                   otlp_traces_endpoint=stack.grpc_endpoint) as router:
        results = stack.drive(router.url, "smg-probe", n=4, seed=3)
        ids = sorted(_ok(results, 4))
        stack.wait_for_requests(ids)
    n_all = stack.scalar("select count(*) from requests")
    assert n_all == 4, stack.query("select request_id, endpoint from requests")


# ---------------------------------------------------------------------------------- vllm-router
@needs_vllm_router
@pytest.mark.parametrize("policy", ["round_robin", "power_of_two"])
def test_vllm_router_requests_link_and_lost_spans_are_flagged(scraped_stack: Stack,
                                                              policy: str) -> None:
    stack = scraped_stack
    stack.wait_for_scrapes()
    with start_vllm_router(stack.worker_urls, policy=policy,
                           otlp_traces_endpoint=stack.grpc_endpoint,
                           prometheus_port=stack.router_metrics_port) as router:
        results = stack.drive(router.url, f"vr-{policy}")
        by_id = _ok(results, 20)
        ids = sorted(by_id)
        # vllm-router loses the spans of its first request or two: wait, but accept gaps
        routed = stack.wait_for_requests(ids, allowed_router_missing=3)
        assert router.metrics_url is not None
        _check_router_view(stack, router.metrics_url, ids)
    assert routed >= len(ids) - 3
    truth = stack.truth(ids)
    rows = _requests(stack, ids)
    missing = []
    for rid, row in rows.items():
        _check_client_replica_consistency(row, by_id[rid], truth[rid])
        if row["has_router"]:
            _check_router_side(row, by_id[rid], truth[rid])
        else:
            # lost router span: flagged, never a wrong row
            missing.append(rid)
            assert row["router_side_missing"] is True, rid
            assert row["chosen_replica"] is None and row["attempts"] == 0, rid
            assert row["router_ms"] is None, rid
            assert row["link_method"] in ("trace", "request_id", "none"), rid
    # Spans still in the router's exporter when it stopped may arrive after the wait above:
    # a request can gain its router side, never lose it.
    routed_now = sum(1 for row in rows.values() if row["has_router"])
    assert routed_now >= routed
    assert len(missing) == len(ids) - routed_now
    _check_decisions(stack, rows, "vllm_router")
    _check_reconstructed(stack, rows, router_target=router.metrics_url)


@needs_vllm_router
def test_vllm_router_launcher_builds_the_rust_router_like_its_cli() -> None:
    from collectors.routers.vllm_router import router_kwargs, to_rust

    kw, printed = router_kwargs(["--worker-urls", "http://127.0.0.1:1", "http://127.0.0.1:2",
                                 "--policy", "power_of_two", "--port", "1234",
                                 "--otlp-traces-endpoint", "http://127.0.0.1:4317"])
    assert not printed
    assert kw["enable_trace"] is True and kw["otlp_traces_endpoint"] == "127.0.0.1:4317"
    assert kw["worker_urls"] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert kw["port"] == 1234 and kw["prefill_urls"] is None and "mini_lb" not in kw
    rust = to_rust(kw)
    import vllm_router_rs

    assert rust["policy"] == vllm_router_rs.PolicyType.PowerOfTwo
    kw2, _ = router_kwargs(["--worker-urls", "http://127.0.0.1:1"])
    assert "enable_trace" not in kw2  # no endpoint, no flag: the Rust default (off)


@needs_vllm_router
def test_vllm_router_without_tracing_flags_every_request_router_side_missing(stack: Stack) -> None:
    """A router that emits nothing (vllm-router's own CLI: no tracing flag): client and replica
    still link, every row says its router side is missing, none claims a choice."""
    with start_vllm_router(stack.worker_urls, policy="round_robin") as router:
        results = stack.drive(router.url, "vr-notrace", n=6, seed=5)
        by_id = _ok(results, 6)
        ids = sorted(by_id)
        routed = stack.wait_for_requests(ids, allowed_router_missing=6, settle_s=1.0)
    assert routed == 0
    truth = stack.truth(ids)
    rows = _requests(stack, ids)
    for rid, row in rows.items():
        _check_client_replica_consistency(row, by_id[rid], truth[rid])
        assert row["router_side_missing"] is True and row["has_router"] is False, rid
        assert row["chosen_replica"] is None and row["attempts"] == 0, rid
        assert row["link_method"] in ("trace", "request_id"), rid
    assert stack.scalar("select count(*) from decisions") == 0


@needs_vllm_router
def test_attributions_of_router_side_missing_requests_are_not_recorded_evidence(
        stack: Stack) -> None:
    with start_vllm_router(stack.worker_urls, policy="round_robin") as router:
        results = stack.drive(router.url, "vr-noevidence", n=3, seed=5)
        ids = sorted(_ok(results, 3))
        stack.wait_for_requests(ids, allowed_router_missing=3, settle_s=1.0)
    reader = stack.reader(SLO(ttft_ms=0.001, tpot_ms=0.001))
    attr = reader.query(
        "select request_id, cause, sub_kind, evidence_source from attributions "
        "where request_id in (select unnest(?::varchar[])) and is_primary", [ids]
    ).rows(named=True)
    assert len(attr) == 3
    primary = {(a["cause"], a["sub_kind"]) for a in attr}
    assert primary == {("incomplete_trace", "router_side_missing")}
    assert {a["evidence_source"] for a in attr} == {"none"}


# ------------------------------------------------------------------- routers' /metrics → snapshots
def _router_view(stack: Stack, target: str) -> dict[str, dict[str, Any]]:
    """replica → the latest router row about it scraped from ``target``."""
    rows = stack.query(
        "select replica, arg_max(router_dispatched, scraped_ns) as dispatched, "
        "arg_max(router_in_flight, scraped_ns) as in_flight, "
        "arg_max(router_healthy, scraped_ns) as healthy, "
        "bool_and(source = 'router') as all_router, bool_and(running is null) as no_engine "
        "from snapshots where target = ? and ok group by replica", [target])
    return {r["replica"]: r for r in rows}



def _check_router_view(stack: Stack, target: str, ids: list[str]) -> None:
    """The collector scraped the router's /metrics next to the replicas': one snapshot row per
    worker with source 'router', counting exactly the requests the replicas say the router sent
    them (polled: the counters reach the store with a later scrape). Call it while the router
    runs."""
    assert target == f"http://127.0.0.1:{stack.router_metrics_port}/metrics"
    served = Counter(stack.truth(ids).values())
    want = {rid: served.get(rid, 0) for rid in stack.replica_ids}
    deadline = time.monotonic() + 15.0
    while True:
        view = _router_view(stack, target)
        got = {rid: (view[rid]["dispatched"] or 0) if rid in view else 0
               for rid in stack.replica_ids}
        # the in-flight gauge of the last request may reach the store a scrape after its count
        drained = all(row["in_flight"] in (None, 0.0) for row in view.values())
        if (got == want and drained) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got == want, view
    assert view and set(view) <= set(stack.replica_ids), view  # workers, never the router
    for row in view.values():
        assert row["all_router"] and row["no_engine"], row
        assert row["healthy"] is True, row
        assert row["in_flight"] in (None, 0.0), row  # nothing left in flight
    # docs/routers.md's query: each decision with the router's latest view of the chosen worker
    seen = stack.query(ROUTER_VIEW_SQL + " where d.request_id in (select unnest(?::varchar[]))",
                       [ids])
    first = {r["replica"]: r["at"] for r in stack.query(
        "select replica, min(scraped_at) as at from snapshots where source = 'router' and ok "
        "group by replica")}
    later = [r for r in seen if r["chosen_replica"] in first
             and r["decided_at"] > first[r["chosen_replica"]]]
    assert later, (first, seen)
    for r in later:
        # a worker's series appear one by one (health from a first check, counters from a
        # first dispatch): an early view may lack some, never says unhealthy
        assert r["router_healthy"] is not False and r["view_age_ms"] >= 0, r


ROUTER_VIEW_SQL = """
select
    d.request_id,
    d.decided_at,
    d.chosen_replica,
    s.router_in_flight,
    s.router_dispatched,
    s.router_healthy,
    s.waiting,
    date_diff('millisecond', s.scraped_at, d.decided_at) as view_age_ms
from decisions as d
asof left join (select * from snapshots where source = 'router' and ok) as s
    on d.chosen_replica = s.replica
    and d.decided_at >= s.scraped_at
"""
