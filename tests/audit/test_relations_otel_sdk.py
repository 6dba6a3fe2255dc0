"""The real OpenTelemetry SDK path: spans built with the SDK, encoded to OTLP, decoded, stored."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from relation_rows import MS, T0, query

import semconv as sc
from audit._store import Store
from collectors.otlp._decode import decode, parse_protobuf


def _tracer(host: str, exporter: InMemorySpanExporter) -> trace.Tracer:
    provider = TracerProvider(resource=Resource.create({sc.HOST_NAME: host}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("routeaudit.test")


def test_sdk_spans_make_one_request(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    client, router, replica = (_tracer(h, exporter) for h in ("c-host", "r-host", "p-host"))
    k = trace.SpanKind
    c = client.start_span(sc.SPAN_CLIENT, kind=k.CLIENT, start_time=T0, attributes={
        sc.COMPONENT: "client", sc.REQUEST_ID: "sdk-1", sc.HTTP_METHOD: "POST",
        sc.REQUEST_ENDPOINT: "/v1/completions", sc.CLIENT_TTFT_MS: 40.0,
        sc.CLIENT_E2E_MS: 100.0, sc.USAGE_OUTPUT_TOKENS: 7, sc.STATUS: "ok"})
    d = router.start_span(sc.SPAN_DECISION, context=trace.set_span_in_context(c),
                          start_time=T0 + 2 * MS, attributes={
        sc.COMPONENT: "router", sc.REQUEST_ID: "sdk-1", sc.ATTEMPT: 0,
        sc.ROUTER_POLICY: "least_load", sc.DECISION_CHOSEN: "localhost:9001"})
    d.add_event(sc.EVENT_CANDIDATE, {sc.CANDIDATE_REPLICA: "localhost:9001",
                                     sc.CANDIDATE_CHOSEN: True,
                                     sc.CANDIDATE_PREDICTED_CACHED_TOKENS: 16},
                timestamp=T0 + 3 * MS)
    d.add_event(sc.EVENT_CANDIDATE, {sc.CANDIDATE_REPLICA: "localhost:9002",
                                     sc.CANDIDATE_CHOSEN: False}, timestamp=T0 + 3 * MS)
    f = router.start_span(sc.SPAN_FORWARD, kind=k.CLIENT, context=trace.set_span_in_context(d),
                          start_time=T0 + 4 * MS,
                          attributes={sc.URL_FULL: "http://localhost:9001/v1/completions"})
    d.end(end_time=T0 + 4 * MS)
    p = replica.start_span(sc.SPAN_VLLM_REQUEST, kind=k.SERVER,
                           context=trace.set_span_in_context(f), start_time=T0 + 6 * MS,
                           attributes={sc.GEN_AI_REQUEST_ID: "cmpl-sdk-1-0",
                                       sc.USAGE_PROMPT_TOKENS: 32,
                                       sc.USAGE_COMPLETION_TOKENS: 7,
                                       sc.USAGE_CACHE_READ_INPUT_TOKENS: 16,
                                       sc.LATENCY_TTFT_S: 0.03,
                                       sc.REPLICA_ID: "http://127.0.0.1:9001"})
    p.end(end_time=T0 + 95 * MS)
    f.end(end_time=T0 + 97 * MS)
    c.end(end_time=T0 + 100 * MS)

    body = encode_spans(exporter.get_finished_spans()).SerializeToString()
    batch = decode(parse_protobuf(body), time.time_ns())
    assert batch.rejected == [] and batch.accepted == 4
    store = Store(tmp_path / "sdk.duckdb")
    try:
        store.append(spans=batch.spans, events=batch.events)
        req = query(store, "select * from requests")
    finally:
        store.close()
    assert req.height == 1
    r = req.row(0, named=True)
    assert r["request_id"] == "sdk-1" and r["link_method"] == "trace"
    assert (r["has_client"], r["has_router"], r["has_replica"]) == (True, True, True)
    assert r["chosen_replica"] == r["served_by"] == "127.0.0.1:9001"
    assert r["ttft_ms"] == 40.0 and r["tpot_ms"] == pytest.approx(10.0)
    assert (r["input_tokens"], r["output_tokens"]) == (32, 7)
    assert (r["predicted_cached_tokens"], r["actual_cached_tokens"]) == (16, 16)
    assert r["policy"] == "least_load" and r["clock_suspect"] is False
