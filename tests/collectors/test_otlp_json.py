"""The OTLP/JSON fast paths give exactly what ``ParseDict`` gives.

``parse_json`` takes the fast path for the documents SDKs send and protobuf's ``ParseDict`` (the
reference) for any other; the fast path must never accept a document the reference refuses, and
must build the same message byte for byte where it accepts one. Documents come from the real
SDK and from hypothesis (well-formed ones, which must all take the fast path, and damaged ones).
The C transcoder (``_json_native.transcode``, used by ``json_to_protobuf``) must give
``build_request``'s bytes straight from the text, or None, and None wherever ``build_request``
does not build the document; it is checked on the same documents written several ways and on
damaged text.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from collectors.otlp._decode import (
    MAX_VALUE_DEPTH,
    PayloadError,
    _json_native,
    _parse_dict,
    decode,
    json_python_bodies,
    json_to_protobuf,
    parse_json,
)
from collectors.otlp._otlp_json import MAX_BUILT_DEPTH, build_request, reference_transcode


def _reference(doc: dict[str, Any]) -> bytes | None:
    try:
        return _parse_dict(copy.deepcopy(doc)).SerializeToString(deterministic=True)
    except PayloadError:
        return None


def assert_same(doc: dict[str, Any]) -> bool:
    """Equal where the fast path accepts; returns whether it did."""
    fast = build_request(copy.deepcopy(doc))
    if fast is None:
        return False
    ref = _reference(doc)
    assert ref is not None, "the fast path accepted a document ParseDict refuses"
    assert fast.SerializeToString(deterministic=True) == ref
    return True


def test_sdk_documents_take_the_fast_path() -> None:
    """Real spans of the SDK (decision with candidates, events, links, status, every value type)
    as the OTLP/JSON exporters write them."""
    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Link, StatusCode

    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("tests", "1.0")
    with tracer.start_as_current_span("parent", attributes={"s": "x", "i": -3, "f": 0.25, "b": True,
                                                             "ls": ["a", "b"], "li": [1, 2]}) as parent:
        parent.add_event("ev", {"k": "v"})
        with tracer.start_as_current_span("child", links=[Link(parent.get_span_context(), {"l": 1})]) as child:
            child.set_status(StatusCode.ERROR, "boom")
    tp.shutdown()
    doc = json_format.MessageToDict(encode_spans(exporter.get_finished_spans()))
    for rs in doc["resourceSpans"]:  # OTLP/JSON ids are hex (protobuf's mapping gives base64)
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in sp:
                        sp[key] = base64.b64decode(sp[key]).hex()
                for lk in sp.get("links", []):
                    for key in ("traceId", "spanId"):
                        lk[key] = base64.b64decode(lk[key]).hex()
    assert assert_same(doc)
    assert parse_json(json.dumps(doc).encode()).SerializeToString(deterministic=True) == _reference(doc)


# -- generated documents -------------------------------------------------------------------------
_TEXT = st.text(max_size=6)
_INT64 = st.integers(-(2**63), 2**63 - 1)
_NANOS = st.integers(0, 2**64 - 1)
_U32 = st.integers(0, 2**32 - 1)


def _either(ints: st.SearchStrategy[int]) -> st.SearchStrategy[int | str]:
    return st.one_of(ints, ints.map(str))  # int64 may be a JSON number or a string


_SCALAR = st.one_of(
    st.builds(lambda v: {"stringValue": v}, _TEXT),
    st.builds(lambda v: {"boolValue": v}, st.booleans()),
    st.builds(lambda v: {"intValue": v}, _either(_INT64)),
    st.builds(lambda v: {"doubleValue": v}, st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                                      st.integers(-(2**53), 2**53))),
    st.just({}),
)
_KV: Any = st.deferred(lambda: st.fixed_dictionaries({"key": _TEXT}, optional={"value": _ANY}))
_ANY: Any = st.recursive(_SCALAR, lambda inner: st.one_of(
    st.builds(lambda v: {"arrayValue": {"values": v}}, st.lists(inner, max_size=3)),
    st.builds(lambda v: {"kvlistValue": {"values": v}}, st.lists(
        st.fixed_dictionaries({"key": _TEXT}, optional={"value": inner}), max_size=3)),
), max_leaves=6)
_ATTRS = st.lists(_KV, max_size=3)
_HEX = st.sampled_from([16, 8]).flatmap(lambda n: st.binary(min_size=n, max_size=n).map(bytes.hex))
_EVENT = st.fixed_dictionaries({}, optional={
    "timeUnixNano": _either(_NANOS), "name": _TEXT, "attributes": _ATTRS, "droppedAttributesCount": _U32})
_LINK = st.fixed_dictionaries({"traceId": _HEX, "spanId": _HEX}, optional={
    "traceState": _TEXT, "attributes": _ATTRS, "droppedAttributesCount": _U32, "flags": _U32})
_STATUS = st.fixed_dictionaries({}, optional={
    "message": _TEXT, "code": st.sampled_from([*Status.StatusCode.keys(), *Status.StatusCode.values()])})
_SPAN = st.fixed_dictionaries({"traceId": _HEX, "spanId": _HEX}, optional={
    "parentSpanId": _HEX, "traceState": _TEXT, "name": _TEXT,
    "kind": st.sampled_from([*Span.SpanKind.keys(), *Span.SpanKind.values()]),
    "startTimeUnixNano": _either(_NANOS), "endTimeUnixNano": _either(_NANOS), "attributes": _ATTRS,
    "droppedAttributesCount": _U32, "events": st.lists(_EVENT, max_size=2), "droppedEventsCount": _U32,
    "links": st.lists(_LINK, max_size=2), "droppedLinksCount": _U32, "status": _STATUS, "flags": _U32})
_SCOPE = st.fixed_dictionaries({}, optional={
    "name": _TEXT, "version": _TEXT, "attributes": _ATTRS, "droppedAttributesCount": _U32})
_DOC = st.fixed_dictionaries({"resourceSpans": st.lists(st.fixed_dictionaries({}, optional={
    "resource": st.fixed_dictionaries({}, optional={"attributes": _ATTRS, "droppedAttributesCount": _U32}),
    "schemaUrl": _TEXT,
    "scopeSpans": st.lists(st.fixed_dictionaries({}, optional={
        "scope": _SCOPE, "schemaUrl": _TEXT, "spans": st.lists(_SPAN, max_size=3)}), max_size=2),
}), max_size=2)})

_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), _TEXT,
                  st.sampled_from(["12", "-3", "1e3", " 7", "0x10", "NaN", "Infinity", "zz", "AQID"]),
                  st.lists(st.integers(), max_size=2), st.dictionaries(_TEXT, st.integers(), max_size=2))


def _slots(node: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            out.append((node, key))
            _slots(value, out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.append((node, i))
            _slots(value, out)
    return out


@st.composite
def _damaged(draw: Any) -> dict[str, Any]:
    doc = draw(_DOC)
    for _ in range(draw(st.integers(1, 3))):
        slots = _slots(doc, [])
        if not slots:
            break
        parent, key = draw(st.sampled_from(slots))
        how = draw(st.integers(0, 3))
        if how == 0 or isinstance(parent, list):
            parent[key] = draw(_JUNK)  # a value of another type
        elif how == 1:  # the snake_case spelling ParseDict also reads
            parent[re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)] = parent.pop(key)
        elif how == 2:
            parent[draw(_TEXT)] = draw(_JUNK)  # an unknown key
        else:
            del parent[key]
    return doc


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DOC)
def test_well_formed_documents_take_the_fast_path_and_equal_parse_dict(doc: dict[str, Any]) -> None:
    assert assert_same(doc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_damaged())
def test_damaged_documents_never_differ_from_parse_dict(doc: dict[str, Any]) -> None:
    assert_same(doc)


@pytest.mark.parametrize("levels", [MAX_VALUE_DEPTH, MAX_VALUE_DEPTH + 1, 30, 48, 49, 80])
@pytest.mark.parametrize("wrap", ["arrayValue", "kvlistValue"])
def test_deeply_nested_values_are_refused_as_parse_dict_refuses_them(levels: int, wrap: str) -> None:
    """Beyond the decoder's depth the document goes to ParseDict (upb's own limit made the
    constructors raise a DecodeError, a 500 instead of a 400); the decoder rejects the span."""
    value: dict[str, Any] = {"stringValue": "x"}
    for _ in range(levels):
        value = {wrap: {"values": [value if wrap == "arrayValue" else {"key": "k", "value": value}]}}
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "deep", "startTimeUnixNano": "1767225600000000000",
         "endTimeUnixNano": "1767225600000000001", "attributes": [{"key": "deep", "value": value}]}]}]}]}
    assert (build_request(copy.deepcopy(doc)) is None) == (levels > MAX_VALUE_DEPTH)
    assert_same(doc)
    try:
        req = parse_json(json.dumps(doc).encode())
    except PayloadError:
        return  # what ParseDict says of a document upb cannot hold
    batch = decode(req, 1)
    if levels < MAX_VALUE_DEPTH:
        assert batch.accepted == 1
    elif levels >= 30:
        assert batch.accepted == 0 and "deeper than" in batch.rejected[0]


# -- the C transcoder: the text straight to the protobuf bytes ------------------------------------
needs_transcoder = pytest.mark.skipif(
    _json_native is None, reason="OTLP/JSON transcoder extension not built (pip install -e . compiles it)")


_built = reference_transcode


def assert_transcoded(text: bytes) -> bool:
    """The transcoder gives build_request's bytes or None, never anything else, and None wherever
    build_request does not accept the text; returns whether it answered."""
    wire = _json_native.transcode(text, MAX_BUILT_DEPTH)
    built = _built(text)
    if built is None:
        assert wire is None, "the transcoder answered for a body the Python path does not build"
        return False
    if wire is not None:
        assert wire == built
    return wire is not None


def _renderings(doc: dict[str, Any], rnd: Any) -> list[bytes]:
    """The same document as different senders write it: compact, indented, \\u-escaped, keys in
    another order."""
    def shuffled(node: Any) -> Any:
        if isinstance(node, dict):
            items = list(node.items())
            rnd.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        if isinstance(node, list):
            return [shuffled(v) for v in node]
        return node
    return [json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode(),
            json.dumps(doc, indent=2).encode(),
            json.dumps(shuffled(doc), ensure_ascii=False).encode(),
            b" \r\n\t" + json.dumps(shuffled(doc)).encode() + b"\n"]


@needs_transcoder
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DOC, st.randoms(use_true_random=False))
def test_transcoder_answers_for_well_formed_documents_with_build_requests_bytes(
        doc: dict[str, Any], rnd: Any) -> None:
    for text in _renderings(doc, rnd):
        assert assert_transcoded(text), text[:300]


@needs_transcoder
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_damaged())
def test_transcoder_never_answers_otherwise_for_damaged_documents(doc: dict[str, Any]) -> None:
    assert_transcoded(json.dumps(doc).encode())


@needs_transcoder
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DOC, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3), st.binary(min_size=1, max_size=3)),
                      min_size=1, max_size=3))
def test_transcoder_never_answers_otherwise_for_damaged_text(
        doc: dict[str, Any], edits: list[tuple[int, int, bytes]]) -> None:
    """Bytes inserted, replaced or cut, or the body truncated: whatever json.loads still reads."""
    text = bytearray(json.dumps(doc, ensure_ascii=False).encode())
    for at, how, data in edits:
        at %= len(text) + 1
        if how == 0:
            text[at:at] = data
        elif how == 1:
            text[at:at + len(data)] = data
        elif how == 2:
            del text[at:at + len(data)]
        else:
            del text[at:]
    assert_transcoded(bytes(text))


def _span_text(**fields: str) -> bytes:
    """One span whose fields are JSON text given verbatim (to write what json.dumps never does)."""
    body = {"traceId": '"' + "ab" * 16 + '"', "spanId": '"' + "cd" * 8 + '"', **fields}
    span = "{" + ",".join(f'"{k}":{v}' for k, v in body.items()) + "}"
    return ('{"resourceSpans":[{"scopeSpans":[{"spans":[' + span + "]}]}]}").encode()


def _attr(value: str) -> str:
    return '[{"key":"k","value":' + value + "}]"


@needs_transcoder
@pytest.mark.parametrize(("text", "answers"), [
    # what it writes as build_request does
    (_span_text(name='"a\\u00e9\\ud83d\\ude00\\/\\"\\\\\\b\\f\\n\\r\\t"'), True),
    (_span_text(name='"caf\u00e9 \U0001F600"'), True),
    (_span_text(**{"na\\u006de": '"escaped key"'}), True),
    (_span_text(startTimeUnixNano="18446744073709551615", endTimeUnixNano='"00018446744073709551615"'), True),
    (_span_text(droppedAttributesCount="-0", flags="4294967295", kind='"SPAN_KIND_SERVER"'), True),
    (_span_text(attributes=_attr('{"doubleValue":-0}')), True),  # float(-0) is +0.0
    (_span_text(attributes=_attr('{"doubleValue":-0.0}')), True),
    (_span_text(attributes=_attr('{"doubleValue":1e-320}')), True),
    (_span_text(attributes=_attr('{"doubleValue":9007199254740992}')), True),
    (_span_text(attributes=_attr('{"doubleValue":0.1000000000000000055511151231257827}')), True),
    (_span_text(attributes=_attr('{"intValue":"-9223372036854775808"}')), True),
    (_span_text(attributes=_attr('{"intValue":-9223372036854775808}')), True),
    (_span_text(attributes=_attr('{"intValue":"0009"}')), True),
    (_span_text(traceId='"ABCDEF0123456789abcdef0123456789"'), True),
    (_span_text(status="{}", links="[]", events='[{}]'), True),
    (_span_text(attributes='[{"key":"k","value":{"kvlistValue":{}}},'
                           '{"value":{"arrayValue":{"values":[{}]}},"key":"z"}]'), True),
    # what it leaves to Python
    (_span_text(name='"\\ud800"'), False),  # a lone surrogate: upb refuses the str
    (_span_text(name='"\\udc00\\ud800"'), False),
    (_span_text(name='"a\\udc00"'), False),
    (_span_text(name='"a\x01"'), False),  # a raw control character: json.loads refuses it
    (_span_text(name='"x"').replace(b'"x"', b'"\xed\xa0\x80"'), False),  # a surrogate in UTF-8
    (_span_text(name='"x"').replace(b'"x"', b'"\xff"'), False),  # not UTF-8: json.loads refuses it
    (_span_text(name='"x"', **{"name ": '"y"'}), False),  # an unknown key
    (_span_text(attributes=_attr('{"doubleValue":NaN}')), False),
    (_span_text(attributes=_attr('{"doubleValue":1e400}')), False),
    (_span_text(attributes=_attr('{"doubleValue":9007199254740993}')), False),
    (_span_text(attributes=_attr('{"intValue":9223372036854775808}')), False),
    (_span_text(attributes=_attr('{"intValue":"+1"}')), False),
    (_span_text(attributes=_attr('{"intValue":1.0}')), False),
    (_span_text(attributes=_attr('{"boolValue":1}')), False),
    (_span_text(attributes=_attr('{"stringValue":null}')), False),
    (_span_text(attributes=_attr('{"stringValue":"a","boolValue":true}')), False),
    (_span_text(startTimeUnixNano="18446744073709551616"), False),
    (_span_text(startTimeUnixNano="-1"), False),
    (_span_text(startTimeUnixNano="01"), False),
    (_span_text(startTimeUnixNano='"-1"'), False),
    (_span_text(droppedAttributesCount="4294967296"), False),
    (_span_text(kind="6"), False),
    (_span_text(kind='"SERVER"'), False),
    (_span_text(spanId='"cd cd cd cd cd cd cd cd"'), False),  # bytes.fromhex reads it; Python does
    (_span_text(spanId='"abc"'), False),
    (_span_text(trace_id='"' + "ab" * 16 + '"'), False),  # snake_case: ParseDict's
    (_span_text(name='"a"') + b" x", False),
    (b"\xef\xbb\xbf" + _span_text(name='"bom"'), False),
    (b'{"resourceSpans":[],"resourceSpans":[]}', False),  # a duplicate key: json.loads keeps the last
    (_span_text(name='"a"', attributes='[{"key":"a","value":{},"key":"b"}]'), False),
    (_span_text(attributes=_attr('{"arrayValue":{"values":[],"values":[{}]}}')), False),
    (b"[]", False),
    (b"", False),
])
def test_transcoder_edges(text: bytes | str, answers: bool) -> None:
    text = text.encode() if isinstance(text, str) else text
    assert assert_transcoded(text) is answers


@needs_transcoder
@pytest.mark.parametrize("levels", [MAX_BUILT_DEPTH - 1, MAX_BUILT_DEPTH, MAX_BUILT_DEPTH + 1, 200])
def test_transcoder_stops_at_build_requests_depth(levels: int) -> None:
    value = '{"stringValue":"x"}'
    for i in range(levels):
        value = ('{"arrayValue":{"values":[' + value + "]}}" if i % 2 else
                 '{"kvlistValue":{"values":[{"key":"k","value":' + value + "}]}}")
    assert assert_transcoded(_span_text(attributes=_attr(value))) is (levels <= MAX_BUILT_DEPTH)


@needs_transcoder
def test_transcoder_refuses_a_depth_its_stack_would_not_hold() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        _json_native.transcode(b"{}", 10_000)


@needs_transcoder
def test_json_to_protobuf_counts_the_bodies_left_to_python() -> None:
    camel = json.dumps(_span_doc()).encode()
    snake = camel.replace(b'"traceId"', b'"trace_id"')
    before = json_python_bodies()
    assert json_to_protobuf(camel) == parse_json(camel).SerializeToString()
    assert json_python_bodies() == before
    assert json_to_protobuf(snake) == parse_json(snake).SerializeToString()
    assert json_python_bodies() == before + 1
    with pytest.raises(PayloadError, match="not valid JSON"):
        json_to_protobuf(b"{")
    assert json_python_bodies() == before + 2


def _span_doc() -> dict[str, Any]:
    return {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "s", "startTimeUnixNano": "1767225600000000000",
         "endTimeUnixNano": "1767225600000000001", "attributes": [{"key": "k", "value": {"intValue": "3"}}]}]}]}]}
