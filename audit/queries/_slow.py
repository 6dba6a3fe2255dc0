"""The slow-requests page: requests that succeeded but missed a target, by primary cause."""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import polars as pl

from audit._reads import Reads
from audit._slo import SLO
from audit.queries._common import (
    ATTR_COLUMNS,
    JUDGED,
    REPLICA,
    REQUEST_AT,
    TABLE_LIMIT,
    TimeWindow,
    has_relation,
    in_window,
    query_at,
    window_variables,
)


def filter_options(reader: Reads, *, window: TimeWindow | None = None) -> dict[str, Any]:
    """Choices for the slow-request filters among the requests of ``window``: replicas,
    routers, policies, runs, and when they started (``first_at``, ``last_at``; None when the
    window holds no request). Causes come from :func:`slow_cause_breakdown` (planning the
    attribution relations is the expensive part, so it is done once per page)."""
    where, params = in_window(window)
    df = reader.query(
        f"""
        select
            list(distinct {REPLICA} order by {REPLICA})
                filter (where {REPLICA} is not null) as replicas,
            list(distinct router_id order by router_id)
                filter (where router_id is not null) as routers,
            list(distinct policy order by policy) filter (where policy is not null) as policies,
            list(distinct run_id order by run_id) filter (where run_id is not null) as runs,
            min({REQUEST_AT}) as first_at,
            max({REQUEST_AT}) as last_at
        from requests
        where {where}
        """,
        params, variables=window_variables(window),
    )
    row = df.row(0, named=True)
    out: dict[str, Any] = {k: (row[k] or []) for k in ("replicas", "routers", "policies", "runs")}
    out["first_at"], out["last_at"] = row["first_at"], row["last_at"]
    return out


_PRIMARY_ATTR: Final = """
    primary_attr as (
        select request_key, cause, sub_kind, excess_ms, confidence, evidence, evidence_source
        from attributions
        -- only the rows of the requests shown (those of the window): a request's rows are all
        -- kept or all dropped, so its one primary cause below is unchanged
        where is_primary and request_key in (select request_key from base)
        qualify row_number() over (
            partition by request_key order by excess_ms desc nulls last) = 1
    ),"""
"""CTE ``primary_attr``: one primary cause per request."""

_NO_ATTR: Final = """
    primary_attr as (
        select cast(null as varchar) as request_key, cast(null as varchar) as cause,
            cast(null as varchar) as sub_kind, cast(null as double) as excess_ms,
            cast(null as double) as confidence, cast(null as varchar) as evidence,
            cast(null as varchar) as evidence_source
        where false
    ),"""
"""``primary_attr`` in a store without the attribution relations: no cause for anyone."""


def _slow_sql(reader: Reads, *, window: TimeWindow | None,
              replica: str | None, router: str | None, policy: str | None, run: str | None,
              cause: str | None, materialized: bool = False) -> tuple[str, list[Any]]:
    """The ``slow`` CTE chain (ends in a relation named ``slow_f``) and its parameters;
    ``materialized``: ``slow_f`` is computed once however often the query reads it."""
    when, params = in_window(window)
    where = ["is_slow", when]
    # Column names below are constants; only the values are parameters.
    for column, value in ((f"{REPLICA} = ?", replica), ("router_id = ?", router),
                          ("policy = ?", policy), ("run_id = ?", run)):
        if value is not None:
            where.append(column)
            params.append(value)
    attributed = has_relation(reader, "attributions", *ATTR_COLUMNS)
    if cause is not None:
        params.append(cause)
    return f"""
        with base as (
            select *, total_excess_ms as over_slo_ms from {JUDGED} where {' and '.join(where)}
        ),
        {_PRIMARY_ATTR if attributed else _NO_ATTR}
        slow as (
            select base.*, coalesce(a.cause, 'unattributed') as cause, a.sub_kind,
                a.excess_ms, a.confidence, cast(a.evidence as varchar) as evidence,
                cast(a.evidence_source as varchar) as evidence_source
            from base
            left join primary_attr as a
                on a.request_key = base.request_key
        ),
        slow_f as {'materialized ' if materialized else ''}(
            select * from slow{' where cause = ?' if cause is not None else ''}
        )""", params


_SLOW_ROWS: Final = f"""
    select request_id, run_id, {REQUEST_AT} as started_at, ttft_ms, tpot_ms, over_slo_ms, cause,
        sub_kind, excess_ms, confidence, evidence, evidence_source,
        {REPLICA} as replica, router_id, policy, request_key
    from slow_f"""
_SLOW_ROWS_ORDER: Final = "coalesce(excess_ms, over_slo_ms) desc, request_id, request_key"
_SLOW_CAUSES: Final = """
    select cause, count(*) as requests,
        sum(coalesce(excess_ms, over_slo_ms)) as total_excess_ms,
        count(*) / sum(count(*)) over () as share
    from slow_f
    group by cause"""
_SLOW_CAUSES_ORDER: Final = "total_excess_ms desc nulls last, cause"


def slow_requests(reader: Reads, slo: SLO | None = None, *,
                  window: TimeWindow | None = None,
                  replica: str | None = None, router: str | None = None,
                  policy: str | None = None, run: str | None = None,
                  cause: str | None = None, limit: int = TABLE_LIMIT) -> pl.DataFrame:
    """Slow requests (succeeded, missed a target) that started in ``window`` (None: the whole
    store), worst first.

    Columns: request_id, run_id, started_at (:data:`REQUEST_AT`), ttft_ms, tpot_ms, over_slo_ms (ms beyond the
    targets: TTFT excess + TPOT excess × (output tokens − 1)), cause (primary cause, or
    ``'unattributed'`` when the attribution relations are absent or silent), sub_kind, excess_ms
    (attributed), confidence, evidence, evidence_source, replica, router_id, policy,
    request_key (request ids may repeat; the key does not).
    """
    ctes, params = _slow_sql(reader, window=window, replica=replica, router=router,
                             policy=policy, run=run, cause=cause)
    params.append(int(limit))
    return query_at(reader, f"{ctes} {_SLOW_ROWS} order by {_SLOW_ROWS_ORDER} limit ?", params,
                    slo, run=run, window=window)


def slow_cause_breakdown(reader: Reads, slo: SLO | None = None, *,
                         window: TimeWindow | None = None,
                         replica: str | None = None, router: str | None = None,
                         policy: str | None = None, run: str | None = None,
                         cause: str | None = None) -> pl.DataFrame:
    """Slow requests by primary cause. Columns: cause, requests, total_excess_ms (attributed
    excess; the over-SLO ms when unattributed), share (of slow requests)."""
    ctes, params = _slow_sql(reader, window=window, replica=replica, router=router,
                             policy=policy, run=run, cause=cause)
    return query_at(reader, f"{ctes} {_SLOW_CAUSES} order by {_SLOW_CAUSES_ORDER}", params,
                    slo, run=run, window=window)


class SlowPage(NamedTuple):
    """What the slow-request page shows, from one computation of the slow requests' causes."""

    requests: pl.DataFrame
    """As :func:`slow_requests`."""
    causes: pl.DataFrame
    """As :func:`slow_cause_breakdown`."""


def slow_page(reader: Reads, slo: SLO | None = None, *,
              window: TimeWindow | None = None,
              replica: str | None = None, router: str | None = None,
              policy: str | None = None, run: str | None = None,
              cause: str | None = None, limit: int = TABLE_LIMIT) -> SlowPage:
    """:func:`slow_requests` and :func:`slow_cause_breakdown` in one query.

    At an SLO other than the defaults both are computed live over every slow request, most of
    their time; one query computes that once (``slow_f`` materialised) and returns the two
    results as lists of rows."""
    ctes, params = _slow_sql(reader, window=window, replica=replica, router=router,
                             policy=policy, run=run, cause=cause, materialized=True)
    params.append(int(limit))
    both = query_at(reader, ctes + f""",
        page_requests as ({_SLOW_ROWS} order by {_SLOW_ROWS_ORDER} limit ?),
        page_causes as ({_SLOW_CAUSES})
        select
            (select list(r order by {_SLOW_ROWS_ORDER}) from page_requests as r) as requests,
            (select list(c order by {_SLOW_CAUSES_ORDER}) from page_causes as c) as causes
        """, params, slo, run=run, window=window)
    return SlowPage(_rows_of(both, "requests"), _rows_of(both, "causes"))


def _rows_of(both: pl.DataFrame, column: str) -> pl.DataFrame:
    """The rows of one list-of-struct cell (none when the list is NULL: no rows)."""
    fields = both.schema[column].inner.fields  # type: ignore[attr-defined]
    value: pl.Series | None = both[column][0]  # a list cell is a Series of its structs
    if value is None or len(value) == 0:
        return pl.DataFrame(schema={f.name: f.dtype for f in fields})
    return value.struct.unnest()
