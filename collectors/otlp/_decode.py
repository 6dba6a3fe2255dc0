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
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

import semconv
from audit.schema import RAW_SPAN_EVENTS_SCHEMA, RAW_SPANS_SCHEMA
from collectors.otlp import _candidate_events
from collectors.otlp._otlp_json import MAX_BUILT_DEPTH, build_request

# The optional C extensions (setup.py); without them every body takes the Python path. mypy
# types a module name as the module (the .pyi stubs), never None: hence the ignores.
try:
    from collectors.otlp import _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None  # type: ignore[assignment]
try:
    from collectors.otlp import _json_native
except ImportError:  # pragma: no cover - depends on the build
    _json_native = None  # type: ignore[assignment]

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

_APART: Final = semconv.DECISION_CANDIDATES
"""The span attribute whose string value is left out of ``raw_spans.attributes``: it is stored
as candidate rows in ``raw_span_events`` and, where those do not hold all of it, verbatim in its
typed column (:func:`collectors.otlp._candidate_events.expand`). The text was a decision span's
largest attribute, and storing it once made ingest 16 % faster (docs/performance.md). Its limit is
:data:`MAX_APART_LEN`, not :data:`MAX_STRING_LEN`, and it does not count towards
:data:`MAX_SPAN_ATTR_BYTES`: 16,384 characters hold only about 50 candidates, and a truncated
text is malformed, so a decision over a larger fleet lost all its candidates."""

MAX_APART_LEN = 2 * 1024 * 1024
"""Longest candidates text kept whole (characters): 4,096 candidates of the recorder's encoding
(:data:`collectors.otlp._candidate_events.MAX_CANDIDATES`) are about 1.4 million."""

_EXACT_TYPE: Final = {"VARCHAR": str, "BIGINT": int, "DOUBLE": float, "BOOLEAN": bool}


VIEW_KEYS: Final = frozenset(semconv.TYPED_SPAN_ATTRIBUTES)
"""The typed span keys ``raw_span_attributes`` puts back (its SQL lists them; a test checks they
are these). A key added to the registry at run time is not among them, so it stays in the JSON."""


def stored_once(typed: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """Typed span keys (to their column type) whose exactly held values leave the attributes JSON:
    those the view puts back, with a column of their own (two keys sharing one column would lose
    one value), less the candidates text, which has its own rule (:data:`_APART`)."""
    uses = Counter(col for col, _typ in typed.values())
    return {k: typ for k, (col, typ) in typed.items()
            if k != _APART and k in VIEW_KEYS and uses[col] == 1}


def _held_exactly(value: Any, typ: str) -> bool:
    """Whether a typed column of ``typ`` holds ``value`` (as converted) exactly: the same kind, no
    conversion; for a list, every element. Such a span attribute is left out of the attributes
    JSON, and ``raw_span_attributes`` puts it back; ``held_exactly`` in ``_native.c`` is the twin.
    Storing each value once made ingest faster (docs/performance.md)."""
    if typ.endswith("[]"):
        want = _EXACT_TYPE.get(typ[:-2])
        return type(value) is list and want is not None and all(type(x) is want for x in value)
    return type(value) is _EXACT_TYPE.get(typ)


class PayloadError(ValueError):
    """The request body could not be decoded at all (answered 400)."""


def one_line_reason(exc: BaseException) -> str:
    """An exception's message on one line, at most 200 characters (it goes to the sender)."""
    return " ".join(str(exc).split())[:200] or type(exc).__name__


@dataclass
class DecodedBatch:
    """Columns for ``raw_spans`` and ``raw_span_events``, and what was rejected and why."""

    spans: pa.Table
    events: pa.Table
    rejected: list[str] = field(default_factory=list)
    truncated_values: int = 0
    prompt_values_dropped: int = 0
    """Attribute values dropped for privacy (:data:`PROMPT_PATTERNS`, ``drop_attributes``), nested
    ones included."""
    candidate_json_malformed: int = 0
    """Decision spans whose candidates attribute was not a JSON array of objects (kept verbatim,
    expanded to no candidate rows; see :mod:`collectors.otlp._candidate_events`)."""
    duplicate_spans: int = 0
    """Spans left out because an earlier span of the same request had the same trace and span
    id (the first copy is stored, with its own events only)."""

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
        raise PayloadError("body is not a valid OTLP ExportTraceServiceRequest protobuf: "
                           f"{one_line_reason(exc)}") from exc
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
        doc = orjson.loads(body)  # refuses invalid UTF-8 and lone surrogates (\\ud800)
    except orjson.JSONDecodeError as exc:
        raise PayloadError(f"body is not valid JSON: {one_line_reason(exc)}") from exc
    if not isinstance(doc, dict):
        raise PayloadError("OTLP/JSON body must be an object with 'resourceSpans'")
    fast = build_request(doc)  # the documents SDKs send, without json_format (×2.5)
    return fast if fast is not None else _parse_dict(doc)


def json_to_protobuf(body: bytes) -> bytes:
    """The protobuf bytes of the request an OTLP/JSON body encodes: ``parse_json(body)``
    serialized, and its errors.

    The C transcoder (``_json_native.c``) writes them straight from the text, without the GIL, for
    the documents :func:`build_request` builds (the ones SDKs send): about 18x less CPU than
    ``json.loads`` and the upb constructors (docs/performance.md). It gives None
    for anything else, which then takes :func:`parse_json` (counted in
    :func:`json_python_bodies`); a differential test holds the two equal byte for byte.
    """
    if _json_native is not None:
        wire: bytes | None = _json_native.transcode(body, MAX_BUILT_DEPTH)
        if wire is not None:
            return wire
    global _json_python_bodies
    with _fallback_lock:
        _json_python_bodies += 1
    serialized: bytes = parse_json(body).SerializeToString()
    return serialized


def _parse_dict(doc: dict[str, Any]) -> ExportTraceServiceRequest:
    """The reference path: protobuf's ``ParseDict`` after the ids are re-encoded (it modifies
    ``doc``)."""
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
    except (json_format.ParseError, ValueError, TypeError, RecursionError, AttributeError) as exc:
        raise PayloadError(f"JSON is not an OTLP ExportTraceServiceRequest: {one_line_reason(exc)}") from exc
    return req


def _list(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        return []
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list):
            return value
    return []


PROMPT_PATTERNS: Final = (
    # OpenTelemetry GenAI semantic conventions
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
    "gen_ai.prompt*", "gen_ai.completion*", "gen_ai.choice*",
    "gen_ai.tool.call.arguments", "gen_ai.tool.call.result",
    # OpenLLMetry (Traceloop)
    "traceloop.entity.input", "traceloop.entity.output",
    "llm.prompts*", "llm.completions*", "llm.prompt_template*",
    # OpenInference (Arize Phoenix)
    "input.value", "output.value", "llm.input_messages*", "llm.output_messages*",
)
"""Attribute keys that carry prompt or completion text, the one list of them. A pattern is a
whole key, or a key prefix when it ends in ``*``; ASCII letters match in either case. A matching
attribute is dropped (and counted) wherever it is: on a span, event, link or resource, or inside
a kvlist value at any depth, unless the collector keeps prompts (``keep_prompts``). Users add
patterns of the same form (``drop_attributes``, ``--drop-attribute``); those apply always."""

PROMPT_KEYS: Final = frozenset(p for p in PROMPT_PATTERNS if not p.endswith("*"))
"""The patterns of :data:`PROMPT_PATTERNS` that are whole keys."""


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` is not a valid attribute key pattern, or None when it is."""
    if not isinstance(pattern, str) or not pattern.strip(" *") or not pattern.isprintable():
        return "must be a non-empty printable key"
    if "*" in pattern[:-1]:
        return "may hold '*' only at its end (a key prefix)"
    return None


@lru_cache(maxsize=64)
def drop_patterns(keep_prompts: bool, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The patterns a decode drops, lower case: :data:`PROMPT_PATTERNS` (unless
    ``keep_prompts``) and ``extra``."""
    chosen = extra if keep_prompts else PROMPT_PATTERNS + extra
    return tuple(dict.fromkeys(p.lower() for p in chosen))


_MATCH_CACHE: dict[tuple[tuple[str, ...], str], bool] = {}
_MATCH_CACHE_MAX = 65_536


def _ascii_lower(key: str) -> str:
    return key.translate(_ASCII_LOWER)


_ASCII_LOWER: Final = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def matches(patterns: tuple[str, ...], key: str) -> bool:
    """Whether ``key`` matches one of ``patterns`` (lower case, from :func:`drop_patterns`)."""
    hit = _MATCH_CACHE.get((patterns, key))
    if hit is None:
        low = _ascii_lower(key)
        hit = any(low.startswith(p[:-1]) if p.endswith("*") else low == p for p in patterns)
        if len(_MATCH_CACHE) >= _MATCH_CACHE_MAX:
            _MATCH_CACHE.clear()  # bounded: keys are the sender's choice
        _MATCH_CACHE[(patterns, key)] = hit
    return hit


def is_prompt_key(key: str) -> bool:
    """Whether an attribute key names prompt or completion text (:data:`PROMPT_PATTERNS`)."""
    return matches(drop_patterns(False), key)


class _ValueConverter:
    """AnyValue → plain Python, with depth and size limits; counts truncations and drops the
    attributes :func:`drop_patterns` names (at any depth), counting them."""

    def __init__(self, keep_prompts: bool = False, drop_attributes: tuple[str, ...] = ()) -> None:
        self.truncated = 0
        self.prompts_dropped = 0
        self.keep_prompts = keep_prompts
        self.patterns = drop_patterns(keep_prompts, drop_attributes)
        self.apart_string = False
        """Whether the last span attributes read held :data:`_APART` as a string value (bytes,
        which become a base64 string, stay in the attributes JSON)."""

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
            out = []
            for x in v.array_value.values:
                w = x.WhichOneof("value")
                if w == "string_value":
                    s = x.string_value
                    if len(s) > MAX_STRING_LEN:
                        self.truncated += 1
                        s = s[:MAX_STRING_LEN]
                    out.append(s)
                elif w == "int_value":
                    out.append(x.int_value)
                else:
                    out.append(self.convert(x, depth + 1))
            return out
        if which == "kvlist_value":
            patterns = self.patterns
            obj: dict[str, Any] = {}
            for kv in v.kvlist_value.values:
                if patterns and matches(patterns, kv.key):
                    self.prompts_dropped += 1
                    continue
                obj[kv.key] = self.convert(kv.value, depth + 1)
            return obj
        if which == "bytes_value":
            return base64.b64encode(v.bytes_value[:MAX_STRING_LEN]).decode("ascii")
        return None

    def attrs(self, kvs: Any, span: bool = False) -> dict[str, Any]:
        """One attribute list → dict. The hot path of the decoder: scalars are inlined.
        ``span``: a span's own attributes, where :data:`_APART` has its own string limit."""
        out: dict[str, Any] = {}
        if span:
            self.apart_string = False
        patterns = self.patterns
        for kv in kvs:
            key = kv.key
            if patterns and matches(patterns, key):
                self.prompts_dropped += 1
                continue
            v = kv.value
            which = v.WhichOneof("value")
            if span and key == _APART:  # the last of repeated keys counts, as in the dict
                self.apart_string = which == "string_value"
            if which == "string_value":
                s = v.string_value
                if len(s) > MAX_STRING_LEN:
                    limit = MAX_APART_LEN if span and key == _APART else MAX_STRING_LEN
                    if len(s) > limit:
                        self.truncated += 1
                        s = s[:limit]
                out[key] = s
            elif which == "int_value":
                out[key] = v.int_value
            elif which == "double_value":
                d = v.double_value
                out[key] = d if d - d == 0.0 else None  # finite (inf - inf and nan are nan)
            elif which == "bool_value":
                out[key] = v.bool_value
            else:
                out[key] = self.convert(v)
        return out


def _coerce(value: Any, typ: str) -> Any:
    """Coerce an attribute value to a typed column; None when it cannot be (JSON keeps it)."""
    try:
        if value is None:
            return None
        if typ == "VARCHAR":
            return (value if isinstance(value, str)
                    else json.dumps(value) if isinstance(value, (list, dict)) else str(value))
        if typ == "BIGINT":
            if isinstance(value, bool):
                return int(value)
            if isinstance(value, int):
                return value if -(2**63) <= value < 2**63 else None
            if isinstance(value, float):
                return int(value) if math.isfinite(value) and abs(value) < 2**62 else None
            if isinstance(value, str):
                s = value.strip()
                number = _coerce(float(s), typ) if "." in s or "e" in s.lower() else int(s)
                # out of int64 ("1E100", 20 digits) is NULL, as for a number; Arrow refused the batch
                return number if number is None or -(2**63) <= number < 2**63 else None
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


_JSON = json.JSONEncoder(ensure_ascii=False, default=str).encode
"""``json.dumps(x, ensure_ascii=False, default=str)`` without building an encoder per call."""


def _coerce_column(values: list[Any], typ: str) -> list[Any]:
    """``[_coerce(v, typ) for v in values]`` with the common exact-type cases inlined."""
    if typ == "VARCHAR":
        return [v if v is None or type(v) is str else _coerce(v, typ) for v in values]
    if typ == "BIGINT":
        return [v if v is None or (type(v) is int and -(2**63) <= v < 2**63) else _coerce(v, typ)
                for v in values]
    if typ == "DOUBLE":
        return [v if v is None or (type(v) is float and math.isfinite(v)) else _coerce(v, typ)
                for v in values]
    if typ == "BOOLEAN":
        return [v if v is None or type(v) is bool else _coerce(v, typ) for v in values]
    return [None if v is None else _coerce(v, typ) for v in values]


def _typed_columns(cols: dict[str, list[Any]], dicts: list[dict[str, Any]],
                   typed: Mapping[str, tuple[str, str]]) -> None:
    """Fill the typed columns of ``typed`` from ``dicts``, only scanning keys that occur."""
    present: set[str] = set()
    for d in dicts:
        present.update(d)
    n = len(dicts)
    for key, (col, typ) in typed.items():
        if key in present:
            cols[col] = _coerce_column([d.get(key) for d in dicts], typ)
        else:
            cols[col] = [None] * n


_SPAN_FIXED = ("trace_id", "span_id", "parent_span_id", "trace_state", "name", "kind", "start_ns",
               "end_ns", "status_code", "status_message", "flags", "scope_name", "scope_version",
               "attributes", "links", "event_count", "dropped_attributes_count")
_EVENT_FIXED = ("trace_id", "span_id", "event_index", "name", "time_ns", "attributes")


def decode(req: ExportTraceServiceRequest, received_ns: int, *,
           keep_prompts: bool = False, drop_attributes: tuple[str, ...] = ()) -> DecodedBatch:
    """Flatten a parsed request into raw store columns; reject bad spans individually.

    Attributes whose key matches :data:`PROMPT_PATTERNS` (unless ``keep_prompts``) or
    ``drop_attributes`` are dropped from spans, events, links, resources and kvlist values at
    any depth, and counted in :attr:`DecodedBatch.prompt_values_dropped`. A span whose trace
    and span id an earlier span of the request had is left out with its events
    (:attr:`DecodedBatch.duplicate_spans`).
    """
    conv = _ValueConverter(keep_prompts, tuple(drop_attributes))
    attrs_of = conv.attrs
    rows: list[tuple[Any, ...]] = []          # one tuple per span, in _SPAN_FIXED order
    span_attrs: list[dict[str, Any]] = []
    res_of_span: list[tuple[str, dict[str, Any]]] = []
    ev_rows: list[tuple[Any, ...]] = []       # one tuple per event, in _EVENT_FIXED order
    ev_attrs_all: list[dict[str, Any]] = []
    rejected: list[str] = []
    kinds, statuses = _KINDS, _STATUS
    n_kinds, n_status = len(_KINDS), len(_STATUS)
    min_ns, max_ns = _MIN_NS, _MAX_NS
    encode = _JSON
    # typed span keys whose exactly held values stay out of the attributes JSON (the candidates
    # text has its own rule: _APART); read per call, as the native config is
    span_typed = stored_once(semconv.TYPED_SPAN_ATTRIBUTES)

    for rs in req.resource_spans:
        try:
            res_attrs = attrs_of(rs.resource.attributes)
        except _TooDeep as exc:
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            rejected.append(f"{n} span(s) rejected: resource {exc}")
            continue
        res = (encode(res_attrs), res_attrs)
        for ss in rs.scope_spans:
            scope_name = ss.scope.name or None
            scope_version = ss.scope.version or None
            for sp in ss.spans:
                tid, sid, pid = sp.trace_id, sp.span_id, sp.parent_span_id
                start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
                problem = None
                if len(tid) != 16 or not any(tid):
                    problem = f"trace_id must be 16 non-zero bytes, got {len(tid)}"
                elif len(sid) != 8 or not any(sid):
                    problem = f"span_id must be 8 non-zero bytes, got {len(sid)}"
                elif pid and len(pid) != 8:
                    problem = f"parent_span_id must be 8 bytes, got {len(pid)}"
                elif not (min_ns <= start <= max_ns and min_ns <= end <= max_ns):
                    problem = f"timestamps out of range (start {start}, end {end} ns)"
                elif end < start:
                    problem = f"ends before it starts (start {start}, end {end} ns)"
                if problem is not None:
                    rejected.append(f"span {sid.hex() or '?'} ({sp.name[:60]!r}): {problem}")
                    continue
                try:
                    attrs = attrs_of(sp.attributes, True)
                    events = [(ev.name, ev.time_unix_nano, attrs_of(ev.attributes))
                              for ev in sp.events] if len(sp.events) else ()
                    links = [
                        {
                            "trace_id": lk.trace_id.hex(),
                            "span_id": lk.span_id.hex(),
                            "trace_state": lk.trace_state or None,
                            "attributes": attrs_of(lk.attributes),
                        }
                        for lk in sp.links
                    ] if len(sp.links) else None
                except _TooDeep as exc:
                    rejected.append(f"span {sid.hex() or '?'} ({sp.name[:60]!r}): {exc}")
                    continue
                # the candidates text is stored once: as rows, or in its typed column
                whole = {k: v for k, v in attrs.items() if k != _APART} if conv.apart_string else attrs
                attrs_json = encode(whole)
                size = len(attrs_json)  # the whole JSON counts, whatever is stored of it
                rest = {k: v for k, v in whole.items()
                        if not ((typ := span_typed.get(k)) is not None and _held_exactly(v, typ))}
                if len(rest) != len(whole):
                    attrs_json = encode(rest)
                if events:
                    ev_jsons = [encode(a) for _, _, a in events]
                    for e in ev_jsons:
                        size += len(e)
                if size > MAX_SPAN_ATTR_BYTES:
                    rejected.append(f"span {sid.hex() or '?'} ({sp.name[:60]!r}): attributes and "
                                    f"events are {size} bytes, over {MAX_SPAN_ATTR_BYTES}")
                    continue
                tid_hex, sid_hex = tid.hex(), sid.hex()
                kind = sp.kind
                status = sp.status
                code = status.code
                rows.append((
                    tid_hex, sid_hex, pid.hex() if pid and any(pid) else None,
                    sp.trace_state or None, sp.name,
                    kinds[kind] if 0 <= kind < n_kinds else "unspecified",
                    start, end,
                    statuses[code] if 0 <= code < n_status else "unset",
                    status.message or None, sp.flags, scope_name, scope_version,
                    attrs_json, json.dumps(links, default=str) if links else None,
                    len(events), sp.dropped_attributes_count,
                ))
                span_attrs.append(attrs)
                res_of_span.append(res)
                for i, (ev_name, ev_time, ev_attrs) in enumerate(events):
                    ev_rows.append((tid_hex, sid_hex, i, ev_name,
                                    ev_time if min_ns <= ev_time <= max_ns else start, ev_jsons[i]))
                    ev_attrs_all.append(ev_attrs)

    n = len(rows)
    # every row holds one value per name (strict: a row of another length is a bug, not data)
    span_cols: dict[str, list[Any]] = dict(
        zip(_SPAN_FIXED, map(list, zip(*rows, strict=True)), strict=True)) if n else {
        name: [] for name in _SPAN_FIXED}
    span_cols["received_ns"] = [received_ns] * n
    span_cols["resource_attributes"] = [r[0] for r in res_of_span]
    _typed_columns(span_cols, [r[1] for r in res_of_span], semconv.TYPED_RESOURCE_ATTRIBUTES)
    _typed_columns(span_cols, span_attrs, semconv.TYPED_SPAN_ATTRIBUTES)
    event_cols: dict[str, list[Any]] = dict(
        zip(_EVENT_FIXED, map(list, zip(*ev_rows, strict=True)), strict=True)) if ev_rows \
        else {name: [] for name in _EVENT_FIXED}
    _typed_columns(event_cols, ev_attrs_all, semconv.TYPED_EVENT_ATTRIBUTES)

    spans, events_tbl, copies = _first_copies(
        pa.Table.from_pydict(span_cols, schema=RAW_SPANS_SCHEMA),
        pa.Table.from_pydict(event_cols, schema=RAW_SPAN_EVENTS_SCHEMA))
    spans, events_tbl, malformed = _candidate_events.expand(spans, events_tbl)
    return DecodedBatch(spans=spans, events=events_tbl, rejected=rejected,
                        truncated_values=conv.truncated, prompt_values_dropped=conv.prompts_dropped,
                        candidate_json_malformed=malformed, duplicate_spans=copies)


# --------------------------------------------------------------------------------------------
# Native path: protobuf bytes -> columns in C (collectors/otlp/_native.c)
# --------------------------------------------------------------------------------------------
NATIVE_AVAILABLE: Final = _native is not None
"""Whether the C decoder was built and imports."""

_fallback_lock = threading.Lock()
_native_fallbacks = 0
_json_python_bodies = 0


def json_python_bodies() -> int:
    """OTLP/JSON bodies :func:`json_to_protobuf` left to :func:`parse_json` (process-wide): those
    the C transcoder declined (other shapes, snake_case keys, malformed text) and, when the
    extension is not built, all of them."""
    return _json_python_bodies


def native_fallbacks() -> int:
    """Protobuf bodies :func:`decode_protobuf` decoded on the Python path (process-wide): those
    the native decoder declined (rare or awkward content, undecodable bodies) and, when the
    extension is not built, all of them."""
    return _native_fallbacks


def _count_fallback() -> None:
    global _native_fallbacks
    with _fallback_lock:
        _native_fallbacks += 1


_KIND_OF_TYPE: Final = {"VARCHAR": 0, "BIGINT": 1, "DOUBLE": 2, "BOOLEAN": 3,
                        "VARCHAR[]": 5, "BIGINT[]": 6, "DOUBLE[]": 7}
"""Typed-column types the C code fills itself (values of the exact type, int <-> double, arrays
of those); other values, and other types (kind 4), come back as raw values and go through
:func:`_coerce_column` here."""
_ARROW_OF_KIND: Final = {0: pa.string(), 1: pa.int64(), 2: pa.float64(), 3: pa.bool_()}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class _NativeConfig:
    snapshot: tuple[Any, ...]
    capsule: Any
    span_items: tuple[tuple[str, tuple[str, str]], ...]
    res_items: tuple[tuple[str, tuple[str, str]], ...]
    ev_items: tuple[tuple[str, tuple[str, str]], ...]


_native_cfg: _NativeConfig | None = None


_native_cfgs: dict[tuple[str, ...], _NativeConfig] = {}


def _snapshot(patterns: tuple[str, ...]) -> tuple[Any, ...]:
    return (dict(semconv.TYPED_SPAN_ATTRIBUTES), dict(semconv.TYPED_RESOURCE_ATTRIBUTES),
            dict(semconv.TYPED_EVENT_ATTRIBUTES), patterns,
            MAX_STRING_LEN, MAX_APART_LEN, MAX_SPAN_ATTR_BYTES, _MIN_NS, _MAX_NS)


def _native_config(patterns: tuple[str, ...]) -> _NativeConfig:
    """The C decoder's tables for these drop patterns, rebuilt whenever the registries (or
    limits) changed."""
    cfg = _native_cfgs.get(patterns)
    if cfg is not None:
        snap = cfg.snapshot
        if (snap[0] == semconv.TYPED_SPAN_ATTRIBUTES and snap[1] == semconv.TYPED_RESOURCE_ATTRIBUTES
                and snap[2] == semconv.TYPED_EVENT_ATTRIBUTES
                and snap[4:] == (MAX_STRING_LEN, MAX_APART_LEN, MAX_SPAN_ATTR_BYTES, _MIN_NS, _MAX_NS)):
            return cfg
    snap = _snapshot(patterns)
    items = tuple(tuple(d.items()) for d in snap[:3])
    span_kinds, res_kinds, ev_kinds = ([(key, _KIND_OF_TYPE.get(typ, 4)) for key, (_col, typ) in its]
                                       for its in items)
    exact = sorted(p for p in patterns if not p.endswith("*"))  # exact-bytes fast path; lower case
    capsule = _native.make_config((span_kinds, res_kinds, ev_kinds), exact, list(patterns), [_APART],
                                  sorted(stored_once(snap[0])), *snap[4:])
    cfg = _NativeConfig(snap, capsule, items[0], items[1], items[2])
    if len(_native_cfgs) >= 16:  # a collector uses one or two; tests more
        _native_cfgs.clear()
    _native_cfgs[patterns] = cfg
    return cfg


def _arrow(spec: tuple[Any, ...], hint: pa.DataType | None = None) -> pa.Array:
    """An Arrow array from the C decoder's buffers (``hint``: the schema's type, for lists)."""
    kind, n, nulls, validity, data, offsets = spec
    if kind >= 4:  # list<...> (or, all null, a type left to Python)
        if data is None:
            return pa.nulls(n, hint) if hint is not None else pa.nulls(n)
        child = _arrow(data)
        typ = hint if (hint is not None and pa.types.is_list(hint) and hint.value_type == child.type) \
            else pa.list_(child.type)
        return pa.Array.from_buffers(typ, n, [None if validity is None else pa.py_buffer(validity),
                                              pa.py_buffer(offsets)], null_count=nulls, children=[child])
    typ = _ARROW_OF_KIND[kind]
    if data is None:
        return pa.nulls(n, typ)
    bufs = [None if validity is None else pa.py_buffer(validity)]
    if offsets is not None:
        bufs.append(pa.py_buffer(offsets))
    bufs.append(pa.py_buffer(data))
    return pa.Array.from_buffers(typ, n, bufs, null_count=nulls)


def _native_typed(cols: dict[str, Any], items: tuple[tuple[str, tuple[str, str]], ...],
                  specs: list[Any], schema: pa.Schema) -> None:
    names = schema.names
    for (_key, (col, typ)), spec in zip(items, specs, strict=True):
        if isinstance(spec, list):
            cols[col] = _coerce_column(spec, typ)
        else:
            cols[col] = _arrow(spec, schema.field(col).type if spec[0] >= 4 and col in names else None)


def decode_protobuf(body: bytes, received_ns: int, *, keep_prompts: bool = False,
                    drop_attributes: tuple[str, ...] = ()) -> DecodedBatch:
    """Decode a binary ``ExportTraceServiceRequest`` straight from its bytes.

    Same result as ``decode(parse_protobuf(body), received_ns, keep_prompts=...,
    drop_attributes=...)`` (equal tables, rejections and counters; :class:`PayloadError` for
    undecodable bodies), computed by the native decoder when it is built and the body holds
    nothing it leaves to Python; otherwise by exactly that call (counted in
    :func:`native_fallbacks`).
    """
    if _native is not None and _INT64_MIN <= received_ns <= _INT64_MAX:
        patterns = drop_patterns(keep_prompts, tuple(drop_attributes))
        cfg = _native_config(patterns)
        out = _native.decode(body, cfg.capsule, not patterns, received_ns)
        if out is not None:
            sfixed, rtyped, styped, efixed, etyped, rejected, truncated, prompts = out
            span_cols: dict[str, Any] = {
                name: _arrow(spec)
                for name, spec in zip(_SPAN_FIXED + ("received_ns", "resource_attributes"), sfixed, strict=True)}
            _native_typed(span_cols, cfg.res_items, rtyped, RAW_SPANS_SCHEMA)
            _native_typed(span_cols, cfg.span_items, styped, RAW_SPANS_SCHEMA)
            event_cols: dict[str, Any] = {name: _arrow(spec) for name, spec in zip(_EVENT_FIXED, efixed, strict=True)}
            _native_typed(event_cols, cfg.ev_items, etyped, RAW_SPAN_EVENTS_SCHEMA)
            spans, events, copies = _first_copies(
                pa.Table.from_pydict(span_cols, schema=RAW_SPANS_SCHEMA),
                pa.Table.from_pydict(event_cols, schema=RAW_SPAN_EVENTS_SCHEMA))
            spans, events, malformed = _candidate_events.expand(spans, events)
            return DecodedBatch(
                spans=spans, events=events, rejected=rejected, truncated_values=truncated,
                prompt_values_dropped=prompts, candidate_json_malformed=malformed,
                duplicate_spans=copies)
    _count_fallback()
    return decode(parse_protobuf(body), received_ns, keep_prompts=keep_prompts,
                  drop_attributes=drop_attributes)


def _first_copies(spans: pa.Table, events: pa.Table) -> tuple[pa.Table, pa.Table, int]:
    """``spans`` without the later copies of a (trace id, span id) the request repeats, and
    ``events`` without those copies' events (rows of a span follow its ``event_count``, in span
    order, as both decoders write them); and how many copies were left out. The store keeps
    the first copy of a span; without this, it also kept every copy's events (their keys are
    the same ids and indexes, so the union of all copies' events was stored)."""
    n = spans.num_rows
    if n < 2:
        return spans, events, 0
    keys = pc.binary_join_element_wise(spans.column("trace_id"), spans.column("span_id"), "")
    if pc.count_distinct(keys).as_py() == n:
        return spans, events, 0
    seen: set[str] = set()
    keep = np.ones(n, bool)
    for i, key in enumerate(keys.to_pylist()):
        if key in seen:
            keep[i] = False
        seen.add(key)
    counts = np.asarray(pc.fill_null(spans.column("event_count"), 0).to_numpy(), np.int64)
    if counts.sum() != events.num_rows:  # pragma: no cover - both decoders write them so
        raise ValueError("event rows do not follow the spans' event counts")
    return (spans.filter(pa.array(keep)), events.filter(pa.array(np.repeat(keep, counts))),
            int(n - keep.sum()))
