"""OTLP/JSON → protobuf message, for the documents senders actually send, without json_format.

protobuf's ``json_format.ParseDict`` walks the message descriptors in Python and cost 260 µs per
span: three quarters of the OTLP/JSON receive path, which ran at 2,600 spans/s end to end while
protobuf bodies ran at 24,000. :func:`build_request` builds the same
message with the upb constructors, for documents of the shape the OTLP specification gives
(lowerCamelCase keys, hex ids, int64 as strings or numbers, enums as names or known numbers). It
returns None for anything else (a snake_case key, a null, a value of another type, two values in
one ``AnyValue``, bytes, a non-finite double written as a string, an unknown enum number), and
:func:`collectors.otlp._decode.parse_json` then takes the ``ParseDict`` path, the reference:
its results and its error messages. A differential test holds the two equal byte for byte.

The receiver goes through this module only for bodies the C transcoder (``_json_native.c``,
``_decode.json_to_protobuf``) leaves aside: it writes the same bytes straight from the text for
the documents :func:`build_request` builds, and stops at the same depth, :data:`MAX_BUILT_DEPTH`.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from google.protobuf.message import Error as ProtobufError
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


class _Unknown(Exception):  # noqa: N818 - control flow, never escapes this module
    """The document has a shape this builder leaves to ``ParseDict``."""


_KINDS: Final = dict(Span.SpanKind.items())
_KIND_NUMBERS: Final = frozenset(_KINDS.values())
_CODES: Final = dict(Status.StatusCode.items())
_CODE_NUMBERS: Final = frozenset(_CODES.values())

_DOC: Final = frozenset({"resourceSpans"})
_RESOURCE_SPANS: Final = frozenset({"resource", "scopeSpans", "schemaUrl"})
_RESOURCE: Final = frozenset({"attributes", "droppedAttributesCount"})
_SCOPE_SPANS: Final = frozenset({"scope", "spans", "schemaUrl"})
_SCOPE: Final = frozenset({"name", "version", "attributes", "droppedAttributesCount"})
_SPAN: Final = frozenset({
    "traceId", "spanId", "parentSpanId", "traceState", "name", "kind", "startTimeUnixNano",
    "endTimeUnixNano", "attributes", "droppedAttributesCount", "events", "droppedEventsCount",
    "links", "droppedLinksCount", "status", "flags"})
_EVENT: Final = frozenset({"timeUnixNano", "name", "attributes", "droppedAttributesCount"})
_LINK: Final = frozenset({"traceId", "spanId", "traceState", "attributes", "droppedAttributesCount",
                          "flags"})
_STATUS: Final = frozenset({"message", "code"})
_KV: Final = frozenset({"key", "value"})
_VALUES: Final = frozenset({"values"})

MAX_BUILT_DEPTH: Final = 8
"""Nesting of array and kvlist values built here at most (the decoder's ``MAX_VALUE_DEPTH``);
a deeper document goes to ``ParseDict``, which refuses what upb cannot hold, and the decoder
rejects the span."""

_I64: Final = 2 ** 63
_U32: Final = 2 ** 32


def build_request(doc: dict[str, Any]) -> ExportTraceServiceRequest | None:
    """The request ``doc`` encodes, or None when its shape is left to ``ParseDict``."""
    try:
        _keys(doc, _DOC)
        return ExportTraceServiceRequest(
            resource_spans=[_resource_spans(rs) for rs in _list(doc, "resourceSpans")])
    except (_Unknown, ValueError, TypeError, OverflowError, ProtobufError):
        return None


def _keys(obj: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if type(obj) is not dict or not allowed.issuperset(obj):
        raise _Unknown
    return obj


def _list(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key, ())
    if type(value) is not list and value != ():
        raise _Unknown
    return value  # type: ignore[no-any-return]


def _str(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key, "")
    if type(value) is not str:
        raise _Unknown
    return value


def _u32(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key, 0)
    if type(value) is not int or not 0 <= value < _U32:
        raise _Unknown
    return value


def _nanos(obj: dict[str, Any], key: str) -> int:
    """A fixed64: a number or a string of digits (int64 as JSON strings)."""
    value = obj.get(key, 0)
    if type(value) is str and value.isdigit() and value.isascii():
        value = int(value)
    if type(value) is not int or not 0 <= value < 2 * _I64:
        raise _Unknown
    return value


def _id(obj: dict[str, Any], key: str) -> bytes:
    value = obj.get(key, "")
    if type(value) is not str:
        raise _Unknown
    return bytes.fromhex(value)  # ValueError: not hex; ParseDict's path says so


def _attrs(obj: dict[str, Any], depth: int = 0) -> list[KeyValue]:
    out = []
    for kv in _list(obj, "attributes"):
        _keys(kv, _KV)
        if "value" in kv:
            out.append(KeyValue(key=_str(kv, "key"), value=_any(kv["value"], depth)))
        else:
            out.append(KeyValue(key=_str(kv, "key")))
    return out


def _any(value: Any, depth: int = 0) -> AnyValue:
    if type(value) is not dict or len(value) > 1 or depth > MAX_BUILT_DEPTH:
        raise _Unknown
    if not value:
        return AnyValue()
    ((which, v),) = value.items()
    t = type(v)
    if which == "stringValue" and t is str:
        return AnyValue(string_value=v)
    if which == "intValue":
        if t is str and v.isascii() and (v.isdigit() or (v[:1] == "-" and v[1:].isdigit())):
            v, t = int(v), int
        if t is int and -_I64 <= v < _I64:
            return AnyValue(int_value=v)
    elif which == "boolValue" and t is bool:
        return AnyValue(bool_value=v)
    elif which == "doubleValue" and ((t is float and math.isfinite(v)) or (t is int and abs(v) <= 2 ** 53)):
        return AnyValue(double_value=v)
    elif which == "arrayValue":
        return AnyValue(array_value=ArrayValue(
            values=[_any(x, depth + 1) for x in _list(_keys(v, _VALUES), "values")]))
    elif which == "kvlistValue":
        return AnyValue(kvlist_value=KeyValueList(values=_attrs_of(_keys(v, _VALUES), depth + 1)))
    raise _Unknown


def _attrs_of(kvlist: dict[str, Any], depth: int) -> list[KeyValue]:
    return _attrs({"attributes": _list(kvlist, "values")}, depth)


def _enum(obj: dict[str, Any], key: str, names: dict[str, int], numbers: frozenset[int]) -> int:
    value = obj.get(key, 0)
    if type(value) is str and value in names:
        return names[value]
    if type(value) is not int or value not in numbers:
        raise _Unknown
    return value


# A sub-message present in the document is passed to the constructor even when empty: ParseDict
# marks it present too, and the serialized bytes differ.
def _resource_spans(rs: Any) -> ResourceSpans:
    _keys(rs, _RESOURCE_SPANS)
    extra = {}
    if "resource" in rs:
        res = _keys(rs["resource"], _RESOURCE)
        extra["resource"] = Resource(attributes=_attrs(res),
                                     dropped_attributes_count=_u32(res, "droppedAttributesCount"))
    return ResourceSpans(scope_spans=[_scope_spans(ss) for ss in _list(rs, "scopeSpans")],
                         schema_url=_str(rs, "schemaUrl"), **extra)


def _scope_spans(ss: Any) -> ScopeSpans:
    _keys(ss, _SCOPE_SPANS)
    extra = {}
    if "scope" in ss:
        sc = _keys(ss["scope"], _SCOPE)
        extra["scope"] = InstrumentationScope(
            name=_str(sc, "name"), version=_str(sc, "version"), attributes=_attrs(sc),
            dropped_attributes_count=_u32(sc, "droppedAttributesCount"))
    return ScopeSpans(spans=[_span(sp) for sp in _list(ss, "spans")], schema_url=_str(ss, "schemaUrl"),
                      **extra)


def _span(sp: Any) -> Span:
    _keys(sp, _SPAN)
    extra = {}
    if "status" in sp:
        st = _keys(sp["status"], _STATUS)
        extra["status"] = Status(message=_str(st, "message"),
                                 code=_enum(st, "code", _CODES, _CODE_NUMBERS))  # type: ignore[arg-type]
    return Span(
        trace_id=_id(sp, "traceId"), span_id=_id(sp, "spanId"), parent_span_id=_id(sp, "parentSpanId"),
        trace_state=_str(sp, "traceState"), name=_str(sp, "name"),
        kind=_enum(sp, "kind", _KINDS, _KIND_NUMBERS),  # type: ignore[arg-type]
        start_time_unix_nano=_nanos(sp, "startTimeUnixNano"),
        end_time_unix_nano=_nanos(sp, "endTimeUnixNano"),
        attributes=_attrs(sp), dropped_attributes_count=_u32(sp, "droppedAttributesCount"),
        events=[_event(ev) for ev in _list(sp, "events")],
        dropped_events_count=_u32(sp, "droppedEventsCount"),
        links=[_link(lk) for lk in _list(sp, "links")],
        dropped_links_count=_u32(sp, "droppedLinksCount"), flags=_u32(sp, "flags"), **extra)


def _event(ev: Any) -> Span.Event:
    _keys(ev, _EVENT)
    return Span.Event(time_unix_nano=_nanos(ev, "timeUnixNano"), name=_str(ev, "name"),
                      attributes=_attrs(ev), dropped_attributes_count=_u32(ev, "droppedAttributesCount"))


def _link(lk: Any) -> Span.Link:
    _keys(lk, _LINK)
    return Span.Link(trace_id=_id(lk, "traceId"), span_id=_id(lk, "spanId"),
                     trace_state=_str(lk, "traceState"), attributes=_attrs(lk),
                     dropped_attributes_count=_u32(lk, "droppedAttributesCount"), flags=_u32(lk, "flags"))


def reference_transcode(text: bytes) -> bytes | None:
    """The protobuf bytes the Python path makes of an OTLP/JSON ``text`` (the standard JSON
    parser, then :func:`build_request`), or None where it declines: what the C transcoder must
    give whenever it answers (its tests and fuzzer compare the two)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    built = build_request(doc) if isinstance(doc, dict) else None
    return None if built is None else built.SerializeToString()
