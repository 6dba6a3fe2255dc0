"""DecisionRecorder against the real OTel SDK (in-memory exporter)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import struct
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import collectors.router as router_pkg
import semconv as sc
from collectors.router import Candidate, DecisionRecord, DecisionRecorder
from collectors.router import _recorder as recorder_mod

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def spans(exporter: InMemorySpanExporter) -> dict[str, Any]:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_public_surface() -> None:
    assert sorted(router_pkg.__all__) == sorted(
        n for n in dir(router_pkg) if not n.startswith("_"))


def test_decision_candidates_forward(otel: Any) -> None:
    """candidate_encoding="events": one routeaudit.candidate event per candidate (as before)."""
    tp, exporter = otel
    rec = DecisionRecorder(policy="cache_aware", router_id="r1", tracer_provider=tp,
                           candidate_encoding="events")
    now = time.time_ns()
    with rec.decide("req-1", model="m", input_tokens=100, max_tokens=16,
                    prefix_hashes=["h1", "h2"], stream=True, endpoint="/v1/completions",
                    incoming_headers={"Traceparent": TRACEPARENT, "tracestate": "audit=t61",
                                      "baggage": "k=v"}) as d:
        d.candidate("a", waiting=3, running=2, kv_usage=0.5, remaining_tokens=900,
                    telemetry_ts_ns=now - 250_000_000, pending=1, predicted_cached_tokens=64,
                    est_queue_ms=12.5, est_prefill_ms=30.0, score=42.5)
        d.candidate("b", eligible=False, excluded_reason="unhealthy")
        d.candidate("c", waiting=0, telemetry_ts_ns=now - 1_000_000)
        d.choose("c", reason="least_load")
        with d.forward("http://c:8000/v1/completions") as f:
            headers = f.headers
            assert d.outgoing_headers() == headers
            f.set_http_status(200)
    got = spans(exporter)
    dec, fwd = got[sc.SPAN_DECISION], got[sc.SPAN_FORWARD]
    assert dec.kind == SpanKind.INTERNAL and fwd.kind == SpanKind.CLIENT
    # continues the incoming trace; forward is the decision's child; headers point at forward
    assert format(dec.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert format(dec.parent.span_id, "016x") == TRACEPARENT.split("-")[2]
    assert fwd.parent.span_id == dec.context.span_id
    assert headers["traceparent"].split("-")[2] == format(fwd.context.span_id, "016x")
    assert headers["tracestate"] == "audit=t61" and headers["baggage"] == "k=v"
    assert headers["x-request-id"] == "req-1"
    a = dec.attributes
    assert a[sc.COMPONENT] == "router" and a[sc.REQUEST_ID] == "req-1" and a[sc.ATTEMPT] == 0
    assert a[sc.ROUTER_ID] == "r1" and a[sc.ROUTER_POLICY] == "cache_aware"
    assert a[sc.DECISION_CHOSEN] == "c" and a[sc.DECISION_REASON] == "least_load"
    assert a[sc.DECISION_OUTCOME] == "routed" and a[sc.DECISION_CANDIDATE_COUNT] == 3
    assert a[sc.REQUEST_PREFIX_HASHES] == ("h1", "h2") and a[sc.REQUEST_INPUT_TOKENS] == 100
    assert sc.DECISION_RECORDER_ERRORS not in a
    decided = a[sc.DECISION_TIME]
    assert dec.start_time <= decided <= dec.end_time
    ev = [e.attributes for e in dec.events]
    assert [e[sc.CANDIDATE_REPLICA] for e in ev] == ["a", "b", "c"]
    assert [e[sc.CANDIDATE_CHOSEN] for e in ev] == [False, False, True]
    assert ev[0][sc.CANDIDATE_TELEMETRY_AGE_MS] == pytest.approx((decided - now) / 1e6 + 250)
    assert ev[0][sc.CANDIDATE_SCORE] == 42.5 and ev[0][sc.CANDIDATE_PENDING] == 1
    assert ev[1][sc.CANDIDATE_ELIGIBLE] is False
    assert ev[1][sc.CANDIDATE_EXCLUDED_REASON] == "unhealthy"
    assert sc.CANDIDATE_TELEMETRY_AGE_MS not in ev[1]
    assert all(e.timestamp == decided for e in dec.events)
    f = fwd.attributes
    assert f[sc.URL_FULL] == "http://c:8000/v1/completions" and f[sc.REPLICA_ID] == "c"
    assert f[sc.HTTP_STATUS] == 200 and f[sc.REQUEST_ID] == "req-1"
    assert rec.errors == 0


def test_reject_retry_and_generated_id(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    with rec.decide(None, incoming_headers={"X-Request-Id": "from-client"}) as d:
        d.candidate("a")
        d.reject(reason="admission_limit")
    with rec.decide("r2", attempt=1) as d2:
        d2.choose("a", "retry")
        with d2.forward("http://a") as f:
            f.set_error("connection refused")
    with rec.decide(None) as d3:
        pass
    done = exporter.get_finished_spans()
    a0, a1, a2 = (s.attributes for s in done if s.name == sc.SPAN_DECISION)
    assert a0[sc.REQUEST_ID] == "from-client" and a0[sc.DECISION_OUTCOME] == "rejected"
    assert sc.DECISION_CHOSEN not in a0 and sc.ROUTER_ID not in a0
    assert a1[sc.ATTEMPT] == 1 and a1[sc.DECISION_OUTCOME] == "routed"
    assert a2[sc.DECISION_OUTCOME] == "error" and a2[sc.DECISION_REASON] == "no_decision"
    assert len(d3.request_id) == 32
    fwd = [s for s in done if s.name == sc.SPAN_FORWARD][0]
    assert fwd.status.status_code == StatusCode.ERROR


def test_router_exception_propagates_and_is_recorded(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    with pytest.raises(ZeroDivisionError):
        with rec.decide("x") as d:
            d.candidate("a")
            1 / 0  # noqa: B018
    s = exporter.get_finished_spans()[0]
    assert s.status.status_code == StatusCode.ERROR
    assert s.attributes[sc.DECISION_OUTCOME] == "error"
    assert s.events[-1].name == "exception"
    assert rec.errors == 0


def test_bad_values_are_dropped_and_counted(otel: Any, caplog: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp, candidate_encoding="events")
    with caplog.at_level(logging.WARNING, logger="collectors.router"):
        with rec.decide("x", attempt=0) as d:
            d.candidate("a", waiting="lots", kv_usage=object(), running="3")
            d.candidate(object(), score="nan-ish")  # type: ignore[arg-type]
            d.choose("a")
    s = exporter.get_finished_spans()[0]
    ev = [e.attributes for e in s.events]
    assert sc.CANDIDATE_WAITING not in ev[0] and sc.CANDIDATE_KV_USAGE not in ev[0]
    assert ev[0][sc.CANDIDATE_RUNNING] == 3  # coerced
    assert s.attributes[sc.DECISION_RECORDER_ERRORS] == 3
    assert rec.errors == 3
    assert "recorder error" in caplog.text


class _BrokenTracer:
    def start_span(self, *a: Any, **k: Any) -> Any:
        raise RuntimeError("tracer down")


class _BrokenProvider(trace.TracerProvider):
    def get_tracer(self, *a: Any, **k: Any) -> Any:
        return _BrokenTracer()


def test_broken_tracer_never_raises(caplog: Any) -> None:
    rec = DecisionRecorder("p", "r", tracer_provider=_BrokenProvider())
    with caplog.at_level(logging.CRITICAL, logger="collectors.router"):
        with rec.decide("x", incoming_headers={"traceparent": TRACEPARENT}) as d:
            d.candidate("a", waiting=1)
            d.choose("a")
            with d.forward("http://a") as f:
                f.set_http_status(200)
                assert f.headers["x-request-id"] == "x"
                # trace context still flows through: the incoming traceparent's trace
                assert f.headers["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]
        ctx = rec.record(DecisionRecord(request_id="y", decided_ns=1))
    assert ctx is None
    assert rec.errors == 3  # decision span, forward span, record()


def test_no_sdk_is_noop_but_propagates() -> None:
    rec = DecisionRecorder("p", tracer_provider=trace.NoOpTracerProvider())
    with rec.decide("x", incoming_headers={"traceparent": TRACEPARENT}) as d:
        d.candidate("a")
        d.choose("a")
        headers = d.forward("http://a").headers
    assert headers["traceparent"] == TRACEPARENT
    assert rec.errors == 0


def test_record_after_the_fact(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("qp_cost", "r9", tracer_provider=tp, candidate_encoding="events")
    t = 1_700_000_000_000_000_000
    ctx = rec.record(DecisionRecord(
        request_id="v1", decided_ns=t + 2_000, start_ns=t, end_ns=t + 3_000,
        candidates=[Candidate("a", waiting=1, telemetry_ts_ns=t - 5_000_000),
                    Candidate("b", running=4, est_queue_ms=3.0)],
        chosen="b", reason="min_cost", model="m", input_tokens=10, max_tokens=5, attempt=2,
        forward_url="http://b/v1/completions", forward_start_ns=t + 3_000,
        forward_end_ns=t + 50_000_000, forward_http_status=200))
    assert ctx is not None
    got = spans(exporter)
    dec, fwd = got[sc.SPAN_DECISION], got[sc.SPAN_FORWARD]
    assert (dec.start_time, dec.end_time) == (t, t + 3_000)
    assert (fwd.start_time, fwd.end_time) == (t + 3_000, t + 50_000_000)
    assert fwd.parent.span_id == dec.context.span_id
    assert trace.get_current_span(ctx).get_span_context().span_id == fwd.context.span_id
    ev = [e.attributes for e in dec.events]
    assert ev[0][sc.CANDIDATE_TELEMETRY_AGE_MS] == pytest.approx(5.002)
    assert [e[sc.CANDIDATE_CHOSEN] for e in ev] == [False, True]
    assert dec.attributes[sc.ATTEMPT] == 2 and dec.attributes[sc.DECISION_TIME] == t + 2_000
    # no forward: the decision's context is returned
    ctx2 = rec.record(DecisionRecord(request_id="v2", decided_ns=t, outcome="rejected"))
    span2 = trace.get_current_span(ctx2)
    assert span2.get_span_context().span_id == got_decision(exporter, "v2").context.span_id
    # parent context from the caller (e.g. a client span recorded by the testbed)
    ctx3 = rec.record(DecisionRecord(request_id="v3", decided_ns=t, parent_context=ctx))
    assert got_decision(exporter, "v3").parent.span_id == fwd.context.span_id
    assert ctx3 is not None


def got_decision(exporter: InMemorySpanExporter, rid: str) -> Any:
    return next(s for s in exporter.get_finished_spans()
                if s.name == sc.SPAN_DECISION and s.attributes[sc.REQUEST_ID] == rid)


def test_async_routers_interleave(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)

    async def route(i: int) -> None:
        with rec.decide(f"q{i}") as d:
            d.candidate("a")
            await asyncio.sleep(0.001 * (5 - i))
            d.candidate("b")
            d.choose("b" if i % 2 else "a")
            with d.forward("http://x") as f:
                await asyncio.sleep(0.001)
                f.set_http_status(200)

    async def main() -> None:
        await asyncio.gather(*(route(i) for i in range(5)))

    asyncio.run(main())
    decs = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_DECISION]
    assert len(decs) == 5 and all(s.parent is None for s in decs)
    assert len({s.context.trace_id for s in decs}) == 5
    assert rec.errors == 0


# ----------------------------------------------------------------------------- JSON encoding
def candidates(span: Any) -> list[dict[str, Any]]:
    """The decision's candidates from routeaudit.decision.candidates (must be strict JSON)."""
    def no_constants(name: str) -> Any:
        raise AssertionError(f"non-standard JSON constant {name}")
    value = span.attributes[sc.DECISION_CANDIDATES]
    assert isinstance(value, str)
    got = json.loads(value, parse_constant=no_constants)
    assert isinstance(got, list) and all(isinstance(c, dict) for c in got)
    return got


def test_semconv_candidate_json_keys() -> None:
    cand = {v for k, v in vars(sc).items() if k.startswith("CANDIDATE_") and isinstance(v, str)}
    assert set(sc.CANDIDATE_JSON_KEYS) == cand | {sc.REPLICA_DP_RANK}
    for key, short in sc.CANDIDATE_JSON_KEYS.items():
        assert short == key.rsplit(".", 1)[1]
    assert sc.DECISION_CANDIDATES == "routeaudit.decision.candidates"


def test_json_is_the_default_and_round_trips_every_fact(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder(policy="cache_aware", router_id="r1", tracer_provider=tp)
    assert rec.candidate_encoding == "json"
    now = time.time_ns()
    with rec.decide("req-1", model="m", input_tokens=100) as d:
        d.candidate("a", waiting=3, running=2, kv_usage=0.5, remaining_tokens=900,
                    telemetry_ts_ns=now - 250_000_000, pending=1, predicted_cached_tokens=64,
                    est_queue_ms=12.5, est_prefill_ms=30.0, score=42.5, dp_rank=2)
        d.candidate("b", eligible=False, excluded_reason="unhealthy")
        d.candidate("c\u00e9\"\\", waiting=0, kv_usage=1, score=-0.0,
                    telemetry_ts_ns=now - 1_000_000)
        d.choose("c\u00e9\"\\", reason="least_load")
    dec = spans(exporter)[sc.SPAN_DECISION]
    assert dec.events == ()  # no per-candidate events
    a = dec.attributes
    decided = a[sc.DECISION_TIME]
    assert a[sc.DECISION_CANDIDATE_COUNT] == 3 and sc.DECISION_RECORDER_ERRORS not in a
    c = candidates(dec)
    assert c[0] == {
        "replica": "a", "eligible": True, "waiting": 3, "running": 2, "kv_usage": 0.5,
        "remaining_tokens": 900, "telemetry_ts_ns": now - 250_000_000,
        "telemetry_age_ms": pytest.approx((decided - now) / 1e6 + 250), "pending": 1,
        "predicted_cached_tokens": 64, "est_queue_ms": 12.5, "est_prefill_ms": 30.0,
        "score": 42.5, "dp_rank": 2, "chosen": False,
    }
    assert c[1] == {"replica": "b", "eligible": False, "excluded_reason": "unhealthy",
                    "chosen": False}
    assert c[2]["replica"] == "c\u00e9\"\\" and c[2]["chosen"] is True
    assert c[2]["kv_usage"] == 1 and c[2]["score"] == 0.0 and c[2]["waiting"] == 0
    # types survive: JSON numbers/booleans, ints stay ints (exact for ns timestamps)
    assert type(c[0]["waiting"]) is int and type(c[0]["kv_usage"]) is float
    assert type(c[0]["telemetry_ts_ns"]) is int and c[0]["eligible"] is True
    # every key is a documented short key
    short = set(sc.CANDIDATE_JSON_KEYS.values())
    assert all(set(obj) <= short for obj in c)
    assert rec.errors == 0


def test_events_mode_unchanged(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp, candidate_encoding="events")
    with rec.decide("e") as d:
        d.candidate("a", waiting=1, kv_usage=0.5, telemetry_ts_ns=5)
        d.candidate("b", eligible=False, excluded_reason="full", dp_rank=1)
        d.choose("a")
    dec = spans(exporter)[sc.SPAN_DECISION]
    assert sc.DECISION_CANDIDATES not in dec.attributes
    assert [e.name for e in dec.events] == [sc.EVENT_CANDIDATE] * 2
    decided = dec.attributes[sc.DECISION_TIME]
    assert dict(dec.events[0].attributes) == {
        sc.CANDIDATE_REPLICA: "a", sc.CANDIDATE_ELIGIBLE: True, sc.CANDIDATE_WAITING: 1,
        sc.CANDIDATE_KV_USAGE: 0.5, sc.CANDIDATE_TELEMETRY_TS: 5,
        sc.CANDIDATE_TELEMETRY_AGE_MS: (decided - 5) / 1e6, sc.CANDIDATE_CHOSEN: True}
    assert dict(dec.events[1].attributes) == {
        sc.CANDIDATE_REPLICA: "b", sc.CANDIDATE_ELIGIBLE: False,
        sc.CANDIDATE_EXCLUDED_REASON: "full", sc.REPLICA_DP_RANK: 1, sc.CANDIDATE_CHOSEN: False}
    assert all(e.timestamp == decided for e in dec.events)
    with pytest.raises(ValueError):
        DecisionRecorder("p", tracer_provider=tp, candidate_encoding="xml")  # type: ignore[arg-type]


class _Weird:
    def __str__(self) -> str:
        return "weird\n\"obj\""


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __float__(self) -> float:
        raise RuntimeError("no float")


def test_json_weird_values_never_raise_and_stay_valid(otel: Any, caplog: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    nan, inf = float("nan"), float("inf")
    with caplog.at_level(logging.CRITICAL, logger="collectors.router"):
        with rec.decide("w") as d:
            d.candidate("nan", kv_usage=nan, score=inf, est_queue_ms=-inf, est_prefill_ms=1e308)
            d.candidate("huge", waiting=2**70, running=-(2**64), telemetry_ts_ns=2**63,
                        pending=2**63 - 1, score=10**400, kv_usage=2**80)  # 4 dropped
            d.candidate(12345, eligible=1, waiting=True, running=3.9,  # type: ignore[arg-type]
                        excluded_reason=_Weird())  # type: ignore[arg-type]
            d.candidate(_Weird(), waiting="lots", kv_usage=object(),  # type: ignore[arg-type]
                        score="2.5", running="3")  # type: ignore[arg-type]  # 2 dropped
            d.candidate(_Unprintable(), excluded_reason=_Unprintable(),  # type: ignore[arg-type]
                        score=_Unprintable())  # type: ignore[arg-type]  # 3 dropped
            d.candidate(None, telemetry_ts_ns=nan)  # type: ignore[arg-type]  # a misuse: left out
            d.choose("nan")
    dec = spans(exporter)[sc.SPAN_DECISION]
    c = candidates(dec)  # strict JSON: no NaN/Infinity tokens
    assert len(c) == 5
    assert c[0] == {"replica": "nan", "eligible": True, "kv_usage": None, "score": None,
                    "est_queue_ms": None, "est_prefill_ms": 1e308, "chosen": True}
    assert c[1] == {"replica": "huge", "eligible": True, "pending": 2**63 - 1,
                    "kv_usage": float(2**80), "chosen": False}
    assert c[2] == {"replica": "12345", "eligible": True, "waiting": 1, "running": 3,
                    "excluded_reason": 'weird\n"obj"', "chosen": False}
    assert c[3] == {"replica": 'weird\n"obj"', "eligible": True, "running": 3, "score": 2.5,
                    "chosen": False}
    assert c[4] == {"eligible": True, "chosen": False}
    dropped = 4 + 2 + 3
    assert dec.attributes[sc.DECISION_RECORDER_ERRORS] == dropped
    assert dec.attributes[sc.MISUSE] == ("none_replica",)
    assert rec.errors == dropped + 1
    assert dec.attributes[sc.DECISION_CHOSEN] == "nan"


def test_json_fast_and_checked_paths_agree() -> None:
    """The per-signature plan and the value-by-value path give the same object, keys in the
    same order (the C formatter aside)."""
    t = 1_700_000_000_000_000_000
    rows = [
        ("a", True, None, 1, 2, 0.25, 900, t - 5_000_000, 0, 64, 1.5, 2.0, -3.0, 1),
        ("b", False, "unhealthy", None, None, None, None, None, None, None, None, None, None,
         None),
        ("c\u2603\"", True, None, 0, 0, 1, None, t, None, None, 0, 7, 1e-9, 0),
        ("d", True, None, None, None, 0.1 + 0.2, None, None, None, None, None, None, 12345.678,
         None),
    ]
    for chosen in (True, False):
        for row in rows:
            assert recorder_mod._plan(tuple(map(type, row))) is not None
            text, errors = _without_c([row], 0 if chosen else -1, t)
            checked, bad = recorder_mod._row_checked(row, t, chosen)
            assert errors == bad == 0
            (fast,) = json.loads(text)
            assert fast == checked and list(fast) == list(checked)


def test_json_record_after_the_fact(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("qp_cost", "r9", tracer_provider=tp)
    t = 1_700_000_000_000_000_000
    rec.record(DecisionRecord(
        request_id="v1", decided_ns=t + 2_000, start_ns=t, end_ns=t + 3_000,
        candidates=[Candidate("a", waiting=1, telemetry_ts_ns=t - 5_000_000),
                    Candidate("b", running=4, est_queue_ms=3.0, dp_rank=1)],
        chosen="b", reason="min_cost"))
    rec.record(DecisionRecord(request_id="v2", decided_ns=t, outcome="rejected"))
    decs = {s.attributes[sc.REQUEST_ID]: s for s in exporter.get_finished_spans()}
    c = candidates(decs["v1"])
    assert c == [
        {"replica": "a", "eligible": True, "waiting": 1, "telemetry_ts_ns": t - 5_000_000,
         "telemetry_age_ms": 5.002, "chosen": False},
        {"replica": "b", "eligible": True, "running": 4, "est_queue_ms": 3.0, "dp_rank": 1,
         "chosen": True},
    ]
    assert decs["v1"].events == () and decs["v1"].attributes[sc.DECISION_TIME] == t + 2_000
    # no candidates: no attribute
    assert sc.DECISION_CANDIDATES not in decs["v2"].attributes
    assert decs["v2"].attributes[sc.DECISION_CANDIDATE_COUNT] == 0
    assert rec.errors == 0


def test_json_many_signatures_still_correct(otel: Any) -> None:
    """Past the formatter cache, rows still encode (value by value)."""
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    fields = ["waiting", "running", "kv_usage", "remaining_tokens", "pending",
              "predicted_cached_tokens", "est_queue_ms", "est_prefill_ms", "score"]
    with rec.decide("many") as d:
        for mask in range(1 << len(fields)):  # 512 signatures > the cache
            d.candidate(f"r{mask}", **{f: 1 for i, f in enumerate(fields) if mask >> i & 1})
        d.choose("r7")
    c = candidates(spans(exporter)[sc.SPAN_DECISION])
    assert len(c) == 1 << len(fields)
    for mask, obj in enumerate(c):
        assert obj == {"replica": f"r{mask}", "eligible": True, "chosen": mask == 7,
                       **{f: 1 for i, f in enumerate(fields) if mask >> i & 1}}
    assert len(recorder_mod._plans) <= recorder_mod._ENCODER_CACHE_MAX
    assert rec.errors == 0


_INT = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**70), 2**70))
_FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1e6, 1e6).map(lambda v: round(v, 3)),
    st.integers(-(10**12), 10**12).map(lambda n: n / 1e6),
)
_STR = st.text(max_size=12)
_ANY = st.one_of(st.none(), st.booleans(), _INT, _FLOAT, _STR)
_BY_KIND = {recorder_mod._T_BOOL: st.booleans(), recorder_mod._T_STR: _STR,
            recorder_mod._T_INT: _INT, recorder_mod._T_FLOAT: st.one_of(_FLOAT, _INT)}
# mostly values of the field's type (the planned path), sometimes anything (coerced)
_ROW = st.tuples(*(st.one_of(st.none(), _BY_KIND[kind], _BY_KIND[kind], _ANY)
                   for _, kind in recorder_mod._JSON_SPEC))


def _expected(row: tuple[Any, ...], chosen: bool, t: int) -> tuple[dict[str, Any], int]:
    """The object a row must become, written out field by field from the semantic conventions:
    values of the field's kind kept (an int64 int where a float goes), others converted as
    ``str`` / ``int`` / ``float`` / ``bool`` do or dropped and counted, non-finite floats null,
    the telemetry age after its timestamp, ``chosen`` last."""
    obj: dict[str, Any] = {}
    errors = 0
    for i, ((key, kind), v) in enumerate(zip(recorder_mod._JSON_SPEC, row, strict=True)):
        if v is None:
            continue
        try:
            if kind == recorder_mod._T_STR:
                v = v if type(v) is str else str(v)
            elif kind == recorder_mod._T_BOOL:
                v = v if type(v) is bool else bool(v)
            elif kind == recorder_mod._T_INT:
                v = v if type(v) is int else int(v)
                if not -(2**63) <= v < 2**63:
                    raise OverflowError
            else:
                v = v if type(v) in (int, float) else float(v)
                if type(v) is int and not -(2**63) <= v < 2**63:
                    v = float(v)
                if v - v != 0:
                    v = None
        except (ValueError, TypeError, OverflowError):
            errors += 1
            continue
        obj[key] = v
        if i == recorder_mod._TELEMETRY_TS_INDEX:
            obj[recorder_mod._AGE_KEY] = (t - v) / 1e6
    obj[recorder_mod._CHOSEN_KEY] = chosen
    return obj, errors


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(_ROW, max_size=4), chosen=st.integers(-1, 4),
       t=st.integers(0, 2**62))
def test_json_text_holds_every_row(rows: list[tuple[Any, ...]], chosen: int, t: int) -> None:
    """The text is strict JSON (no NaN) of exactly the expected objects, keys in order, whichever
    path each row takes (the C formatter, the per-signature plan, value by value); values
    dropped are counted."""
    for text, errors in (recorder_mod._candidates_json(rows, chosen, t), _without_c(rows, chosen, t)):
        _check_text(rows, chosen, t, text, errors)


def _without_c(rows: list[tuple[Any, ...]], chosen: int, t: int) -> tuple[str, int]:
    native, recorder_mod._native_candidates_json = recorder_mod._native_candidates_json, None
    try:
        return recorder_mod._candidates_json(rows, chosen, t)
    finally:
        recorder_mod._native_candidates_json = native


def _check_text(rows: list[tuple[Any, ...]], chosen: int, t: int, text: str, errors: int) -> None:
    got = json.loads(text, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    want = [_expected(row, i == chosen, t) for i, row in enumerate(rows)]
    assert errors == sum(e for _obj, e in want)
    assert [list(o.items()) for o in got] == [list(o.items()) for o, _e in want]


def test_a_lone_surrogate_in_a_replica_name_keeps_the_record() -> None:
    rows = [("\ud800-replica",) + (None,) * 13, ("ok",) + (None,) * 13]
    for text, errors in (recorder_mod._candidates_json(rows, 1, 0), _without_c(rows, 1, 0)):
        assert errors == 0
        assert [o["replica"] for o in json.loads(text)] == ["\ud800-replica", "ok"]


def test_json_float_text_round_trips() -> None:
    """Every finite float reads back as itself, around the formatting boundaries."""
    import random

    rng = random.Random(7)
    values = [0.0, -0.0, 1e-4, 9.9999e-05, 1e15, 1e15 - 1, 999999999999999.9, 0.1 + 0.2, 1 / 3,
              2.5, -2.5, 1e-3, 5e-324, 1.7976931348623157e308, 0.30000000000000004, 1e16, 1e22]
    for _ in range(20_000):
        values.append(round(rng.uniform(-1e6, 1e6), rng.randint(0, 9)))
        values.append(struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0])
    values = [v for v in values if v - v == 0]
    rows = [("a",) + (None,) * 4 + (v,) + (None,) * 8 for v in values]
    for text, errors in (recorder_mod._candidates_json(rows, -1, 0), _without_c(rows, -1, 0)):
        assert errors == 0
        got = [obj["kv_usage"] for obj in json.loads(text)]
        assert got == values
        assert [math.copysign(1, g) for g in got] == [math.copysign(1, v) for v in values]
