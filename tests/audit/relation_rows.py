"""Helpers for the SQL relation tests: hand-built raw rows and stores built from captures.

Rows are built the way the decoder builds them: every attribute kept in the JSON column, typed
columns filled with the decoder's own coercion (``collectors.otlp._decode._coerce``), so the
relations see exactly what a collector would store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

import semconv
from audit._store import Store
from audit.schema import RAW_SPAN_EVENTS_SCHEMA, RAW_SPANS_SCHEMA
from collectors.otlp._decode import _coerce, decode, parse_protobuf

T0 = 1_800_000_000 * 10**9
"""An arbitrary epoch instant (2027-01-15) for hand-built spans."""

MS = 1_000_000


@dataclass
class RawRows:
    """Collects hand-built raw_spans / raw_span_events rows."""

    spans: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def span(
        self,
        trace_id: str,
        span_id: str,
        parent_span_id: str | None,
        name: str,
        *,
        kind: str = "internal",
        start_ns: int,
        end_ns: int,
        attrs: dict[str, Any] | None = None,
        resource: dict[str, Any] | None = None,
        status_code: str = "unset",
        scope_name: str | None = None,
        events: Iterable[tuple[str, int, dict[str, Any]]] = (),
    ) -> None:
        attrs = dict(attrs or {})
        resource = dict(resource or {})
        events = list(events)
        row: dict[str, Any] = {f.name: None for f in RAW_SPANS_SCHEMA}
        row.update(
            trace_id=trace_id.rjust(32, "0"),
            span_id=span_id.rjust(16, "0"),
            parent_span_id=parent_span_id.rjust(16, "0") if parent_span_id else None,
            name=name,
            kind=kind,
            start_ns=start_ns,
            end_ns=end_ns,
            status_code=status_code,
            scope_name=scope_name,
            received_ns=time.time_ns(),
            attributes=json.dumps(attrs),
            resource_attributes=json.dumps(resource),
            event_count=len(events),
            flags=0,
            dropped_attributes_count=0,
        )
        for key, (col, typ) in semconv.TYPED_SPAN_ATTRIBUTES.items():
            row[col] = _coerce(attrs.get(key), typ)
        for key, (col, typ) in semconv.TYPED_RESOURCE_ATTRIBUTES.items():
            row[col] = _coerce(resource.get(key), typ)
        self.spans.append(row)
        for index, (ev_name, ev_ns, ev_attrs) in enumerate(events):
            ev: dict[str, Any] = {f.name: None for f in RAW_SPAN_EVENTS_SCHEMA}
            ev.update(
                trace_id=row["trace_id"],
                span_id=row["span_id"],
                event_index=index,
                name=ev_name,
                time_ns=ev_ns,
                attributes=json.dumps(ev_attrs),
            )
            for key, (col, typ) in semconv.TYPED_EVENT_ATTRIBUTES.items():
                ev[col] = _coerce(ev_attrs.get(key), typ)
            self.events.append(ev)

    def tables(self) -> tuple[pa.Table, pa.Table]:
        return (
            pa.Table.from_pylist(self.spans, schema=RAW_SPANS_SCHEMA),
            pa.Table.from_pylist(self.events, schema=RAW_SPAN_EVENTS_SCHEMA),
        )


def query(store: Store, sql: str, params: list[Any] | None = None) -> pl.DataFrame:
    return pl.from_arrow(store.query_arrow(sql, params))  # type: ignore[return-value]


def one_request(
    rows: RawRows,
    *,
    n: int = 1,
    router_skew_ns: int = 0,
    replica_skew_ns: int = 0,
    base_ns: int = T0,
    client_status: str = "ok",
    decision_outcome: str = "routed",
) -> None:
    """client -> decision (+2 candidate events) -> forward -> replica, one trace.

    Client: ttft 200 ms, e2e 1000 ms, 11 output tokens. Router on ``router-host`` (clock
    ``router_skew_ns`` ahead), replica on ``replica-host``. Request id ``req-<n>``.
    """
    t = f"{n:x}a"
    b = base_ns
    r = b + router_skew_ns
    p = b + replica_skew_ns
    rid = f"req-{n}"
    rows.span(
        t, f"{n:x}c", None, semconv.SPAN_CLIENT, kind="client",
        start_ns=b, end_ns=b + 1000 * MS,
        attrs={
            semconv.COMPONENT: "client", semconv.REQUEST_ID: rid,
            semconv.REQUEST_MODEL: "tiny", semconv.REQUEST_MAX_TOKENS: 64,
            semconv.REQUEST_INPUT_TOKENS: 100, semconv.REQUEST_STREAM: True,
            semconv.REQUEST_ENDPOINT: "/v1/chat/completions",
            semconv.HTTP_METHOD: "POST", semconv.HTTP_STATUS: 200,
            semconv.STATUS: client_status, semconv.CLIENT_TTFT_MS: 200.0,
            semconv.CLIENT_E2E_MS: 1000.0, semconv.USAGE_OUTPUT_TOKENS: 11,
            semconv.CLIENT_CACHED_TOKENS: 64,
            semconv.RESPONSE_FINISH_REASONS: ["stop"],
        },
        resource={semconv.HOST_NAME: "client-host", semconv.RUN_ID: "run-1"},
    )
    if decision_outcome == "rejected":
        rows.span(
            t, f"{n:x}d", f"{n:x}c", semconv.SPAN_DECISION,
            start_ns=r + 5 * MS, end_ns=r + 6 * MS,
            attrs={
                semconv.COMPONENT: "router", semconv.REQUEST_ID: rid,
                semconv.ATTEMPT: 0, semconv.ROUTER_POLICY: "qp_cost",
                semconv.DECISION_OUTCOME: "rejected",
                semconv.DECISION_REASON: "no_eligible_replica",
            },
            resource={semconv.HOST_NAME: "router-host", semconv.ROUTER_ID: "r1"},
        )
        return
    rows.span(
        t, f"{n:x}d", f"{n:x}c", semconv.SPAN_DECISION,
        start_ns=r + 5 * MS, end_ns=r + 7 * MS,
        attrs={
            semconv.COMPONENT: "router", semconv.REQUEST_ID: rid, semconv.ATTEMPT: 0,
            semconv.ROUTER_POLICY: "qp_cost",
            semconv.DECISION_CHOSEN: "http://LOCALHOST:18001/v1/chat/completions",
            semconv.DECISION_REASON: "cache_affinity",
            semconv.DECISION_OUTCOME: decision_outcome,
            semconv.DECISION_CANDIDATE_COUNT: 2,
            semconv.DECISION_TIME: r + 6 * MS,
        },
        resource={semconv.HOST_NAME: "router-host", semconv.ROUTER_ID: "r1"},
        events=[
            (semconv.EVENT_CANDIDATE, r + 6 * MS, {
                semconv.CANDIDATE_REPLICA: "localhost:18001",
                semconv.CANDIDATE_ELIGIBLE: True, semconv.CANDIDATE_CHOSEN: True,
                semconv.CANDIDATE_WAITING: 1, semconv.CANDIDATE_RUNNING: 2,
                semconv.CANDIDATE_KV_USAGE: 0.5,
                semconv.CANDIDATE_TELEMETRY_TS: r + 6 * MS - 250 * MS,
                semconv.CANDIDATE_PENDING: 1,
                semconv.CANDIDATE_PREDICTED_CACHED_TOKENS: 64,
                semconv.CANDIDATE_EST_QUEUE_MS: 10.0,
                semconv.CANDIDATE_EST_PREFILL_MS: 20.0, semconv.CANDIDATE_SCORE: 30.0,
            }),
            (semconv.EVENT_CANDIDATE, r + 6 * MS, {
                semconv.CANDIDATE_REPLICA: "http://127.0.0.1:18002",
                semconv.CANDIDATE_ELIGIBLE: True, semconv.CANDIDATE_CHOSEN: False,
                semconv.CANDIDATE_WAITING: 4,
                semconv.CANDIDATE_TELEMETRY_AGE_MS: 100.0,
                semconv.CANDIDATE_PREDICTED_CACHED_TOKENS: 0,
                semconv.CANDIDATE_SCORE: 170.0,
            }),
        ],
    )
    rows.span(
        t, f"{n:x}f", f"{n:x}d", semconv.SPAN_FORWARD, kind="client",
        start_ns=r + 7 * MS, end_ns=r + 995 * MS,
        attrs={
            semconv.COMPONENT: "router",
            semconv.URL_FULL: "http://127.0.0.1:18001/v1/chat/completions",
            semconv.HTTP_STATUS: "200",
        },
        resource={semconv.HOST_NAME: "router-host", semconv.ROUTER_ID: "r1"},
    )
    rows.span(
        t, f"{n:x}e", f"{n:x}f", semconv.SPAN_VLLM_REQUEST, kind="server",
        start_ns=p + 10 * MS, end_ns=p + 990 * MS,
        attrs={
            semconv.GEN_AI_REQUEST_ID: f"chatcmpl-{rid}",
            semconv.USAGE_PROMPT_TOKENS: 100, semconv.USAGE_COMPLETION_TOKENS: 11,
            semconv.USAGE_CACHE_READ_INPUT_TOKENS: 64,
            semconv.LATENCY_TTFT_S: 0.15, semconv.LATENCY_E2E_S: 0.98,
            semconv.LATENCY_QUEUE_S: 0.01, semconv.LATENCY_PREFILL_S: 0.05,
            semconv.LATENCY_DECODE_S: 0.8, semconv.REPLICA_ID: "127.0.0.1:18001",
            semconv.RESPONSE_FINISH_REASONS: ["stop"],
        },
        resource={semconv.HOST_NAME: "replica-host"},
    )


CAPTURE_RUNS = {
    "smg_round_robin": ("smg-0.3.2_round_robin_fake-workers",
                        ["smg-0.3.2_round_robin_fake-workers.pb",
                         "smg-0.3.2_round_robin_fake-workers_health.pb"]),
    "smg_cache_aware": ("smg-0.3.2_cache_aware_fake-workers",
                        ["smg-0.3.2_cache_aware_fake-workers.pb"]),
    "vllmr_round_robin": ("vllm-router-0.1.17_round_robin_fake-workers",
                          ["vllm-router-0.1.17_round_robin_fake-workers.pb"]),
    "vllmr_power_of_two": ("vllm-router-0.1.17_power_of_two_fake-workers",
                           ["vllm-router-0.1.17_power_of_two_fake-workers.pb"]),
}


def store_from_pb(path: Path, files: Iterable[Path]) -> Store:
    store = Store(path)
    for f in files:
        batch = decode(parse_protobuf(f.read_bytes()), time.time_ns())
        assert not batch.rejected, batch.rejected
        store.append(spans=batch.spans, events=batch.events)
    return store




REPLICA_NAMES = {
    "1": ("http://LOCALHOST:18001/v1/chat/completions", None, "127.0.0.1:18001"),
    "2": ("127.0.0.1:18001", None, "127.0.0.1:18001"),
    "3": ("localhost:18001", 0, "127.0.0.1:18001"),
    "4": ("http://127.0.0.1:18001", 2, "127.0.0.1:18001#2"),
    "5": ("engine-uuid-7", None, "engine-uuid-7"),
    "6": ("https://Replica-A.example:8443/x?y=1", None, "replica-a.example:8443"),
}
"""span id -> (replica id as emitted, DP rank, expected normalised id); trace ``77``."""

STATUS_CASES = {
    21: ("cancelled", "routed", "cancelled"),
    22: ("timeout", "routed", "timeout"),
    23: ("rejected", "rejected", "rejected"),
    24: ("error", "routed", "error"),
}
"""request number -> (client status, decision outcome, expected requests.status)."""


def scenario_rows() -> RawRows:
    """Several independent scenarios in one store (clocks agree; ids and traces distinct).

    * ``req-1``..``req-3``: client -> decision -> forward -> replica, one trace each;
    * ``req-21``..``req-24``: statuses (see STATUS_CASES);
    * ``client-req-7``: SMG-like router starting its own trace, linked by request id;
    * ``r-9``: client + replica whose router span never arrived;
    * ``x``: a lone rejected decision;
    * trace ``77``: replica spans naming one replica in several ways (REPLICA_NAMES).
    """
    rows = RawRows()
    for n in range(1, 4):
        one_request(rows, n=n, base_ns=T0 + n * 2000 * MS)
    for n, (client_status, outcome, _) in STATUS_CASES.items():
        one_request(rows, n=n, base_ns=T0 + n * 2000 * MS, client_status=client_status,
                    decision_outcome=outcome)
    b = T0 + 100_000 * MS
    rows.span(
        "c1", "c1", None, semconv.SPAN_CLIENT, kind="client", start_ns=b, end_ns=b + 50 * MS,
        attrs={semconv.COMPONENT: "client", semconv.REQUEST_ID: "client-req-7",
               semconv.HTTP_METHOD: "POST", semconv.REQUEST_ENDPOINT: "/v1/completions",
               semconv.CLIENT_TTFT_MS: 20.0, semconv.CLIENT_E2E_MS: 50.0,
               semconv.USAGE_OUTPUT_TOKENS: 1},
        resource={semconv.HOST_NAME: "client-host"},
    )
    rows.span(
        "5a", "5a", None, "http_request", start_ns=b + 2 * MS, end_ns=b + 48 * MS,
        scope_name="smg",
        attrs={"method": "POST", "uri": "/v1/completions", "request_id": "client-req-7",
               "status_code": "200", "latency": "46000"},
        resource={semconv.SERVICE_NAME: "smg"},
        events=[(semconv.EVENT_SMG_SENDING, b + 3 * MS, {"url": "http://localhost:18002"})],
    )
    rows.span(
        "5a", "5e", "5a", semconv.SPAN_VLLM_REQUEST, kind="server",
        start_ns=b + 4 * MS, end_ns=b + 46 * MS,
        attrs={semconv.GEN_AI_REQUEST_ID: "cmpl-client-req-7-0",
               semconv.USAGE_PROMPT_TOKENS: 5, semconv.USAGE_COMPLETION_TOKENS: 1,
               semconv.LATENCY_TTFT_S: 0.01},
        resource={semconv.SERVICE_NAME: "vllm", semconv.SERVICE_INSTANCE_ID: "engine-b"},
    )
    b = T0 + 200_000 * MS
    rows.span(
        "b1", "c1", None, semconv.SPAN_CLIENT, kind="client", start_ns=b, end_ns=b + 50 * MS,
        attrs={semconv.COMPONENT: "client", semconv.REQUEST_ID: "r-9",
               semconv.HTTP_METHOD: "POST"},
        resource={semconv.HOST_NAME: "client-host"},
    )
    # the parent is the router's forward span, which never arrived
    rows.span(
        "b1", "e1", "f1", semconv.SPAN_VLLM_REQUEST, kind="server",
        start_ns=b + 5 * MS, end_ns=b + 45 * MS,
        attrs={semconv.GEN_AI_REQUEST_ID: "cmpl-0123abcd-0",
               semconv.USAGE_COMPLETION_TOKENS: 3,
               semconv.LATENCY_TTFT_S: 0.01, semconv.LATENCY_E2E_S: 0.04},
        resource={semconv.HOST_NAME: "replica-host"},
    )
    rows.span(
        "d9", "d9", None, semconv.SPAN_DECISION, start_ns=b, end_ns=b + MS,
        attrs={semconv.COMPONENT: "router", semconv.REQUEST_ID: "x",
               semconv.DECISION_OUTCOME: "rejected"},
        resource={semconv.HOST_NAME: "router-host"},
    )
    for sid, (name, rank, _) in REPLICA_NAMES.items():
        attrs: dict[str, Any] = {semconv.REPLICA_ID: name, semconv.COMPONENT: "replica"}
        if rank is not None:
            attrs[semconv.REPLICA_DP_RANK] = rank
        rows.span("77", sid, None, semconv.SPAN_VLLM_REQUEST, kind="server",
                  start_ns=b, end_ns=b + MS, attrs=attrs)
    return rows


def scenario_snapshots() -> pa.Table:
    from audit.schema import RAW_SNAPSHOTS_SCHEMA

    base = {f.name: None for f in RAW_SNAPSHOTS_SCHEMA}
    snaps = [
        base | dict(target="http://localhost:18001/metrics", replica="localhost:18001",
                    dp_rank=0, scraped_ns=T0 + i * 1000 * MS, ok=True,
                    prefix_cache_queries=float(q), prefix_cache_hits=float(h))
        for i, (q, h) in enumerate([(100, 50), (200, 125), (200, 125), (50, 10)])
    ]
    return pa.Table.from_pylist(snaps + snaps[:1], schema=RAW_SNAPSHOTS_SCHEMA)


def all_marts(store: Store) -> dict[str, pl.DataFrame]:
    """Every mart and the staged spans, read once."""
    names = ("requests", "decisions", "candidates", "executions", "snapshots", "stg_spans",
             "int_clock_offsets")
    return {n: query(store, f"select * from {n}") for n in names}
