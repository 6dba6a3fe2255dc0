"""Fuzzing the OTLP/HTTP handler over a real socket: random bytes, mutated valid protobuf and
JSON payloads, random JSON documents. Nothing may produce a 5xx other than 503/429 (by design),
crash the handler or the decoder, or take the collector down."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from collectors.otlp import Collector, CollectorConfig

CAPTURES = Path(__file__).resolve().parents[1] / "testdata" / "otlp"
NOW = time.time_ns()
ALLOWED = {200, 400, 413, 415, 429, 503}
CI = settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SOAK = settings(max_examples=3000, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _valid_protobuf() -> bytes:
    nested = AnyValue(kvlist_value=KeyValueList(values=[
        KeyValue(key="a", value=AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1),
                                                                       AnyValue(double_value=2.5)]))),
    ]))
    spans = [Span(trace_id=bytes(range(1, 17)), span_id=(i + 1).to_bytes(8, "big"), name=f"f{i}",
                  start_time_unix_nano=NOW, end_time_unix_nano=NOW + 10,
                  attributes=[KeyValue(key="gen_ai.usage.prompt_tokens", value=AnyValue(string_value="12")),
                              KeyValue(key="nested", value=nested)],
                  events=[Span.Event(name="e", time_unix_nano=NOW)])
             for i in range(3)]
    req = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])])
    return req.SerializeToString()


SEEDS_PB = [_valid_protobuf()] + [p.read_bytes() for p in sorted(CAPTURES.glob("*.pb"))[:2]]
SEED_JSON = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
    "traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "00f067aa0ba902b7", "name": "j",
    "startTimeUnixNano": str(NOW), "endTimeUnixNano": str(NOW + 1),
    "attributes": [{"key": "k", "value": {"intValue": "7"}}]}]}]}]}).encode()


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    cfg = CollectorConfig(db_path=tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb", http_port=0,
                          grpc_port=None, max_body_bytes=256 * 1024, max_decompressed_bytes=1024 * 1024)
    with Collector(cfg) as c:
        yield c
        health = httpx.get(c.http_url + "/health").json()
        assert health["status"] == "ok"
        assert health["counters"]["internal_errors"] == 0, health


@pytest.fixture(scope="module")
def client(collector: Collector) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=collector.http_url, timeout=30) as c:
        yield c


def _mutate(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    buf = bytearray(data)
    for kind, pos, val in ops:
        if not buf:
            buf.append(val)
            continue
        i = pos % len(buf)
        if kind == 0:
            buf[i] = val
        elif kind == 1:
            del buf[i:]
        elif kind == 2:
            buf.insert(i, val)
        else:
            del buf[i]
    return bytes(buf)


mutations = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255)),
                     min_size=1, max_size=8)
ctypes = st.sampled_from(["application/x-protobuf", "application/json", "application/protobuf",
                          "text/plain", "", "application/json; charset=utf-8"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "name",
                         "attributes", "key", "value", "intValue", "events", "links", "resource",
                         "startTimeUnixNano", "kvlistValue", "values", "x"]), inner, max_size=5),
    max_leaves=30)


def _check(client: httpx.Client, body: bytes, ctype: str, gz: bool, path: str = "/v1/traces") -> None:
    headers = {"content-type": ctype}
    if gz:
        headers["content-encoding"] = "gzip"
    r = client.post(path, content=body, headers=headers)
    assert r.status_code in ALLOWED, (r.status_code, r.content[:200])


def _random_bytes(client: httpx.Client, body: bytes, ctype: str, gz: bool) -> None:
    _check(client, body, ctype, gz)


def _mutated_pb(client: httpx.Client, seed: int, ops: list[tuple[int, int, int]], gz: bool) -> None:
    body = _mutate(SEEDS_PB[seed % len(SEEDS_PB)], ops)
    _check(client, gzip.compress(body) if gz else body, "application/x-protobuf", gz, "/" if gz else "/v1/traces")


def _mutated_json(client: httpx.Client, ops: list[tuple[int, int, int]], doc: Any) -> None:
    _check(client, _mutate(SEED_JSON, ops), "application/json", False)
    _check(client, json.dumps(doc).encode(), "application/json", False)


@CI
@given(body=st.binary(max_size=2048), ctype=ctypes, gz=st.booleans())
def test_random_bytes(client: httpx.Client, body: bytes, ctype: str, gz: bool) -> None:
    _random_bytes(client, body, ctype, gz)


@CI
@given(seed=st.integers(0, 10), ops=mutations, gz=st.booleans())
def test_mutated_protobuf(client: httpx.Client, seed: int, ops: list[tuple[int, int, int]], gz: bool) -> None:
    _mutated_pb(client, seed, ops, gz)


@CI
@given(ops=mutations, doc=json_values)
def test_mutated_and_random_json(client: httpx.Client, ops: list[tuple[int, int, int]], doc: Any) -> None:
    _mutated_json(client, ops, doc)


@pytest.mark.soak
@SOAK
@given(body=st.binary(max_size=8192), ctype=ctypes, gz=st.booleans(), seed=st.integers(0, 10),
       ops=mutations, doc=json_values)
def test_soak_all(client: httpx.Client, body: bytes, ctype: str, gz: bool, seed: int,
                  ops: list[tuple[int, int, int]], doc: Any) -> None:
    _random_bytes(client, body, ctype, gz)
    _mutated_pb(client, seed, ops, gz)
    _mutated_json(client, ops, doc)
