"""The cache page: how well routers predicted prefix-cache hits, per replica and policy; misses
and the engines' hit rate over time."""

from __future__ import annotations

from typing import Any

import polars as pl

from audit._reads import Reads
from audit.queries._common import (
    REPLICA,
    REQUEST_AT,
    TimeWindow,
    bucket,
    buckets_param,
    in_window,
    width,
    window_variables,
)


def _cache_base(window: TimeWindow | None) -> tuple[str, list[Any]]:
    """CTE ``base``: the requests of ``window`` with both a predicted and an actual
    cached-token count; and its parameters."""
    where, params = in_window(window)
    return f"""
    with base as (
        select {REPLICA} as replica, coalesce(policy, '(none)') as policy, request_id,
            {REQUEST_AT} as started_at, predicted_cached_tokens as predicted,
            actual_cached_tokens as actual,
            input_tokens
        from requests
        where predicted_cached_tokens is not null and actual_cached_tokens is not null
            and {where}
    )""", params


def cache_by_replica(reader: Reads, *, window: TimeWindow | None = None) -> pl.DataFrame:
    """Prediction quality per replica and policy, over the requests of ``window``. Columns:
    replica, policy, requests, predicted_tokens, actual_tokens (sums), mean_abs_error (tokens),
    over_predicted (requests where predicted > actual: the router expected a cache hit it did
    not get)."""
    base, params = _cache_base(window)
    return reader.query(
        base + """
        select replica, policy, count(*) as requests,
            sum(predicted)::bigint as predicted_tokens, sum(actual)::bigint as actual_tokens,
            avg(abs(predicted - actual)) as mean_abs_error,
            count(*) filter (where predicted > actual) as over_predicted
        from base group by all order by replica, policy
        """,
        params, variables=window_variables(window),
    )


def cache_scatter(reader: Reads, limit: int = 5000, *,
                  window: TimeWindow | None = None) -> pl.DataFrame:
    """Predicted vs actual cached tokens, one point per request of ``window`` (a sample of
    at most ``limit``, a stable pseudo-random sample). Columns: request_id, replica, policy,
    predicted, actual, input_tokens."""
    base, params = _cache_base(window)
    return reader.query(
        base + """
        select request_id, replica, policy, predicted, actual, input_tokens
        from base
        order by hash(request_id)
        limit ?
        """,
        [*params, int(limit)], variables=window_variables(window),
    )


def cache_confusion(reader: Reads, *, window: TimeWindow | None = None) -> pl.DataFrame:
    """Hit/miss confusion per replica and policy, over the requests of ``window``. Columns:
    replica, policy, predicted ('hit' when predicted > 0), actual ('hit' when actual > 0),
    requests."""
    base, params = _cache_base(window)
    return reader.query(
        base + """
        select replica, policy,
            case when predicted > 0 then 'hit' else 'miss' end as predicted,
            case when actual > 0 then 'hit' else 'miss' end as actual,
            count(*) as requests
        from base group by all order by replica, policy, predicted, actual
        """,
        params, variables=window_variables(window),
    )


def cache_misses_over_time(reader: Reads, buckets: int = 60, *,
                           window: TimeWindow | None = None) -> pl.DataFrame:
    """Predicted-but-missing cached tokens over time per replica, over the requests of
    ``window``: tokens the router believed were cached but the replica did not find (evicted,
    or never there). Columns: bucket, bucket_s, replica, missing_tokens, over_predicted
    (requests)."""
    base, params = _cache_base(window)
    return reader.query(
        base + f""",
        {width('started_at')}
        select
            {bucket('base.started_at')} as bucket,
            any_value(width.bucket_s) as bucket_s,
            base.replica,
            sum(greatest(base.predicted - base.actual, 0))::bigint as missing_tokens,
            count(*) filter (where base.predicted > base.actual) as over_predicted
        from base cross join width
        where base.started_at is not null
        group by all order by bucket, replica
        """,
        [*params, buckets_param(buckets)], variables=window_variables(window),
    )


def cache_hit_rate_over_time(reader: Reads, buckets: int = 60, *,
                             window: TimeWindow | None = None) -> pl.DataFrame:
    """Engine-reported prefix-cache hit rate and KV usage per replica over time (from
    ``snapshots`` scraped in ``window``). Columns: bucket, replica, prefix_cache_hit_rate,
    kv_usage (0..1)."""
    where, params = in_window(window, "scraped_at")
    return reader.query(
        f"""
        with base as (select * from snapshots where ok and scraped_at is not null and {where}),
        {width('scraped_at')}
        select
            {bucket('base.scraped_at')} as bucket,
            base.replica,
            avg(coalesce(base.prefix_cache_hit_rate, base.cache_hit_rate))
                as prefix_cache_hit_rate,
            avg(base.kv_usage) as kv_usage
        from base cross join width
        group by all order by bucket, replica
        """,
        [*params, buckets_param(buckets)], variables=window_variables(window),
    )
