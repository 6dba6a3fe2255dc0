"""The candidate expansion of the prototype decoder (benchmarks/ptars_prototype/decode.py):
``collectors.otlp._candidate_events`` without its C path; Arrow's JSON reader for plain texts.

Expand the compact candidate encoding into candidate event rows, at ingest.

A decision span may carry its candidates in one JSON string attribute
(:data:`semconv.DECISION_CANDIDATES`, the recorder's default) instead of one
:data:`semconv.EVENT_CANDIDATE` span event per candidate. The store keeps the attribute
verbatim and also writes one ``raw_span_events`` row per candidate, exactly as if the events had
been sent, so the SQL reads one form: ``orjson.loads``, then one Arrow struct conversion (or,
for values of other types, the decoder's coercion value by value). Expanding in SQL
(``from_json`` + ``unnest``) cost about 16 µs per decision at
analysis time, most of the analysis budget at a million requests.

The rows get event indexes after the span's real events (``event_count + i``), so a retried
export produces the same keys and is stored once. Their ``attributes`` column is NULL: the rows
carry the typed ``c_*`` facts.

The text is stored once (which made ingest 16 % faster). The decoders leave it out of the span's
``attributes`` JSON and put it in the typed column
``a_decision_candidates``, which :func:`expand` empties where the rows hold all of it: an array
of objects, at most :data:`MAX_CANDIDATES`, every key one a column takes, every value of its
column's kind. Any other text (malformed, empty, longer, a key no column takes, a value the
expansion converts, e.g. ``"3"`` for a count) stays verbatim there.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

import semconv
from audit.schema import RAW_SPAN_EVENTS_SCHEMA

MAX_CANDIDATES: Final = 4096
"""Candidates expanded per decision at most; the text of a decision with more is kept verbatim."""

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

    In the returned spans the typed column of the attribute keeps only the texts that the rows
    do not hold whole (the module docstring says which); the others are NULL."""
    if _COLUMN not in spans.column_names or spans.num_rows == 0:
        return spans, events, 0
    column = spans.column(_COLUMN)
    if column.null_count == len(column):
        return spans, events, 0
    # the decoders fill the typed columns; only these rows need the other fields
    mask = column.is_valid()
    picked = spans.select(
        ["trace_id", "span_id", "event_count", "start_ns", "a_decision_time_ns", _COLUMN]).filter(mask)
    extra, malformed, keep = _expand_rows(picked)
    text = column.combine_chunks()
    kept = pc.if_else(keep, picked.column(_COLUMN).combine_chunks(), pa.scalar(None, column.type))
    spans = spans.set_column(spans.schema.get_field_index(_COLUMN), spans.schema.field(_COLUMN),
                             pc.replace_with_mask(text, text.is_valid(), kept))
    if extra is None:
        return spans, events, malformed
    return spans, (pa.concat_tables([events, extra]) if events.num_rows else extra), malformed


def _rows(cols: dict[str, Any], typed_cols: dict[str, Any], n: int) -> pa.Table:
    arrays = dict(cols)
    arrays["name"] = pa.array([semconv.EVENT_CANDIDATE] * n, pa.string())
    # the verbatim JSON is the span's attribute; these rows carry only the typed facts
    arrays["attributes"] = pa.nulls(n, pa.string())
    arrays.update(typed_cols)
    for name in RAW_SPAN_EVENTS_SCHEMA.names:
        arrays.setdefault(name, pa.nulls(n, RAW_SPAN_EVENTS_SCHEMA.field(name).type))
    return pa.Table.from_pydict(arrays, schema=RAW_SPAN_EVENTS_SCHEMA)


def _expand_rows(picked: pa.Table) -> tuple[pa.Table | None, int, pa.Array]:
    """The candidate rows, the malformed count and which texts to keep: by Arrow's JSON reader
    for batches of plain texts (:func:`_expand_plain`), else text by text."""
    done = _expand_plain(picked)
    return done if done is not None else _expand_each(picked)


_DOUBLE_EXACT: Final = float(2 ** 53)


def _expand_plain(picked: pa.Table) -> tuple[pa.Table | None, int, pa.Array] | None:
    """The expansion when every text of the batch is one the typed columns hold whole (arrays of
    at most :data:`MAX_CANDIDATES` objects, every key a column's, every value of its column's
    kind, doubles finite and exact), read in one pass by Arrow's JSON reader with an explicit
    schema that refuses anything else; None when one text is not (the batch then goes text by
    text, which gives the same rows for these texts)."""
    typed = _short_typed()
    fields = [pa.field(short, RAW_SPAN_EVENTS_SCHEMA.field(col).type) for short, (col, _) in typed.items()]
    text = picked.column(_COLUMN).combine_chunks()
    if pc.any(pc.match_substring_regex(text, r"[\r\n]")).as_py():
        return None  # one line per text below
    lines = pc.binary_join_element_wise('{"c":', text, "}\n", "")
    data = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines), "")[0]
    schema = pa.schema([pa.field("c", pa.list_(pa.struct(fields)))])
    try:
        table = pa_json.read_json(
            pa.BufferReader(data.as_buffer()), read_options=pa_json.ReadOptions(use_threads=False),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error"))
        lists = table.column("c").combine_chunks()
        lists.validate(full=True)  # the reader does not check escapes for valid UTF-8
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if len(lists) != len(text) or lists.null_count:
        return None
    counts = pc.list_value_length(lists)
    if pc.max(counts).as_py() > MAX_CANDIDATES:
        return None
    flat = pc.list_flatten(lists)
    for f in fields:
        if pa.types.is_floating(f.type):
            v = pc.struct_field(flat, f.name)
            if not pc.all(pc.fill_null(pc.and_(pc.is_finite(v), pc.less_equal(pc.abs(v), _DOUBLE_EXACT)),
                                       True)).as_py():
                return None
    keep = pc.equal(counts, 0)
    n = len(flat)
    if n == 0:
        return None, 0, keep
    parent = pc.list_parent_indices(lists)
    firsts = pc.subtract(pc.cumulative_sum(counts), counts)
    position = pc.subtract(pa.array(range(n), pa.int64()), pc.cast(firsts, pa.int64()).take(parent))
    cols = {
        "trace_id": picked.column("trace_id").combine_chunks().take(parent),
        "span_id": picked.column("span_id").combine_chunks().take(parent),
        "event_index": pc.add(pc.fill_null(picked.column("event_count"), 0).combine_chunks().take(parent),
                              position),
        "time_ns": pc.coalesce(picked.column("a_decision_time_ns"),
                               picked.column("start_ns")).combine_chunks().take(parent),
    }
    facts = {col: pc.struct_field(flat, short) for short, (col, _) in typed.items()}
    return _rows(cols, facts, n), 0, keep


def _expand_each(picked: pa.Table) -> tuple[pa.Table | None, int, pa.Array]:
    """The expansion text by text: orjson, then one Arrow struct conversion (or, for values of
    other types, the decoder's coercion value by value)."""
    from .decode import _coerce_column  # noqa: PLC0415 - avoids an import cycle

    rows: list[tuple[str, str, int, int]] = []
    dicts: list[dict[str, Any]] = []
    keep: list[bool] = []
    malformed = 0
    strict = True  # every attribute was strict JSON (no NaN / Infinity)
    typed = _short_typed()
    for trace_id, span_id, event_count, start_ns, decided_ns, text in zip(
            *(picked.column(i).to_pylist() for i in range(picked.num_columns)), strict=True):
        cands, was_strict = _parse(text)
        if cands is None:
            malformed += 1
            keep.append(True)
            continue
        strict = strict and was_strict
        keep.append(not cands or len(cands) > MAX_CANDIDATES
                    or not all(_held_whole(cand, typed) for cand in cands))
        at = decided_ns if decided_ns is not None else start_ns
        for i, cand in enumerate(cands[:MAX_CANDIDATES]):
            rows.append((trace_id, span_id, (event_count or 0) + i, at))
            dicts.append(cand)
    if not rows:
        return None, malformed, pa.array(keep, pa.bool_())
    cols: dict[str, Any] = {
        "trace_id": [r[0] for r in rows],
        "span_id": [r[1] for r in rows],
        "event_index": [r[2] for r in rows],
        "time_ns": [r[3] for r in rows],
    }
    facts = _fast_facts(dicts, typed) if strict else None
    if facts is None:  # the decoder's own coercion, value by value (non-finite numbers become NULL)
        facts = {col: _coerce_column([d.get(short) for d in dicts], typ)
                 for short, (col, typ) in typed.items()}
    return _rows(cols, facts, len(rows)), malformed, pa.array(keep, pa.bool_())


_EXACT: Final = 2 ** 53
"""Integers up to this size are exact as doubles."""


def _held_whole(cand: dict[str, Any], typed: dict[str, tuple[str, str]]) -> bool:
    """Whether the typed columns hold this candidate object whole: every key one a column
    takes, every value null or of its column's kind (an integer where a double goes, exact).
    """
    for key, value in cand.items():
        spec = typed.get(key)
        if spec is None:
            return False
        if value is None:
            continue
        typ, kind = spec[1], type(value)
        if typ == "VARCHAR":
            ok = kind is str
        elif typ == "BOOLEAN":
            ok = kind is bool
        elif typ == "BIGINT":
            ok = kind is int and -2 ** 63 <= value < 2 ** 63
        elif typ == "DOUBLE":
            ok = (kind is float and math.isfinite(value)) or (kind is int and -_EXACT <= value <= _EXACT)
        else:
            ok = False
        if not ok:
            return False
    return True


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
            # a lone surrogate (\ud800) parses here but is no UTF-8 text: Arrow would refuse
            # the whole batch, so the attribute counts as malformed instead
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except (ValueError, RecursionError):
            return None, False
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        return None, strict
    return value, strict
