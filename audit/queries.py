"""The query layer behind the dashboard (and notebooks): named questions over the marts.

Every function takes a reader (anything with ``query(sql, params) -> polars.DataFrame``, such as
:class:`audit._store.Reader`) plus plain values (SLO targets, filters, a request id) and returns
a polars DataFrame. Aggregation and time bucketing happen in DuckDB, tables carry a ``LIMIT``, so
a page never pulls a whole relation into Python.

Contracts:

* SQL text is fixed; values are bound as parameters. The only text chosen at run time is picked
  from constants in this module (which filter columns apply, whether the attribution relations
  are joined), never built from user input.
* Relations that do not exist yet (the attribution layer is optional, marts may lag) are detected
  with :func:`relation_columns`; functions that need them return an empty frame with the documented
  columns instead of raising. Other failures raise :class:`audit._errors.AuditError` subclasses
  (``QueryError``, ``ReadOnlyError``, ``StoreError``) with a one-line message.
* Durations are milliseconds, times ``timestamptz`` on the reference clock (see docs/schema.md).
* "Slow" and "good" follow the SLO passed in: a request is *good* when it succeeded
  (``status = 'ok'``, or no status recorded) and its TTFT and TPOT are within the targets (a null
  TPOT, i.e. fewer than two output tokens, counts as within). A *slow* request succeeded but missed
  a target. Failures are counted separately, never as slow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple, Protocol

import polars as pl

from audit import _relations
from audit._slo import DEFAULT_TPOT_SLO_MS, DEFAULT_TTFT_SLO_MS, as_slo, query_with_slo

__all__ = [
    "DEFAULT_SLO",
    "EXAMPLE_QUERIES",
    "relation_columns",
    "has_relation",
    "overview_totals",
    "requests_over_time",
    "replica_load_over_time",
    "failures_by_kind",
    "filter_options",
    "slow_requests",
    "slow_cause_breakdown",
    "slow_page",
    "SlowPage",
    "request_detail",
    "request_waterfall",
    "request_spans",
    "request_decisions",
    "request_candidates",
    "request_attributions",
    "cache_by_replica",
    "cache_scatter",
    "cache_confusion",
    "cache_misses_over_time",
    "cache_hit_rate_over_time",
    "telemetry_age_by_router",
    "telemetry_age_over_time",
    "herding_episodes",
    "run_list",
    "compare_runs",
    "run_failures",
    "run_sql",
    "relations_freshness",
    "describe_lag",
]


class Reads(Protocol):
    """What the query layer needs from a reader."""

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pl.DataFrame: ...


DEFAULT_SLO: Final[Mapping[str, float]] = {"ttft_ms": DEFAULT_TTFT_SLO_MS,
                                            "tpot_ms": DEFAULT_TPOT_SLO_MS}
"""Default SLO targets (ms) when the caller gives none."""

SCOPE_RUN_VARIABLE, SCOPE_REQUEST_VARIABLE = _relations.SCOPE_VARIABLES
"""Session variables limiting the live attribution views to one run / one request."""

TABLE_LIMIT: Final = 500
"""Default row cap on tables shown to a person."""

# Shared SQL fragments (constants, never user input). ``?`` order: ttft target, tpot target.
_OK: Final = "coalesce(status, 'ok') = 'ok'"
_GOOD: Final = f"({_OK} and ttft_ms <= ? and coalesce(tpot_ms <= ?, true))"
_SLOW: Final = f"({_OK} and (ttft_ms > ? or coalesce(tpot_ms > ?, false)))"
_OVER_SLO_MS: Final = (
    "(greatest(coalesce(ttft_ms, 0) - ?, 0)"
    " + greatest(coalesce(tpot_ms, 0) - ?, 0) * greatest(coalesce(output_tokens, 1) - 1, 0))"
)
_REPLICA: Final = "coalesce(served_by, chosen_replica)"


def _width(column: str) -> str:
    """CTE ``width``: start ``t0`` and bucket length ``bucket_s`` (s) that split the ``base``
    rows' ``column`` window into as many buckets as the one bound parameter says."""
    return (f"width as (select min({column}) as t0, greatest(1, ceil((epoch(max({column}))"
            f" - epoch(min({column}))) / ?)) as bucket_s from base)")


def _bucket(column: str) -> str:
    """Start of the time bucket ``column`` falls in (needs the ``width`` CTE)."""
    return (f"to_timestamp(epoch(width.t0) + floor((epoch({column}) - epoch(width.t0))"
            f" / width.bucket_s) * width.bucket_s)")


def _slo(slo: object) -> tuple[float, float]:
    resolved = as_slo(slo)
    return resolved.ttft_ms, resolved.tpot_ms


def _query(reader: Reads, sql: str, params: Sequence[Any] | None = None,
           slo: Mapping[str, float] | None = None, *, run: str | None = None,
           request: str | None = None) -> pl.DataFrame:
    """Every query of the dashboard goes through here with the sidebar's SLO, so the causes
    shown follow the same targets as the slow/good split computed here.

    ``run`` / ``request``: the caller's query reads only that run's / that request's rows, so
    the live attribution computation (the one at a non-default SLO) may be limited to them
    (``routeaudit_scope_run`` / ``routeaudit_scope_request``; docs/attribution.md): the same
    rows, in a fraction of the time on a large store."""
    scope = {name: value for name, value in ((SCOPE_RUN_VARIABLE, run),
                                             (SCOPE_REQUEST_VARIABLE, request)) if value is not None}
    return query_with_slo(reader, sql, params, slo, scope or None)  # type: ignore[no-any-return]

# --------------------------------------------------------------------------------------------
# What exists
# --------------------------------------------------------------------------------------------
def relation_columns(reader: Reads) -> dict[str, list[str]]:
    """Every relation visible to the reader (views, tables, temp ones) and its columns; a
    temporary relation shadows the store's own of that name, as it does in queries."""
    df = reader.query(
        "select table_name, list(column_name order by ordinal_position) as columns "
        "from information_schema.columns as c "
        "where table_catalog = 'temp' or not exists (select 1 from information_schema.tables as t "
        "where t.table_catalog = 'temp' and t.table_name = c.table_name) "
        "group by table_name"
    )
    return {str(r["table_name"]): list(r["columns"]) for r in df.iter_rows(named=True)}


def has_relation(reader: Reads, name: str, *columns: str,
                 known: Mapping[str, list[str]] | None = None) -> bool:
    """Whether relation ``name`` exists and has all ``columns``."""
    rels = relation_columns(reader) if known is None else known
    cols = rels.get(name)
    return cols is not None and all(c in cols for c in columns)


_ATTR_COLS: Final = ("request_key", "request_id", "run_id", "cause", "excess_ms", "is_primary")


def _primary_attr_cte(reader: Reads) -> str | None:
    """A CTE named ``primary_attr`` (one primary cause per request) or None if absent."""
    if not has_relation(reader, "attributions", *_ATTR_COLS):
        return None
    return (
        "primary_attr as (\n"
        "    select request_key, cause, sub_kind, excess_ms, confidence, evidence,\n"
        "        evidence_source\n"
        "    from attributions\n"
        "    where is_primary\n"
        "    qualify row_number() over (\n"
        "        partition by request_key order by excess_ms desc nulls last) = 1\n"
        ")"
    )


# --------------------------------------------------------------------------------------------
# Overview
# --------------------------------------------------------------------------------------------
def overview_totals(reader: Reads, slo: Mapping[str, float] | None = None) -> pl.DataFrame:
    """One row: request counts, SLO attainment, goodput and latency percentiles.

    Columns: requests, ok, failed, slow, good, attainment (good / requests), goodput_rps (good
    requests per second of the observed window), window_s, first_at, last_at, ttft_p50/p90/p99,
    tpot_p50/p90/p99 (ms, successful requests only).
    """
    ttft, tpot = _slo(slo)
    return reader.query(
        f"""
        with base as (select * from requests),
        final as (
            select
                count(*) as requests,
                count(*) filter (where {_OK}) as ok,
                count(*) filter (where not {_OK}) as failed,
                count(*) filter (where {_SLOW}) as slow,
                count(*) filter (where {_GOOD}) as good,
                good / nullif(requests, 0) as attainment,
                min(client_start) as first_at,
                max(client_start) as last_at,
                greatest(epoch(max(client_start)) - epoch(min(client_start)), 1e-3) as window_s,
                good / window_s as goodput_rps,
                quantile_cont(ttft_ms::double, 0.5) filter (where {_OK}) as ttft_p50,
                quantile_cont(ttft_ms::double, 0.9) filter (where {_OK}) as ttft_p90,
                quantile_cont(ttft_ms::double, 0.99) filter (where {_OK}) as ttft_p99,
                quantile_cont(tpot_ms::double, 0.5) filter (where {_OK}) as tpot_p50,
                quantile_cont(tpot_ms::double, 0.9) filter (where {_OK}) as tpot_p90,
                quantile_cont(tpot_ms::double, 0.99) filter (where {_OK}) as tpot_p99
            from base
        )
        select * from final
        """,
        [ttft, tpot, ttft, tpot],
    )


def requests_over_time(reader: Reads, slo: Mapping[str, float] | None = None,
                       buckets: int = 60) -> pl.DataFrame:
    """Per time bucket of ``client_start``: requests, good, failed, attainment, goodput_rps,
    ttft_p50, ttft_p99 (ms). ``bucket_s`` is the bucket width in seconds (about ``buckets``
    buckets over the observed window)."""
    ttft, tpot = _slo(slo)
    return reader.query(
        f"""
        with base as (select * from requests where client_start is not null),
        {_width('client_start')},
        bucketed as (
            select
                {_bucket('base.client_start')} as bucket,
                width.bucket_s,
                base.*
            from base cross join width
        ),
        final as (
            select
                bucket,
                any_value(bucket_s) as bucket_s,
                count(*) as requests,
                count(*) filter (where {_GOOD}) as good,
                count(*) filter (where not {_OK}) as failed,
                good / count(*) as attainment,
                good / any_value(bucket_s) as goodput_rps,
                quantile_cont(ttft_ms::double, 0.5) filter (where {_OK}) as ttft_p50,
                quantile_cont(ttft_ms::double, 0.99) filter (where {_OK}) as ttft_p99
            from bucketed
            group by bucket
        )
        select * from final order by bucket
        """,
        [max(int(buckets), 1), ttft, tpot],
    )


def replica_load_over_time(reader: Reads, buckets: int = 60) -> pl.DataFrame:
    """Per replica and time bucket, true load beside the load the routers saw.

    Columns: bucket, replica, source, load. ``source = 'true (executions)'``: requests in flight
    on the replica (started, not ended) at the bucket's start, from ``executions``.
    ``source = 'seen by routers (candidates)'``: mean waiting + running the routers' telemetry
    showed for that replica in decisions taken during the bucket.
    """
    return reader.query(
        f"""
        with execs as (
            select replica, start_at, coalesce(end_at, start_at) as end_at
            from executions
            where start_at is not null and replica is not null
        ),
        seen as (
            select c.replica, d.decided_at,
                coalesce(c.waiting, 0) + coalesce(c.running, 0) as load
            from candidates as c
            inner join decisions as d
                on c.request_key = d.request_key and c.attempt = d.attempt
            where d.decided_at is not null and c.replica is not null
                and (c.waiting is not null or c.running is not null)
        ),
        bounds as (
            select min(t) as t0, max(t) as t1
            from (
                select start_at as t from execs
                union all select end_at from execs
                union all select decided_at from seen
            )
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
                {_bucket('seen.decided_at')} as bucket,
                seen.replica,
                'seen by routers (candidates)' as source,
                avg(seen.load)::double as load
            from seen cross join width
            group by all
        ),
        final as (select * from true_load union all select * from seen_load)
        select * from final order by bucket, replica, source
        """,
        [max(int(buckets), 1), max(int(buckets), 1)],
    )


def failures_by_kind(reader: Reads) -> pl.DataFrame:
    """Failed requests by kind. Columns: kind, status, http_status, requests."""
    return reader.query(
        f"""
        with failed as (select * from requests where not {_OK}),
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
        """
    )


# --------------------------------------------------------------------------------------------
# Slow requests
# --------------------------------------------------------------------------------------------
def filter_options(reader: Reads) -> dict[str, Any]:
    """Choices for the slow-request filters: replicas, routers, policies, runs, and the time
    window (``first_at``, ``last_at``). Causes come from :func:`slow_cause_breakdown` (planning
    the attribution relations is the expensive part, so it is done once per page)."""
    df = reader.query(
        f"""
        select
            list(distinct {_REPLICA} order by {_REPLICA})
                filter (where {_REPLICA} is not null) as replicas,
            list(distinct router_id order by router_id)
                filter (where router_id is not null) as routers,
            list(distinct policy order by policy) filter (where policy is not null) as policies,
            list(distinct run_id order by run_id) filter (where run_id is not null) as runs,
            min(client_start) as first_at,
            max(client_start) as last_at
        from requests
        """
    )
    row = df.row(0, named=True)
    out: dict[str, Any] = {k: (row[k] or []) for k in ("replicas", "routers", "policies", "runs")}
    out["first_at"], out["last_at"] = row["first_at"], row["last_at"]
    return out


def _slow_sql(reader: Reads, slo: Mapping[str, float] | None, *, start: datetime | None,
              end: datetime | None, replica: str | None, router: str | None,
              policy: str | None, run: str | None, cause: str | None,
              materialized: bool = False) -> tuple[str, list[Any]]:
    """The ``slow`` CTE chain (ends in a relation named ``slow_f``) and its parameters;
    ``materialized``: ``slow_f`` is computed once however often the query reads it."""
    slow_f = "slow_f as materialized" if materialized else "slow_f as"
    ttft, tpot = _slo(slo)
    params: list[Any] = [ttft, tpot, ttft, tpot]
    where = [_SLOW]
    # Column names below are constants; only the values are parameters.
    for column, value in (("client_start >= ?", start), ("client_start <= ?", end),
                          (f"{_REPLICA} = ?", replica), ("router_id = ?", router),
                          ("policy = ?", policy), ("run_id = ?", run)):
        if value is not None:
            where.append(column)
            params.append(value)
    attr = _primary_attr_cte(reader)
    if attr is None:
        ctes = f"""
        with base as (
            select *, {_OVER_SLO_MS} as over_slo_ms from requests where {' and '.join(where)}
        ),
        slow as (
            select base.*, 'unattributed' as cause, cast(null as varchar) as sub_kind,
                cast(null as double) as excess_ms, cast(null as double) as confidence,
                cast(null as varchar) as evidence, cast(null as varchar) as evidence_source
            from base
        )"""
        # Without attributions every slow request is 'unattributed'.
        where_cause = " where false" if cause not in (None, "unattributed") else ""
        return ctes + f", {slow_f} (select * from slow{where_cause})", params
    ctes = f"""
        with {attr},
        base as (
            select *, {_OVER_SLO_MS} as over_slo_ms from requests where {' and '.join(where)}
        ),
        slow as (
            select base.*, coalesce(a.cause, 'unattributed') as cause, a.sub_kind,
                a.excess_ms, a.confidence, cast(a.evidence as varchar) as evidence,
                cast(a.evidence_source as varchar) as evidence_source
            from base
            left join primary_attr as a
                on a.request_key = base.request_key
        )"""
    if cause is not None:
        params.append(cause)
        return ctes + f", {slow_f} (select * from slow where cause = ?)", params
    return ctes + f", {slow_f} (select * from slow)", params


_SLOW_ROWS: Final = f"""
    select request_id, run_id, client_start, ttft_ms, tpot_ms, over_slo_ms, cause,
        sub_kind, excess_ms, confidence, evidence, evidence_source,
        {_REPLICA} as replica, router_id, policy, request_key
    from slow_f"""
_SLOW_ROWS_ORDER: Final = "coalesce(excess_ms, over_slo_ms) desc, request_id, request_key"
_SLOW_CAUSES: Final = """
    select cause, count(*) as requests,
        sum(coalesce(excess_ms, over_slo_ms)) as total_excess_ms,
        count(*) / sum(count(*)) over () as share
    from slow_f
    group by cause"""
_SLOW_CAUSES_ORDER: Final = "total_excess_ms desc nulls last, cause"


def slow_requests(reader: Reads, slo: Mapping[str, float] | None = None, *,
                  start: datetime | None = None, end: datetime | None = None,
                  replica: str | None = None, router: str | None = None,
                  policy: str | None = None, run: str | None = None,
                  cause: str | None = None, limit: int = TABLE_LIMIT) -> pl.DataFrame:
    """Slow requests (succeeded, missed a target), worst first.

    Columns: request_id, run_id, client_start, ttft_ms, tpot_ms, over_slo_ms (ms beyond the
    targets: TTFT excess + TPOT excess × (output tokens − 1)), cause (primary cause, or
    ``'unattributed'`` when the attribution relations are absent or silent), sub_kind, excess_ms
    (attributed), confidence, evidence, evidence_source, replica, router_id, policy,
    request_key (request ids may repeat; the key does not).
    """
    ctes, params = _slow_sql(reader, slo, start=start, end=end, replica=replica, router=router,
                             policy=policy, run=run, cause=cause)
    params.append(int(limit))
    return _query(reader, f"{ctes} {_SLOW_ROWS} order by {_SLOW_ROWS_ORDER} limit ?", params,
                  slo, run=run)


def slow_cause_breakdown(reader: Reads, slo: Mapping[str, float] | None = None, *,
                         start: datetime | None = None, end: datetime | None = None,
                         replica: str | None = None, router: str | None = None,
                         policy: str | None = None, run: str | None = None,
                         cause: str | None = None) -> pl.DataFrame:
    """Slow requests by primary cause. Columns: cause, requests, total_excess_ms (attributed
    excess; the over-SLO ms when unattributed), share (of slow requests)."""
    ctes, params = _slow_sql(reader, slo, start=start, end=end, replica=replica, router=router,
                             policy=policy, run=run, cause=cause)
    return _query(reader, f"{ctes} {_SLOW_CAUSES} order by {_SLOW_CAUSES_ORDER}", params, slo,
                  run=run)


class SlowPage(NamedTuple):
    """What the slow-request page shows, from one computation of the slow requests' causes."""

    requests: pl.DataFrame
    """As :func:`slow_requests`."""
    causes: pl.DataFrame
    """As :func:`slow_cause_breakdown`."""


def slow_page(reader: Reads, slo: Mapping[str, float] | None = None, *,
              start: datetime | None = None, end: datetime | None = None,
              replica: str | None = None, router: str | None = None,
              policy: str | None = None, run: str | None = None,
              cause: str | None = None, limit: int = TABLE_LIMIT) -> SlowPage:
    """:func:`slow_requests` and :func:`slow_cause_breakdown` in one query.

    At an SLO other than the defaults both are computed live over every slow request, most of
    their time; one query computes that once (``slow_f`` materialised) and returns the two
    results as lists of rows."""
    ctes, params = _slow_sql(reader, slo, start=start, end=end, replica=replica, router=router,
                             policy=policy, run=run, cause=cause, materialized=True)
    params.append(int(limit))
    both = _query(reader, ctes + f""",
        page_requests as ({_SLOW_ROWS} order by {_SLOW_ROWS_ORDER} limit ?),
        page_causes as ({_SLOW_CAUSES})
        select
            (select list(r order by {_SLOW_ROWS_ORDER}) from page_requests as r) as requests,
            (select list(c order by {_SLOW_CAUSES_ORDER}) from page_causes as c) as causes
        """, params, slo, run=run)
    return SlowPage(_rows_of(both, "requests"), _rows_of(both, "causes"))


def _rows_of(both: pl.DataFrame, column: str) -> pl.DataFrame:
    """The rows of one list-of-struct cell (none when the list is NULL: no rows)."""
    fields = both.schema[column].inner.fields  # type: ignore[attr-defined]
    value: pl.Series | None = both[column][0]  # a list cell is a Series of its structs
    if value is None or len(value) == 0:
        return pl.DataFrame(schema={f.name: f.dtype for f in fields})
    return value.struct.unnest()


# --------------------------------------------------------------------------------------------
# One request
# --------------------------------------------------------------------------------------------
def request_matches(reader: Reads, text: str, limit: int = 50, *,
                    prefer: str | None = None) -> pl.DataFrame:
    """Requests whose request id or request key is ``text``, latest first, the request key
    ``prefer`` (the one a link named) first of all, so ``limit`` never drops it: request ids
    repeat (capture runs, replays, clients reusing X-Request-Id), request keys do not. Columns:
    request_key, request_id, run_id, client_start, status, ttft_ms, matching (how many requests
    match in all, beyond ``limit`` too)."""
    return reader.query(
        "select request_key, request_id, run_id, client_start, status, ttft_ms, "
        "count(*) over () as matching from requests "
        "where request_id = ? or request_key = ? "
        "order by request_key is not distinct from ? desc, client_start desc nulls last, "
        "request_key limit ?",
        [text, text, prefer, int(limit)])


def request_detail(reader: Reads, request_key: str) -> pl.DataFrame:
    """The request's row in ``requests`` (0 or 1 row); ``request_key`` from
    :func:`request_matches` (the other request functions take it too)."""
    return reader.query("select * from requests where request_key = ?", [request_key])


def request_waterfall(reader: Reads, request_key: str) -> pl.DataFrame:
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
        [request_key, request_key, request_key],
    )


def request_spans(reader: Reads, request_key: str, limit: int = 200) -> pl.DataFrame:
    """Raw spans of the request: those the audit linked to it (every trace it crossed), else
    its trace. Times are on each emitter's own clock (raw, uncorrected). Columns: name,
    component, service, kind, start_at (emitter clock), duration_ms, status_code, trace_id,
    span_id, parent_span_id, attributes (every span attribute, JSON: ``raw_span_attributes``)."""
    if has_relation(reader, "int_spans_clock_corrected", "trace_id", "span_id", "request_key"):
        linked = ("select trace_id, span_id from int_spans_clock_corrected "
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
        [request_key, int(limit)],
    )


def request_decisions(reader: Reads, request_key: str) -> pl.DataFrame:
    """Routing attempts of the request (``decisions`` rows), by attempt."""
    return reader.query(
        "select * from decisions where request_key = ? order by attempt", [request_key]
    )


def request_candidates(reader: Reads, request_key: str) -> pl.DataFrame:
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
        [request_key],
    )


def request_attributions(reader: Reads, request_key: str,
                         slo: Mapping[str, float] | None = None) -> pl.DataFrame:
    """The attribution rows (verdict and evidence) of one request, primary first; empty frame
    when the attribution relations are not installed."""
    if not has_relation(reader, "attributions", *_ATTR_COLS):
        return pl.DataFrame()
    ids = reader.query("select request_id from requests where request_key = ?", [request_key])
    if ids.height == 0:  # no such request: nothing to compute (live, that would be all of them)
        return pl.DataFrame()
    # Computed live (a non-default SLO), only the requests of this id are computed.
    return _query(
        reader,
        "select * from attributions where request_key = ? "
        "order by is_primary desc, excess_ms desc nulls last",
        [request_key],
        slo,
        request=ids["request_id"][0],
    )


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------
_CACHE_BASE: Final = f"""
    with base as (
        select {_REPLICA} as replica, coalesce(policy, '(none)') as policy, request_id,
            client_start, predicted_cached_tokens as predicted, actual_cached_tokens as actual,
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
        {_width('client_start')}
        select
            {_bucket('base.client_start')} as bucket,
            any_value(width.bucket_s) as bucket_s,
            base.replica,
            sum(greatest(base.predicted - base.actual, 0))::bigint as missing_tokens,
            count(*) filter (where base.predicted > base.actual) as over_predicted
        from base cross join width
        where base.client_start is not null
        group by all order by bucket, replica
        """,
        [max(int(buckets), 1)],
    )


def cache_hit_rate_over_time(reader: Reads, buckets: int = 60) -> pl.DataFrame:
    """Engine-reported prefix-cache hit rate and KV usage per replica over time (from
    ``snapshots``). Columns: bucket, replica, prefix_cache_hit_rate, kv_usage (0..1)."""
    return reader.query(
        f"""
        with base as (select * from snapshots where ok and scraped_at is not null),
        {_width('scraped_at')}
        select
            {_bucket('base.scraped_at')} as bucket,
            base.replica,
            avg(coalesce(base.prefix_cache_hit_rate, base.cache_hit_rate))
                as prefix_cache_hit_rate,
            avg(base.kv_usage) as kv_usage
        from base cross join width
        group by all order by bucket, replica
        """,
        [max(int(buckets), 1)],
    )


# --------------------------------------------------------------------------------------------
# Telemetry
# --------------------------------------------------------------------------------------------
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
        {_width('decided_at')}
        select
            {_bucket('base.decided_at')} as bucket,
            base.router_id,
            quantile_cont(base.telemetry_age_ms::double, 0.5) as age_p50,
            quantile_cont(base.telemetry_age_ms::double, 0.99) as age_p99
        from base cross join width
        where base.decided_at is not null
        group by all order by bucket, router_id
        """,
        [max(int(buckets), 1)],
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


# --------------------------------------------------------------------------------------------
# The store itself
# --------------------------------------------------------------------------------------------
def relations_freshness(reader: Reads) -> pl.DataFrame:
    """How current the relations are, in one row: ``refreshed_at`` (their last rebuild),
    ``spans_in_relations`` (the ``raw_spans`` rows it read), ``spans_stored`` (the rows now)
    and ``spans_pending`` (stored and queryable in ``raw_spans``, not yet in the marts and the
    attribution relations). Under sustained ingest a large store's rebuild runs minutes behind
    (docs/architecture.md, "Freshness"). Nulls where the store cannot say: no rebuild yet, one
    by a version that did not count, or spans deleted since (retention). Reads no relation, so
    it never waits for a rebuild."""
    return reader.query(
        "select *, case when spans_stored >= spans_in_relations\n"
        "               then spans_stored - spans_in_relations end as spans_pending\n"
        "from (\n"
        "    select\n"
        "        to_timestamp(try_cast(max(value) filter (where key = 'refreshed_ns') as bigint)\n"
        "                     / 1e9) as refreshed_at,\n"
        "        try_cast(max(value) filter (where key = 'relations_spans') as bigint)\n"
        "            as spans_in_relations,\n"
        "        (select count(*) from raw_spans) as spans_stored\n"
        "    from routeaudit_meta\n"
        ") as meta"
    )


def describe_lag(fresh: pl.DataFrame, now: datetime | None = None) -> str | None:
    """One sentence when :func:`relations_freshness`'s row says spans are stored that the
    relations lack ("Relations rebuilt 3 min ago: 1,200 spans stored since then are not in them
    yet."); None when they are current or the store cannot say."""
    if fresh.height != 1:
        return None
    row = fresh.row(0, named=True)
    pending, at = row["spans_pending"], row["refreshed_at"]
    if not pending or pending <= 0 or at is None:
        return None
    age_s = max(0.0, ((now or datetime.now(UTC)) - at).total_seconds())
    age = (f"{age_s:.0f} s" if age_s < 90 else f"{age_s / 60:.0f} min" if age_s < 5400
           else f"{age_s / 3600:.1f} h")
    spans = f"{pending:,} span{'s' if pending != 1 else ''} stored since then"
    return f"Relations rebuilt {age} ago: {spans} {'are' if pending != 1 else 'is'} not in them yet."


# --------------------------------------------------------------------------------------------
# Policies (runs compared on the same trace)
# --------------------------------------------------------------------------------------------
def run_list(reader: Reads) -> pl.DataFrame:
    """Runs seen in ``requests``. Columns: run_id, policies (comma-separated), requests,
    first_at, last_at."""
    return reader.query(
        """
        select run_id, string_agg(distinct policy, ', ' order by policy) as policies,
            count(*) as requests, min(client_start) as first_at, max(client_start) as last_at
        from requests where run_id is not null
        group by run_id order by first_at, run_id
        """
    )


def compare_runs(reader: Reads, run_ids: Sequence[str],
                 slo: Mapping[str, float] | None = None) -> pl.DataFrame:
    """One row per run: requests, ok, failed, good, attainment, goodput_rps, window_s,
    ttft_p50/p90/p99, tpot_p50/p90/p99 (ms, successful requests only)."""
    ttft, tpot = _slo(slo)
    return reader.query(
        f"""
        with base as (select * from requests where list_contains(?, run_id)),
        final as (
            select run_id,
                count(*) as requests,
                count(*) filter (where {_OK}) as ok,
                count(*) filter (where not {_OK}) as failed,
                count(*) filter (where {_GOOD}) as good,
                good / count(*) as attainment,
                greatest(epoch(max(client_start)) - epoch(min(client_start)), 1e-3) as window_s,
                good / window_s as goodput_rps,
                quantile_cont(ttft_ms::double, 0.5) filter (where {_OK}) as ttft_p50,
                quantile_cont(ttft_ms::double, 0.9) filter (where {_OK}) as ttft_p90,
                quantile_cont(ttft_ms::double, 0.99) filter (where {_OK}) as ttft_p99,
                quantile_cont(tpot_ms::double, 0.5) filter (where {_OK}) as tpot_p50,
                quantile_cont(tpot_ms::double, 0.9) filter (where {_OK}) as tpot_p90,
                quantile_cont(tpot_ms::double, 0.99) filter (where {_OK}) as tpot_p99
            from base group by run_id
        )
        select * from final order by list_position(?, run_id)
        """,
        [list(run_ids), ttft, tpot, list(run_ids)],
    )


def run_failures(reader: Reads, run_ids: Sequence[str]) -> pl.DataFrame:
    """Failed requests per run and kind. Columns: run_id, kind, requests."""
    return reader.query(
        f"""
        select run_id, status || coalesce(' ' || http_status::varchar, '') as kind,
            count(*) as requests
        from requests where list_contains(?, run_id) and not {_OK}
        group by all order by run_id, requests desc
        """,
        [list(run_ids)],
    )


# --------------------------------------------------------------------------------------------
# SQL box
# --------------------------------------------------------------------------------------------
EXAMPLE_QUERIES: Final[Mapping[str, str]] = {
    "Every attribute of the slowest request's spans": (
        "select s.name, s.kind, v.attributes\nfrom raw_spans s\n"
        "join raw_span_attributes v using (trace_id, span_id)\n"
        "where s.a_request_id = (select request_id from requests\n"
        "    where ttft_ms is not null order by ttft_ms desc limit 1)\n"
        "order by s.start_ns"
    ),
    "Slowest requests by TTFT": (
        "select request_id, policy, chosen_replica, ttft_ms, tpot_ms, status\n"
        "from requests\nwhere ttft_ms is not null\norder by ttft_ms desc\nlimit 20"
    ),
    "TTFT percentiles per policy": (
        "select policy, count(*) as requests,\n"
        "    quantile_cont(ttft_ms::double, [0.5, 0.9, 0.99]) as ttft_p50_p90_p99_ms\n"
        "from requests\ngroup by policy\norder by policy"
    ),
    "Decisions per replica and reason": (
        "select chosen_replica, reason, count(*) as decisions\n"
        "from decisions\ngroup by all\norder by decisions desc"
    ),
    "Stale telemetry at decision time": (
        "select d.router_id, c.replica, c.telemetry_age_ms\nfrom candidates c\n"
        "join decisions d using (request_key, attempt)\n"
        "order by c.telemetry_age_ms desc nulls last\nlimit 50"
    ),
    "Relations and columns": (
        "select table_name, count(*) as columns\nfrom information_schema.columns\n"
        "group by table_name\norder by table_name"
    ),
}
"""Read-only example queries offered by the dashboard's SQL page."""


def run_sql(reader: Reads, sql: str, max_rows: int = 10_000) -> tuple[pl.DataFrame, bool]:
    """Run a user's read-only query; return (at most ``max_rows`` rows, whether truncated).

    The reader's read-only guard refuses writes, ATTACH, COPY, INSTALL and file access with
    :class:`audit._errors.ReadOnlyError` / ``QueryError``.
    """
    df = reader.query(sql)
    return df.head(max_rows), df.height > max_rows
