"""Live verdicts on ``/metrics``: what the relations say about the most recent requests.

After each background refresh of the relations, :meth:`VerdictMetrics.update` reads the
requests anchored in the last :data:`DEFAULT_WINDOW_S` seconds of event time (ending at the
newest request, not at the wall clock, so replayed or delayed traffic is judged the same way)
and keeps plain numbers; :meth:`VerdictMetrics.collect` turns the last numbers into
``routeaudit_verdicts_*`` families at scrape time. A scrape never queries the store.

The queries filter on ``part`` (the requests' time partition) before ``anchor_ns``, so they
read only the partitions the window touches, whatever the store's size.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import pyarrow as pa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from collectors.otlp._status import one_line

log = logging.getLogger("routeaudit.collector")

DEFAULT_WINDOW_S: Final = 300.0
"""Event-time seconds, ending at the newest request, that the window gauges cover."""

STATUSES: Final = ("ok", "error", "timeout", "cancelled", "rejected")
"""Request statuses the relations produce (docs/schema.md, ``requests.status``); any other is
counted as ``other`` so the label set stays bounded."""

CAUSES: Final = ("misrouting", "eviction", "stale_telemetry", "overload", "slow_replica",
                 "long_prompt", "client_network", "incomplete_trace", "unknown")
"""Primary causes the attribution produces (docs/attribution.md, "Cause rules"); always
exported, 0 when absent, so a share of them is defined as soon as one request is slow."""


UPDATE_MAX_SHARE: Final = 0.25
"""Longest share of the time spent updating: after an update of *d* seconds the next waits at
least *d* × (1 − share) / share, whatever refreshes happened meanwhile (the next one after the
pause, or a moved horizon, brings the numbers up to date)."""


class _Store(Protocol):
    """What the update reads from :class:`audit.Store`."""

    newest_request_ns: int | None
    final_until_ns: int | None

    def query_arrow(self, sql: str, params: Any = None) -> pa.Table: ...


@dataclass(frozen=True)
class VerdictSnapshot:
    """The numbers of one update (all over the window unless said otherwise)."""

    window_start_ns: int
    """Requests anchored after this (exclusive) and up to ``newest_request_ns`` count."""
    newest_request_ns: int
    newest_span_ns: int | None
    final_until_ns: int | None
    requests: dict[str, int] = field(default_factory=dict)
    """By status (every name of :data:`STATUSES`, plus ``other``)."""
    provisional_requests: int = 0
    slow_by_cause: dict[str, int] = field(default_factory=dict)
    slow_by_kind: dict[tuple[str, str], int] = field(default_factory=dict)
    excess_ms_by_cause: dict[str, float] = field(default_factory=dict)
    good_requests: int = 0
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None


_PARTITION_SQL = "select partition_ns from stg_partitioning"

_NEWEST_SPAN_SQL = "select max(start_ns) from raw_spans"

_REQUESTS_SQL = """
select
    status,
    count(*) as n,
    count(*) filter (where not verdict_final) as provisional
from requests
where part >= $1 and anchor_ns > $2 and anchor_ns <= $3
group by status
"""

_TTFT_SQL = """
select
    quantile_cont(ttft_ms, 0.5) as p50,
    quantile_cont(ttft_ms, 0.99) as p99
from requests
where part >= $1 and anchor_ns > $2 and anchor_ns <= $3
    and status = 'ok' and ttft_ms is not null
"""

# One row per request to explain (slow or timed out) is primary; an ok one among them is not
# good, so good = ok requests minus ok primaries (the definition of slo_summary.goodput).
_CAUSES_SQL = """
with windowed as (
    select request_key
    from requests
    where part >= $1 and anchor_ns > $2 and anchor_ns <= $3
)
select
    a.cause,
    coalesce(a.sub_kind, '') as sub_kind,
    count(*) as n,
    count(*) filter (where a.status = 'ok') as ok_n,
    sum(a.excess_ms) as excess_ms
from attributions as a
semi join windowed as w on a.request_key = w.request_key
where a.is_primary and a.part >= $1
group by all
"""


def read_snapshot(store: _Store, window_s: float = DEFAULT_WINDOW_S) -> VerdictSnapshot | None:
    """The window's numbers from the store's relations as last refreshed; None when the
    relations hold no request yet. Raises what the queries raise."""
    if store.newest_request_ns is None:
        return None
    # A query on the relations refreshes them first when rows arrived and the last refresh was
    # quick, so the window's bounds are read after this one.
    partition_ns = int(store.query_arrow(_PARTITION_SQL).column(0)[0].as_py())
    until, final_until = store.newest_request_ns, store.final_until_ns
    if until is None:
        return None
    since = until - int(window_s * 1e9)
    params = [since // partition_ns, since, until]
    requests = {s: 0 for s in (*STATUSES, "other")}
    provisional = 0
    for row in store.query_arrow(_REQUESTS_SQL, params).to_pylist():
        key = row["status"] if row["status"] in STATUSES else "other"
        requests[key] += int(row["n"])
        provisional += int(row["provisional"])
    ttft = store.query_arrow(_TTFT_SQL, params).to_pylist()[0]
    by_cause = dict.fromkeys(CAUSES, 0)
    excess = dict.fromkeys(CAUSES, 0.0)
    by_kind: dict[tuple[str, str], int] = {}
    ok_slow = 0
    for row in store.query_arrow(_CAUSES_SQL, params).to_pylist():
        cause = str(row["cause"])
        by_cause[cause] = by_cause.get(cause, 0) + int(row["n"])
        excess[cause] = excess.get(cause, 0.0) + float(row["excess_ms"] or 0.0)
        by_kind[(cause, str(row["sub_kind"]))] = int(row["n"])
        ok_slow += int(row["ok_n"])
    newest_span = store.query_arrow(_NEWEST_SPAN_SQL).column(0)[0].as_py()
    return VerdictSnapshot(
        window_start_ns=since, newest_request_ns=until,
        newest_span_ns=None if newest_span is None else int(newest_span),
        final_until_ns=final_until, requests=requests,
        provisional_requests=provisional, slow_by_cause=by_cause, slow_by_kind=by_kind,
        excess_ms_by_cause=excess, good_requests=requests["ok"] - ok_slow,
        ttft_p50_ms=ttft["p50"], ttft_p99_ms=ttft["p99"])


class VerdictMetrics(Collector):
    """``routeaudit_verdicts_*``: a prometheus_client collector over the last snapshot.

    :meth:`update` runs on the refresh thread; :meth:`collect` on the scraping thread. Neither
    raises: a failed update is counted (``routeaudit_verdicts_update_failures_total``), logged
    once until an update succeeds again, and the previous numbers stay exported.
    """

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._snapshot: VerdictSnapshot | None = None
        self._updates = 0
        self._failures = 0
        self._failing = False
        self._last_update_s: float | None = None
        self._last_duration_s = 0.0
        self._horizon: tuple[int | None, int | None] = (None, None)
        self._last_attempt = float("-inf")
        self._pending = False

    @property
    def snapshot(self) -> VerdictSnapshot | None:
        """The numbers exported now (None before the first update that found a request)."""
        with self._lock:
            return self._snapshot

    @property
    def failures(self) -> int:
        with self._lock:
            return self._failures

    def update_after_refresh(self, store: _Store, *, refreshed: bool) -> None:
        """Update when the background thread refreshed the relations, or when their horizon
        moved since the last update (a query refreshed them, or a collector started on a store
        whose relations were already built); within :data:`UPDATE_MAX_SHARE`, so a change seen
        during the pause is read once it ends (the refresh loop calls this at every check)."""
        horizon = (store.newest_request_ns, store.final_until_ns)
        self._pending = self._pending or refreshed or (
            horizon[0] is not None and horizon != self._horizon)
        if not self._pending:
            return
        # In a small store attributions is computed at query time (no cached table), so an
        # update can cost as much as the refresh beside it: pace them to a share of the time.
        since_last = time.monotonic() - self._last_attempt
        if since_last < self._last_duration_s * (1 - UPDATE_MAX_SHARE) / UPDATE_MAX_SHARE:
            return
        self.update(store)

    def update(self, store: _Store) -> None:
        """Read the window from ``store`` (own thread; never raises)."""
        started = time.perf_counter()
        self._last_attempt = time.monotonic()
        self._pending = False
        # a failed read waits for the next refresh rather than retrying on every check
        self._horizon = (store.newest_request_ns, store.final_until_ns)
        try:
            snap = read_snapshot(store, self.window_s)
            # the horizon this snapshot read: a query of it may have refreshed the relations
            # again, and then the next check sees the horizon moved
            if snap is not None:
                self._horizon = (snap.newest_request_ns, snap.final_until_ns)
        except Exception as exc:  # ingest must go on whatever the relations do
            with self._lock:
                self._last_duration_s = time.perf_counter() - started
                self._failures += 1
                first = not self._failing
                self._failing = True
            if first:
                log.warning("verdict metrics not updated (kept as they were; logged once until "
                            "they update again): %s", one_line(exc))
            return
        with self._lock:
            self._snapshot = snap
            self._updates += 1
            self._failing = False
            self._last_update_s = time.time()
            self._last_duration_s = time.perf_counter() - started

    def collect(self) -> Iterator[Any]:
        with self._lock:
            snap = self._snapshot
            updates, failures = self._updates, self._failures
            last_update_s, duration_s = self._last_update_s, self._last_duration_s
        yield CounterMetricFamily(
            "routeaudit_verdicts_updates", "Times the verdict metrics were read from the relations "
            "(after a background refresh)", value=updates)
        yield CounterMetricFamily(
            "routeaudit_verdicts_update_failures", "Verdict metric updates that failed (the "
            "previous values stay exported; ingest is unaffected)", value=failures)
        yield GaugeMetricFamily(
            "routeaudit_verdicts_window_seconds", "Event-time seconds the window gauges cover, "
            "ending at the newest request", value=self.window_s)
        if last_update_s is not None:
            yield GaugeMetricFamily(
                "routeaudit_verdicts_last_update_timestamp_seconds",
                "Wall-clock time of the last successful update", value=last_update_s)
            yield GaugeMetricFamily(
                "routeaudit_verdicts_update_duration_seconds",
                "Seconds the last update's queries took (failed or not)", value=duration_s)
        if snap is None:
            return
        yield from _families(snap)


def _families(snap: VerdictSnapshot) -> Iterator[Any]:
    requests = GaugeMetricFamily(
        "routeaudit_verdicts_requests", "Requests in the window, by status", labels=["status"])
    for status, n in snap.requests.items():
        requests.add_metric([status], n)
    yield requests
    yield GaugeMetricFamily(
        "routeaudit_verdicts_provisional_requests",
        "Requests in the window whose verdicts are still provisional (may change)",
        value=snap.provisional_requests)
    slow = GaugeMetricFamily(
        "routeaudit_verdicts_slow_requests", "Requests in the window that missed the SLO or timed "
        "out, by primary cause", labels=["cause"])
    for cause, n in snap.slow_by_cause.items():
        slow.add_metric([cause], n)
    yield slow
    kinds = GaugeMetricFamily(
        "routeaudit_verdicts_slow_requests_by_kind", "Requests in the window that missed the SLO "
        "or timed out, by primary cause and its sub-kind (empty when the cause has none); only "
        "pairs seen in the window", labels=["cause", "sub_kind"])
    for (cause, kind), n in sorted(snap.slow_by_kind.items()):
        kinds.add_metric([cause, kind], n)
    yield kinds
    excess = GaugeMetricFamily(
        "routeaudit_verdicts_excess_seconds", "Seconds the primary causes cost the window's slow "
        "requests, by cause", labels=["cause"])
    for cause, ms in snap.excess_ms_by_cause.items():
        excess.add_metric([cause], ms / 1000)
    yield excess
    total = sum(snap.requests.values())
    yield GaugeMetricFamily(
        "routeaudit_verdicts_good_requests", "Requests in the window that were ok and met both "
        "SLO targets", value=snap.good_requests)
    yield GaugeMetricFamily(
        "routeaudit_verdicts_goodput_ratio", "Good requests / all requests in the window "
        "(failures included); NaN when the window is empty",
        value=snap.good_requests / total if total else float("nan"))
    ttft = GaugeMetricFamily(
        "routeaudit_verdicts_ttft_seconds", "TTFT quantiles of the window's ok requests",
        labels=["quantile"])
    quantiles: tuple[tuple[str, float | None], ...] = (
        ("0.5", snap.ttft_p50_ms), ("0.99", snap.ttft_p99_ms))
    for q, q_ms in quantiles:
        ttft.add_metric([q], float("nan") if q_ms is None else q_ms / 1000)
    yield ttft
    yield GaugeMetricFamily(
        "routeaudit_verdicts_newest_request_timestamp_seconds",
        "Event time of the newest request in the relations", value=snap.newest_request_ns / 1e9)
    yield GaugeMetricFamily(
        "routeaudit_verdicts_relations_lag_seconds",
        "Newest span stored minus newest request in the relations (event time, >= 0): how "
        "far the relations run behind the raw spans",
        value=float("nan") if snap.newest_span_ns is None
        else max(0.0, (snap.newest_span_ns - snap.newest_request_ns) / 1e9))
    yield GaugeMetricFamily(
        "routeaudit_verdicts_final_until_timestamp_seconds",
        "Verdicts of requests anchored before this event time are final; NaN when none is yet",
        value=float("nan") if snap.final_until_ns is None else snap.final_until_ns / 1e9)
    yield GaugeMetricFamily(
        "routeaudit_verdicts_provisional_seconds",
        "Newest request minus final_until (event time): how much of the recent past is still "
        "provisional; NaN when nothing is final yet",
        value=_provisional_s(snap))


def _provisional_s(snap: VerdictSnapshot) -> float:
    if snap.final_until_ns is None:
        return float("nan")
    return max(0.0, (snap.newest_request_ns - snap.final_until_ns) / 1e9)
