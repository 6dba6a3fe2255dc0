"""The cache page: how well routers predicted prefix-cache hits, per replica and policy; misses
and the engines' hit rate over time."""

from __future__ import annotations

from typing import Final

import polars as pl

from audit._reads import Reads
from audit.queries._common import REPLICA, REQUEST_AT, bucket, buckets_param, width

_CACHE_BASE: Final = f"""
    with base as (
        select {REPLICA} as replica, coalesce(policy, '(none)') as policy, request_id,
            {REQUEST_AT} as started_at, predicted_cached_tokens as predicted,
            actual_cached_tokens as actual,
            input_tokens
        from requests
        where predicted_cached_tokens is not null and actual_cached_tokens is not null
    )"""


def cache_by_replica(reader: Reads) -> pl.DataFrame:
    """Prediction quality per replica and policy. Columns: replica, policy, requests,
    predicted_tokens, actual_tokens (sums), mean_abs_error (tokens), over_predicted (requests
    where predicted > actual: the router expected a cache hit it did not get)."""
    return reader.query(
        _CACHE_BASE + """
        select replica, policy, count(*) as requests,
            sum(predicted)::bigint as predicted_tokens, sum(actual)::bigint as actual_tokens,
            avg(abs(predicted - actual)) as mean_abs_error,
            count(*) filter (where predicted > actual) as over_predicted
        from base group by all order by replica, policy
        """
    )


def cache_scatter(reader: Reads, limit: int = 5000) -> pl.DataFrame:
    """Predicted vs actual cached tokens, one point per request (a sample of at most
    ``limit``, a stable pseudo-random sample). Columns: request_id, replica, policy, predicted,
    actual, input_tokens."""
    return reader.query(
        _CACHE_BASE + """
        select request_id, replica, policy, predicted, actual, input_tokens
        from base
        order by hash(request_id)
        limit ?
        """,
        [int(limit)],
    )


def cache_confusion(reader: Reads) -> pl.DataFrame:
    """Hit/miss confusion per replica and policy. Columns: replica, policy, predicted ('hit'
    when predicted > 0), actual ('hit' when actual > 0), requests."""
    return reader.query(
        _CACHE_BASE + """
        select replica, policy,
            case when predicted > 0 then 'hit' else 'miss' end as predicted,
            case when actual > 0 then 'hit' else 'miss' end as actual,
            count(*) as requests
        from base group by all order by replica, policy, predicted, actual
        """
    )


def cache_misses_over_time(reader: Reads, buckets: int = 60) -> pl.DataFrame:
    """Predicted-but-missing cached tokens over time per replica: tokens the router believed
    were cached but the replica did not find (evicted, or never there). Columns: bucket,
    bucket_s, replica, missing_tokens, over_predicted (requests)."""
    return reader.query(
        _CACHE_BASE + f""",
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
        [buckets_param(buckets)],
    )


def cache_hit_rate_over_time(reader: Reads, buckets: int = 60) -> pl.DataFrame:
    """Engine-reported prefix-cache hit rate and KV usage per replica over time (from
    ``snapshots``). Columns: bucket, replica, prefix_cache_hit_rate, kv_usage (0..1)."""
    return reader.query(
        f"""
        with base as (select * from snapshots where ok and scraped_at is not null),
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
        [buckets_param(buckets)],
    )
