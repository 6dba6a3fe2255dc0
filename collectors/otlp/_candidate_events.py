"""Expand the compact candidate encoding into candidate event rows, at ingest.

A decision span may carry its candidates in one JSON string attribute
(:data:`audit.semconv.DECISION_CANDIDATES`, the recorder's default) instead of one
:data:`audit.semconv.EVENT_CANDIDATE` span event per candidate. The store keeps the attribute
verbatim and also writes one ``raw_span_events`` row per candidate, exactly as if the events had
been sent, so the SQL reads one form. Expanding here costs one ``orjson.loads`` per decision;
expanding in SQL (``from_json`` + ``unnest``) cost about 16 µs per decision at analysis time,
which is most of the analysis budget at a million requests.

The rows get event indexes after the span's real events (``event_count + i``), so a retried
export produces the same keys and is stored once. Their ``attributes`` column is NULL: the
verbatim JSON is the span's attribute; the rows carry the typed ``c_*`` facts.
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson
import pyarrow as pa

from audit import semconv
from audit.schema import RAW_SPAN_EVENTS_SCHEMA

MAX_CANDIDATES: Final = 4096
"""Candidates expanded per decision at most; more are ignored (the attribute keeps them all)."""

_COLUMN: Final = semconv.TYPED_SPAN_ATTRIBUTES[semconv.DECISION_CANDIDATES][0]


def _short_typed() -> dict[str, tuple[str, str]]:
    """The typed event columns keyed by the candidates' short JSON keys."""
    return {short: semconv.TYPED_EVENT_ATTRIBUTES[key]
            for key, short in semconv.CANDIDATE_JSON_KEYS.items()
            if key in semconv.TYPED_EVENT_ATTRIBUTES}


def expand(spans: pa.Table, events: pa.Table) -> tuple[pa.Table, pa.Table, int]:
    """``spans`` and ``events`` plus one event row per candidate of every decision span that
    carries the JSON attribute, and the number of attributes that were not a JSON array of
    objects (kept verbatim and expanded to nothing).

    The typed copy of the attribute is emptied in the returned spans once expanded: the text
    stays in the span's ``attributes`` JSON, and a second copy cost 1.2 GB per million
    decisions on disk."""
    if _COLUMN not in spans.column_names or spans.num_rows == 0:
        return spans, events, 0
    column = spans.column(_COLUMN)
    if column.null_count == len(column):
        return spans, events, 0
    # the decoders fill the typed columns; only these rows need the other fields
    from collectors.otlp._decode import _typed_columns  # noqa: PLC0415 - avoids an import cycle

    mask = column.is_valid()
    picked = spans.filter(mask).select(
        ["trace_id", "span_id", "event_count", "start_ns", "a_decision_time_ns", _COLUMN])
    spans = spans.set_column(spans.schema.get_field_index(_COLUMN), spans.schema.field(_COLUMN),
                             pa.nulls(spans.num_rows, column.type))
    rows: list[tuple[str, str, int, int]] = []
    dicts: list[dict[str, Any]] = []
    malformed = 0
    strict = True  # every attribute was strict JSON (no NaN / Infinity)
    for trace_id, span_id, event_count, start_ns, decided_ns, text in zip(
            *(picked.column(i).to_pylist() for i in range(picked.num_columns)), strict=True):
        cands, was_strict = _parse(text)
        if cands is None:
            malformed += 1
            continue
        strict = strict and was_strict
        at = decided_ns if decided_ns is not None else start_ns
        for i, cand in enumerate(cands[:MAX_CANDIDATES]):
            rows.append((trace_id, span_id, (event_count or 0) + i, at))
            dicts.append(cand)
    if not rows:
        return spans, events, malformed
    cols: dict[str, list[Any]] = {
        "trace_id": [r[0] for r in rows],
        "span_id": [r[1] for r in rows],
        "event_index": [r[2] for r in rows],
        "name": [semconv.EVENT_CANDIDATE] * len(rows),
        "time_ns": [r[3] for r in rows],
        # the verbatim JSON is the span's attribute; these rows carry only the typed facts
        "attributes": [None] * len(rows),
    }
    typed = _short_typed()
    arrays: dict[str, Any] = dict(cols)
    facts = _fast_facts(dicts, typed) if strict else None
    if facts is not None:
        arrays.update(facts)
    else:  # the decoder's own coercion, value by value (non-finite numbers become NULL)
        _typed_columns(arrays, dicts, typed)
    for name in RAW_SPAN_EVENTS_SCHEMA.names:
        arrays.setdefault(name, pa.nulls(len(rows), RAW_SPAN_EVENTS_SCHEMA.field(name).type))
    extra = pa.Table.from_pydict(arrays, schema=RAW_SPAN_EVENTS_SCHEMA)
    return spans, (pa.concat_tables([events, extra]) if events.num_rows else extra), malformed


def _fast_facts(dicts: list[dict[str, Any]], typed: dict[str, tuple[str, str]]
                ) -> dict[str, pa.Array] | None:
    """The typed columns converted by Arrow in one pass, when every value already has its
    column's type (or an int where a double goes); None when one does not (then the slower
    coercion of the Python decoder applies, which turns e.g. ``"3"`` into 3)."""
    fields = [pa.field(short, RAW_SPAN_EVENTS_SCHEMA.field(col).type) for short, (col, _) in typed.items()]
    try:
        struct = pa.array(dicts, type=pa.struct(fields))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return None
    return {col: struct.field(i) for i, (col, _) in enumerate(typed.values())}


def _parse(text: str) -> tuple[list[dict[str, Any]] | None, bool]:
    """The candidates, and whether the text was strict JSON (orjson refuses NaN / Infinity,
    which Python's encoder writes; those texts take the slower path)."""
    strict = True
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        strict = False
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return None, False
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        return None, strict
    return value, strict
