"""Fuzzing the OTLP/HTTP handler over a real socket: random bytes, mutated valid protobuf and
JSON payloads, random JSON documents. Nothing may produce a 5xx other than 503/429 (by design),
crash the handler or the decoder, or take the collector down. And every body that cannot be
decoded is refused as such: :class:`PayloadError` with a one-line reason from the decode
functions, 400 over HTTP and ``INVALID_ARGUMENT`` over gRPC, never 500."""

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
from collectors.otlp._decode import PayloadError, decode_protobuf, json_to_protobuf

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


# -- every undecodable body is the sender's fault, said in one line --------------------------------
LONE_SURROGATES = [b'{"\\ud800":1}', b'{"\xed\xa0\x80":1}', b'{"resourceSpans":[{"\\udfff":[]}]}',
                   b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"\\ud834"}]}]}]}',
                   b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"\xed\xb0\x80",'
                   b'"value":{"stringValue":"x"}}]}]}]}]}']
surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
any_text = st.text(st.one_of(st.characters(), surrogates), max_size=8)
otlp_keys = st.sampled_from(["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "name",
                             "attributes", "key", "value", "stringValue", "intValue", "doubleValue",
                             "arrayValue", "kvlistValue", "values", "events", "links", "resource",
                             "startTimeUnixNano", "endTimeUnixNano", "kind", "status", "code"])
any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.one_of(otlp_keys, any_text), inner,
                                                                  max_size=5),
    max_leaves=30)


def _json_texts(doc: Any) -> list[bytes]:
    """The document as an SDK escapes it, and with raw UTF-8 (lone surrogates as their 3 bytes,
    which is not UTF-8)."""
    return [json.dumps(doc).encode(), json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")]


def _decoded_or_refused(body: bytes, as_json: bool) -> bool:
    """Decode like the receivers; True when decoded, False when refused with a one-line reason.
    Any other exception fails the test."""
    try:
        decode_protobuf(json_to_protobuf(body) if as_json else body, NOW)
    except PayloadError as exc:
        text = str(exc)
        assert text and "\n" not in text, text
        return False
    return True


def test_lone_surrogates_are_refused_with_a_reason() -> None:
    for body in LONE_SURROGATES:
        assert not _decoded_or_refused(body, True), body


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=2048), as_json=st.booleans())
def test_decoder_answers_any_bytes(body: bytes, as_json: bool) -> None:
    _decoded_or_refused(body, as_json)


@settings(max_examples=400, deadline=None)
@given(doc=any_json)
def test_decoder_answers_any_json(doc: Any) -> None:
    for text in _json_texts(doc):
        _decoded_or_refused(text, True)


@settings(max_examples=300, deadline=None)
@given(doc=any_json, ops=mutations)
def test_decoder_answers_mutated_otlp_json(doc: Any, ops: list[tuple[int, int, int]]) -> None:
    seed = json.loads(SEED_JSON)
    seed["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].append({"key": "k", "value": doc})
    for text in _json_texts(seed):
        _decoded_or_refused(text, True)
        _decoded_or_refused(_mutate(text, ops), True)


def _refused_400(client: httpx.Client, body: bytes, ctype: str) -> None:
    r = client.post("/v1/traces", content=body, headers={"content-type": ctype})
    assert r.status_code == 400, (r.status_code, r.content[:300])
    if ctype == "application/json":
        message = r.json()["message"]
        assert message and "\n" not in message, message


def test_lone_surrogates_answer_400_over_http(client: httpx.Client) -> None:
    for body in LONE_SURROGATES:
        _refused_400(client, body, "application/json")
    bad_utf8 = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[
        Span(trace_id=bytes(range(1, 17)), span_id=b"\x01" * 8, name="@@",
             start_time_unix_nano=NOW, end_time_unix_nano=NOW + 1)])])]).SerializeToString()
    _refused_400(client, bad_utf8.replace(b"@@", b"\xed\xa0"), "application/x-protobuf")


@CI
@given(doc=any_json)
def test_any_json_is_answered_200_or_400_over_http(client: httpx.Client, doc: Any) -> None:
    for text in _json_texts(doc):
        r = client.post("/v1/traces", content=text, headers={"content-type": "application/json"})
        assert r.status_code in (200, 400), (r.status_code, r.content[:300])


def test_undecodable_grpc_export_is_invalid_argument(tmp_path: Path) -> None:
    import grpc

    body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[
        Span(trace_id=bytes(range(1, 17)), span_id=b"\x01" * 8, name="@@",
             start_time_unix_nano=NOW, end_time_unix_nano=NOW + 1)])])]).SerializeToString()
    cfg = CollectorConfig(db_path=tmp_path / "g.duckdb", http_port=0, grpc_port=0)
    with Collector(cfg) as c, grpc.insecure_channel(c.grpc_target) as ch:
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                              request_serializer=None, response_deserializer=None)
        for bad in (body.replace(b"@@", b"\xed\xa0"), b"\x0a\xff\xff", body[:-3]):
            with pytest.raises(grpc.RpcError) as info:
                call(bad, timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
            assert "\n" not in (info.value.details() or "")
        call(body, timeout=30)  # the same span, well formed, is stored
