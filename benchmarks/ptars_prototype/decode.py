"""A prototype of the collector's decoder without hand-written C, kept to measure it against
``collectors.otlp._decode`` (benchmarks/decode_ab.py); not used by the collector.

It gives the same tables as the collector's decoder on the ingest templates (decode_ab.py checks
that before it measures), but costs about 4x the CPU of the C decoder (decode_ab.py prints the
ratio), so the collector keeps the C decoder. Its privacy rule is an older draft (glob patterns).

Decode OTLP trace export requests into the raw store's columns.

The decoder only translates: protobuf (or OTLP/JSON) in, Arrow tables shaped like
``raw_spans`` / ``raw_span_events`` out. It validates what would corrupt the store (ids of the
wrong length or all zero, absurd timestamps, values nested too deep or too large) and rejects
those spans one by one, so the good spans of the same request are kept (OTLP partial success).
Aliases and meaning are left to the SQL staging layer.

No parser here is our own: ``ptars`` (Rust) turns the protobuf bytes into one nested Arrow
record batch, and refuses malformed wire data and invalid UTF-8; the rest is Arrow compute over
whole columns (flattening, validation, the attributes JSON, the typed columns). ``AnyValue`` is
recursive, so ptars leaves array and kvlist elements as serialized bytes; they go through ptars
again, one nesting level per call, down to :data:`MAX_VALUE_DEPTH`. OTLP/JSON is read by
``orjson`` and built into the protobuf message by upb (:mod:`collectors.otlp._otlp_json`, else
protobuf's ``json_format``), then takes the same path.
"""

from __future__ import annotations

import base64
import json
import math
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from ptars import HandlerPool

import semconv
from audit.schema import RAW_SPAN_EVENTS_SCHEMA, RAW_SPANS_SCHEMA
from collectors.otlp._otlp_json import build_request

from . import candidate_events as _candidate_events

_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
_STATUS = ("unset", "ok", "error")
# Spans dated before 2000 or after 2200 are clock garbage, not data: rejected, never stored.
_MIN_NS = 946_684_800 * 10**9
_MAX_NS = 7_258_118_400 * 10**9
MAX_VALUE_DEPTH = 8
"""Deepest nesting of array/kvlist attribute values accepted."""
MAX_STRING_LEN = 16_384
"""Longest attribute string kept whole (characters); longer strings are truncated (and counted)."""
MAX_SPAN_ATTR_BYTES = 256 * 1024
"""A span whose attributes and events encode to more than this (characters of their JSON) is
rejected."""

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
    JSON, and ``raw_span_attributes`` puts it back. Storing each value once made ingest faster
    (docs/performance.md)."""
    if typ.endswith("[]"):
        want = _EXACT_TYPE.get(typ[:-2])
        return type(value) is list and want is not None and all(type(x) is want for x in value)
    return type(value) is _EXACT_TYPE.get(typ)


class PayloadError(ValueError):
    """The request body could not be decoded at all (answered 400)."""


@dataclass
class DecodedBatch:
    """Columns for ``raw_spans`` and ``raw_span_events``, and what was rejected and why."""

    spans: pa.Table
    events: pa.Table
    rejected: list[str] = field(default_factory=list)
    truncated_values: int = 0
    prompt_values_dropped: int = 0
    """Attribute values dropped for privacy (see :data:`PROMPT_PATTERNS`), nested ones included."""
    candidate_json_malformed: int = 0
    """Decision spans whose candidates attribute was not a JSON array of objects (kept verbatim,
    expanded to no candidate rows; see :mod:`collectors.otlp._candidate_events`)."""
    duplicate_spans: int = 0
    """Spans left out because an earlier span of the same request had the same trace and span
    id (the first copy is stored, with its own events only)."""

    @property
    def accepted(self) -> int:
        return int(self.spans.num_rows)


# --------------------------------------------------------------------------------------------
# Privacy: which attribute keys carry prompt or completion text
# --------------------------------------------------------------------------------------------
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
"""Attribute keys that carry prompt or completion text, as patterns: ``*`` matches any run of
characters, everything else itself, case-insensitively, over the whole key. An attribute whose
key matches is dropped (and counted) wherever it is: on a span, event, link or resource, or inside
a kvlist value at any depth, unless the collector keeps prompts (``keep_prompts``). Users add
patterns of the same form (``drop_attributes``, ``--drop-attribute``); those apply always."""

PROMPT_KEYS: Final = frozenset(p for p in PROMPT_PATTERNS if "*" not in p)
"""The patterns of :data:`PROMPT_PATTERNS` that name one key."""


def pattern_regex(patterns: Sequence[str]) -> str | None:
    """One anchored regular expression (RE2 and Python syntax) matching any of ``patterns``;
    None for no pattern."""
    if not patterns:
        return None
    alts = (re.escape(p).replace(r"\*", ".*") for p in dict.fromkeys(patterns))
    return "^(?:" + "|".join(alts) + ")$"


@lru_cache(maxsize=64)
def _drop_regex(keep_prompts: bool, extra: tuple[str, ...]) -> str | None:
    return pattern_regex(tuple(extra) if keep_prompts else PROMPT_PATTERNS + tuple(extra))


@lru_cache(maxsize=1)
def _prompt_re() -> re.Pattern[str]:
    return re.compile(pattern_regex(PROMPT_PATTERNS) or "(?!)", re.IGNORECASE | re.DOTALL)


def is_prompt_key(key: str) -> bool:
    """Whether an attribute key names prompt or completion text (:data:`PROMPT_PATTERNS`)."""
    return _prompt_re().match(key) is not None


def check_patterns(patterns: Sequence[str]) -> None:
    """Raise ``ValueError`` for a pattern that is not a non-empty string of printable text."""
    for p in patterns:
        if not isinstance(p, str) or not p.strip() or not p.isprintable():
            raise ValueError(f"attribute pattern {p!r} must be a non-empty printable string")


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------
_tls = threading.local()


def _handlers() -> tuple[Any, Any, Any]:
    """ptars handlers for the request, ``AnyValue`` and ``KeyValue`` (one set per thread)."""
    h = getattr(_tls, "handlers", None)
    if h is None:
        pool = HandlerPool([ExportTraceServiceRequest.DESCRIPTOR.file])
        h = (pool.get_for_message(ExportTraceServiceRequest.DESCRIPTOR),
             pool.get_for_message(AnyValue.DESCRIPTOR), pool.get_for_message(KeyValue.DESCRIPTOR))
        _tls.handlers = h
    return h


def _not_protobuf(exc: BaseException) -> PayloadError:
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    return PayloadError(f"body is not a valid OTLP ExportTraceServiceRequest protobuf: {reason}")


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """Parse a binary ``ExportTraceServiceRequest``; raise :class:`PayloadError` if it is not."""
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise _not_protobuf(exc) from exc
    return req


def _hex_to_b64(value: Any, what: str) -> Any:
    if not isinstance(value, str) or value == "":
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError as exc:
        raise PayloadError(f"{what} {value[:40]!r} is not hex (OTLP/JSON encodes ids as hex)") from exc
    return base64.b64encode(raw).decode("ascii")


_json_bodies = 0
_json_lock = threading.Lock()


def json_python_bodies() -> int:
    """OTLP/JSON bodies decoded (process-wide); all of them take the same path."""
    return _json_bodies


def native_fallbacks() -> int:
    """Always 0: there is no hand-written decoder to fall back from (kept for the metric)."""
    return 0


NATIVE_AVAILABLE: Final = False
"""No hand-written C decoder is built or used."""


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    """Parse OTLP/JSON (hex ids, lowerCamelCase or snake_case keys, int64 as strings).

    Any body that is not such a document raises :class:`PayloadError` with a one-line reason:
    invalid UTF-8, a lone surrogate (``"\\ud800"``), nesting orjson refuses, values of the wrong
    type."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PayloadError(f"body is not valid JSON: {' '.join(str(exc).split())[:200]}") from exc
    if not isinstance(doc, dict):
        raise PayloadError("OTLP/JSON body must be an object with 'resourceSpans'")
    fast = build_request(doc)  # the documents SDKs send, without json_format (×2.5)
    return fast if fast is not None else _parse_dict(doc)


def json_to_protobuf(body: bytes) -> bytes:
    """The protobuf bytes of the request an OTLP/JSON body encodes: ``parse_json(body)``
    serialized, and its errors."""
    global _json_bodies
    with _json_lock:
        _json_bodies += 1
    req = parse_json(body)
    try:
        return req.SerializeToString()
    except (ValueError, RuntimeError) as exc:  # pragma: no cover - upb built it, it can write it
        raise PayloadError(f"JSON is not an OTLP ExportTraceServiceRequest: {exc}") from exc


def _parse_dict(doc: dict[str, Any]) -> ExportTraceServiceRequest:
    """protobuf's ``ParseDict`` after the ids are re-encoded (it modifies ``doc``)."""
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
    except (json_format.ParseError, ValueError, TypeError, RecursionError, AttributeError,
            DecodeError, RuntimeError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise PayloadError(f"JSON is not an OTLP ExportTraceServiceRequest: {reason}") from exc
    return req


def _list(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        return []
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list):
            return value
    return []


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


# --------------------------------------------------------------------------------------------
# Columns: Arrow compute over the nested batch
# --------------------------------------------------------------------------------------------
_NEEDS_ESCAPE: Final = r'[\x00-\x1f"\\]'
_HEX: Final = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_NONE, _STR, _INT, _DBL, _BOOL, _BYTES, _ARR, _KVL = range(8)
_EXACT_KIND: Final = {"VARCHAR": _STR, "BIGINT": _INT, "DOUBLE": _DBL, "BOOLEAN": _BOOL}
_NULL_STR: Final = pa.scalar(None, pa.string())


class _Ctx:
    """One request's decoding state: the drop pattern and the counters."""

    def __init__(self, regex: str | None) -> None:
        self.regex = regex
        self.truncated = 0
        self.dropped = 0
        _req, self.any_h, self.kv_h = _handlers()


def _sf(arr: Any, name: str) -> pa.Array:
    return pc.struct_field(arr, name)


def _np(arr: Any, dtype: Any = np.int64) -> np.ndarray[Any, Any]:
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _mask_np(arr: Any) -> np.ndarray[Any, Any]:
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def _parents(lists: Any) -> tuple[pa.Array, np.ndarray[Any, Any]]:
    """The flattened values of a list array and the index of the list each came from."""
    return pc.list_flatten(lists), _np(pc.list_parent_indices(lists))


def _count(n: int, owner: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.bincount(owner, minlength=n) if n else np.zeros(0, np.int64)


def _join(owner: np.ndarray[Any, Any], n: int, parts: pa.Array, open_: str, close: str) -> pa.Array:
    """Per owner, its parts (in order; owners non-decreasing) joined by commas inside
    ``open_``/``close``."""
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(_count(n, owner), out=offsets[1:])
    lists = pa.ListArray.from_arrays(pa.array(offsets), parts)
    return pc.binary_join_element_wise(open_, pc.binary_join(lists, ", "), close, "")


def _quote(s: pa.Array) -> pa.Array:
    """JSON string literals of ``s``, as ``json.dumps(ensure_ascii=False)`` writes them."""
    quoted = pc.binary_join_element_wise('"', s, '"', "")
    need = pc.fill_null(pc.match_substring_regex(s, _NEEDS_ESCAPE), False)
    if pc.any(need).as_py():
        esc = [encode_basestring(x) for x in s.filter(need).to_pylist()]
        quoted = pc.replace_with_mask(quoted, need, pa.array(esc, pa.string()))
    return quoted


def _hex(arr: pa.Array) -> pa.Array:
    """Lower-case hex of a binary array (nulls as empty)."""
    arr = pc.fill_null(arr, b"").combine_chunks() if isinstance(arr, pa.ChunkedArray) else pc.fill_null(arr, b"")
    n = len(arr)
    if n == 0:
        return pa.array([], pa.string())
    _validity, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1, arr.offset * 4)
    start, stop = int(offsets[0]), int(offsets[-1])
    raw = np.frombuffer(data_buf, np.uint8, stop - start, start) if data_buf is not None and stop > start \
        else np.zeros(0, np.uint8)
    out = np.empty(raw.size * 2, np.uint8)
    out[0::2] = _HEX[raw >> 4]
    out[1::2] = _HEX[raw & 15]
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer((offsets - start) * 2),
                                                  pa.py_buffer(out.tobytes())])


def _struct_of(batch: pa.RecordBatch) -> pa.StructArray:
    return pa.StructArray.from_arrays(batch.columns, names=batch.schema.names)


def _nested(handler: Any, data: pa.Array) -> pa.StructArray:
    """Serialized nested messages (array / kvlist elements) through ptars again."""
    try:
        return _struct_of(handler.array_to_record_batch(data))
    except (ValueError, RuntimeError, OverflowError) as exc:
        raise _not_protobuf(exc) from exc


@dataclass
class _Values:
    """One ``AnyValue`` column: JSON text, kind and typed children per value."""

    json: pa.Array
    kind: np.ndarray[Any, Any]
    bad: np.ndarray[Any, Any]
    """Nested deeper than :data:`MAX_VALUE_DEPTH`."""
    str: pa.Array
    int: pa.Array
    dbl: pa.Array
    bool: pa.Array
    strings: pa.Array | None = None
    """For each array value of strings only: those strings as a list (else null)."""

    def take(self, rows: np.ndarray[Any, Any]) -> _Values:
        at = pa.array(rows)
        return _Values(self.json.take(at), self.kind[rows], self.bad[rows], self.str.take(at),
                       self.int.take(at), self.dbl.take(at), self.bool.take(at),
                       None if self.strings is None else self.strings.take(at))


def _values(vals: pa.Array, depth: int, ctx: _Ctx, limit: np.ndarray[Any, Any] | None = None,
            skip: np.ndarray[Any, Any] | None = None) -> _Values:
    """JSON text of each ``AnyValue`` as the reference encoding writes the converted value:
    strings truncated at :data:`MAX_STRING_LEN` characters (or ``limit`` per row), non-finite
    doubles null, bytes as base64 of their first :data:`MAX_STRING_LEN` bytes. ``skip``: string
    rows whose JSON is not needed (written as null).

    Each kind is formatted on its own rows only; one ``take`` puts the texts in place."""
    n = len(vals)
    kind = np.zeros(n, np.int8)
    bad = np.zeros(n, bool)
    index = np.full(n, -1, np.int64)
    parts: list[pa.Array] = []
    base = 0

    def place(mask: np.ndarray[Any, Any], text: pa.Array) -> None:
        nonlocal base
        index[mask] = np.arange(base, base + len(text))
        base += len(text)
        parts.append(text)

    sv = _sf(vals, "string_value")
    m = _mask_np(sv.is_valid())
    if m.any():
        lens = _np(pc.fill_null(pc.utf8_length(sv), 0))
        over = lens > (MAX_STRING_LEN if limit is None else limit)
        if over.any():
            ctx.truncated += int(over.sum())
            idx = np.nonzero(over)[0]
            short = [s[:int(MAX_STRING_LEN if limit is None else limit[i])]
                     for i, s in zip(idx, sv.take(pa.array(idx)).to_pylist(), strict=True)]
            sv = pc.replace_with_mask(sv, pa.array(over), pa.array(short, pa.string()))
        kind[m] = _STR
        if skip is not None:
            m = m & ~skip
        place(m, _quote(sv.filter(pa.array(m))))
    bv = _sf(vals, "bool_value")
    m = _mask_np(bv.is_valid())
    if m.any():
        kind[m] = _BOOL
        place(m, pc.if_else(bv.filter(pa.array(m)), "true", "false"))
    iv = _sf(vals, "int_value")
    m = _mask_np(iv.is_valid())
    if m.any():
        kind[m] = _INT
        place(m, pc.cast(iv.filter(pa.array(m)), pa.string()))
    dv = _sf(vals, "double_value")
    m = _mask_np(pc.is_finite(dv))
    if m.any():
        kind[m] = _DBL
        place(m, pa.array([float.__repr__(x) for x in dv.filter(pa.array(m)).to_pylist()], pa.string()))
        dv = pc.if_else(pa.array(m), dv, pa.scalar(None, pa.float64()))
    else:
        dv = pa.nulls(n, pa.float64())
    yb = _sf(vals, "bytes_value")
    m = _mask_np(yb.is_valid())
    if m.any():
        kind[m] = _BYTES
        place(m, pa.array(['"' + base64.b64encode(b[:MAX_STRING_LEN]).decode("ascii") + '"'
                           for b in yb.filter(pa.array(m)).to_pylist()], pa.string()))
    strings = None
    for which, open_, close in (("array_value", "[", "]"), ("kvlist_value", "{", "}")):
        nested = _sf(vals, which)
        m = _mask_np(nested.is_valid())
        if not m.any():
            continue
        kind[m] = _ARR if which == "array_value" else _KVL
        if depth >= MAX_VALUE_DEPTH:
            bad |= m
            index[m] = -1
            continue
        rows = np.nonzero(m)[0]
        lists = _sf(nested.filter(pa.array(m)), "values")
        data, owner = _parents(lists)
        k = len(rows)
        if which == "array_value":
            sub = _values(_nested(ctx.any_h, data), depth + 1, ctx)
            text = _join(owner, k, sub.json, open_, close)
            bad_rows = np.bincount(owner[sub.bad], minlength=k) > 0 if sub.bad.any() else None
            not_str = np.bincount(owner[sub.kind != _STR], minlength=k) > 0
            offsets = np.zeros(k + 1, np.int32)
            np.cumsum(_count(k, owner), out=offsets[1:])
            listed = pa.ListArray.from_arrays(pa.array(offsets), sub.str,
                                              mask=pa.array(not_str)).cast(pa.list_(pa.string()))
            at = np.full(n, -1, np.int64)
            at[rows] = np.arange(k)
            strings = listed.take(pa.array(at, mask=at < 0))
        else:
            attrs = _attrs(_nested(ctx.kv_h, data), owner, k, depth + 1, ctx)
            text, bad_rows = attrs.json, attrs.bad if attrs.bad.any() else None
        place(m, text)
        if bad_rows is not None:
            bad[rows[bad_rows]] = True
    parts.append(pa.array(["null"], pa.string()))
    index[index < 0] = base
    out = pa.concat_arrays(parts).take(pa.array(index)) if n else pa.array([], pa.string())
    return _Values(out, kind, bad, sv, iv, dv, bv, strings)


@dataclass
class _Attrs:
    """One attribute list per owner (span, event, link, resource or kvlist value)."""

    json: pa.Array
    """The JSON object stored for each owner."""
    size: np.ndarray[Any, Any]
    """Characters of each owner's whole JSON object (what :data:`MAX_SPAN_ATTR_BYTES` limits)."""
    bad: np.ndarray[Any, Any]
    typed: dict[str, Any]
    """Typed column name → values per owner (an Arrow array or a list), for keys present."""


def _dedupe(owner: np.ndarray[Any, Any], codes: np.ndarray[Any, Any], distinct: int
            ) -> np.ndarray[Any, Any] | None:
    """Rows to keep when an owner repeats a key (``codes``: the key's index among ``distinct``
    keys): the value of the last, in the place of the first, as a dict does; None when no key
    repeats."""
    if len(codes) < 2:
        return None
    combined = owner * distinct + codes
    if np.unique(combined).size == combined.size:
        return None
    first: dict[int, int] = {}
    rows: list[int] = []
    for i, key in enumerate(combined.tolist()):
        j = first.get(key)
        if j is None:
            first[key] = len(rows)
            rows.append(i)
        else:
            rows[j] = i
    return np.asarray(rows, np.int64)


def _py(values: _Values, row: int) -> Any:
    """The converted Python value of one row (its JSON text read back)."""
    return orjson.loads(values.json[row].as_py())


_MATCH_CACHE: dict[tuple[str, str], bool] = {}
_MATCH_CACHE_MAX: Final = 65_536


def _matches(regex: str, keys: list[str]) -> np.ndarray[Any, Any]:
    """Which ``keys`` (distinct) the drop pattern matches, case-insensitively (cached: keys
    repeat from request to request; bounded, as keys are the sender's choice)."""
    cache = _MATCH_CACHE
    out = np.zeros(len(keys), bool)
    compiled = None
    for i, key in enumerate(keys):
        hit = cache.get((regex, key))
        if hit is None:
            if compiled is None:
                compiled = _compiled(regex)
            hit = compiled.match(key) is not None
            if len(cache) >= _MATCH_CACHE_MAX:
                cache.clear()
            cache[(regex, key)] = hit
        out[i] = hit
    return out


@lru_cache(maxsize=64)
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(regex, re.IGNORECASE | re.DOTALL)


def _attrs(kv: pa.Array, owner: np.ndarray[Any, Any], n: int, depth: int, ctx: _Ctx, *,
           typed: Mapping[str, tuple[str, str]] | None = None, once: Mapping[str, str] | None = None,
           apart: bool = False) -> _Attrs:
    """The attributes ``kv`` (``KeyValue`` rows; ``owner``: whose, non-decreasing) of ``n``
    owners. Keys matching the drop pattern are dropped and counted. ``typed``: the typed
    columns to fill; ``once``: typed keys left out of the JSON when held exactly; ``apart``:
    span attributes, where :data:`_APART` has its own rule.

    Work per key (matching, quoting, lookups) is done once per distinct key of the request."""
    encoded = pc.dictionary_encode(_sf(kv, "key"))
    distinct: list[str] = encoded.dictionary.to_pylist()
    codes = _np(encoded.indices)
    vals = _sf(kv, "value")
    if ctx.regex is not None and len(codes):
        hit = _matches(ctx.regex, distinct)[codes]
        if hit.any():
            ctx.dropped += int(hit.sum())
            vals, owner, codes = vals.filter(pa.array(~hit)), owner[~hit], codes[~hit]
    is_apart = None
    if apart and _APART in distinct:
        is_apart = codes == distinct.index(_APART)
    limit = np.where(is_apart, MAX_APART_LEN, MAX_STRING_LEN) if is_apart is not None else None
    values = _values(vals, depth, ctx, limit, is_apart)
    rows = _dedupe(owner, codes, len(distinct))
    if rows is not None:
        owner, codes = owner[rows], codes[rows]
        values = values.take(rows)
        if is_apart is not None:
            is_apart = is_apart[rows]
    kind = values.kind
    quoted = _quote(pa.array(distinct, pa.string())).take(pa.array(codes, pa.int32()))
    frags = pc.binary_join_element_wise(quoted, values.json, ": ")
    whole = np.ones(len(codes), bool) if is_apart is None else ~(is_apart & (kind == _STR))
    lens = _np(pc.utf8_length(frags))
    cnt = np.bincount(owner[whole], minlength=n) if n else np.zeros(0, np.int64)
    size = 2 + np.bincount(owner[whole], weights=lens[whole], minlength=n).astype(np.int64) \
        + 2 * np.maximum(cnt - 1, 0)
    bad = np.bincount(owner[values.bad], minlength=n) > 0 if values.bad.any() else np.zeros(n, bool)
    cols: dict[str, Any] = {}
    stored = whole
    if typed and len(codes):
        held = np.zeros(len(codes), bool)
        for code, key in enumerate(distinct):
            spec = typed.get(key)
            if spec is None:
                continue
            col, typ = spec
            sel = np.nonzero(codes == code)[0]
            if not sel.size:
                continue
            pos = np.full(n, -1, np.int64)
            pos[owner[sel]] = sel
            at = pa.array(pos, mask=pos < 0)
            want = _EXACT_KIND.get(typ)
            kinds = kind[sel]
            if want is not None and ((kinds == want) | (kinds == _NONE)).all():
                child = {_STR: values.str, _INT: values.int, _DBL: values.dbl, _BOOL: values.bool}[want]
                cols[col] = child.take(at)
                if once is not None and key in once:
                    held[sel] = kinds == want
                continue
            if typ == "VARCHAR[]" and values.strings is not None and (kinds == _ARR).all() \
                    and values.strings.take(pa.array(sel)).null_count == 0:
                cols[col] = values.strings.take(at)  # arrays of strings only: held exactly
                if once is not None and key in once:
                    held[sel] = True
                continue
            pyvals: list[Any] = [None] * n
            for r in sel.tolist():
                v = _py(values, r)
                pyvals[int(owner[r])] = v
                if once is not None and key in once and _held_exactly(v, typ):
                    held[r] = True
            cols[col] = _coerce_column(pyvals, typ)
        stored = whole & ~held
    json_text = _join(owner[stored], n, frags.filter(pa.array(stored)), "{", "}")
    return _Attrs(json_text, size, bad, cols)


def _empty_null(arr: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(arr, ""), _NULL_STR, arr)


def _names(codes: pa.Array, names: tuple[str, ...]) -> pa.Array:
    c = _np(codes)
    return pa.array(names, pa.string()).take(pa.array(np.where((c >= 0) & (c < len(names)), c, 0)))


def _typed_arrays(n: int, typed: Mapping[str, tuple[str, str]], cols: dict[str, Any],
                  schema: pa.Schema, rows: np.ndarray[Any, Any] | None = None) -> dict[str, pa.Array]:
    """Every typed column of ``typed``: ``cols`` (taken at ``rows``) or nulls."""
    out: dict[str, pa.Array] = {}
    at = None if rows is None else pa.array(rows)
    for _key, (col, _typ) in typed.items():
        typ = schema.field(col).type
        values = cols.get(col)
        if values is None:
            out[col] = pa.nulls(n, typ)
            continue
        arr = values if isinstance(values, pa.Array) else pa.array(values, typ)
        if arr.type != typ:
            arr = arr.cast(typ)
        out[col] = arr if at is None else arr.take(at)
    return out


def _rejection(sid: bytes, name: str, problem: str) -> str:
    return f"span {sid.hex() or '?'} ({name[:60]!r}): {problem}"


def decode_protobuf(body: bytes, received_ns: int, *, keep_prompts: bool = False,
                    drop_attributes: Sequence[str] = ()) -> DecodedBatch:
    """Decode a binary ``ExportTraceServiceRequest`` straight from its bytes.

    :class:`PayloadError` for a body that is not one (malformed wire data, invalid UTF-8 in a
    string, a malformed nested value). Spans are rejected one by one, with a reason each: ids of
    the wrong length or all zero, timestamps out of range or reversed, a value nested deeper than
    :data:`MAX_VALUE_DEPTH`, attributes and events over :data:`MAX_SPAN_ATTR_BYTES`. A span
    whose trace and span id an earlier span of the request had is left out, with its events
    (:attr:`DecodedBatch.duplicate_spans`). Attributes matching :data:`PROMPT_PATTERNS` (unless
    ``keep_prompts``) or ``drop_attributes`` are dropped and counted.
    """
    req_h, _any_h, _kv_h = _handlers()
    try:
        batch = req_h.list_to_record_batch([body])
    except (ValueError, RuntimeError, OverflowError) as exc:
        raise _not_protobuf(exc) from exc
    ctx = _Ctx(_drop_regex(keep_prompts, tuple(drop_attributes)))
    rs = pc.list_flatten(batch.column(0))
    n_res = len(rs)
    res_kv, res_owner = _parents(_sf(_sf(rs, "resource"), "attributes"))
    res = _attrs(res_kv, res_owner, n_res, 0, ctx, typed=semconv.TYPED_RESOURCE_ATTRIBUTES)
    ss, ss_res = _parents(_sf(rs, "scope_spans"))
    sp, sp_ss = _parents(_sf(ss, "spans"))
    sp_res = ss_res[sp_ss]
    rejected: list[tuple[int, int, str]] = []  # (span position, order, reason)

    per_res = _count(n_res, sp_res)
    res_first = np.concatenate([[0], np.cumsum(per_res)[:-1]]) if n_res else per_res
    for r in np.nonzero(res.bad)[0].tolist():
        rejected.append((int(res_first[r]), 0, f"{int(per_res[r])} span(s) rejected: resource attribute value "
                         f"nested deeper than {MAX_VALUE_DEPTH} levels"))

    tid, sid, pid = _sf(sp, "trace_id"), _sf(sp, "span_id"), _sf(sp, "parent_span_id")
    start = _np(_sf(sp, "start_time_unix_nano"), np.uint64)
    end = _np(_sf(sp, "end_time_unix_nano"), np.uint64)
    tid_len, sid_len, pid_len = (_np(pc.binary_length(a)) for a in (tid, sid, pid))
    tid_ok = (tid_len == 16) & ~_mask_np(pc.equal(tid, pa.scalar(bytes(16), pa.binary())))
    sid_ok = (sid_len == 8) & ~_mask_np(pc.equal(sid, pa.scalar(bytes(8), pa.binary())))
    in_range = (start >= _MIN_NS) & (start <= _MAX_NS) & (end >= _MIN_NS) & (end <= _MAX_NS)
    ok = tid_ok & sid_ok & ((pid_len == 0) | (pid_len == 8)) & in_range & (end >= start)
    ok &= ~res.bad[sp_res] if n_res else ok
    for i in np.nonzero(~ok & ~(res.bad[sp_res] if n_res else False))[0].tolist():
        s, e = int(start[i]), int(end[i])
        if not tid_ok[i]:
            problem = f"trace_id must be 16 non-zero bytes, got {int(tid_len[i])}"
        elif not sid_ok[i]:
            problem = f"span_id must be 8 non-zero bytes, got {int(sid_len[i])}"
        elif pid_len[i] not in (0, 8):
            problem = f"parent_span_id must be 8 bytes, got {int(pid_len[i])}"
        elif not in_range[i]:
            problem = f"timestamps out of range (start {s}, end {e} ns)"
        else:
            problem = f"ends before it starts (start {s}, end {e} ns)"
        rejected.append((i, 1, _rejection(sid[i].as_py(), _sf(sp, "name")[i].as_py(), problem)))

    good = np.nonzero(ok)[0]
    sp = sp.take(pa.array(good))
    n = len(good)
    sp_res, sp_ss, start, end = sp_res[good], sp_ss[good], start[good], end[good]
    span_typed = stored_once(semconv.TYPED_SPAN_ATTRIBUTES)
    kv, owner = _parents(_sf(sp, "attributes"))
    attrs = _attrs(kv, owner, n, 0, ctx, typed=semconv.TYPED_SPAN_ATTRIBUTES, once=span_typed, apart=True)
    ev_lists = _sf(sp, "events")
    ev, ev_sp = _parents(ev_lists)
    n_ev = len(ev)
    ev_kv, ev_owner = _parents(_sf(ev, "attributes"))
    ev_attrs = _attrs(ev_kv, ev_owner, n_ev, 0, ctx, typed=semconv.TYPED_EVENT_ATTRIBUTES)
    size = attrs.size + (np.bincount(ev_sp, weights=ev_attrs.size, minlength=n).astype(np.int64)
                         if n_ev else 0)
    bad = attrs.bad | ((np.bincount(ev_sp[ev_attrs.bad], minlength=n) > 0) if n_ev else False)
    links_json = _links(sp, n, ctx)
    bad |= links_json[1]
    for i in np.nonzero(bad | (size > MAX_SPAN_ATTR_BYTES))[0].tolist():
        problem = (f"attribute value nested deeper than {MAX_VALUE_DEPTH} levels" if bad[i] else
                   f"attributes and events are {int(size[i])} bytes, over {MAX_SPAN_ATTR_BYTES}")
        rejected.append((int(good[i]), 1, _rejection(_sf(sp, "span_id")[i].as_py(),
                                                     _sf(sp, "name")[i].as_py(), problem)))
    keep = ~bad & (size <= MAX_SPAN_ATTR_BYTES)
    tid_hex, sid_hex = _hex(_sf(sp, "trace_id")), _hex(_sf(sp, "span_id"))
    seen: set[tuple[str, str]] = set()
    duplicates = 0
    for i, key in enumerate(zip(tid_hex.to_pylist(), sid_hex.to_pylist(), strict=True)):
        if keep[i]:
            if key in seen:
                keep[i] = False
                duplicates += 1
            else:
                seen.add(key)

    pid = _sf(sp, "parent_span_id")
    pid_zero = _mask_np(pc.equal(pid, pa.scalar(bytes(8), pa.binary())))
    pid_hex = pc.if_else(pa.array(pid_zero | (_np(pc.binary_length(pid)) == 0)), _NULL_STR, _hex(pid))
    scope = _sf(ss, "scope")
    at_ss, at_res = pa.array(sp_ss), pa.array(sp_res)
    status = _sf(sp, "status")
    cols: dict[str, Any] = {
        "trace_id": tid_hex, "span_id": sid_hex, "parent_span_id": pid_hex,
        "trace_state": _empty_null(_sf(sp, "trace_state")), "name": _sf(sp, "name"),
        "kind": _names(_sf(sp, "kind"), _KINDS),
        "start_ns": pa.array(start.astype(np.int64)), "end_ns": pa.array(end.astype(np.int64)),
        "status_code": _names(pc.fill_null(_sf(status, "code"), 0), _STATUS),
        "status_message": _empty_null(pc.fill_null(_sf(status, "message"), "")),
        "flags": pc.cast(_sf(sp, "flags"), pa.int64()),
        "scope_name": _empty_null(pc.fill_null(_sf(scope, "name"), "")).take(at_ss),
        "scope_version": _empty_null(pc.fill_null(_sf(scope, "version"), "")).take(at_ss),
        "received_ns": pa.array(np.full(n, received_ns, np.int64)),
        "attributes": attrs.json,
        "resource_attributes": res.json.take(at_res),
        "links": links_json[0],
        "event_count": pc.cast(pc.list_value_length(ev_lists), pa.int64()),
        "dropped_attributes_count": pc.cast(_sf(sp, "dropped_attributes_count"), pa.int64()),
    }
    cols.update(_typed_arrays(n, semconv.TYPED_RESOURCE_ATTRIBUTES, res.typed, RAW_SPANS_SCHEMA, sp_res))
    cols.update(_typed_arrays(n, semconv.TYPED_SPAN_ATTRIBUTES, attrs.typed, RAW_SPANS_SCHEMA))
    spans = pa.Table.from_pydict(cols, schema=RAW_SPANS_SCHEMA)

    ev_time = _np(_sf(ev, "time_unix_nano"), np.uint64)
    ev_time = np.where((ev_time >= _MIN_NS) & (ev_time <= _MAX_NS), ev_time, start[ev_sp]).astype(np.int64)
    firsts = np.concatenate([[0], np.cumsum(_count(n, ev_sp))[:-1]]) if n else np.zeros(0, np.int64)
    at_sp = pa.array(ev_sp)
    ev_cols: dict[str, Any] = {
        "trace_id": tid_hex.take(at_sp), "span_id": sid_hex.take(at_sp),
        "event_index": pa.array(np.arange(n_ev, dtype=np.int64) - firsts[ev_sp]),
        "name": _sf(ev, "name"), "time_ns": pa.array(ev_time), "attributes": ev_attrs.json,
    }
    ev_cols.update(_typed_arrays(n_ev, semconv.TYPED_EVENT_ATTRIBUTES, ev_attrs.typed, RAW_SPAN_EVENTS_SCHEMA))
    events = pa.Table.from_pydict(ev_cols, schema=RAW_SPAN_EVENTS_SCHEMA)
    if not keep.all():
        spans = spans.filter(pa.array(keep))
        events = events.filter(pa.array(keep[ev_sp])) if n_ev else events
    spans, events, malformed = _candidate_events.expand(spans, events)
    rejected.sort(key=lambda r: (r[0], r[1]))
    return DecodedBatch(spans=spans, events=events, rejected=[r[2] for r in rejected],
                        truncated_values=ctx.truncated, prompt_values_dropped=ctx.dropped,
                        candidate_json_malformed=malformed, duplicate_spans=duplicates)


def _links(sp: pa.Array, n: int, ctx: _Ctx) -> tuple[pa.Array, np.ndarray[Any, Any]]:
    """The links column (JSON text, null for none) and which spans hold a value nested too deep."""
    lists = _sf(sp, "links")
    lk, lk_sp = _parents(lists)
    if len(lk) == 0:
        return pa.nulls(n, pa.string()), np.zeros(n, bool)
    kv, owner = _parents(_sf(lk, "attributes"))
    attrs = _attrs(kv, owner, len(lk), 0, ctx)
    texts: list[str | None] = [None] * n
    per_span: dict[int, list[dict[str, Any]]] = {}
    for i, (t, s, state, a) in enumerate(zip(
            _sf(lk, "trace_id").to_pylist(), _sf(lk, "span_id").to_pylist(),
            _sf(lk, "trace_state").to_pylist(), attrs.json.to_pylist(), strict=True)):
        per_span.setdefault(int(lk_sp[i]), []).append(
            {"trace_id": t.hex(), "span_id": s.hex(), "trace_state": state or None,
             "attributes": orjson.loads(a)})
    for i, links in per_span.items():
        texts[i] = json.dumps(links, default=str)
    bad = np.bincount(lk_sp[attrs.bad], minlength=n) > 0 if attrs.bad.any() else np.zeros(n, bool)
    return pa.array(texts, pa.string()), bad


def decode(req: ExportTraceServiceRequest, received_ns: int, *, keep_prompts: bool = False,
           drop_attributes: Sequence[str] = ()) -> DecodedBatch:
    """:func:`decode_protobuf` of a parsed request (serialized again: one decoder)."""
    return decode_protobuf(req.SerializeToString(), received_ns, keep_prompts=keep_prompts,
                           drop_attributes=drop_attributes)


class _ValueConverter:
    """AnyValue → plain Python as the decoder stores it (strings truncated, non-finite doubles
    None, bytes as base64, prompt keys dropped at any depth unless ``keep_prompts``): for
    callers that hold upb messages (benchmarks, tests). Counts truncations and drops."""

    def __init__(self, keep_prompts: bool = False) -> None:
        self.truncated = 0
        self.prompts_dropped = 0
        self.keep_prompts = keep_prompts
        self.apart_string = False
        """Whether the last span attributes read held :data:`_APART` as a string value."""

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
        if which == "bytes_value":
            return base64.b64encode(v.bytes_value[:MAX_STRING_LEN]).decode("ascii")
        if which is None:
            return None
        if depth >= MAX_VALUE_DEPTH:
            raise ValueError(f"attribute value nested deeper than {MAX_VALUE_DEPTH} levels")
        if which == "array_value":
            return [self.convert(x, depth + 1) for x in v.array_value.values]
        return self.attrs(v.kvlist_value.values, depth=depth + 1)

    def attrs(self, kvs: Any, span: bool = False, depth: int = 0) -> dict[str, Any]:
        """One attribute list → dict. ``span``: a span's own attributes, where :data:`_APART`
        has its own string limit."""
        out: dict[str, Any] = {}
        if span:
            self.apart_string = False
        for kv in kvs:
            key = kv.key
            if not self.keep_prompts and is_prompt_key(key):
                self.prompts_dropped += 1
                continue
            if span and key == _APART:
                self.apart_string = kv.value.WhichOneof("value") == "string_value"
                if self.apart_string:
                    s = kv.value.string_value
                    if len(s) > MAX_APART_LEN:
                        self.truncated += 1
                    out[key] = s[:MAX_APART_LEN]
                    continue
            out[key] = self.convert(kv.value, depth)
        return out
