"""Backpressure: a tiny queue and a slowed writer make the receiver refuse with 429 /
RESOURCE_EXHAUSTED (with a retry delay); the real SDK exporters retry and every span they were
told was exported ends up stored once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collectors.otlp import Collector, CollectorConfig


def _batches(n_batches: int, per_batch: int) -> list[list[ReadableSpan]]:
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bp"}))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("bp")
    for i in range(n_batches * per_batch):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    spans = list(mem.get_finished_spans())
    provider.shutdown()
    return [spans[i * per_batch:(i + 1) * per_batch] for i in range(n_batches)]


def _count(c: Collector) -> int:
    r = httpx.post(c.query_url, json={"sql": "select count(*) as n from raw_spans"},
                   headers={"x-routeaudit-query": "1"})
    return int(pa.ipc.open_stream(r.content).read_all().to_pylist()[0]["n"])


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sdk_retries_after_queue_full(tmp_path: Path, transport: str) -> None:
    cfg = CollectorConfig(db_path=tmp_path / "bp.duckdb", http_port=0, grpc_port=0,
                          queue_max_spans=10, retry_after_s=1)
    with Collector(cfg, before_commit=lambda: time.sleep(0.3)) as c:
        batches = _batches(6, 5)
        results: list[Any] = [None] * len(batches)

        def send(i: int) -> None:
            if transport == "http":
                exp: Any = HttpSpanExporter(endpoint=c.traces_url, timeout=20)
            else:
                exp = GrpcSpanExporter(endpoint=c.grpc_target, insecure=True, timeout=20)
            try:
                results[i] = exp.export(batches[i])
            finally:
                exp.shutdown()

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(batches))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == [SpanExportResult.SUCCESS] * len(batches)
        refused = c.health()["counters"]["requests"]
        key = "http:429" if transport == "http" else "grpc:RESOURCE_EXHAUSTED"
        assert refused.get(key, 0) >= 1, refused
        assert _count(c) == 30


def test_http_429_has_retry_after(tmp_path: Path) -> None:
    release = threading.Event()
    cfg = CollectorConfig(db_path=tmp_path / "bp.duckdb", http_port=0, grpc_port=None,
                          queue_max_spans=3, retry_after_s=2)
    with Collector(cfg, before_commit=lambda: release.wait(10)) as c:
        exp = HttpSpanExporter(endpoint=c.traces_url)
        first = _batches(1, 3)[0]
        t = threading.Thread(target=exp.export, args=(first,))
        t.start()
        deadline = time.monotonic() + 5
        while c.health()["queue_spans"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        body = encode_spans(_batches(1, 1)[0]).SerializeToString()
        r = httpx.post(c.traces_url, content=body, headers={"content-type": "application/x-protobuf"})
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        assert c.health()["queue_spans"] == 3
        release.set()
        t.join(10)
        exp.shutdown()
        assert _count(c) == 3
