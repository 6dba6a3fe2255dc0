"""Expand the compact candidate encoding into candidate event rows, at ingest.

A decision span may carry its candidates in one JSON string attribute
(:data:`audit.semconv.DECISION_CANDIDATES`, the recorder's default) instead of one
:data:`audit.semconv.EVENT_CANDIDATE` span event per candidate. The store keeps the attribute
verbatim and also writes one ``raw_span_events`` row per candidate, exactly as if the events had
been sent, so the SQL reads one form. Expanding here costs one ``json.loads`` per decision;
expanding in SQL (``from_json`` + ``unnest``) cost about 16 µs per decision at analysis time,
which is most of the analysis budget at a million requests.

The rows get event indexes after the span's real events (``event_count + i``), so a retried
export produces the same keys and is stored once.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import pyarrow as pa

from audit import semconv
from audit.schema import RAW_SPAN_EVENTS_SCHEMA

MAX_CANDIDATES: Final = 4096
"""Candidates expanded per decision at most; more are ignored (the attribute keeps them all)."""

_FULL_KEY: Final = {short: key for key, short in semconv.CANDIDATE_JSON_KEYS.items()}
_COLUMN: Final = semconv.TYPED_SPAN_ATTRIBUTES[semconv.DECISION_CANDIDATES][0]
_ENCODE: Final = json.JSONEncoder(ensure_ascii=False, default=str).encode


def expand(spans: pa.Table, events: pa.Table) -> tuple[pa.Table, int]:
    """``events`` plus one row per candidate of every decision span of ``spans`` that carries
    the JSON attribute; also the number of attributes that were not a JSON array of objects
    (those are kept verbatim and expanded to nothing)."""
    if _COLUMN not in spans.column_names or spans.num_rows == 0:
        return events, 0
    column = spans.column(_COLUMN)
    if column.null_count == len(column):
        return events, 0
    # the decoders fill the typed columns; only these rows need the other fields
    from collectors.otlp._decode import _typed_columns  # noqa: PLC0415 - avoids an import cycle

    mask = column.is_valid()
    picked = spans.filter(mask).select(
        ["trace_id", "span_id", "event_count", "start_ns", "a_decision_time_ns", _COLUMN])
    rows: list[tuple[str, str, int, int]] = []
    dicts: list[dict[str, Any]] = []
    malformed = 0
    for trace_id, span_id, event_count, start_ns, decided_ns, text in zip(
            *(picked.column(i).to_pylist() for i in range(picked.num_columns)), strict=True):
        cands = _parse(text)
        if cands is None:
            malformed += 1
            continue
        at = decided_ns if decided_ns is not None else start_ns
        for i, cand in enumerate(cands[:MAX_CANDIDATES]):
            rows.append((trace_id, span_id, (event_count or 0) + i, at))
            dicts.append({_FULL_KEY.get(k, k): _finite(v) for k, v in cand.items()})
    if not rows:
        return events, malformed
    cols: dict[str, list[Any]] = {
        "trace_id": [r[0] for r in rows],
        "span_id": [r[1] for r in rows],
        "event_index": [r[2] for r in rows],
        "name": [semconv.EVENT_CANDIDATE] * len(rows),
        "time_ns": [r[3] for r in rows],
        "attributes": [_ENCODE(d) for d in dicts],
    }
    _typed_columns(cols, dicts, semconv.TYPED_EVENT_ATTRIBUTES)
    extra = pa.Table.from_pydict(cols, schema=RAW_SPAN_EVENTS_SCHEMA)
    return (pa.concat_tables([events, extra]) if events.num_rows else extra), malformed


def _parse(text: str) -> list[dict[str, Any]] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        return None
    return value


def _finite(value: Any) -> Any:
    # json.loads accepts NaN/Infinity; the typed columns and the JSON text must not carry them
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
