"""Decode OTLP trace export requests into the raw store's columns.

The decoder only translates: protobuf (or OTLP/JSON) in, Arrow tables shaped like
``raw_spans`` / ``raw_span_events`` out. It validates what would corrupt the store (ids of the
wrong length or all zero, absurd timestamps, values nested too deep or too large) and rejects
those spans one by one, so the good spans of the same request are kept (OTLP partial success).
Aliases and meaning are left to the SQL staging layer.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from audit import semconv
from audit.schema import RAW_SPAN_EVENTS_SCHEMA, RAW_SPANS_SCHEMA

_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
_STATUS = ("unset", "ok", "error")
# Spans dated before 2000 or after 2200 are clock garbage, not data: rejected, never stored.
_MIN_NS = 946_684_800 * 10**9
_MAX_NS = 7_258_118_400 * 10**9
MAX_VALUE_DEPTH = 8
"""Deepest nesting of array/kvlist attribute values accepted."""
MAX_STRING_LEN = 16_384
"""Longest attribute string kept whole; longer strings are truncated (and counted)."""
MAX_SPAN_ATTR_BYTES = 256 * 1024
"""A span whose attributes and events encode to more than this is rejected."""


class PayloadError(ValueError):
    """The request body could not be decoded at all (answered 400)."""


@dataclass
class DecodedBatch:
    """Columns for ``raw_spans`` and ``raw_span_events``, and what was rejected and why."""

    spans: pa.Table
    events: pa.Table
    rejected: list[str] = field(default_factory=list)
    truncated_values: int = 0

    @property
    def accepted(self) -> int:
        return int(self.spans.num_rows)


class _TooDeep(ValueError):
    pass


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """Parse a binary ``ExportTraceServiceRequest``; raise :class:`PayloadError` if it is not."""
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise PayloadError(f"body is not a valid OTLP ExportTraceServiceRequest protobuf: {exc}") from exc
    return req


def _hex_to_b64(value: Any, what: str) -> Any:
    if not isinstance(value, str) or value == "":
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError as exc:
        raise PayloadError(f"{what} {value[:40]!r} is not hex (OTLP/JSON encodes ids as hex)") from exc
    return base64.b64encode(raw).decode("ascii")


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    """Parse OTLP/JSON (hex ids, lowerCamelCase or snake_case keys, int64 as strings)."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise PayloadError("OTLP/JSON body must be an object with 'resourceSpans'")
    for rs in _list(doc, "resourceSpans", "resource_spans"):
        for ss in _list(rs, "scopeSpans", "scope_spans"):
            for span in _list(ss, "spans"):
                if not isinstance(span, dict):
                    raise PayloadError("each span must be an object")
                for key in ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"):
                    if key in span:
                        span[key] = _hex_to_b64(span[key], key)
                for link in _list(span, "links"):
                    for key in ("traceId", "trace_id", "spanId", "span_id"):
                        if isinstance(link, dict) and key in link:
                            link[key] = _hex_to_b64(link[key], key)
    req = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(doc, req, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise PayloadError(f"JSON is not an OTLP ExportTraceServiceRequest: {exc}") from exc
    return req


def _list(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        return []
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list):
            return value
    return []


class _ValueConverter:
    """AnyValue → plain Python, with depth and size limits; counts truncations."""

    def __init__(self) -> None:
        self.truncated = 0

    def convert(self, v: AnyValue, depth: int = 0) -> Any:
        which = v.WhichOneof("value")
        if which == "string_value":
            s = v.string_value
            if len(s) > MAX_STRING_LEN:
                self.truncated += 1
                return s[:MAX_STRING_LEN]
            return s
        if which == "int_value":
            return v.int_value
        if which == "double_value":
            d = v.double_value
            return d if math.isfinite(d) else None
        if which == "bool_value":
            return v.bool_value
        if which is None:
            return None
        if depth >= MAX_VALUE_DEPTH:
            raise _TooDeep(f"attribute value nested deeper than {MAX_VALUE_DEPTH} levels")
        if which == "array_value":
            return [self.convert(x, depth + 1) for x in v.array_value.values]
        if which == "kvlist_value":
            return {kv.key: self.convert(kv.value, depth + 1) for kv in v.kvlist_value.values}
        if which == "bytes_value":
            return base64.b64encode(v.bytes_value[:MAX_STRING_LEN]).decode("ascii")
        return None

    def attrs(self, kvs: Any) -> dict[str, Any]:
        return {kv.key: self.convert(kv.value) for kv in kvs}


def _coerce(value: Any, typ: str) -> Any:
    """Coerce an attribute value to a typed column; None when it cannot be (JSON keeps it)."""
    try:
        if value is None:
            return None
        if typ == "VARCHAR":
            return value if isinstance(value, str) else json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        if typ == "BIGINT":
            if isinstance(value, bool):
                return int(value)
            if isinstance(value, int):
                return value if -(2**63) <= value < 2**63 else None
            if isinstance(value, float):
                return int(value) if math.isfinite(value) and abs(value) < 2**62 else None
            if isinstance(value, str):
                s = value.strip()
                return int(float(s)) if "." in s or "e" in s.lower() else int(s)
            return None
        if typ == "DOUBLE":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                f = float(value)
                return f if math.isfinite(f) else None
            if isinstance(value, str):
                f = float(value.strip())
                return f if math.isfinite(f) else None
            return None
        if typ == "BOOLEAN":
            if isinstance(value, bool):
                return value
            if isinstance(value, str):
                return {"true": True, "false": False, "1": True, "0": False}.get(value.strip().lower())
            if isinstance(value, int):
                return bool(value)
            return None
        if typ.endswith("[]"):
            inner = typ[:-2]
            items = value if isinstance(value, list) else [value]
            out = [_coerce(x, inner) for x in items]
            return out
    except (ValueError, OverflowError):
        return None
    return None


def _valid_id(b: bytes, n: int) -> bool:
    return len(b) == n and any(b)


def decode(req: ExportTraceServiceRequest, received_ns: int) -> DecodedBatch:
    """Flatten a parsed request into raw store columns; reject bad spans individually."""
    conv = _ValueConverter()
    span_cols: dict[str, list[Any]] = {f.name: [] for f in RAW_SPANS_SCHEMA}
    event_cols: dict[str, list[Any]] = {f.name: [] for f in RAW_SPAN_EVENTS_SCHEMA}
    rejected: list[str] = []
    span_typed = semconv.TYPED_SPAN_ATTRIBUTES
    res_typed = semconv.TYPED_RESOURCE_ATTRIBUTES
    ev_typed = semconv.TYPED_EVENT_ATTRIBUTES

    for rs in req.resource_spans:
        try:
            res_attrs = conv.attrs(rs.resource.attributes)
        except _TooDeep as exc:
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            rejected.append(f"{n} span(s) rejected: resource {exc}")
            continue
        res_json = json.dumps(res_attrs, ensure_ascii=False, default=str)
        res_values = {col: _coerce(res_attrs.get(key), typ) for key, (col, typ) in res_typed.items()}
        for ss in rs.scope_spans:
            scope_name = ss.scope.name or None
            scope_version = ss.scope.version or None
            for sp in ss.spans:
                tid, sid, pid = sp.trace_id, sp.span_id, sp.parent_span_id
                label = f"span {sid.hex() or '?'} ({sp.name[:60]!r})"
                if not _valid_id(tid, 16):
                    rejected.append(f"{label}: trace_id must be 16 non-zero bytes, got {len(tid)}")
                    continue
                if not _valid_id(sid, 8):
                    rejected.append(f"{label}: span_id must be 8 non-zero bytes, got {len(sid)}")
                    continue
                if pid and len(pid) != 8:
                    rejected.append(f"{label}: parent_span_id must be 8 bytes, got {len(pid)}")
                    continue
                start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
                if not (_MIN_NS <= start <= _MAX_NS and _MIN_NS <= end <= _MAX_NS):
                    rejected.append(f"{label}: timestamps out of range (start {start}, end {end} ns)")
                    continue
                if end < start:
                    rejected.append(f"{label}: ends before it starts (start {start}, end {end} ns)")
                    continue
                try:
                    attrs = conv.attrs(sp.attributes)
                    events = [
                        (ev.name, ev.time_unix_nano, conv.attrs(ev.attributes)) for ev in sp.events
                    ]
                    links = [
                        {
                            "trace_id": lk.trace_id.hex(),
                            "span_id": lk.span_id.hex(),
                            "trace_state": lk.trace_state or None,
                            "attributes": conv.attrs(lk.attributes),
                        }
                        for lk in sp.links
                    ]
                except _TooDeep as exc:
                    rejected.append(f"{label}: {exc}")
                    continue
                attrs_json = json.dumps(attrs, ensure_ascii=False, default=str)
                ev_jsons = [json.dumps(a, ensure_ascii=False, default=str) for _, _, a in events]
                size = len(attrs_json) + sum(len(e) for e in ev_jsons)
                if size > MAX_SPAN_ATTR_BYTES:
                    rejected.append(f"{label}: attributes and events are {size} bytes, over {MAX_SPAN_ATTR_BYTES}")
                    continue
                tid_hex, sid_hex = tid.hex(), sid.hex()
                kind = sp.kind
                status = sp.status.code
                span_cols["trace_id"].append(tid_hex)
                span_cols["span_id"].append(sid_hex)
                span_cols["parent_span_id"].append(pid.hex() if pid and any(pid) else None)
                span_cols["trace_state"].append(sp.trace_state or None)
                span_cols["name"].append(sp.name)
                span_cols["kind"].append(_KINDS[kind] if 0 <= kind < len(_KINDS) else "unspecified")
                span_cols["start_ns"].append(start)
                span_cols["end_ns"].append(end)
                span_cols["status_code"].append(_STATUS[status] if 0 <= status < len(_STATUS) else "unset")
                span_cols["status_message"].append(sp.status.message or None)
                span_cols["flags"].append(sp.flags)
                span_cols["scope_name"].append(scope_name)
                span_cols["scope_version"].append(scope_version)
                span_cols["received_ns"].append(received_ns)
                span_cols["attributes"].append(attrs_json)
                span_cols["resource_attributes"].append(res_json)
                span_cols["links"].append(json.dumps(links, default=str) if links else None)
                span_cols["event_count"].append(len(events))
                span_cols["dropped_attributes_count"].append(sp.dropped_attributes_count)
                for col, value in res_values.items():
                    span_cols[col].append(value)
                for key, (col, typ) in span_typed.items():
                    span_cols[col].append(_coerce(attrs.get(key), typ))
                for i, (ev_name, ev_time, ev_attrs) in enumerate(events):
                    event_cols["trace_id"].append(tid_hex)
                    event_cols["span_id"].append(sid_hex)
                    event_cols["event_index"].append(i)
                    event_cols["name"].append(ev_name)
                    event_cols["time_ns"].append(ev_time if _MIN_NS <= ev_time <= _MAX_NS else start)
                    event_cols["attributes"].append(ev_jsons[i])
                    for key, (col, typ) in ev_typed.items():
                        event_cols[col].append(_coerce(ev_attrs.get(key), typ))

    spans = pa.Table.from_pydict(span_cols, schema=RAW_SPANS_SCHEMA)
    events_tbl = pa.Table.from_pydict(event_cols, schema=RAW_SPAN_EVENTS_SCHEMA)
    return DecodedBatch(spans=spans, events=events_tbl, rejected=rejected, truncated_values=conv.truncated)
