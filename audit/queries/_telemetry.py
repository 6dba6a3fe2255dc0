"""The telemetry page: how old the routers' view of the replicas was, and herding episodes."""

from __future__ import annotations

from typing import Any

import polars as pl

from audit._reads import Reads
from audit.queries._common import (
    TABLE_LIMIT,
    TimeWindow,
    bucket,
    buckets_param,
    has_relation,
    in_window,
    width,
    window_variables,
)


def _telemetry_base(window: TimeWindow | None) -> tuple[str, list[Any]]:
    """CTE ``base``: the candidates scored in ``window`` (by their decision's instant) that
    carry a telemetry age; and its parameters."""
    where, params = in_window(window, "decided_at")
    return f"""
    with base as (
        select coalesce(router_id, '(unknown)') as router_id, decided_at, telemetry_age_ms
        from candidates
        where telemetry_age_ms is not null and {where}
    )""", params


def telemetry_age_by_router(reader: Reads, *, window: TimeWindow | None = None) -> pl.DataFrame:
    """Telemetry age (ms) of the candidates' data at decision time, per router, for the
    decisions taken in ``window``. Columns: router_id, candidates, age_p50, age_p90, age_p99,
    age_max."""
    base, params = _telemetry_base(window)
    return reader.query(
        base + """
        select router_id, count(*) as candidates,
            quantile_cont(telemetry_age_ms::double, 0.5) as age_p50,
            quantile_cont(telemetry_age_ms::double, 0.9) as age_p90,
            quantile_cont(telemetry_age_ms::double, 0.99) as age_p99,
            max(telemetry_age_ms) as age_max
        from base group by router_id order by router_id
        """,
        params, variables=window_variables(window),
    )


def telemetry_age_over_time(reader: Reads, buckets: int = 60, *,
                            window: TimeWindow | None = None) -> pl.DataFrame:
    """Telemetry age per router per time bucket, for the decisions taken in ``window``.
    Columns: bucket, router_id, age_p50, age_p99 (ms)."""
    base, params = _telemetry_base(window)
    return reader.query(
        base + f""",
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
        [*params, buckets_param(buckets)], variables=window_variables(window),
    )


def herding_episodes(reader: Reads, limit: int | None = None, *,
                     window: TimeWindow | None = None) -> pl.DataFrame:
    """Rows of the ``herding_episodes`` relation that started in ``window``, the ``limit``
    (default :data:`TABLE_LIMIT`) largest (most decisions on one telemetry sample, then
    earliest), so a cut keeps the worst; the column ``episodes_total`` counts them all (in the
    window). Empty frame when the relation is not installed.

    The episodes themselves are found over the whole store (a relation rebuilt with the
    others); the window only chooses which are shown."""
    if not has_relation(reader, "herding_episodes", "episode_id", "decisions", "started_at"):
        return pl.DataFrame()
    where, params = in_window(window, "started_at")
    return reader.query(
        "select *, count(*) over () as episodes_total from herding_episodes "
        f"where {where} order by decisions desc, started_at, episode_id limit ?",
        [*params, TABLE_LIMIT if limit is None else int(limit)], variables=window_variables(window))
