"""The request drill-down page: one request's row, timeline, spans, decisions, candidates and
attribution."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import polars as pl

from audit._reads import Reads
from audit._slo import SLO
from audit.queries._common import (
    ATTR_COLUMNS,
    REQUEST_AT,
    TimeWindow,
    has_relation,
    in_window,
    query_at,
    request_variables,
    window_variables,
)


def request_matches(reader: Reads, text: str, limit: int = 50, *,
                    prefer: str | None = None, window: TimeWindow | None = None) -> pl.DataFrame:
    """Requests of ``window`` (None: the whole store) whose request id or request key is
    ``text``, latest first, the request key ``prefer`` (the one a link named) first of all, so
    ``limit`` never drops it: request ids repeat (capture runs, replays, clients reusing
    X-Request-Id), request keys do not. Columns: request_key, request_id, run_id, started_at
    (:data:`REQUEST_AT`), status, ttft_ms, matching (how many requests match in all, beyond
    ``limit`` too)."""
    where, params = in_window(window)
    return reader.query(
        f"select request_key, request_id, run_id, {REQUEST_AT} as started_at, status, ttft_ms, "
        "count(*) over () as matching from requests "
        f"where (request_id = ? or request_key = ?) and {where} "
        "order by request_key is not distinct from ? desc, started_at desc nulls last, "
        "request_key limit ?",
        [text, text, *params, prefer, int(limit)], variables=window_variables(window))


def request_detail(reader: Reads, request_key: str, *, at: datetime | None = None) -> pl.DataFrame:
    """The request's row in ``requests`` (0 or 1 row); ``request_key`` from
    :func:`request_matches` (the other request functions take it too).

    ``at``: when the request started (``started_at`` of :func:`request_matches`), which every
    request function takes: only the partitions near it are read (one request's rows among
    thousands of closed partitions); None reads every partition."""
    return reader.query("select * from requests where request_key = ?", [request_key],
                        variables=request_variables(at))


def request_waterfall(reader: Reads, request_key: str, *,
                      at: datetime | None = None) -> pl.DataFrame:
    """Client, router and replica phases of one request on the reference clock.

    Columns: lane (client / router / replica), phase, start_ms, end_ms (ms since the earliest
    phase start), duration_ms, start_at. Router phases: the forward of each attempt (from the
    decision instant); replica phases: queue, prefill, decode of each execution.
    """
    return reader.query(
        """
        with req as (select * from requests where request_key = ?),
        dec as (select * from decisions where request_key = ?),
        exe as (select * from executions where request_key = ?),
        phases as (
            select 'client' as lane, 'client e2e' as phase, client_start as start_at,
                e2e_ms as duration_ms, 1 as ord
            from req where client_start is not null
            union all
            select 'client', 'client TTFT', client_start, ttft_ms, 2
            from req where client_start is not null and ttft_ms is not null
            union all
            select 'router', 'forward (attempt ' || attempt || ', ' || coalesce(chosen_replica, '-')
                || ')', decided_at, coalesce(forward_ms, 0), 10 + attempt
            from dec where decided_at is not null
            union all
            select 'replica', 'queue @ ' || replica, start_at, coalesce(queue_ms, 0), 100
            from exe where start_at is not null
            union all
            select 'replica', 'prefill @ ' || replica,
                start_at + to_milliseconds(coalesce(queue_ms, 0)), coalesce(prefill_ms, 0), 101
            from exe where start_at is not null
            union all
            select 'replica', 'decode @ ' || replica,
                start_at + to_milliseconds(coalesce(queue_ms, 0) + coalesce(prefill_ms, 0)),
                coalesce(decode_ms, greatest((epoch(end_at) - epoch(start_at)) * 1000
                    - coalesce(queue_ms, 0) - coalesce(prefill_ms, 0), 0)), 102
            from exe where start_at is not null
        ),
        origin as (select min(start_at) as t0 from phases),
        final as (
            select lane, phase,
                (epoch(start_at) - epoch(origin.t0)) * 1000 as start_ms,
                (epoch(start_at) - epoch(origin.t0)) * 1000 + coalesce(duration_ms, 0) as end_ms,
                duration_ms, start_at, ord
            from phases cross join origin
        )
        select lane, phase, start_ms, end_ms, duration_ms, start_at from final
        order by ord, start_ms
        """,
        [request_key, request_key, request_key], variables=request_variables(at),
    )


def request_spans(reader: Reads, request_key: str, limit: int = 200, *,
                  at: datetime | None = None,
                  known: Mapping[str, list[str]] | None = None) -> pl.DataFrame:
    """Raw spans of the request: those the audit linked to it (every trace it crossed), else
    its trace. Times are on each emitter's own clock (raw, uncorrected). Columns: name,
    component, service, kind, start_at (emitter clock), duration_ms, status_code, trace_id,
    span_id, parent_span_id, attributes (every span attribute, JSON: ``raw_span_attributes``).

    ``known``: :func:`relation_columns` if the caller has it (a page caches it), so this is one
    query instead of two."""
    if has_relation(reader, "int_request_spans", "trace_id", "span_id", "request_key",
                    known=known):
        linked = ("select trace_id, span_id from int_request_spans "
                  "where request_key = ?")
    else:
        linked = ("select s.trace_id, s.span_id from raw_spans as s "
                  "semi join requests as r on r.trace_id = s.trace_id and r.request_key = ?")
    return reader.query(
        f"""
        with spans as (
            select s.* from raw_spans as s
            semi join ({linked}) as k on k.trace_id = s.trace_id and k.span_id = s.span_id
        )
        select s.name, s.a_component as component, s.service_name as service, s.kind,
            make_timestamp(s.start_ns // 1000) as start_at,
            (s.end_ns - s.start_ns) / 1e6 as duration_ms,
            s.status_code, s.trace_id, s.span_id, s.parent_span_id,
            v.attributes::varchar as attributes
        from spans as s
        left join raw_span_attributes as v
            on v.trace_id = s.trace_id and v.span_id = s.span_id
        order by s.start_ns
        limit ?
        """,
        [request_key, int(limit)], variables=request_variables(at),
    )


def request_decisions(reader: Reads, request_key: str, *,
                      at: datetime | None = None) -> pl.DataFrame:
    """Routing attempts of the request (``decisions`` rows), by attempt."""
    return reader.query(
        "select * from decisions where request_key = ? order by attempt", [request_key],
        variables=request_variables(at),
    )


def request_candidates(reader: Reads, request_key: str, *,
                       at: datetime | None = None) -> pl.DataFrame:
    """Every candidate of every attempt, what the router saw beside the true state.

    Router's view: eligible, excluded_reason, chosen, waiting, running, kv_usage,
    remaining_tokens, telemetry_age_ms, pending, predicted_cached_tokens, est_queue_ms,
    est_prefill_ms, score. True state at the decision instant: ``true_in_flight`` (other requests
    executing on that replica, from ``executions``) and the latest scrape at or before the
    decision (``scraped_running``, ``scraped_waiting``, ``scraped_kv_usage``,
    ``scrape_age_ms``).
    """
    return reader.query(
        """
        with dec as (
            select request_key, attempt, decided_at, chosen_replica, reason
            from decisions where request_key = ?
        ),
        cand as (
            select c.* exclude (decided_at), dec.decided_at
            from candidates as c
            inner join dec on c.request_key = dec.request_key and c.attempt = dec.attempt
        ),
        with_inflight as (
            select cand.*,
                (select count(*) from executions as e
                 where e.replica = cand.replica and e.request_key <> cand.request_key
                     and e.start_at <= cand.decided_at
                     and (e.end_at is null or e.end_at > cand.decided_at)) as true_in_flight
            from cand
        ),
        final as (
            select w.attempt, w.replica, w.chosen, w.eligible, w.excluded_reason, w.score,
                w.waiting, w.running, w.pending, w.kv_usage, w.remaining_tokens,
                w.telemetry_age_ms, w.predicted_cached_tokens, w.est_queue_ms,
                w.est_prefill_ms, w.true_in_flight,
                s.running as scraped_running, s.waiting as scraped_waiting,
                s.kv_usage as scraped_kv_usage,
                (epoch(w.decided_at) - epoch(s.scraped_at)) * 1000 as scrape_age_ms
            from with_inflight as w
            asof left join snapshots as s
                on s.replica = w.replica and w.decided_at >= s.scraped_at
        )
        select * from final
        order by attempt, chosen desc nulls last, score desc nulls last, replica
        """,
        [request_key], variables=request_variables(at),
    )


def request_attributions(reader: Reads, request_key: str, slo: SLO | None = None, *,
                         at: datetime | None = None, request_id: str | None = None,
                         known: Mapping[str, list[str]] | None = None) -> pl.DataFrame:
    """The attribution rows (verdict and evidence) of one request, primary first; empty frame
    when the attribution relations are not installed.

    ``request_id``: the request's id, if the caller has its row (:func:`request_detail`), and
    ``known``: :func:`relation_columns`, if it has them; each saves a query (a page's time is
    the sum of its queries')."""
    if not has_relation(reader, "attributions", *ATTR_COLUMNS, known=known):
        return pl.DataFrame()
    if request_id is None:
        ids = reader.query("select request_id from requests where request_key = ?",
                           [request_key], variables=request_variables(at))
        if ids.height == 0:  # no such request: nothing to compute (live, all of them)
            return pl.DataFrame()
        request_id = ids["request_id"][0]
    # Computed live (a non-default SLO), only the requests of this id are computed.
    return query_at(
        reader,
        "select * from attributions where request_key = ? "
        "order by is_primary desc, excess_ms desc nulls last",
        [request_key],
        slo,
        request=request_id,
        window=None if at is None else TimeWindow(at, at),
    )
