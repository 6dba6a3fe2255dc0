"""The telemetry page: how old the routers' view of the replicas was, and herding episodes."""

from __future__ import annotations

from typing import Final

import polars as pl

from audit._reads import Reads
from audit.queries._common import TABLE_LIMIT, bucket, buckets_param, has_relation, width

_TELEMETRY_BASE: Final = """
    with base as (
        select coalesce(router_id, '(unknown)') as router_id, decided_at, telemetry_age_ms
        from candidates
        where telemetry_age_ms is not null
    )"""


def telemetry_age_by_router(reader: Reads) -> pl.DataFrame:
    """Telemetry age (ms) of the candidates' data at decision time, per router. Columns:
    router_id, candidates, age_p50, age_p90, age_p99, age_max."""
    return reader.query(
        _TELEMETRY_BASE + """
        select router_id, count(*) as candidates,
            quantile_cont(telemetry_age_ms::double, 0.5) as age_p50,
            quantile_cont(telemetry_age_ms::double, 0.9) as age_p90,
            quantile_cont(telemetry_age_ms::double, 0.99) as age_p99,
            max(telemetry_age_ms) as age_max
        from base group by router_id order by router_id
        """
    )


def telemetry_age_over_time(reader: Reads, buckets: int = 60) -> pl.DataFrame:
    """Telemetry age per router per time bucket. Columns: bucket, router_id, age_p50, age_p99
    (ms)."""
    return reader.query(
        _TELEMETRY_BASE + f""",
        {width('decided_at')}
        select
            {bucket('base.decided_at')} as bucket,
            base.router_id,
            quantile_cont(base.telemetry_age_ms::double, 0.5) as age_p50,
            quantile_cont(base.telemetry_age_ms::double, 0.99) as age_p99
        from base cross join width
        where base.decided_at is not null
        group by all order by bucket, router_id
        """,
        [buckets_param(buckets)],
    )


def herding_episodes(reader: Reads, limit: int | None = None) -> pl.DataFrame:
    """Rows of the ``herding_episodes`` relation, the ``limit`` (default :data:`TABLE_LIMIT`)
    largest (most decisions on one telemetry sample, then earliest), so a cut keeps the worst;
    the column ``episodes_total`` counts them all. Empty frame when the relation is not
    installed."""
    if not has_relation(reader, "herding_episodes", "episode_id", "decisions", "started_at"):
        return pl.DataFrame()
    return reader.query(
        "select *, count(*) over () as episodes_total from herding_episodes "
        "order by decisions desc, started_at, episode_id limit ?",
        [TABLE_LIMIT if limit is None else int(limit)])
