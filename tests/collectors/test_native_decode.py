"""The native OTLP decoder (collectors/otlp/_native.c) against the Python decoder.

``decode_protobuf(body)`` must give exactly what ``decode(parse_protobuf(body))`` gives: equal
Arrow tables, the same rejections and counters, and :class:`PayloadError` for the same bodies.
Compared on real emitter captures, on spans of the real OTel SDK (testbed run through routeaudit's
own client/router/replica instrumentation, encoded with the SDK's ``encode_spans``), on generated
requests full of edge cases, and on hand-written wire bytes protobuf's Python API cannot produce.
"""

from __future__ import annotations

import json
import math
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
from otlp_strategies import TEXT, attribute_lists

import semconv
from collectors.otlp import _decode
from collectors.otlp._decode import (
    MAX_STRING_LEN,
    NATIVE_AVAILABLE,
    DecodedBatch,
    PayloadError,
    decode,
    decode_protobuf,
    native_fallbacks,
    parse_protobuf,
)

NOW = 1_764_000_000 * 10**9
MIN_NS = 946_684_800 * 10**9
MAX_NS = 7_258_118_400 * 10**9
needs_native = pytest.mark.skipif(
    not NATIVE_AVAILABLE, reason="native decoder extension not built (pip install -e . compiles it; "
                                 "the Python path still runs everywhere)")


def python_decode(body: bytes, keep_prompts: bool) -> DecodedBatch | type[PayloadError]:
    try:
        return decode(parse_protobuf(body), 42, keep_prompts=keep_prompts)
    except PayloadError:
        return PayloadError


def assert_same(body: bytes, keep_prompts: bool = False) -> DecodedBatch | None:
    """Both decoders on one body; returns the batch (None when both refused it)."""
    want = python_decode(body, keep_prompts)
    if want is PayloadError:
        with pytest.raises(PayloadError):
            decode_protobuf(body, 42, keep_prompts=keep_prompts)
        return None
    assert isinstance(want, DecodedBatch)
    got = decode_protobuf(body, 42, keep_prompts=keep_prompts)
    for name in want.spans.column_names:
        assert got.spans[name].equals(want.spans[name]), (
            name, got.spans[name].to_pylist()[:3], want.spans[name].to_pylist()[:3])
    for name in want.events.column_names:
        assert got.events[name].equals(want.events[name]), (
            name, got.events[name].to_pylist()[:3], want.events[name].to_pylist()[:3])
    assert got.spans.equals(want.spans)
    assert got.events.equals(want.events)
    assert got.rejected == want.rejected
    assert got.truncated_values == want.truncated_values
    assert got.prompt_values_dropped == want.prompt_values_dropped
    return got


def assert_native(body: bytes, keep_prompts: bool = False) -> DecodedBatch | None:
    """Same result, and computed by the native decoder (no fallback)."""
    before = native_fallbacks()
    batch = assert_same(body, keep_prompts)
    if NATIVE_AVAILABLE:
        assert native_fallbacks() == before, "native decoder fell back to Python"
    return batch


def assert_fallback(body: bytes, keep_prompts: bool = False) -> None:
    before = native_fallbacks()
    assert_same(body, keep_prompts)
    assert native_fallbacks() == before + 1


# -- real captures ----------------------------------------------------------------------------------
@pytest.mark.parametrize("keep_prompts", [False, True])
def test_captures_take_the_native_path(captures: Path, keep_prompts: bool) -> None:
    files = sorted((captures / "otlp").glob("*.pb"))
    assert files
    for pb in files:
        batch = assert_native(pb.read_bytes(), keep_prompts)
        assert batch is not None and batch.accepted > 0, pb.name


def test_captures_truncated_and_corrupted(captures: Path) -> None:
    """Cut or damaged captures: the native decoder either matches or hands over to Python."""
    for pb in sorted((captures / "otlp").glob("*.pb"))[:3]:
        body = pb.read_bytes()
        for cut in range(0, len(body), max(1, len(body) // 97)):
            assert_same(body[:cut])
        for pos in range(0, len(body), max(1, len(body) // 61)):
            for byte in (0x00, 0xFF, 0x80, body[pos] ^ 0x01):
                assert_same(body[:pos] + bytes([byte]) + body[pos + 1:])


# -- real SDK spans (testbed through routeaudit's own instrumentation) ----------------------------
@pytest.fixture(scope="module")
def sdk_bodies() -> list[bytes]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import testbed
    from testbed.emit import OTelEmitter

    bodies = []
    for scenario, workload in (("baseline", "hot_prefix"), ("mixed", None)):
        exp = InMemorySpanExporter()
        em = OTelEmitter(exp, batch=False)
        kwargs: dict[str, Any] = {"workload": workload} if workload else {}
        sim = testbed.prepare_scenario(scenario, n_requests=120, replicas=4, emitter=em, **kwargs)
        sim.run()
        spans = list(exp.get_finished_spans())
        em.close()
        assert spans
        for i in range(0, len(spans), 128):
            bodies.append(encode_spans(spans[i:i + 128]).SerializeToString())
    return bodies


@pytest.mark.parametrize("keep_prompts", [False, True])
def test_sdk_spans_equal(sdk_bodies: list[bytes], keep_prompts: bool) -> None:
    n = 0
    for body in sdk_bodies:
        batch = assert_same(body, keep_prompts)
        assert batch is not None
        n += batch.accepted
    assert n > 400


@needs_native
def test_sdk_spans_take_the_native_path(sdk_bodies: list[bytes]) -> None:
    before = native_fallbacks()
    events = 0
    for body in sdk_bodies:
        events += decode_protobuf(body, 1).events.num_rows
    assert native_fallbacks() == before
    assert events > 0


def _outcome(body: bytes) -> tuple[pa.Table, pa.Table, list[str]] | str:
    try:
        b = decode_protobuf(body, 42)
    except PayloadError as exc:
        return f"PayloadError: {exc}"
    return b.spans, b.events, b.rejected


@needs_native
def test_concurrent_decodes_equal_serial(sdk_bodies: list[bytes]) -> None:
    """The wire-format parse runs without the GIL, so decodes in several threads overlap: none
    may see another's state (whole, truncated and undecodable bodies, doubles in attributes,
    whose formatting takes the GIL back mid-parse)."""
    from concurrent.futures import ThreadPoolExecutor

    doubles = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[
        Span(trace_id=bytes([i + 1]) * 16, span_id=bytes([i + 1]) * 8, name="d",
             start_time_unix_nano=NOW, end_time_unix_nano=NOW + 1,
             attributes=[KeyValue(key=f"x{j}", value=AnyValue(double_value=j / 7 + i)) for j in range(40)])
        for i in range(50)])])]).SerializeToString()
    bodies = sdk_bodies + [doubles] + [b[: len(b) // 2] for b in sdk_bodies[:6]] + [b"\xff" * 64]
    want = [_outcome(b) for b in bodies]
    assert any(isinstance(w, str) for w in want) and any(not isinstance(w, str) for w in want)
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            got = list(pool.map(_outcome, bodies))
            for g, w in zip(got, want, strict=True):
                if isinstance(w, str):
                    assert g == w
                else:
                    assert not isinstance(g, str)
                    assert g[0].equals(w[0]) and g[1].equals(w[1]) and g[2] == w[2]


# -- generated requests full of edge cases ----------------------------------------------------------
IDS16 = st.one_of(st.binary(min_size=16, max_size=16), st.just(bytes(16)), st.binary(max_size=17))
IDS8 = st.one_of(st.binary(min_size=8, max_size=8), st.just(bytes(8)), st.binary(max_size=9))
TIMES = st.one_of(st.sampled_from([0, MIN_NS - 1, MIN_NS, NOW, NOW + 5, MAX_NS, MAX_NS + 1, 2**64 - 1]),
                  st.integers(MIN_NS, MAX_NS), st.integers(0, 2**64 - 1))


@st.composite
def spans(draw: Any, awkward: bool) -> Span:
    attrs = attribute_lists(awkward)
    start = draw(TIMES)
    end = draw(st.one_of(TIMES, st.just(start), st.just(min(start + 1000, 2**64 - 1))))
    events = st.lists(st.builds(lambda n, t, a: Span.Event(name=n, time_unix_nano=t, attributes=a),
                                TEXT, TIMES, attrs), max_size=3)
    links = st.lists(st.builds(lambda t, s, ts, a: Span.Link(trace_id=t, span_id=s, trace_state=ts, attributes=a),
                               IDS16, IDS8, TEXT, attrs), max_size=2)
    return Span(
        trace_id=draw(st.one_of(st.binary(min_size=16, max_size=16), IDS16)),
        span_id=draw(st.one_of(st.binary(min_size=8, max_size=8), IDS8)),
        parent_span_id=draw(st.one_of(st.just(b""), IDS8)),
        trace_state=draw(st.one_of(st.just(""), TEXT)),
        name=draw(TEXT), kind=draw(st.integers(-2, 7)), flags=draw(st.integers(0, 2**32 - 1)),
        start_time_unix_nano=start, end_time_unix_nano=end,
        attributes=draw(attrs), events=draw(events), links=draw(links),
        dropped_attributes_count=draw(st.integers(0, 2**32 - 1)),
        status=Status(code=draw(st.integers(-1, 4)), message=draw(st.one_of(st.just(""), TEXT))),
    )


def requests(awkward: bool) -> st.SearchStrategy[bytes]:
    return st.lists(st.builds(
        lambda ra, sc: ResourceSpans(resource=Resource(attributes=ra), scope_spans=sc),
        attribute_lists(awkward),
        st.lists(st.builds(lambda name, ver, sp: ScopeSpans(scope=InstrumentationScope(name=name, version=ver),
                                                            spans=sp),
                           st.one_of(st.just(""), TEXT), st.one_of(st.just(""), TEXT),
                           st.lists(spans(awkward), max_size=4)),
                 max_size=2),
    ), max_size=3).map(lambda rs: ExportTraceServiceRequest(resource_spans=rs).SerializeToString())


REQUESTS = requests(awkward=True)
CI = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@CI
@given(requests(awkward=False), st.booleans())
def test_generated_requests_native(body: bytes, keep_prompts: bool) -> None:
    """Scalars and arrays of scalars, unique keys, any ids/times/text/numbers: always native."""
    assert_native(body, keep_prompts)


@CI
@given(REQUESTS, st.booleans())
def test_generated_requests_equal(body: bytes, keep_prompts: bool) -> None:
    """Also kvlists, bytes, nested arrays, duplicate keys: native or fallback, same result."""
    assert_same(body, keep_prompts)


@CI
@given(REQUESTS, st.integers(0, 10**6), st.binary(min_size=1, max_size=3))
def test_damaged_requests_equal(body: bytes, pos: int, junk: bytes) -> None:
    if not body:
        body = b"\x0a\x00"
    pos %= len(body)
    assert_same(body[:pos])
    assert_same(body[:pos] + junk + body[pos + len(junk):])
    assert_same(body + junk)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_equal(body: bytes) -> None:
    assert_same(body)


# -- hand-written cases -----------------------------------------------------------------------------
def kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, AnyValue):
        return KeyValue(key=key, value=value)
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    if isinstance(value, list):
        return KeyValue(key=key, value=AnyValue(array_value=ArrayValue(values=[kv("", v).value for v in value])))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def request(*span_list: Span, resource: list[KeyValue] | None = None) -> bytes:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=resource or [kv("service.name", "svc")]),
        scope_spans=[ScopeSpans(scope=InstrumentationScope(name="s", version="1"), spans=list(span_list))],
    )]).SerializeToString()


def span(i: int = 1, attrs: list[KeyValue] | None = None, **fields: Any) -> Span:
    base: dict[str, Any] = dict(trace_id=bytes(range(1, 17)), span_id=i.to_bytes(8, "big"), name=f"op{i}",
                                start_time_unix_nano=NOW, end_time_unix_nano=NOW + 10, kind=2)
    base.update(fields)
    return Span(attributes=attrs or [], **base)


@pytest.mark.parametrize("keep_prompts", [False, True])
def test_common_values_native(keep_prompts: bool) -> None:
    attrs = [
        kv(semconv.REQUEST_ID, "r-1"), kv(semconv.ATTEMPT, 2), kv(semconv.REQUEST_STREAM, True),
        kv(semconv.CLIENT_TTFT_MS, 12.5), kv(semconv.CLIENT_E2E_MS, 7),            # int into DOUBLE
        kv(semconv.REQUEST_MAX_TOKENS, 64.9), kv(semconv.SERVER_PORT, 1e300),       # double into BIGINT
        kv(semconv.REQUEST_PREFIX_HASHES, ["a", "b", "c"]), kv(semconv.RESPONSE_FINISH_REASONS, "stop"),
        kv(semconv.CLIENT_ITL_MS, [1.5, 2.0, float("nan")]), kv("x.nan", float("inf")),
        kv("x.neg0", -0.0), kv("x.big", 1e16), kv("x.small", 1e-7), kv("x.empty", AnyValue()),
        kv("x.ctrl", "a\u0000b\u001f\"\\\n\t\u007f\u2028"), kv("x.astral", "😀\U0010FFFF"),
        kv("x.long", "é" * (MAX_STRING_LEN + 3)), kv("gen_ai.input.messages", "secret"),
        kv("gen_ai.prompt.0.content", "secret"), kv("x.arr", [1, "two", 3.0, True, None]),
    ]
    ev = Span.Event(name="routeaudit.candidate", time_unix_nano=1, attributes=[
        kv(semconv.CANDIDATE_REPLICA, "r1"), kv(semconv.CANDIDATE_ELIGIBLE, 1),
        kv(semconv.CANDIDATE_WAITING, 3), kv(semconv.CANDIDATE_KV_USAGE, 1), kv(semconv.CANDIDATE_CHOSEN, True)])
    link = Span.Link(trace_id=bytes(range(16)), span_id=b"\x01" * 8, trace_state="k=é😀",
                     attributes=[kv("lk", "ünï\u0001😀"), kv("llm.prompts", "secret"), kv("n", 1.25)])
    body = request(span(1, attrs, events=[ev, Span.Event(name="e2")], links=[link],
                        status=Status(code=2, message="boom")),
                   span(2, [kv(semconv.REQUEST_ID, "r-2")], parent_span_id=b"\x00" * 8, trace_state="a=b"),
                   resource=[kv("service.name", "svc"), kv(semconv.RUN_ID, "run"), kv("input.value", "x")])
    batch = assert_native(body, keep_prompts)
    assert batch is not None and batch.accepted == 2 and batch.truncated_values == 1
    assert batch.prompt_values_dropped == (0 if keep_prompts else 4)


def test_coercions_needing_python_stay_native_and_equal() -> None:
    """Strings into numeric columns, bools into doubles, arrays into scalar columns: the C code
    hands those columns' raw values to _coerce_column; the request still takes the native path."""
    attrs = [kv(semconv.SERVER_PORT, "8000"), kv(semconv.HTTP_STATUS, " 200 "), kv(semconv.ATTEMPT, "x"),
             kv(semconv.REQUEST_STREAM, "true"), kv(semconv.CLIENT_TTFT_MS, True), kv(semconv.COMPONENT, 5),
             kv(semconv.REQUEST_MODEL, ["a", "b"]), kv(semconv.REQUEST_PREFIX_HASHES, [1, 2.5, True]),
             kv(semconv.DECISION_TIME, "1e3"), kv(semconv.RESPONSE_FINISH_REASONS, ["stop", 3])]
    assert_native(request(span(1, attrs), span(2, [kv(semconv.SERVER_PORT, 80)])))


@needs_native
@pytest.mark.parametrize("value", [
    AnyValue(kvlist_value=KeyValueList(values=[kv("a", 1)])),
    AnyValue(bytes_value=b"\x00\x01"),
    AnyValue(array_value=ArrayValue(values=[AnyValue(array_value=ArrayValue())])),
])
def test_awkward_values_fall_back(value: AnyValue) -> None:
    assert_fallback(request(span(1, [kv("k", value)])))


@needs_native
def test_duplicate_keys_fall_back() -> None:
    assert_fallback(request(span(1, [kv("k", 1), kv("j", 2), kv("k", "again")])))
    # a dropped prompt key twice is not a duplicate in the dict: stays native
    assert_native(request(span(1, [kv("input.value", "a"), kv("input.value", "b")])))


def test_rejections_native() -> None:
    spans_ = [
        span(1, trace_id=b""), span(2, trace_id=bytes(16)), span(3, span_id=b"\x00" * 8),
        span(4, span_id=b"abc"), span(5, parent_span_id=b"abc"), span(6, start_time_unix_nano=5),
        span(7, end_time_unix_nano=MAX_NS + 1), span(8, end_time_unix_nano=NOW - 1),
        span(9, [kv("big", "x" * 16_000) for _ in range(1)] + [kv(f"k{i}", "y" * 16_000) for i in range(17)]),
        span(10, name="n" * 100 + "'\"\u0001é"), span(11, span_id=b"", name="ñ"),
    ]
    batch = assert_native(request(*spans_))
    assert batch is not None and len(batch.rejected) == 10 and batch.accepted == 1


def test_repeated_span_id_keeps_one_copy_with_its_own_events() -> None:
    """The first copy is stored with its events (and candidate rows) only; before, the store got
    the first span and the union of all copies' events (same keys, so nothing told them apart)."""
    def copy(label: str, events: list[str], candidates: list[str]) -> Span:
        return span(1, [kv("copy", label), kv(semconv.DECISION_CANDIDATES,
                                              json.dumps([{"replica": r} for r in candidates]))],
                    events=[Span.Event(name=e, time_unix_nano=NOW) for e in events])

    other = span(2, events=[Span.Event(name="x", time_unix_nano=NOW)])
    body = request(copy("first", ["a", "b"], ["r1"]), other, copy("second", ["c", "d", "e"], ["r2", "r3"]))
    for batch in (assert_native(body), assert_same(body, True)):
        assert batch is not None and batch.duplicate_spans == 1 and batch.accepted == 2
        assert [json.loads(a) for a in batch.spans["attributes"].to_pylist()] == [{"copy": "first"}, {}]
        rows = sorted(zip(batch.events["span_id"].to_pylist(), batch.events["name"].to_pylist(),
                          batch.events["c_replica"].to_pylist(), strict=True))
        one, two = (1).to_bytes(8, "big").hex(), (2).to_bytes(8, "big").hex()
        assert rows == [(one, "a", None), (one, "b", None), (one, semconv.EVENT_CANDIDATE, "r1"),
                        (two, "x", None)]
    # a copy in another resource of the same request is a copy too
    req = ExportTraceServiceRequest.FromString(request(copy("first", ["a"], [])))
    req.resource_spans.append(ExportTraceServiceRequest.FromString(request(copy("again", [], []))).resource_spans[0])
    batch = assert_native(req.SerializeToString())
    assert batch is not None and batch.accepted == 1 and batch.duplicate_spans == 1


def test_repeated_span_id_is_stored_once_over_http(collector: Any) -> None:
    """Through a collector into the store: one span, its own events, the copy counted."""
    import pyarrow.ipc

    first = span(1, [kv("copy", "first")], events=[Span.Event(name="a", time_unix_nano=NOW)])
    second = span(1, [kv("copy", "second")], events=[Span.Event(name=n, time_unix_nano=NOW) for n in "bcd"])
    r = httpx.post(collector.traces_url, content=request(first, second),
                   headers={"content-type": "application/x-protobuf"}, timeout=60)
    assert r.status_code == 200, r.text
    q = httpx.post(collector.query_url, headers={"x-routeaudit-query": "1"}, timeout=60, json={
        "sql": "select (select count(*) from raw_spans) as spans, (select list(name order by name) "
               "from raw_span_events) as events, (select max(attributes::varchar) from raw_spans) as a"})
    assert q.status_code == 200, q.text
    (row,) = pyarrow.ipc.open_stream(q.content).read_all().to_pylist()
    assert row == {"spans": 1, "events": ["a"], "a": '{"copy": "first"}'}
    assert collector.health()["counters"]["spans_duplicate"] == 1


def test_event_time_and_limits_native() -> None:
    evs = [Span.Event(name="a", time_unix_nano=0), Span.Event(name="b", time_unix_nano=NOW + 3),
           Span.Event(name="c", time_unix_nano=2**64 - 1, attributes=[kv("e", "é" * 20_000)])]
    batch = assert_native(request(span(1, events=evs)))
    assert batch is not None and batch.events.num_rows == 3


def test_registry_changes_are_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Typed keys added to the registries while the collector runs are picked up."""
    body = request(span(1, [kv("my.new.key", "hello"), kv(semconv.COMPONENT, "client")]))
    assert_native(body)
    monkeypatch.setitem(semconv.TYPED_SPAN_ATTRIBUTES, "my.new.key", ("a_component", "VARCHAR"))
    batch = assert_native(body)
    assert batch is not None and batch.spans["a_component"].to_pylist() == ["hello"]
    # two keys now share a_component, which holds one value: both stay in the attributes JSON
    assert json.loads(batch.spans["attributes"][0].as_py()) == {"my.new.key": "hello", semconv.COMPONENT: "client"}
    monkeypatch.setitem(semconv.TYPED_EVENT_ATTRIBUTES, "ev.num", ("c_waiting", "BIGINT"))
    batch = assert_native(request(span(1, events=[Span.Event(name="e", attributes=[kv("ev.num", 7.9)])])))
    assert batch is not None and batch.events["c_waiting"].to_pylist() == [7]


def test_empty_and_spanless_requests() -> None:
    assert_native(b"")
    assert_native(ExportTraceServiceRequest(resource_spans=[ResourceSpans()]).SerializeToString())
    assert_native(request())  # resource attributes but no spans (a dropped prompt still counts)
    assert_native(ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=[kv("input.value", "x")]))]).SerializeToString())


# raw wire bytes ------------------------------------------------------------------------------------
def _varint(v: int) -> bytes:
    v &= 2**64 - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def fld(num: int, wt: int, payload: bytes | int) -> bytes:
    tag = _varint(num << 3 | wt)
    if wt == 0:
        return tag + _varint(int(payload))  # type: ignore[arg-type]
    if wt == 2:
        assert isinstance(payload, bytes)
        return tag + _varint(len(payload)) + payload
    assert isinstance(payload, bytes)
    return tag + payload


def wire_request(span_bytes: bytes, resource: bytes = b"", extra_rs: bytes = b"", order: str = "rs") -> bytes:
    scope = fld(1, 2, fld(1, 2, b"scope") + fld(2, 2, b"v1")) + fld(2, 2, span_bytes)
    rs_parts = {"r": fld(1, 2, resource), "s": fld(2, 2, scope)}
    rs = b"".join(rs_parts[c] for c in order) + extra_rs
    return fld(1, 2, rs)


def wire_span(*extra: bytes, name: bytes = b"op") -> bytes:
    return (fld(1, 2, bytes(range(1, 17))) + fld(2, 2, b"\x01" * 8) + fld(5, 2, name)
            + fld(7, 1, struct.pack("<Q", NOW)) + fld(8, 1, struct.pack("<Q", NOW + 1)) + b"".join(extra))


def wire_kv(key: bytes, any_value: bytes) -> bytes:
    return fld(9, 2, fld(1, 2, key) + fld(2, 2, any_value))


@pytest.mark.parametrize("body", [
    # resource after scope_spans; unknown fields of every wire type everywhere
    wire_request(wire_span(fld(99, 0, 5), fld(98, 1, b"\x00" * 8), fld(97, 5, b"\x00" * 4), fld(96, 2, b"zz")),
                 resource=fld(1, 2, fld(1, 2, b"service.name") + fld(2, 2, fld(1, 2, b"svc"))) + fld(50, 0, 1),
                 extra_rs=fld(3, 2, b"schema") + fld(77, 2, b"\xff\xfe"), order="sr"),
    # int32 enum kind from a 64-bit varint, status code negative, bool varint 2
    wire_request(wire_span(fld(6, 0, 2**32 + 3), fld(15, 2, fld(3, 0, -1)), wire_kv(b"b", fld(2, 0, 2)))),
    # span name twice (last wins), key_strindex on a KeyValue, an unknown AnyValue field
    wire_request(wire_span(fld(5, 2, b"second"), fld(9, 2, fld(1, 2, b"k") + fld(3, 0, 7)
                                                    + fld(2, 2, fld(3, 0, 5) + fld(20, 0, 1))))),
    # scope attributes and entity refs (read only to validate), dropped counts over 32 bits
    wire_request(wire_span(fld(10, 0, 2**33 + 1)),
                 resource=fld(3, 2, fld(1, 2, b"u") + fld(3, 2, b"id")) + fld(2, 0, 9)),
    # KeyValue without a value, AnyValue without a member
    wire_request(wire_span(fld(9, 2, fld(1, 2, b"novalue")), wire_kv(b"empty", b""))),
])
def test_wire_edge_cases_native(body: bytes) -> None:
    assert_native(body)


@pytest.mark.parametrize("body", [
    wire_request(wire_span(name=b"\xff\xfe")),                                        # bad UTF-8
    wire_request(wire_span(wire_kv(b"k\xc0\x80", fld(1, 2, b"v")))),                   # overlong key
    wire_request(wire_span(wire_kv(b"k", fld(1, 2, b"\xed\xa0\x80")))),                # surrogate
    wire_request(wire_span(), extra_rs=fld(3, 2, b"\xff")),                            # schema_url
    wire_request(wire_span(), resource=fld(3, 2, fld(3, 2, b"\xff"))),                  # entity ref
    wire_request(wire_span(fld(1, 2, b"short"), wire_kv(b"k", fld(1, 2, b"\xff")))),    # rejected span
    wire_request(wire_span(fld(11, 2, fld(2, 2, b"\xff")), fld(1, 2, b""))),
    wire_request(wire_span(fld(1, 0, 5))),                                              # wrong wire type
    wire_request(wire_span(fld(15, 2, b"")), fld(15, 2, fld(3, 0, 1))),                 # status twice
    wire_request(wire_span(b"\x0b\x0c")),                                               # group tags
    wire_request(wire_span(b"\x00")),                                                   # field 0
    wire_request(wire_span(wire_kv(b"k", fld(1, 2, b"a") + fld(3, 0, 1)))),             # oneof twice
])
def test_wire_oddities_equal(body: bytes) -> None:
    assert_same(body)


# -- receivers ----------------------------------------------------------------------------------------
@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Any]:
    from collectors.otlp import Collector, CollectorConfig

    with Collector(CollectorConfig(db_path=tmp_path / "audit.duckdb", http_port=0, grpc_port=0)) as c:
        yield c


@needs_native
def test_receivers_use_the_native_decoder(collector: Any, sdk_bodies: list[bytes]) -> None:
    import grpc

    before = native_fallbacks()
    r = httpx.post(collector.http_url + "/v1/traces", content=sdk_bodies[0],
                   headers={"content-type": "application/x-protobuf"}, timeout=30)
    assert r.status_code == 200, r.text
    with grpc.insecure_channel(collector.grpc_target) as ch:
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                              request_serializer=None, response_deserializer=None)
        call(sdk_bodies[1], timeout=30)
    assert native_fallbacks() == before
    # an awkward body falls back, is still stored, and the fallback shows on /metrics
    body = request(span(1, [kv("k", AnyValue(kvlist_value=KeyValueList(values=[kv("a", 1)])))]))
    r = httpx.post(collector.http_url + "/v1/traces", content=body,
                   headers={"content-type": "application/x-protobuf"}, timeout=30)
    assert r.status_code == 200, r.text
    assert native_fallbacks() == before + 1
    garbage = httpx.post(collector.http_url + "/v1/traces", content=b"\x0a\xff\xff",
                         headers={"content-type": "application/x-protobuf"}, timeout=30)
    assert garbage.status_code == 400
    metrics = httpx.get(collector.http_url + "/metrics", timeout=30).text
    line = next(ln for ln in metrics.splitlines() if ln.startswith("routeaudit_decode_native_fallbacks_total"))
    assert float(line.split()[-1]) == native_fallbacks()
    assert "routeaudit_decode_native_available 1.0" in metrics


def test_fallback_counter_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no extension every protobuf body takes the Python path, counted; same result."""
    body = request(span(1, [kv("k", "v")]))
    want = decode_protobuf(body, 42)
    monkeypatch.setattr(_decode, "_native", None)
    before = native_fallbacks()
    got = decode_protobuf(body, 42)
    assert native_fallbacks() == before + 1
    assert got.spans.equals(want.spans) and got.events.equals(want.events)
    assert isinstance(got.spans, pa.Table) and not math.isnan(time.time())
