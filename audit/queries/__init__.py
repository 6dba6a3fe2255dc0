"""The query layer behind the dashboard (and notebooks): named questions over the marts, one
module per dashboard page.

Every function takes a reader (:class:`audit.Reads`: :class:`audit.Reader`, or anything with its
``query``) plus plain values (an :class:`audit.SLO`, filters, a request id) and returns a
polars DataFrame. Aggregation and time bucketing happen in DuckDB, tables carry a ``LIMIT``, so
a page never pulls a whole relation into Python.

Contracts:

* SQL text is fixed; values are bound as parameters. The only text chosen at run time is picked
  from constants in this package (which filter columns apply, whether the attribution relations
  are joined), never built from user input.
* Relations that do not exist yet (the attribution layer is optional, marts may lag) are detected
  with :func:`relation_columns`; functions that need them return an empty frame with the documented
  columns instead of raising. Other failures raise :class:`audit.AuditError` subclasses
  (:class:`audit.QueryError`, :class:`audit.ReadOnlyError`, :class:`audit.StoreError`) with a
  one-line message.
* Durations are milliseconds, times ``timestamptz`` on the reference clock (see docs/schema.md).
* Every function behind a page that lists or aggregates requests takes ``window``, a
  :class:`TimeWindow` (None: the whole store). It keeps the requests whose start
  (``first_seen_at``) lies in it, as a bound range predicate DuckDB pushes into the scan, so a
  page's cost follows the window, not the store; rows of other relations follow their
  request, or for charts over time (load, scrapes, decisions, herding episodes) their own
  instant. :func:`store_range` says which range the store covers, :func:`window_counts` how
  many requests a window holds (final and provisional, when the store says).
* "Good", "slow" and "failed" are the SLO judgement of the attribution relations
  (``int_attr_requests_judged``; docs/attribution.md, "SLO and goodput") at the ``slo`` passed
  in (None: the reader's own): a request is *good* when it succeeded (``status = 'ok'``, or no
  status recorded) and met both targets; *slow* when it succeeded and missed one. Failures are
  counted separately, never as slow.
"""

from audit.queries._cache import (
    cache_by_replica,
    cache_confusion,
    cache_hit_rate_over_time,
    cache_misses_over_time,
    cache_scatter,
)
from audit.queries._common import (
    TABLE_LIMIT,
    TimeWindow,
    describe_lag,
    has_relation,
    relation_columns,
    relations_freshness,
    store_range,
    window_counts,
)
from audit.queries._overview import failures_by_kind, overview_totals, replica_load_over_time, requests_over_time
from audit.queries._policies import run_failures, run_list, run_summaries
from audit.queries._request import (
    request_attributions,
    request_candidates,
    request_decisions,
    request_detail,
    request_matches,
    request_spans,
    request_waterfall,
)
from audit.queries._slow import SlowPage, filter_options, slow_cause_breakdown, slow_page, slow_requests
from audit.queries._sql import EXAMPLE_QUERIES, run_sql
from audit.queries._telemetry import herding_episodes, telemetry_age_by_router, telemetry_age_over_time

__all__ = [
    "TABLE_LIMIT",
    "relation_columns",
    "has_relation",
    "relations_freshness",
    "describe_lag",
    # time window
    "TimeWindow",
    "store_range",
    "window_counts",
    # overview
    "overview_totals",
    "requests_over_time",
    "replica_load_over_time",
    "failures_by_kind",
    # slow requests
    "filter_options",
    "slow_requests",
    "slow_cause_breakdown",
    "slow_page",
    "SlowPage",
    # one request
    "request_matches",
    "request_detail",
    "request_waterfall",
    "request_spans",
    "request_decisions",
    "request_candidates",
    "request_attributions",
    # cache
    "cache_by_replica",
    "cache_scatter",
    "cache_confusion",
    "cache_misses_over_time",
    "cache_hit_rate_over_time",
    # telemetry
    "telemetry_age_by_router",
    "telemetry_age_over_time",
    "herding_episodes",
    # policies
    "run_list",
    "run_summaries",
    "run_failures",
    # SQL
    "EXAMPLE_QUERIES",
    "run_sql",
]
