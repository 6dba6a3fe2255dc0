"""The collector's own telemetry: Prometheus metrics on a private registry, and the counters
``GET /health`` reports. Thread-safe; every method may be called from any thread and never blocks
for long or raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from collectors.otlp import _decode

_COUNTERS = {
    "spans_received": "Spans in decodable export requests (accepted by the decoder)",
    "spans_rejected": "Spans rejected by the decoder (OTLP partial success)",
    "spans_committed": "Spans in committed groups (duplicates included)",
    "spans_new": "Spans newly stored (committed minus duplicates)",
    "spans_duplicate": "Spans already stored (retried exports), ignored on insert",
    "values_truncated": "Attribute strings truncated by the decoder",
    "candidate_texts_malformed": "Decision candidates attributes that are not a JSON array of objects "
                                 "(stored verbatim in a_decision_candidates, no candidate rows)",
    "prompt_values_dropped": "Prompt/completion attribute values dropped by the decoder (privacy; keep_prompts=False)",
    "snapshots_written": "raw_snapshots rows committed",
    "snapshots_dropped": "Scrape results dropped because the queue was full",
    "commits": "Group commits that succeeded",
    "commit_failures": "Group commits that failed (their exports answered 503 / UNAVAILABLE; spooled ones retried)",
    "background_refreshes": "Rebuilds of the relations by the background thread (paced by refresh_max_share)",
    "background_refresh_failures": "Background rebuilds that failed (retried after growing pauses)",
    "background_refresh_seconds": "Seconds spent in those rebuilds (its rate is the share of the time they take)",
    "background_refresh_pause_seconds": "Seconds the background refresher paused between its checks "
                                        "(the pacing that refresh_max_share and failures set)",
    "retention_runs": "Times the retention flags were applied (at most once a minute)",
    "retention_failures": "Retention runs that failed (retried a minute later)",
    "retention_spans_deleted": "Raw spans deleted by --retain-raw",
    "retention_requests_deleted": "Requests whose derived rows were deleted by --retain-verdicts",
    "spool_replayed_spans": "Spans replayed from the spool into the store at start "
                            "(acknowledged before a crash or stop)",
    "internal_errors": "Requests that hit a bug (answered 500 or treated as undecodable); should stay 0",
    "overload_refusals": "Requests refused (429 / RESOURCE_EXHAUSTED) because all requests together "
                         "held max_inflight_bytes of bodies",
    "connections_refused": "HTTP connections answered 503 and closed at once because max_connections were open",
    "header_timeouts": "HTTP connections closed because a request's headers did not arrive within header_timeout_s",
    "queries_cancelled": "Queries through /routeaudit/query stopped because their client went away",
    "log_lines_suppressed": "Repeated warnings left out of the log (at most one per log_repeat_interval_s)",
}


class _NativeDecoderCollector(Collector):
    """The native decoder's process-wide figures, read at scrape time."""

    def collect(self) -> Any:
        yield CounterMetricFamily(
            "routeaudit_decode_native_fallbacks",
            "Protobuf export bodies decoded on the Python path instead of the native decoder "
            "(content it leaves to Python, undecodable bodies, or the extension not built); process-wide",
            value=_decode.native_fallbacks())
        yield CounterMetricFamily(
            "routeaudit_decode_json_python_bodies",
            "OTLP/JSON export bodies parsed in Python (json.loads, then the protobuf constructors or "
            "ParseDict) instead of transcoded in C (shapes it leaves to Python, malformed text, or "
            "the extension not built); process-wide",
            value=_decode.json_python_bodies())
        yield GaugeMetricFamily(
            "routeaudit_decode_native_available", "1 when the native OTLP decoder is built and loaded",
            value=1 if _decode.NATIVE_AVAILABLE else 0)


class Metrics:
    """Counters, gauges and the write-latency histogram of one collector."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._values: dict[str, float] = {name: 0 for name in _COUNTERS}
        self._prom = {
            name: Counter(f"routeaudit_collector_{name}", doc, registry=self.registry)
            for name, doc in _COUNTERS.items()
        }
        self._requests = Counter(
            "routeaudit_collector_requests", "Requests answered, by transport and status",
            ["transport", "status"], registry=self.registry,
        )
        self._request_counts: dict[str, int] = {}
        self._write_seconds = Histogram(
            "routeaudit_collector_write_seconds", "Duration of one group commit (Store.append)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self._group_batches = Histogram(
            "routeaudit_collector_group_batches", "Export batches merged into one commit",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=self.registry,
        )
        self.registry.register(_NativeDecoderCollector())
        self._queue_depth = Gauge(
            "routeaudit_collector_queue_spans", "Spans (and snapshot rows) waiting for the writer",
            registry=self.registry,
        )
        self._relations_lag = Gauge(
            "routeaudit_collector_relations_lag_spans",
            "Spans stored but not yet in the relations (marts, attributions), which are rebuilt "
            "in the background; NaN when the store cannot tell",
            registry=self.registry,
        )
        self._inflight_bytes = Gauge(
            "routeaudit_collector_inflight_bytes",
            "Request body bytes held right now while read, decompressed and decoded (max_inflight_bytes bounds it)",
            registry=self.registry,
        )
        self._http_connections = Gauge(
            "routeaudit_collector_http_connections", "Open OTLP/HTTP connections (max_connections bounds it)",
            registry=self.registry,
        )
        self.last_write_s: float | None = None
        self.last_refresh_s: float | None = None
        self.last_commit_ns: int | None = None
        self.started_monotonic = time.monotonic()

    def inc(self, name: str, amount: float = 1) -> None:
        if amount <= 0:
            return
        with self._lock:
            self._values[name] += amount
        self._prom[name].inc(amount)

    def value(self, name: str) -> float:
        with self._lock:
            return self._values[name]

    def request(self, transport: str, status: str | int) -> None:
        key = f"{transport}:{status}"
        with self._lock:
            self._request_counts[key] = self._request_counts.get(key, 0) + 1
        self._requests.labels(transport=transport, status=str(status)).inc()

    def commit(self, seconds: float, batches: int) -> None:
        self._write_seconds.observe(seconds)
        self._group_batches.observe(batches)
        with self._lock:
            self.last_write_s = seconds
            self.last_commit_ns = time.time_ns()

    def bind_queue_depth(self, fn: Callable[[], float]) -> None:
        self._queue_depth.set_function(fn)

    def bind_relations_lag(self, fn: Callable[[], float]) -> None:
        self._relations_lag.set_function(fn)

    def bind_limits(self, inflight_bytes: Callable[[], float], http_connections: Callable[[], float]) -> None:
        self._inflight_bytes.set_function(inflight_bytes)
        self._http_connections.set_function(http_connections)

    def snapshot(self) -> dict[str, Any]:
        """Plain numbers for ``/health``."""
        with self._lock:
            out: dict[str, Any] = {k: int(v) for k, v in self._values.items()}
            out["requests"] = dict(sorted(self._request_counts.items()))
            return out

    def exposition(self) -> bytes:
        """Prometheus text format of the private registry."""
        return generate_latest(self.registry)
