"""The compact candidate encoding (one JSON attribute) becomes the same candidate rows as events."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import semconv as sc
from audit._store import Store
from collectors.otlp._decode import decode, decode_protobuf, parse_protobuf
from collectors.router import DecisionRecorder

TYPED = [col for col, _ in sc.TYPED_EVENT_ATTRIBUTES.values()]


def _record(encoding: str, request_id: str = "req-1") -> bytes:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    rec = DecisionRecorder(policy="qp_cost", router_id="r1", tracer_provider=tp,
                           candidate_encoding=encoding)
    now = time.time_ns()
    with rec.decide(request_id, model="m", input_tokens=1000, prefix_hashes=["h1", "h2"]) as d:
        d.candidate("http://a:8000", waiting=3, running=2, kv_usage=0.5, remaining_tokens=900,
                    telemetry_ts_ns=now - 250_000_000, pending=1, predicted_cached_tokens=64,
                    est_queue_ms=12.5, est_prefill_ms=30.0, score=42.5, dp_rank=1)
        d.candidate("b:9000", eligible=False, excluded_reason="unhealthy", kv_usage=float("nan"))
        d.candidate("c", waiting=0, telemetry_ts_ns=now - 1_000_000, score=-1e300)
        d.choose("c", reason="least_load")
    tp.shutdown()
    assert rec.errors == 0
    return bytes(encode_spans(exporter.get_finished_spans()).SerializeToString())


def _with_candidates(value: str | int | bytes) -> Any:
    """A recorded decision (JSON encoding) whose candidates attribute is ``value`` instead."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    req.ParseFromString(_record("json"))
    for kv in req.resource_spans[0].scope_spans[0].spans[0].attributes:
        if kv.key == sc.DECISION_CANDIDATES:
            if isinstance(value, str):
                kv.value.string_value = value
            elif isinstance(value, bytes):
                kv.value.bytes_value = value
            else:
                kv.value.int_value = value
    return req


def _candidate_rows(events: pa.Table) -> list[dict[str, Any]]:
    rows = events.filter(pa.compute.equal(events.column("name"), sc.EVENT_CANDIDATE))
    return rows.select(["event_index", "time_ns", *TYPED]).to_pylist()


@pytest.mark.parametrize("via", ["python", "native"])
def test_json_candidates_become_the_rows_events_would_give(via: str) -> None:
    def run(body: bytes) -> Any:
        if via == "native":
            return decode_protobuf(body, time.time_ns())
        return decode(parse_protobuf(body), time.time_ns())

    from_events = run(_record("events"))
    from_json = run(_record("json"))
    assert from_json.candidate_json_malformed == 0
    got, want = _candidate_rows(from_json.events), _candidate_rows(from_events.events)
    # the timestamps differ between two recordings; the decision time is what both carry
    decided = from_json.spans.column("a_decision_time_ns")[0].as_py()
    assert [r.pop("time_ns") for r in got] == [decided] * 3
    for r in want:
        r.pop("time_ns")
        r["c_telemetry_ts_ns"] = r["c_telemetry_age_ms"] = None
    for r in got:
        r["c_telemetry_ts_ns"] = r["c_telemetry_age_ms"] = None
    assert got == want
    assert [r["c_replica"] for r in got] == ["http://a:8000", "b:9000", "c"]
    assert got[0]["c_dp_rank"] == 1 and got[1]["c_kv_usage"] is None
    # the rows hold the text whole, so it is stored nowhere else: not in the span's attributes
    # (which keep what no typed column holds), not in its typed column
    attrs = json.loads(from_json.spans.column("attributes")[0].as_py())
    assert sc.DECISION_CANDIDATES not in attrs and sc.ROUTER_POLICY not in attrs
    assert from_json.spans.column("a_policy")[0].as_py() == "qp_cost"
    assert from_json.spans.column("a_decision_candidates").null_count == 1


_GOOD = '{"replica": "a", "waiting": 2, "kv_usage": 1, "score": 0.5, "chosen": true}'


@pytest.mark.parametrize("text, kept", [
    (f"[{_GOOD}]", False),
    (f"[{_GOOD}, {_GOOD}]", False),
    # the rows do not hold these whole: the text stays verbatim in the typed column
    ("[]", True),                                                       # no rows at all
    ('{"not": "a list"', True),                                         # malformed
    ('[{"replica": "a"}, 3]', True),                                    # not all objects
    ('[{"replica": "a", "zone": "eu-1"}]', True),                       # a key no column takes
    ('[{"replica": "a", "waiting": "3"}]', True),                       # converted: "3" -> 3
    ('[{"replica": "a", "kv_usage": NaN}]', True),                      # not JSON: NaN -> NULL
    ('[{"replica": "a", "waiting": 9223372036854775808}]', True),       # over int64
    ('[{"replica": "a", "score": 9007199254740993}]', True),            # not exact as a double
])
@pytest.mark.parametrize("native", [True, False])
def test_the_text_is_kept_where_the_rows_do_not_hold_it_whole(text: str, kept: bool,
                                                               native: bool) -> None:
    from collectors.otlp import _candidate_events

    req = _with_candidates(text)
    for batch in (decode(req, time.time_ns()), decode_protobuf(req.SerializeToString(), time.time_ns())):
        attrs = json.loads(batch.spans.column("attributes")[0].as_py())
        assert sc.DECISION_CANDIDATES not in attrs  # never twice
    # the expansion alone (C where it applies, or the Python reference), on the typed text
    spans = batch.spans.set_column(batch.spans.schema.get_field_index("a_decision_candidates"),
                                   "a_decision_candidates", pa.array([text], pa.string()))
    out, events, _ = _candidate_events.expand(spans, batch.events.slice(0, 0), native=native)
    assert out.column("a_decision_candidates")[0].as_py() == (text if kept else None)
    assert events.num_rows == (0 if text == "[]" or "not" in text or ", 3]" in text else text.count("{"))


@pytest.mark.parametrize("value, in_json", [(7, 7), (b"[{}]", "W3t9XQ==")])  # bytes: base64
def test_a_candidates_value_that_is_not_a_string_stays_in_the_attributes(value: int | bytes,
                                                                        in_json: Any) -> None:
    req = _with_candidates(value)
    for batch in (decode(req, time.time_ns()), decode_protobuf(req.SerializeToString(), time.time_ns())):
        assert json.loads(batch.spans.column("attributes")[0].as_py())[sc.DECISION_CANDIDATES] == in_json
        assert batch.candidate_json_malformed == 1


def test_malformed_candidates_attribute_is_kept_and_counted() -> None:
    req = _with_candidates('{"not": "a list"')
    batch = decode(req, time.time_ns())
    assert batch.accepted == 1 and batch.candidate_json_malformed == 1
    assert _candidate_rows(batch.events) == []


def test_store_reads_json_candidates_like_events(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.duckdb")
    for i, enc in enumerate(["events", "json"]):
        batch = decode_protobuf(_record(enc, request_id=f"req-{enc}"), time.time_ns() + i)
        store.append(spans=batch.spans, events=batch.events)
        # a retried export is stored once, expanded rows included
        assert store.append(spans=batch.spans, events=batch.events) == 0
    rows = store.query_arrow(
        "select request_id, count(*) filter (where chosen) as chosen, "
        "list(replica order by replica) as replicas from candidates "
        "group by request_id order by request_id").to_pylist()
    store.close()
    # the DP rank of the first candidate shows as its '#1' replica suffix
    replicas = ["a:8000#1", "b:9000", "c"]
    assert rows == [{"request_id": "req-events", "chosen": 1, "replicas": replicas},
                    {"request_id": "req-json", "chosen": 1, "replicas": replicas}]


@pytest.mark.parametrize("text, want", [
    # strict JSON of the right types: converted by Arrow in one pass
    ('[{"replica": "a", "waiting": 2, "kv_usage": 1}]', {"c_replica": "a", "c_waiting": 2, "c_kv_usage": 1.0}),
    # values of other types take the decoder's coercion: "3" -> 3, a number as the replica name
    ('[{"replica": 7, "waiting": "3", "chosen": "true"}]', {"c_replica": "7", "c_waiting": 3, "c_chosen": True}),
    # NaN / Infinity (not JSON, but Python writes them) become NULL
    ('[{"replica": "a", "kv_usage": NaN, "score": -Infinity}]',
     {"c_replica": "a", "c_kv_usage": None, "c_score": None}),
])
def test_candidate_values_are_coerced_like_event_attributes(text: str, want: dict[str, Any]) -> None:
    req = _with_candidates(text)
    for batch in (decode(req, time.time_ns()), decode_protobuf(req.SerializeToString(), time.time_ns())):
        (row,) = _candidate_rows(batch.events)
        assert {k: row[k] for k in want} == want



def _wide_decision(n: int) -> bytes:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    rec = DecisionRecorder(policy="qp_cost", router_id="r1", tracer_provider=tp)
    now = time.time_ns()
    with rec.decide("req-wide", model="m", input_tokens=100) as d:
        for i in range(n):
            d.candidate(f"http://replica-{i}.pool.svc:8000", waiting=3, running=2, kv_usage=0.5,
                        remaining_tokens=900, telemetry_ts_ns=now, pending=1,
                        predicted_cached_tokens=64, est_queue_ms=12.5, est_prefill_ms=30.0, score=42.5)
        d.choose("http://replica-7.pool.svc:8000", reason="least_load")
    tp.shutdown()
    return bytes(encode_spans(exporter.get_finished_spans()).SerializeToString())


def test_a_decision_over_a_few_hundred_replicas_keeps_every_candidate() -> None:
    # 300 candidates are ~90,000 characters: over the 16,384 other strings are cut at (a cut
    # text is malformed: every candidate was lost), within the candidates' own limit
    body = _wide_decision(300)
    for batch in (decode(parse_protobuf(body), time.time_ns()), decode_protobuf(body, time.time_ns())):
        assert batch.accepted == 1 and batch.truncated_values == 0
        assert batch.candidate_json_malformed == 0
        assert batch.events.num_rows == 300
        assert batch.events.column("c_replica")[299].as_py() == "http://replica-299.pool.svc:8000"


def test_a_candidates_text_over_its_limit_is_cut_and_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from collectors.otlp import _decode

    monkeypatch.setattr(_decode, "MAX_APART_LEN", 20_000)
    body = _wide_decision(100)
    for batch in (decode(parse_protobuf(body), time.time_ns()), decode_protobuf(body, time.time_ns())):
        assert batch.accepted == 1 and batch.truncated_values == 1
        assert batch.candidate_json_malformed == 1 and batch.events.num_rows == 0
        assert len(batch.spans.column("a_decision_candidates")[0].as_py()) == 20_000
