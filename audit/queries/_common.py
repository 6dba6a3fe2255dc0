"""What every page's queries share: running a query at an SLO, the judged requests, what
relations exist, the time window, time buckets, the store's freshness and range."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import duckdb
import polars as pl

from audit import _closed, _relations
from audit._errors import QueryCancelled, QueryError, QueryTimeout
from audit._reads import Reads
from audit._slo import SLO

SCOPE_RUN_VARIABLE, SCOPE_REQUEST_VARIABLE = _relations.SCOPE_VARIABLES
"""Session variables limiting the live attribution views to one run / one request."""

TABLE_LIMIT: Final = 500
"""Default row cap on tables shown to a person."""

JUDGED: Final = "int_attr_requests_judged"
"""The relation that judges each request against the SLO: ``is_ok``, ``is_good``, ``is_slow``,
``total_excess_ms`` (ms over the targets) beside the ``requests`` columns. Every count of good
or slow requests reads it, so the rule is the attribution layer's (docs/attribution.md, "SLO
and goodput")."""

REPLICA: Final = "coalesce(served_by, chosen_replica)"
"""The replica a request ran on, else the one its router chose."""

REQUEST_AT: Final = "first_seen_at"
"""When a request started: the earliest start of any of its sides on the reference clock (the
client's when it is instrumented, else the router's or the replica's), so that every page works
on the server-side spans alone."""

FINAL_COLUMNS: Final = ("is_final", "verdict_final")
"""Names the ``requests`` column saying a request's verdict is final (its partition closed,
docs/architecture.md, "The watermark: provisional and final") may have, in order of
preference; a store without one has no provisional/final split."""

ATTR_COLUMNS: Final = ("request_key", "request_id", "run_id", "cause", "excess_ms", "is_primary")
"""Columns of ``attributions`` the queries read."""

OUTCOMES: Final = f"""
    count(*) as requests,
    count(*) filter (where is_ok) as ok,
    count(*) filter (where not is_ok) as failed,
    count(*) filter (where is_slow) as slow,
    count(*) filter (where is_good) as good,
    good / nullif(requests, 0) as attainment,
    min({REQUEST_AT}) as first_at,
    max({REQUEST_AT}) as last_at,
    greatest(epoch(max({REQUEST_AT})) - epoch(min({REQUEST_AT})), 1e-3) as window_s,
    good / window_s as goodput_rps,
    quantile_cont(ttft_ms::double, 0.5) filter (where is_ok) as ttft_p50,
    quantile_cont(ttft_ms::double, 0.9) filter (where is_ok) as ttft_p90,
    quantile_cont(ttft_ms::double, 0.99) filter (where is_ok) as ttft_p99,
    quantile_cont(tpot_ms::double, 0.5) filter (where is_ok) as tpot_p50,
    quantile_cont(tpot_ms::double, 0.9) filter (where is_ok) as tpot_p90,
    quantile_cont(tpot_ms::double, 0.99) filter (where is_ok) as tpot_p99"""
"""Aggregates over judged requests: requests, ok, failed, slow, good, attainment (good /
requests), first_at, last_at, window_s (first to last start, at least 1 ms), goodput_rps (good
per second of the window), ttft/tpot p50/p90/p99 (ms, successful requests only)."""


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """The requests a page shows: those whose start (:data:`REQUEST_AT`) lies in
    ``[start, end]``, both ends included; a bound that is None is open. ``TimeWindow()`` is the
    whole store.

    Times are timestamps on the reference clock; a naive datetime is read as UTC. The query
    functions turn a window into a predicate on ``requests.first_seen_at`` (bound values), so
    DuckDB skips the row groups outside it and a page's cost follows the window."""

    start: datetime | None = None
    end: datetime | None = None

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                object.__setattr__(self, name, value.replace(tzinfo=UTC))
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError(f"time window starts after it ends: {self.start} > {self.end}")

    @classmethod
    def ending_at(cls, newest: datetime, span: timedelta) -> TimeWindow:
        """The ``span`` before ``newest``, ``newest`` included: the dashboard's default is the
        hour ending at the newest request stored (not the wall clock: a store may be days
        old)."""
        return cls(newest - span, newest)

    @property
    def is_all(self) -> bool:
        """No bound: every request."""
        return self.start is None and self.end is None

    def contains(self, at: datetime) -> bool:
        """Whether a request started at ``at`` is in the window."""
        at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        return (self.start is None or at >= self.start) and (self.end is None or at <= self.end)


def in_window(window: TimeWindow | None, column: str = REQUEST_AT) -> tuple[str, list[Any]]:
    """A SQL predicate keeping the rows of ``window`` on ``column`` (a constant of this
    package, never user input) and its parameters, in order; ``("true", [])`` for the whole
    store. Only the bounds that are set are written, so the predicate stays a plain range
    DuckDB can push into the scan."""
    if window is None:
        return "true", []
    parts: list[str] = []
    params: list[Any] = []
    if window.start is not None:
        parts.append(f"{column} >= ?")
        params.append(window.start)
    if window.end is not None:
        parts.append(f"{column} <= ?")
        params.append(window.end)
    return (" and ".join(parts) or "true"), params


def window_variables(window: TimeWindow | None) -> dict[str, float | str] | None:
    """The session variables that let the views over closed partitions skip the partitions no
    row of ``window``'s requests comes from (``routeaudit_window_from_ns`` and
    ``routeaudit_window_to_ns``: the window's bounds; docs/architecture.md, "Closed
    partitions"); None for the whole store. Pass them with every query that keeps only the
    window's rows."""
    if window is None:
        return None
    ends = ((_closed.WINDOW_FROM_VARIABLE, window.start), (_closed.WINDOW_TO_VARIABLE, window.end))
    bounds: dict[str, float | str] = {name: _unix_ns(at) for name, at in ends if at is not None}
    return bounds or None


def request_variables(at: datetime | None) -> dict[str, float | str] | None:
    """The window variables (:func:`window_variables`) of one request that started at ``at``
    (its :data:`REQUEST_AT`): its rows, and what they read, lie in the partitions near it.
    None (``at`` unknown): every partition is read."""
    return None if at is None else window_variables(TimeWindow(at, at))


def _unix_ns(at: datetime) -> int:
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


def overlaps_window(window: TimeWindow | None, start: str, end: str) -> tuple[str, list[Any]]:
    """Like :func:`in_window` for rows that last from column ``start`` to column ``end``
    (an execution on a replica): those that overlap the window."""
    if window is None:
        return "true", []
    parts: list[str] = []
    params: list[Any] = []
    if window.end is not None:
        parts.append(f"{start} <= ?")
        params.append(window.end)
    if window.start is not None:
        parts.append(f"{end} >= ?")
        params.append(window.start)
    return (" and ".join(parts) or "true"), params


def store_range(reader: Reads) -> pl.DataFrame:
    """Which requests the store holds, in one row: ``requests`` (count), ``first_at`` and
    ``last_at`` (the oldest and newest :data:`REQUEST_AT`; null in an empty store).

    A store with closed partitions answers from its per-partition summary
    (``routeaudit_requests_range``; docs/architecture.md, "Closed partitions"), so the answer
    costs the same at any size; other stores, and readers without that view, count
    ``requests``."""
    try:
        return reader.query(f"select requests, first_at, last_at from {_closed.RANGE_VIEW}")
    except (QueryTimeout, QueryCancelled):
        raise
    except (QueryError, duckdb.Error):
        pass  # no summary where this reader reads: the same answer from the rows
    return reader.query(
        f"select count(*) as requests, min({REQUEST_AT}) as first_at, "
        f"max({REQUEST_AT}) as last_at from requests"
    )


def window_counts(reader: Reads, window: TimeWindow | None = None) -> pl.DataFrame:
    """The requests of ``window``, in one row: ``requests``, ``first_at``, ``last_at``, and
    ``final`` / ``provisional`` (how many have a final verdict and how many may still change)
    when ``requests`` has a finality column (:data:`FINAL_COLUMNS`), else null."""
    columns = relation_columns(reader).get("requests", [])
    final = next((c for c in FINAL_COLUMNS if c in columns), None)
    split = (f"count(*) filter (where {final}) as final, "
             f"count(*) filter (where not coalesce({final}, false)) as provisional"
             if final is not None else
             "cast(null as bigint) as final, cast(null as bigint) as provisional")
    where, params = in_window(window)
    return reader.query(
        f"select count(*) as requests, min({REQUEST_AT}) as first_at, "
        f"max({REQUEST_AT}) as last_at, {split} from requests where {where}",
        params, variables=window_variables(window),
    )


def query_at(reader: Reads, sql: str, params: Sequence[Any] | None = None, slo: SLO | None = None,
        *, run: str | None = None, request: str | None = None,
        window: TimeWindow | None = None) -> pl.DataFrame:
    """One query at ``slo`` (None: the reader's own), so that the good/slow split and the causes
    shown follow the same targets.

    ``run`` / ``request``: the query reads only that run's / that request's rows, so the live
    attribution computation (the one at a non-default SLO) may be limited to them
    (``routeaudit_scope_run`` / ``routeaudit_scope_request``; docs/attribution.md): the same
    rows, in a fraction of the time on a large store. ``window``: the query keeps only that
    window's rows (:func:`window_variables`)."""
    scope: dict[str, float | str] = {
        name: value for name, value in ((SCOPE_RUN_VARIABLE, run),
                                        (SCOPE_REQUEST_VARIABLE, request)) if value is not None}
    scope.update(window_variables(window) or {})
    return reader.query(sql, params, slo=slo, variables=scope or None)


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


def width(column: str) -> str:
    """CTE ``width``: start ``t0`` and bucket length ``bucket_s`` (s) that split the ``base``
    rows' ``column`` window into as many buckets as the one bound parameter says."""
    return (f"width as (select min({column}) as t0, greatest(1, ceil((epoch(max({column}))"
            f" - epoch(min({column}))) / ?)) as bucket_s from base)")


def bucket(column: str) -> str:
    """Start of the time bucket ``column`` falls in (needs the ``width`` CTE)."""
    return (f"to_timestamp(epoch(width.t0) + floor((epoch({column}) - epoch(width.t0))"
            f" / width.bucket_s) * width.bucket_s)")


def buckets_param(buckets: int) -> int:
    """The bucket count bound to :func:`width`: at least one."""
    return max(int(buckets), 1)


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
