"""Stores for the dashboard tests and benchmark.

* :func:`empty_store` — a fresh store (raw tables, relations installed, no rows).
* :func:`raw_store` — a store filled through the front door: hand-built raw spans, candidate
  events and snapshots appended with ``Store.append``. Whether the marts show them depends on the
  marts' SQL (placeholders today), so tests using it check ``requests`` first.
* :func:`mart_store` — a store whose marts (and attribution relations) are *tables* filled with
  synthetic rows instead of views over raw data, with ``relations_version`` stamped current so the
  reader uses them as they are. It exercises the dashboard's queries on known data while the real
  marts are being written; ``n`` scales it for the benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa

from audit import _relations
from audit._store import Store
from audit.schema import (
    RAW_SNAPSHOTS_SCHEMA,
    RAW_SPAN_EVENTS_SCHEMA,
    RAW_SPANS_SCHEMA,
    RAW_TABLES,
    raw_ddl,
)

T0_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
REPLICAS = ("replica-0", "replica-1", "replica-2")


def empty_store(path: Path) -> Path:
    Store(path).close()
    return path


# --------------------------------------------------------------------------------------------
# Raw spans through Store.append
# --------------------------------------------------------------------------------------------
def _table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.table(cols, schema=schema)


def raw_store(path: Path, n: int = 12) -> Path:
    """``n`` requests, each a client span → decision span (3 candidate events) → forward span →
    replica ``llm_request`` span, plus one scrape per replica per second."""
    spans: list[dict] = []
    events: list[dict] = []
    for i in range(n):
        trace = f"{i + 1:032x}"
        rid = f"req-{i:04d}"
        chosen = REPLICAS[i % 3]
        start = T0_NS + i * 250_000_000
        ttft_ms = 120.0 + 40 * i + (2500.0 if i % 4 == 3 else 0.0)
        out_tokens = 20
        e2e_ms = ttft_ms + 30.0 * (out_tokens - 1)
        end = start + int(e2e_ms * 1e6)
        common = {"trace_id": trace, "status_code": "unset", "received_ns": end + 1_000_000,
                  "event_count": 0, "flags": 1, "a_request_id": rid, "a_run_id": "run-raw",
                  "r_run_id": "run-raw"}
        client_id, decision_id, forward_id, replica_id = (f"{i + 1:04x}{k:012x}"
                                                          for k in range(1, 5))
        client_attrs = {"routeaudit.component": "client", "routeaudit.request.id": rid,
                        "gen_ai.request.model": "m", "routeaudit.client.ttft_ms": ttft_ms,
                        "routeaudit.client.tpot_ms": 30.0, "routeaudit.status": "ok",
                        "gen_ai.usage.output_tokens": out_tokens, "http.response.status_code": 200}
        spans.append({**common, "span_id": client_id, "parent_span_id": None,
                      "name": "routeaudit.client", "kind": "client", "start_ns": start,
                      "end_ns": end, "service_name": "client", "a_component": "client",
                      "a_model": "m", "a_client_ttft_ms": ttft_ms, "a_client_tpot_ms": 30.0,
                      "a_client_e2e_ms": e2e_ms, "a_status": "ok", "a_http_status": 200,
                      "a_usage_output_tokens": out_tokens, "a_input_tokens": 1000,
                      "a_max_tokens": 64, "a_stream": True,
                      "attributes": json.dumps(client_attrs)})
        dec_ns = start + 1_000_000
        dec_attrs = {"routeaudit.component": "router", "routeaudit.request.id": rid,
                     "routeaudit.attempt": 0, "routeaudit.router.id": "router-a",
                     "routeaudit.router.policy": "least_load",
                     "routeaudit.decision.chosen": chosen,
                     "routeaudit.decision.reason": "least_load",
                     "routeaudit.decision.outcome": "routed",
                     "routeaudit.decision.candidate_count": 3,
                     "routeaudit.decision.time_ns": dec_ns}
        spans.append({**common, "span_id": decision_id, "parent_span_id": client_id,
                      "name": "routeaudit.decision", "kind": "internal", "start_ns": dec_ns,
                      "end_ns": dec_ns + 200_000, "service_name": "router",
                      "event_count": 3, "a_component": "router", "a_attempt": 0,
                      "a_router_id": "router-a", "a_policy": "least_load", "a_chosen": chosen,
                      "a_reason": "least_load", "a_decision_outcome": "routed",
                      "a_candidate_count": 3, "a_decision_time_ns": dec_ns,
                      "a_input_tokens": 1000, "r_router_id": "router-a",
                      "attributes": json.dumps(dec_attrs)})
        for k, rep in enumerate(REPLICAS):
            events.append({"trace_id": trace, "span_id": decision_id, "event_index": k,
                           "name": "routeaudit.candidate", "time_ns": dec_ns,
                           "attributes": json.dumps({"routeaudit.candidate.replica": rep}),
                           "c_replica": rep, "c_eligible": True, "c_chosen": rep == chosen,
                           "c_waiting": k, "c_running": 2, "c_kv_usage": 0.3,
                           "c_telemetry_ts_ns": dec_ns - 50_000_000,
                           "c_telemetry_age_ms": 50.0, "c_pending": 1,
                           "c_predicted_cached_tokens": 256 if rep == chosen else 0,
                           "c_score": float(-k)})
        spans.append({**common, "span_id": forward_id, "parent_span_id": decision_id,
                      "name": "routeaudit.forward", "kind": "client",
                      "start_ns": dec_ns + 300_000, "end_ns": end - 500_000,
                      "service_name": "router", "a_component": "router",
                      "a_router_id": "router-a", "a_attempt": 0, "a_http_status": 200,
                      "a_url_full": f"http://{chosen}:8000/v1/completions",
                      "attributes": json.dumps({"routeaudit.component": "router"})})
        rep_start = dec_ns + 1_000_000
        spans.append({**common, "span_id": replica_id, "parent_span_id": forward_id,
                      "name": "llm_request", "kind": "server", "start_ns": rep_start,
                      "end_ns": end - 1_000_000, "service_name": "vllm",
                      "a_component": "replica", "a_replica_id": chosen, "r_replica_id": chosen,
                      "a_gen_ai_request_id": rid, "a_usage_prompt_tokens": 1000,
                      "a_usage_completion_tokens": out_tokens, "a_usage_cached_tokens": 256,
                      "a_lat_ttft_s": ttft_ms / 1000 - 0.002, "a_lat_queue_s": 0.01,
                      "a_lat_prefill_s": ttft_ms / 1000 - 0.012,
                      "a_lat_decode_s": 30.0 * (out_tokens - 1) / 1000,
                      "a_finish_reasons": ["stop"],
                      "attributes": json.dumps({"routeaudit.component": "replica"})})
    snaps = [{"target": f"http://{rep}:8000/metrics", "replica": rep, "dp_rank": None,
              "scraped_ns": T0_NS + s * 1_000_000_000, "scrape_ms": 2.0, "ok": True,
              "running": 2.0, "waiting": 1.0, "kv_usage": 0.3, "prefix_cache_queries": 100.0 * s,
              "prefix_cache_hits": 40.0 * s, "model_name": "m"}
             for rep in REPLICAS for s in range(n // 4 + 6)]
    store = Store(path)
    try:
        store.append(_table(spans, RAW_SPANS_SCHEMA), _table(events, RAW_SPAN_EVENTS_SCHEMA),
                     _table(snaps, RAW_SNAPSHOTS_SCHEMA))
    finally:
        store.close()
    return path


# --------------------------------------------------------------------------------------------
# Marts as tables
# --------------------------------------------------------------------------------------------
_H = "(hash(i * {k} + {s}) % 1000)"  # deterministic pseudo-random 0..999 per row


def _h(k: int, s: int = 0) -> str:
    return _H.format(k=k, s=s)


_MART_SQL = {
    "requests": f"""
        with g as (select i from range($1) as t(i)),
        base as (
            select i,
                -- $2 = 2 repeats every id in the two runs (as capture runs and replays do)
                'req-' || lpad((i // $2)::varchar, 6, '0') as request_id,
                case when i % 2 = 0 then 'run-rr' else 'run-ca' end as run_id,
                case when i % 2 = 0 then 'round_robin' else 'cache_aware' end as policy,
                case when (i // 2) % 2 = 0 then 'router-a' else 'router-b' end as router_id,
                'replica-' || ({_h(3)} % 3) as chosen_replica,
                timestamptz '2026-01-01 00:00:00+00' + to_milliseconds(i * $3) as client_start,
                case when i % 17 = 5 then 'error' when i % 23 = 7 then 'timeout' else 'ok' end
                    as status,
                case when i % 19 = 0 then 1 else 10 + {_h(5)} % 200 end as output_tokens,
                (50 + {_h(7)} + case when i % 11 = 3 then 3000 else 0 end)::double as ttft_ms,
                (20 + {_h(13)} % 60 + case when i % 13 = 4 then 100 else 0 end)::double
                    as tpot_raw,
                500 + {_h(17)} * 4 as input_tokens,
                case when i % 2 = 1 then ({_h(19)} % 4) * 256 else 0 end as predicted
            from g
        )
        select request_id, lpad(printf('%x', i + 1), 32, '0') || '-' || lpad('1', 16, '0')
                as request_key,
            lpad(printf('%x', i + 1), 32, '0') as trace_id, run_id,
            'model-x' as model, '/v1/completions' as endpoint, input_tokens,
            256::bigint as max_tokens, true as stream, client_start, client_start as first_seen_at,
            (epoch_ns(client_start) // 300000000000)::bigint as part,
            case when status = 'ok' then ttft_ms end as ttft_ms,
            case when status = 'ok' and output_tokens >= 2 then tpot_raw end as tpot_ms,
            case when status = 'ok' then ttft_ms + tpot_raw * (output_tokens - 1) end as e2e_ms,
            output_tokens::bigint as output_tokens,
            case when status = 'ok' then 'stop' else 'abort' end as finish_reason,
            status,
            case when status = 'ok' then 200 when status = 'error' then 503 end::bigint
                as http_status,
            case when status <> 'ok' then 'client' end as failure_source,
            case when status = 'error' then 'HTTP 503' end as failure_reason,
            router_id, policy, (case when i % 29 = 1 then 2 else 1 end)::bigint as attempts,
            chosen_replica, chosen_replica as served_by,
            predicted::bigint as predicted_cached_tokens,
            (case when i % 7 = 0 then 0 else predicted end)::bigint as actual_cached_tokens,
            2.5::double as router_ms, 10.0::double as queue_ms, ttft_ms - 15 as prefill_ms,
            tpot_raw * (output_tokens - 1) as decode_ms, ttft_ms - 5 as replica_ttft_ms,
            true as has_client, true as has_router, status <> 'timeout' as has_replica,
            false as router_side_missing, 'trace' as link_method, false as clock_suspect
        from base
    """,
    "decisions": """
        with att as (
            select r.*, a.attempt
            from requests as r
            cross join lateral (select unnest(range(r.attempts)) as attempt) as a
        )
        select request_key, request_id, attempt::bigint as attempt, trace_id,
            lpad(printf('%x', hash(request_id || attempt) % 1000000000), 16, '0') as span_id,
            router_id, policy,
            client_start + to_milliseconds(1 + attempt * 5) as decided_at,
            (epoch(client_start) * 1e9)::bigint as decided_ns,
            case when attempt = attempts - 1 then chosen_replica
                else 'replica-' || ((hash(request_id) + 1) % 3) end as chosen_replica,
            case when policy = 'cache_aware' then 'cache_affinity' else 'round_robin' end
                as reason,
            'routed' as outcome, 3::bigint as candidate_count,
            case when attempt = attempts - 1 then http_status else 503 end as forward_status,
            case when attempt = attempts - 1 then coalesce(e2e_ms, 30000) - 2 else 4 end
                as forward_ms,
            true as recorded
        from att
    """,
    "candidates": """
        with reps as (select unnest(['replica-0', 'replica-1', 'replica-2']) as replica)
        select d.request_key, d.request_id, d.attempt, d.span_id as decision_span_id,
            reps.replica,
            true as eligible, cast(null as varchar) as excluded_reason,
            reps.replica = d.chosen_replica as chosen,
            (hash(d.request_id || reps.replica) % 5)::bigint as waiting,
            (hash(reps.replica || d.request_id) % 8)::bigint as running,
            (hash(d.request_id || reps.replica || 'kv') % 100) / 100.0 as kv_usage,
            (hash(d.request_id || reps.replica) % 4000)::bigint as remaining_tokens,
            d.decided_at - to_milliseconds(age_ms) as telemetry_ts,
            age_ms as telemetry_age_ms,
            (hash(d.request_id) % 3)::bigint as pending,
            case when reps.replica = d.chosen_replica then r.predicted_cached_tokens else 0 end
                as predicted_cached_tokens,
            (hash(d.request_id || reps.replica) % 300)::double as est_queue_ms,
            (hash(reps.replica || d.request_id) % 200)::double as est_prefill_ms,
            (case when reps.replica = d.chosen_replica then 1.0 else 0.5 end)::double as score,
            d.router_id, d.decided_at
        from decisions as d
        inner join requests as r using (request_key)
        cross join reps
        cross join lateral (select ((hash(d.request_id || reps.replica || 'age') % 400)
            + case when d.router_id = 'router-b' then 1000 else 0 end)::double as age_ms)
    """,
    "executions": """
        select request_key, request_id, trace_id,
            lpad(printf('%x', hash(request_id) % 1000000), 16, 'e') as span_id,
            served_by as replica, 0::bigint as dp_rank,
            client_start + to_milliseconds(3) as start_at,
            client_start + to_milliseconds(3 + coalesce(e2e_ms, 50)) as end_at,
            queue_ms, prefill_ms, decode_ms, replica_ttft_ms as ttft_ms, e2e_ms - 3 as e2e_ms,
            input_tokens, output_tokens, actual_cached_tokens as cached_tokens, finish_reason,
            0::bigint as preemptions, status
        from requests where has_replica
    """,
    "snapshots": """
        with bounds as (select min(client_start) as t0, max(client_start) as t1 from requests),
        ticks as (
            select t0 + to_seconds(s) as scraped_at
            from bounds cross join range(0, (epoch(t1) - epoch(t0))::bigint + 2) as r(s)
        )
        select reps.replica, 0::bigint as dp_rank, ticks.scraped_at, true as ok,
            cast(null as varchar) as error,
            (hash(reps.replica || ticks.scraped_at) % 8)::double as running,
            (hash(ticks.scraped_at || reps.replica) % 4)::double as waiting,
            (hash(reps.replica || ticks.scraped_at || 'kv') % 100) / 100.0 as kv_usage,
            (hash(reps.replica || ticks.scraped_at || 'h') % 100) / 100.0
                as prefix_cache_hit_rate,
            cast(null as double) as cache_hit_rate
        from ticks
        cross join (select unnest(['replica-0', 'replica-1', 'replica-2']) as replica) as reps
    """,
    # The attribution layer as its authors describe it; the default SLO (2000 / 100 ms) decides.
    "attributions": """
        with slow as (
            select * from requests
            where status = 'ok' and (ttft_ms > 2000 or coalesce(tpot_ms > 100, false))
        ),
        primary_rows as (
            select request_key, request_id, run_id,
                case hash(request_id) % 3 when 0 then 'stale_telemetry'
                    when 1 then 'cache_miss' else 'herding' end as cause,
                'synthetic' as sub_kind,
                greatest(ttft_ms - 2000, 0) + greatest(coalesce(tpot_ms, 0) - 100, 0) * 10
                    as excess_ms,
                true as is_primary, 0.8::double as confidence,
                'telemetry 1200 ms old; replica had 7 waiting' as evidence,
                'candidates' as evidence_source
            from slow
        ),
        secondary as (
            select request_key, request_id, run_id, 'queueing' as cause, 'synthetic' as sub_kind,
                5.0::double as excess_ms, false as is_primary, 0.3::double as confidence,
                'minor queueing' as evidence, 'executions' as evidence_source
            from slow
        )
        select * from primary_rows union all select * from secondary
    """,
    "herding_episodes": """
        -- the relation's own columns (audit/sql/marts/herding_episodes.sql)
        select md5(replica || n) as episode_id, 'run-1' as run_id, replica,
            t0 + to_seconds(n) as telemetry_ts,
            t0 + to_seconds(n + 1) as started_at,
            t0 + to_seconds(n + 3) as ended_at,
            decisions::bigint as decisions, 2::bigint as routers, 1::bigint as max_pending_seen,
            decisions - 2::bigint as unreflected_assignments, 7.0::double as seen_waiting,
            decisions::bigint as true_waiting_last, 1::bigint as slow_requests,
            1::bigint as slow_unreflected, 'req-1,req-2' as request_ids,
            'k1,k2' as request_keys, 2000.0::double as span_ms,
            printf('%d decisions from 2 router(s) onto %s', decisions, replica) as evidence
        from (select min(client_start) as t0 from requests),
            (values ('replica-1', 14, 1), ('replica-2', 9, 5), ('replica-1', 11, 8))
                as e(replica, decisions, n)
    """,
}


JUDGEMENT = ("slo_targets", "int_attr_requests_judged")
"""Relations every store has that judge the ``requests`` rows against the reader's SLO, in
dependency order; views over the synthetic marts here, as in a real store."""


def mart_store(path: Path, n: int = 400, *, attribution: bool = True,
               repeat_ids: bool = False, spacing_ms: int = 100) -> Path:
    """A store whose marts are synthetic tables of ``n`` requests (see module docstring);
    ``repeat_ids``: each request id names two requests, one in each run; ``spacing_ms``:
    between two requests' starts (the default puts 400 requests in 40 s, inside the
    dashboard's default window of an hour).

    Built without ``Store`` (which would install every relation as a view first, slow while the
    relations grow): raw tables from their DDL, the marts as tables, the version stamp.
    """
    con = duckdb.connect(str(path))
    try:
        for table in RAW_TABLES:
            con.execute(raw_ddl(table))
        for rel in _relations.load_relations():  # views over the raw tables, as every store has
            if rel.name in _relations.ALWAYS_VIEWS:
                con.execute(f"create view {rel.name} as {rel.sql}")
        con.execute(
            "create table routeaudit_meta (key varchar primary key, value varchar)"
        )
        order = ["requests", "decisions", "candidates", "executions", "snapshots"]
        if attribution:
            order += ["attributions", "herding_episodes"]
        for name in order:
            params = [n, 2 if repeat_ids else 1, spacing_ms] if name == "requests" else None
            con.execute(f"create table {name} as {_MART_SQL[name]}", params)
        for rel in _relations.load_relations():  # the SLO judgement, from its own SQL
            if rel.name in JUDGEMENT:
                con.execute(f"create view {rel.name} as {rel.sql}")
        con.execute(
            "insert into routeaudit_meta values ('relations_version', ?)",
            [_relations.relations_version()],
        )
        con.execute("checkpoint")
    finally:
        con.close()
    return path
