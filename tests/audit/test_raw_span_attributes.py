"""raw_spans.attributes keeps only what its typed columns do not hold exactly; the
``raw_span_attributes`` view must give back every attribute, as the emitter sent it, for spans
decoded by either decoder (and for stores written before, which kept everything in the JSON)."""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from otlp_strategies import attribute_lists

import semconv
from audit import Store
from collectors.otlp import _decode
from collectors.otlp._decode import MAX_SPAN_ATTR_BYTES, decode, decode_protobuf

NOW = 1_764_000_000 * 10**9
SQL = Path(__file__).resolve().parents[2] / "audit" / "sql" / "staging" / "raw_span_attributes.sql"
_ids = itertools.count(1)


def _request(attr_lists: list[list[KeyValue]]) -> tuple[ExportTraceServiceRequest, list[tuple[str, str]]]:
    spans, keys = [], []
    for attrs in attr_lists:
        n = next(_ids)
        tid, sid = n.to_bytes(16, "big"), n.to_bytes(8, "big")
        spans.append(Span(trace_id=tid, span_id=sid, name="s", start_time_unix_nano=NOW,
                          end_time_unix_nano=NOW + 1, attributes=attrs))
        keys.append((tid.hex(), sid.hex()))
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])]), keys


def _whole(span: Span) -> dict[str, Any]:
    """The span's attributes as the decoder read them before only the untyped ones were stored:
    the converter's dict, less a candidates string (stored as rows), through JSON."""
    conv = _decode._ValueConverter()
    attrs = conv.attrs(span.attributes, True)
    if conv.apart_string:
        attrs.pop(semconv.DECISION_CANDIDATES)
    return json.loads(json.dumps(attrs, ensure_ascii=False, default=str))


def _canon(attrs: dict[str, Any]) -> str:
    """Order-free, and kind-exact: 12 and 12.0 (or 0.0 and -0.0) differ."""
    return json.dumps(attrs, sort_keys=True, ensure_ascii=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = Store(tmp_path_factory.mktemp("attrs") / "audit.duckdb", refresh_interval_s=3600)
    yield s
    s.close()


def _view(store: Store, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    # ids inlined (hex): a query with parameters would make the dirty store refresh first
    ids = ", ".join(f"'{t}'" for t in sorted({t for t, _ in keys}))
    got = store.query_arrow(
        f"select trace_id, span_id, attributes::varchar as a from raw_span_attributes "
        f"where trace_id in ({ids})").to_pylist()
    return {(r["trace_id"], r["span_id"]): json.loads(r["a"]) for r in got}


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@given(lists=st.lists(attribute_lists(awkward=True), min_size=1, max_size=12))
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_the_view_gives_back_every_attribute(store: Store, native: bool,
                                             lists: list[list[KeyValue]]) -> None:
    req, keys = _request(lists)
    batch = (decode_protobuf(req.SerializeToString(), time.time_ns()) if native
             else decode(req, time.time_ns()))
    if batch.spans.num_rows == 0:
        return  # rejected (too deep, too large): nothing stored to give back
    store.append(spans=batch.spans, events=batch.events)
    got = _view(store, keys)
    spans = req.resource_spans[0].scope_spans[0].spans
    stored = {(t, s) for t, s in zip(batch.spans.column("trace_id").to_pylist(),
                                     batch.spans.column("span_id").to_pylist(), strict=True)}
    for span, key in zip(spans, keys, strict=True):
        if key not in stored:
            continue
        want, have = _whole(span), got[key]
        if semconv.DECISION_CANDIDATES not in want:
            # a candidates string the rows did not hold whole: verbatim in the typed column
            have.pop(semconv.DECISION_CANDIDATES, None)
        assert _canon(have) == _canon(want)


def test_typed_values_are_stored_once_and_the_rest_verbatim(store: Store) -> None:
    kv = lambda k, **v: KeyValue(key=k, value=AnyValue(**v))  # noqa: E731
    attrs = [
        kv(semconv.REQUEST_ID, string_value="r-1"),                       # held: not in the JSON
        kv(semconv.ATTEMPT, string_value="3"),                            # converted: kept
        kv(semconv.REQUEST_PREFIX_HASHES, array_value=ArrayValue(values=[
            AnyValue(string_value="a"), AnyValue(string_value="b")])),    # held
        kv(semconv.RESPONSE_FINISH_REASONS, array_value=ArrayValue(values=[
            AnyValue(string_value="stop"), AnyValue(int_value=1)])),      # mixed: kept
        kv(semconv.CLIENT_TTFT_MS, int_value=12),                    # int in DOUBLE: kept
        kv(semconv.CLIENT_TPOT_MS, double_value=float("nan")),       # null in the JSON: kept
        kv("team.note", string_value="untyped"),                          # untyped: kept
    ]
    req, keys = _request([attrs])
    for batch in (decode(req, time.time_ns()), decode_protobuf(req.SerializeToString(), time.time_ns())):
        stored = json.loads(batch.spans.column("attributes")[0].as_py())
        assert stored == {semconv.ATTEMPT: "3", semconv.RESPONSE_FINISH_REASONS: ["stop", 1],
                          semconv.CLIENT_TTFT_MS: 12, semconv.CLIENT_TPOT_MS: None,
                          "team.note": "untyped"}
        assert batch.spans.column("a_request_id")[0].as_py() == "r-1"
        assert batch.spans.column("a_attempt")[0].as_py() == 3  # the typed copy still converts
    store.append(spans=batch.spans, events=batch.events)
    assert _canon(_view(store, keys)[keys[0]]) == _canon(_whole(req.resource_spans[0].scope_spans[0].spans[0]))


_VALUES = {  # kind -> AnyValue, and the column types that hold it exactly
    "string": (AnyValue(string_value="7"), {"VARCHAR"}),
    "int": (AnyValue(int_value=7), {"BIGINT"}),
    "double": (AnyValue(double_value=7.0), {"DOUBLE"}),
    "bool": (AnyValue(bool_value=True), {"BOOLEAN"}),
    "empty": (AnyValue(), set()),
    "strings": (AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a")] * 2)), {"VARCHAR[]"}),
    "no elements": (AnyValue(array_value=ArrayValue()), {"VARCHAR[]"}),
    "mixed": (AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a"), AnyValue()])), set()),
    "bytes": (AnyValue(bytes_value=b"\x00\x01"), {"VARCHAR"}),  # base64 text, in JSON and column alike
}
_ONE_KEY_PER_TYPE = {typ: next(k for k, (_c, t) in semconv.TYPED_SPAN_ATTRIBUTES.items()
                               if t == typ and k != semconv.DECISION_CANDIDATES)
                     for typ in ("VARCHAR", "BIGINT", "DOUBLE", "BOOLEAN", "VARCHAR[]")}


@pytest.mark.parametrize("typ", sorted(_ONE_KEY_PER_TYPE))
@pytest.mark.parametrize("kind", sorted(_VALUES))
def test_only_exactly_held_values_leave_the_json(store: Store, typ: str, kind: str) -> None:
    value, exact_in = _VALUES[kind]
    key = _ONE_KEY_PER_TYPE[typ]
    req, keys = _request([[KeyValue(key=key, value=value)]])
    for batch in (decode(req, time.time_ns()), decode_protobuf(req.SerializeToString(), time.time_ns())):
        stored = json.loads(batch.spans.column("attributes")[0].as_py())
        assert (key in stored) == (typ not in exact_in)
    store.append(spans=batch.spans, events=batch.events)
    assert _canon(_view(store, keys)[keys[0]]) == _canon(_whole(req.resource_spans[0].scope_spans[0].spans[0]))


def test_an_older_store_reads_the_same(store: Store) -> None:
    """Rows written with every attribute in the JSON (and the typed copies) read unchanged."""
    req, keys = _request([[KeyValue(key=semconv.REQUEST_ID, value=AnyValue(string_value="old")),
                           KeyValue(key="x", value=AnyValue(int_value=1))]])
    batch = decode(req, time.time_ns())
    old_json = json.dumps({semconv.REQUEST_ID: "old", "x": 1})
    spans = batch.spans.set_column(batch.spans.schema.get_field_index("attributes"), "attributes",
                                   pa.array([old_json], pa.string()))
    store.append(spans=spans, events=batch.events)
    assert _view(store, keys)[keys[0]] == {semconv.REQUEST_ID: "old", "x": 1}


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_typed_values_still_count_towards_the_span_size_limit(native: bool) -> None:
    """The limit bounds what a span holds, stored in the JSON or in its columns."""
    big = "x" * 16_000
    typed = [k for k, (_c, t) in semconv.TYPED_SPAN_ATTRIBUTES.items()
             if t == "VARCHAR" and k != semconv.DECISION_CANDIDATES]
    n = MAX_SPAN_ATTR_BYTES // 16_000 + 1
    assert len(typed) >= n
    attrs = [KeyValue(key=k, value=AnyValue(string_value=big)) for k in typed[:n]]
    req, _ = _request([attrs, attrs[: n - 2]])
    batch = (decode_protobuf(req.SerializeToString(), time.time_ns()) if native
             else decode(req, time.time_ns()))
    assert batch.spans.num_rows == 1 and len(batch.rejected) == 1
    assert f"over {MAX_SPAN_ATTR_BYTES}" in batch.rejected[0]
    assert batch.spans.column("attributes")[0].as_py() == "{}"


@pytest.mark.parametrize("untyped", [False, True], ids=["all typed", "some untyped"])
@pytest.mark.parametrize("over", [0, 1])
def test_the_size_limit_is_the_whole_json_to_the_character(untyped: bool, over: int) -> None:
    """Both decoders measure the JSON the attributes would take whole, in characters (here
    multi-byte ones, so bytes exceed the limit while characters may not)."""
    typed = [k for k, (_c, t) in semconv.TYPED_SPAN_ATTRIBUTES.items()
             if t == "VARCHAR" and k != semconv.DECISION_CANDIDATES]
    chunk = "é" * 16_000
    values = {k: chunk for k in typed[:16]}
    if untyped:
        values["team.note"] = "n"
    pad_key = typed[16]
    base = len(json.dumps({**values, pad_key: ""}, ensure_ascii=False))
    values[pad_key] = "é" * (MAX_SPAN_ATTR_BYTES + over - base)
    assert len(json.dumps(values, ensure_ascii=False)) == MAX_SPAN_ATTR_BYTES + over
    req, _ = _request([[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in values.items()]])
    for batch in (decode(req, time.time_ns()), decode_protobuf(req.SerializeToString(), time.time_ns())):
        assert (batch.spans.num_rows, len(batch.rejected)) == ((1, 0) if over == 0 else (0, 1))


def test_the_view_covers_every_typed_span_attribute() -> None:
    pairs = re.findall(r"'([^']+)', if\(list_contains\(stored_keys, '([^']+)'\), null, (\w+)\)",
                       SQL.read_text("utf-8"))
    assert all(k == k2 for k, k2, _ in pairs)
    assert {k: c for k, _, c in pairs} == {k: c for k, (c, _t) in semconv.TYPED_SPAN_ATTRIBUTES.items()}
