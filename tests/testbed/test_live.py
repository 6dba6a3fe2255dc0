"""Live mode end to end: instrumented client → reference router → live replicas, traced over
OTLP/HTTP into a real collector, checked in the store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

import audit
from audit import queries
from collectors.client import AsyncInstrumentedClient, run_load
from collectors.otlp import Collector, default_config
from collectors.scrape import parse_metrics
from testbed.live import Fleet, live_requests


async def _cancelled_stream(url: str, fleet: Fleet, request_id: str) -> None:
    async with AsyncInstrumentedClient(url, tracer_provider=fleet.client_tracer_provider,
                                       run_id=fleet.run_id) as c:
        task = asyncio.create_task(c.completions("a long story " * 40, max_tokens=20000,
                                                 stream=True, request_id=request_id))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def _wait_for(reader: audit.Reader, sql: str, want: int, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        n = int(reader.query(sql).item())
        if n >= want or time.monotonic() > deadline:
            return n
        time.sleep(0.2)


def _wait_caught_up(reader: audit.Reader, timeout_s: float = 30.0) -> int | None:
    """Spans stored that the relations have not read yet, once none is left or at the deadline:
    a query reads the relations as the last refresh left them, and under load that refresh may
    have begun before the last span was committed."""
    deadline = time.monotonic() + timeout_s
    while True:
        pending = queries.relations_freshness(reader)["spans_pending"][0]
        if pending == 0 or time.monotonic() > deadline:
            return None if pending is None else int(pending)
        time.sleep(0.2)


def test_live_run_through_collector(store_path: Path) -> None:
    cfg = default_config(db_path=store_path, http_port=0, grpc_port=None)
    with Collector(cfg) as col:
        # replica 1 stamps its spans on a clock 3 s ahead
        with Fleet(2, "cache_aware", otlp_endpoint=col.traces_url, telemetry_interval_s=0.1,
                   time_scale=0.05, seed=1, clock_offsets_s={1: 3.0}) as fleet:
            reqs = live_requests("hot_prefix", 30, seed=3, time_scale=0.1, stream_fraction=0.5,
                                 chat_fraction=0.3)
            assert any(r["stream"] for r in reqs) and not all(r["stream"] for r in reqs)
            results = run_load(fleet.router_url, reqs, 8, progress=False, run_id=fleet.run_id,
                               tracer_provider=fleet.client_tracer_provider)
            cancelled_id = "live-cancelled-0"
            asyncio.run(_cancelled_stream(fleet.router_url, fleet, cancelled_id))
            # /metrics in vLLM format, as the collector's scraper reads it
            queries = hits = 0.0
            for url in fleet.metrics_urls:
                rows = parse_metrics(httpx.get(url).text, url, time.time_ns())
                assert len(rows) == 1 and rows[0]["ok"] and rows[0]["dp_rank"] == 0
                assert rows[0]["model_name"] == "sim-8b"
                assert rows[0]["prefix_cache_hits"] <= rows[0]["prefix_cache_queries"]
                queries += rows[0]["prefix_cache_queries"]
                hits += rows[0]["prefix_cache_hits"]
            # cache_aware may send every shared prefix to one replica: count the fleet's hits
            assert 0 < hits <= queries
            assert rows[0]["running"] is not None and rows[0]["kv_usage"] is not None
            replica_ids = set(fleet.replica_ids)
            skewed = fleet.replica_ids[1]
            run_id = fleet.run_id
        # the fleet flushed its spans on exit; the collector acknowledged them once committed
        assert len(results) == 30 and all(r.status == "ok" for r in results)
        by_id = {r.request_id: r for r in results}
        ids = sorted(by_id) + [cancelled_id]
        reader = audit.open(store_path)
        # the cancelled stream's replica span ends when the replica sees the disconnect, which
        # on a loaded machine can be the fleet's stop: its export may follow the others'
        n = _wait_for(reader, "select count(*) from raw_spans where name = 'llm_request'", 31,
                      timeout_s=30)
        assert n == 31, sorted(set(ids) - {str(r[0]) for r in reader.query(
            "select a_request_id from raw_spans where name = 'llm_request'").rows()})
        spans = reader.query(
            "select a_request_id as rid, name, trace_id, span_id, parent_span_id, "
            "a_usage_cache_read_tokens as cached, a_finish_reasons as fr, "
            "a_gen_ai_request_id as gen_id, a_endpoint as endpoint, r_replica_id as replica, "
            "a_chosen as chosen, a_status as status, r_run_id as run_id, a_attempt as attempt, "
            "start_ns, end_ns "
            "from raw_spans where a_request_id in (select unnest(?::varchar[]))", [ids]
        ).rows(named=True)
        per: dict[str, dict[str, list[dict[str, object]]]] = {}
        for s in spans:
            per.setdefault(str(s["rid"]), {}).setdefault(str(s["name"]), []).append(s)
        events = reader.query(
            "select s.a_request_id as rid, count(*) as n, min(e.c_telemetry_age_ms) as min_age, "
            "count(*) filter (where e.c_chosen) as chosen "
            "from raw_span_events e join raw_spans s using (trace_id, span_id) "
            "where e.name = 'routeaudit.candidate' group by all").rows(named=True)
        cands = {str(e["rid"]): e for e in events}
        hits = 0
        for rid in ids:
            kinds = per[rid]
            client = kinds["routeaudit.client"]
            decision = kinds["routeaudit.decision"]
            forward = kinds["routeaudit.forward"]
            replica = kinds["llm_request"]
            assert len(client) == len(decision) == len(forward) == len(replica) == 1, rid
            trace = client[0]["trace_id"]
            assert {decision[0]["trace_id"], forward[0]["trace_id"], replica[0]["trace_id"]} == {trace}
            assert decision[0]["parent_span_id"] == client[0]["span_id"]
            assert forward[0]["parent_span_id"] == decision[0]["span_id"]
            assert replica[0]["parent_span_id"] == forward[0]["span_id"]
            assert replica[0]["replica"] == decision[0]["chosen"] and replica[0]["replica"] in replica_ids
            shift = 3_000_000_000 if replica[0]["replica"] == skewed else 0
            lead = replica[0]["start_ns"] - forward[0]["start_ns"] - shift  # type: ignore[operator]
            # the forward's own latency on a loaded 2-core runner reaches several hundred ms;
            # any lead under half the skew still shows the skew is there, once
            assert 0 <= lead < 1_500_000_000, (rid, lead)
            assert {s["run_id"] for s in (client[0], decision[0], replica[0])} == {run_id}
            c = cands[rid]
            assert c["n"] == 2 and c["chosen"] == 1 and c["min_age"] > 0
            prefix = "chatcmpl-" if replica[0]["endpoint"] == "/v1/chat/completions" else "cmpl-"
            suffix = "" if prefix == "chatcmpl-" else "-0"
            assert replica[0]["gen_id"] == f"{prefix}{rid}{suffix}"
            if rid == cancelled_id:
                assert client[0]["status"] == "cancelled"
                assert replica[0]["fr"] == ["abort"]
                continue
            res = by_id[rid]
            assert replica[0]["fr"] == [res.finish_reason] == ["length"]
            assert replica[0]["cached"] == res.cached_tokens
            hits += bool(res.cached_tokens)
        # hot_prefix: most prompts share one of two 2048-token system prompts
        assert hits >= 10
        # the marts see the same requests (linked by trace, cached tokens from the replica),
        # once they have read every span stored: within a refresh interval (plus one refresh)
        assert _wait_for(reader, f"select count(*) from requests where run_id = '{run_id}'",
                         31, timeout_s=30) == 31
        assert _wait_caught_up(reader) == 0
        mart = reader.query(
            "select request_id, status, chosen_replica, served_by, actual_cached_tokens "
            "from requests where request_id in (select unnest(?::varchar[]))", [ids]
        ).rows(named=True)
        assert len(mart) == 31
        for m in mart:
            assert m["chosen_replica"] == m["served_by"]
            assert m["status"] == ("cancelled" if m["request_id"] == cancelled_id else "ok")


def test_live_clock_offset_is_estimated_by_the_audit(store_path: Path) -> None:
    """Replica 1's clock runs 3 s ahead. Every live span nests inside its cross-host parent (the
    router ends its forward span before relaying the last bytes), so the audit's clock-offset
    estimate is consistent and no request is clock-suspect."""
    cfg = default_config(db_path=store_path, http_port=0, grpc_port=None)
    with Collector(cfg) as col:
        with Fleet(2, "round_robin", otlp_endpoint=col.traces_url, telemetry_interval_s=0.1,
                   clock_offsets_s=[0.0, 3.0]) as fleet:
            reqs = live_requests("uniform_short", 12, seed=5, time_scale=0.1, max_tokens=16)
            results = run_load(fleet.router_url, reqs, 4, progress=False, run_id=fleet.run_id,
                               tracer_provider=fleet.client_tracer_provider)
            skewed = fleet.replica_ids[1]
        assert [r.status for r in results] == ["ok"] * 12
        reader = audit.open(store_path)
        assert _wait_for(reader, "select count(*) from raw_spans where name = 'llm_request'", 12) == 12
        shifts = reader.query(
            "select l.r_replica_id as replica, min(l.start_ns - f.start_ns) as lo, "
            "max(l.end_ns - f.end_ns) as hi from raw_spans l join raw_spans f "
            "on f.trace_id = l.trace_id and f.span_id = l.parent_span_id "
            "where l.name = 'llm_request' group by all").rows(named=True)
        for row in shifts:
            base = 3_000_000_000 if row["replica"] == skewed else 0
            # nested once shifted back; the replica may end its span a moment after the router
            # ended its forward span (the last bytes are relayed after it): 50 ms of slack
            assert base <= row["lo"] and row["hi"] <= base + 50_000_000, row
        # the relations follow the raw tables within a refresh interval (plus one refresh). A
        # refresh may run while some sides' spans are still on their way (each process exports
        # on its own schedule); the offsets, and so the verdicts, settle once they are all in
        settled = _wait_for(reader, f"select count(*) from requests where run_id = '{fleet.run_id}' "
                            "and not clock_suspect", 12, timeout_s=30)
        mart = reader.query(
            "select count(*) as n, count(*) filter (where clock_suspect) as suspect "
            "from requests where run_id = ?", [fleet.run_id]).rows(named=True)[0]
        if settled != 12:  # say which: relations not rebuilt, or verdicts that did not settle
            health = col.health()
            pytest.fail(f"{settled} of 12 requests not clock-suspect after 30 s; requests {mart}; "
                        f"spans {reader.query('select name, count(*) from raw_spans group by all').rows()}; "
                        f"refreshes {health['counters'].get('background_refreshes')}, "
                        f"refresh_error {health.get('refresh_error')}, last_refresh_ms "
                        f"{health.get('last_refresh_ms')}, refresh_gap_ms {health.get('refresh_gap_ms')}; "
                        f"offsets {reader.query('select * from int_clock_offsets').rows(named=True)}; "
                        f"pairs {reader.query('select * from int_clock_bounds_per_domain_pair').rows(named=True)}")
        assert mart == {"n": 12, "suspect": 0}
