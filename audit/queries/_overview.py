"""The overview page: totals, SLO attainment and goodput, load and failures over time."""

from __future__ import annotations

import polars as pl

from audit._reads import Reads
from audit._slo import SLO
from audit.queries._common import (
    JUDGED,
    OUTCOMES,
    REQUEST_AT,
    TimeWindow,
    bucket,
    buckets_param,
    in_window,
    overlaps_window,
    query_at,
    width,
    window_variables,
)


def overview_totals(reader: Reads, slo: SLO | None = None, *,
                    window: TimeWindow | None = None) -> pl.DataFrame:
    """One row: request counts, SLO attainment, goodput and latency percentiles of the
    requests in ``window`` (None: the whole store).

    Columns: requests, ok, failed, slow, good, attainment (good / requests), first_at, last_at,
    window_s, goodput_rps (good requests per second of the observed window), ttft_p50/p90/p99,
    tpot_p50/p90/p99 (ms, successful requests only).
    """
    where, params = in_window(window)
    return query_at(reader, f"select {OUTCOMES} from {JUDGED} where {where}", params, slo, window=window)


def requests_over_time(reader: Reads, slo: SLO | None = None, buckets: int = 60, *,
                       window: TimeWindow | None = None) -> pl.DataFrame:
    """Per time bucket of the requests' start (:data:`REQUEST_AT`), over the requests in
    ``window``: requests, good, failed, attainment, goodput_rps, ttft_p50, ttft_p99 (ms).
    ``bucket_s`` is the bucket width in seconds (about ``buckets`` buckets over the observed
    window)."""
    where, params = in_window(window)
    return query_at(
        reader,
        f"""
        with base as (select * from {JUDGED} where {REQUEST_AT} is not null and {where}),
        {width(REQUEST_AT)},
        bucketed as (
            select
                {bucket('base.' + REQUEST_AT)} as bucket,
                width.bucket_s,
                base.*
            from base cross join width
        ),
        final as (
            select
                bucket,
                any_value(bucket_s) as bucket_s,
                count(*) as requests,
                count(*) filter (where is_good) as good,
                count(*) filter (where not is_ok) as failed,
                good / count(*) as attainment,
                good / any_value(bucket_s) as goodput_rps,
                quantile_cont(ttft_ms::double, 0.5) filter (where is_ok) as ttft_p50,
                quantile_cont(ttft_ms::double, 0.99) filter (where is_ok) as ttft_p99
            from bucketed
            group by bucket
        )
        select * from final order by bucket
        """,
        [*params, buckets_param(buckets)],
        slo, window=window,
    )


def replica_load_over_time(reader: Reads, buckets: int = 60, *,
                           window: TimeWindow | None = None) -> pl.DataFrame:
    """Per replica and time bucket, true load beside the load the routers saw, within
    ``window`` (a chart over time: executions that overlap it, decisions taken in it).

    Columns: bucket, replica, source, load. ``source = 'true (executions)'``: requests in flight
    on the replica (started, not ended) at the bucket's start, from ``executions``.
    ``source = 'seen by routers (candidates)'``: mean waiting + running the routers' telemetry
    showed for that replica in decisions taken during the bucket.
    """
    running, run_params = overlaps_window(window, "start_at", "coalesce(end_at, start_at)")
    decided, dec_params = in_window(window, "d.decided_at")
    inside, inside_params = in_window(window, "t")
    return reader.query(
        f"""
        with execs as (
            select replica, start_at, coalesce(end_at, start_at) as end_at
            from executions
            where start_at is not null and replica is not null and {running}
        ),
        seen as (
            select c.replica, d.decided_at,
                coalesce(c.waiting, 0) + coalesce(c.running, 0) as load
            from candidates as c
            inner join decisions as d
                on c.request_key = d.request_key and c.attempt = d.attempt
            where d.decided_at is not null and c.replica is not null
                and (c.waiting is not null or c.running is not null) and {decided}
        ),
        bounds as (
            -- executions overlapping the window reach past it: the ticks stay inside it
            select min(t) as t0, max(t) as t1
            from (
                select start_at as t from execs
                union all select end_at from execs
                union all select decided_at from seen
            )
            where {inside}
        ),
        width as (
            select t0, t1, greatest(1, ceil((epoch(t1) - epoch(t0)) / ?)) as bucket_s
            from bounds where t0 is not null
        ),
        ticks as (
            select to_timestamp(epoch(width.t0) + r.i * width.bucket_s) as bucket
            from width cross join range(0, ? + 1) as r(i)
            where epoch(width.t0) + r.i * width.bucket_s <= epoch(width.t1)
        ),
        replicas as (select distinct replica from execs),
        true_load as (
            select ticks.bucket, replicas.replica, 'true (executions)' as source,
                count(execs.replica)::double as load
            from ticks
            cross join replicas
            left join execs
                on execs.replica = replicas.replica
                and execs.start_at <= ticks.bucket and execs.end_at > ticks.bucket
            group by all
        ),
        seen_load as (
            select
                {bucket('seen.decided_at')} as bucket,
                seen.replica,
                'seen by routers (candidates)' as source,
                avg(seen.load)::double as load
            from seen cross join width
            group by all
        ),
        final as (select * from true_load union all select * from seen_load)
        select * from final order by bucket, replica, source
        """,
        [*run_params, *dec_params, *inside_params, buckets_param(buckets),
         buckets_param(buckets)], variables=window_variables(window),
    )


def failures_by_kind(reader: Reads, *, window: TimeWindow | None = None) -> pl.DataFrame:
    """Failed requests in ``window`` by kind. Columns: kind, status, http_status, requests."""
    where, params = in_window(window)
    return reader.query(
        f"""
        with failed as (select * from {JUDGED} where not is_ok and {where}),
        final as (
            select
                status || coalesce(' ' || http_status::varchar, '') as kind,
                status,
                http_status,
                count(*) as requests
            from failed
            group by all
        )
        select * from final order by requests desc, kind
        """,
        params, variables=window_variables(window),
    )
