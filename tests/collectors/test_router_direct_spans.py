"""Direct spans (collectors/router/_direct_spans.py) export what the SDK path exports.

Each scenario runs twice, with ``direct_spans`` on and off, against real SDK providers, and the
exported spans are compared after encoding them to OTLP protobuf, as the exporter sends them,
with span ids, trace ids and timestamps replaced by their roles.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, Tracer, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_ON,
    ParentBased,
    TraceIdRatioBased,
)

import semconv as sc
from collectors.router import Candidate, DecisionRecord, DecisionRecorder

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def _routed(rec: DecisionRecorder) -> dict[str, str]:
    now = time.time_ns()
    with rec.decide(None, incoming_headers={"traceparent": TRACEPARENT, "tracestate": "a=1",
                                            "x-request-id": "r-1"},
                    model="m", input_tokens=100, max_tokens=16, prefix_hashes=["h1", 2],
                    stream=True, endpoint="/v1/completions") as d:
        d.candidate("a", waiting=3, running=2, kv_usage=0.5, telemetry_ts_ns=now - 5,
                    pending=1, predicted_cached_tokens=64, est_queue_ms=1.5, score=2.0)
        d.candidate("b", eligible=False, excluded_reason="unhealthy")
        d.candidate("c", waiting="7", kv_usage=float("nan"), score=object())  # type: ignore[arg-type]
        d.choose("a", "least_load")
    with d.forward("http://a/v1/completions") as f:
        f.set_http_status(503)
        return dict(f.headers)


def _rejected(rec: DecisionRecorder) -> dict[str, str]:
    with rec.decide("r-2", model=object()) as d:  # an invalid attribute value: dropped by both
        d.candidate("a")
        d.reject("admission_limit")
    return d.outgoing_headers()


def _raised(rec: DecisionRecorder) -> dict[str, str]:
    with pytest.raises(KeyError), rec.decide("r-3") as d:
        d.candidate("a", waiting=1)
        raise KeyError("boom")
    return {}


def _after_the_fact(rec: DecisionRecorder) -> dict[str, str]:
    ctx = rec.record(DecisionRecord(
        request_id="r-4", decided_ns=1_000_500, start_ns=1_000_000, end_ns=1_001_000,
        candidates=[Candidate("a", waiting=1, telemetry_ts_ns=900_000), Candidate("b")],
        chosen="b", reason="cache", outcome="error", forward_url="http://b/generate",
        forward_start_ns=1_001_000, forward_end_ns=1_009_000, forward_http_status=200,
    ))
    assert ctx is not None
    return {}


def _user_attributes(rec: DecisionRecorder) -> dict[str, str]:
    with rec.decide("r-5") as d:
        span = trace.get_current_span(d.context)
        span.set_attribute("team.attr", [1, 2])
        span.set_attribute("team.bad", {"not": "allowed"})
        span.add_event("team.event", {"k": "v"}, timestamp=7)
        span.add_event("team.event.2", {"k": "w", "n": 1, "x": 2.5}, timestamp=8)
        span.add_link(trace.SpanContext(5, 6, is_remote=True), {"why": "batched with"})
        span.add_link(trace.INVALID_SPAN_CONTEXT)  # dropped by both
        d.choose("a")
    return {}


SCENARIOS: dict[str, Callable[[DecisionRecorder], dict[str, str]]] = {
    "routed": _routed, "rejected": _rejected, "raised": _raised,
    "after_the_fact": _after_the_fact, "user_attributes": _user_attributes,
}


def _normalised(spans: list[ReadableSpan]) -> list[Any]:
    """The OTLP encoding of ``spans`` with ids and times replaced by stable stand-ins."""
    request = encode_spans(spans)
    ids: dict[bytes, int] = {}

    def role(b: bytes) -> bytes:
        return b"" if not b else b"%d" % ids.setdefault(b, len(ids))

    out = []
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for s in ss.spans:
                s.trace_id, s.span_id = role(s.trace_id), role(s.span_id)
                s.parent_span_id = role(s.parent_span_id)
                if s.start_time_unix_nano > 10_000_000:  # a clock reading, not a given time
                    s.start_time_unix_nano = s.end_time_unix_nano = 0
                for e in s.events:
                    if e.name == "exception":
                        e.time_unix_nano = 0
                        for kv in e.attributes:
                            if kv.key == "exception.stacktrace":  # differs by line number
                                kv.value.string_value = ""
                for kv in s.attributes:
                    if kv.key == sc.DECISION_TIME and kv.value.int_value > 10_000_000:
                        kv.value.int_value = 0
                    if kv.key == sc.DECISION_CANDIDATES:  # without the clock readings
                        kv.value.string_value = json.dumps([
                            {k: v for k, v in c.items()
                             if k not in ("telemetry_ts_ns", "telemetry_age_ms")}
                            for c in json.loads(kv.value.string_value)])
                out.append((rs.resource.SerializeToString(deterministic=True),
                            ss.scope.SerializeToString(deterministic=True),
                            s.SerializeToString(deterministic=True)))
    return out


class _SdkStarts:
    """Counts the SDK's ``Tracer.start_span`` calls: none when the direct path is taken."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = Tracer.start_span

        def counted(tracer: Tracer, *a: Any, **k: Any) -> Any:
            self.calls += 1
            return original(tracer, *a, **k)

        monkeypatch.setattr(Tracer, "start_span", counted)


@pytest.fixture
def sdk_starts(monkeypatch: pytest.MonkeyPatch) -> _SdkStarts:
    return _SdkStarts(monkeypatch)


def _run(scenario: str, direct: bool, **provider_args: Any
         ) -> tuple[list[ReadableSpan], dict[str, str], DecisionRecorder]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "router-x"}), **provider_args)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    rec = DecisionRecorder("least_load", "r1", tp, direct_spans=direct)
    headers = SCENARIOS[scenario](rec)
    tp.shutdown()
    return list(exporter.get_finished_spans()), headers, rec


LIMITS = {
    "default": None,
    "unlimited": SpanLimits(max_span_attributes=SpanLimits.UNSET, max_events=SpanLimits.UNSET,
                            max_links=SpanLimits.UNSET, max_event_attributes=SpanLimits.UNSET,
                            max_link_attributes=SpanLimits.UNSET),
    "tight": SpanLimits(max_span_attributes=5, max_events=1, max_links=0,
                        max_event_attributes=2),  # drops attributes, events and links
}


@pytest.mark.parametrize("limits", LIMITS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_direct_spans_export_what_the_sdk_exports(scenario: str, limits: str,
                                                  sdk_starts: _SdkStarts) -> None:
    direct, d_headers, d_rec = _run(scenario, True, span_limits=LIMITS[limits])
    assert direct and sdk_starts.calls == 0  # the direct path was taken
    sdk, s_headers, s_rec = _run(scenario, False, span_limits=LIMITS[limits])
    assert sdk_starts.calls == len(sdk)
    assert _normalised(direct) == _normalised(sdk)
    for a, b in zip(direct, sdk, strict=True):
        assert a.dropped_attributes == b.dropped_attributes
        assert (a.parent is None) == (b.parent is None)
        if a.parent is not None:
            assert a.parent.is_remote == b.parent.is_remote
    assert d_headers.keys() == s_headers.keys()
    for spans, headers in ((direct, d_headers), (sdk, s_headers)):
        if "traceparent" in headers:  # points at the last span: the forward, else the decision
            _, trace_id, span_id, _ = headers["traceparent"].split("-")
            assert trace_id == format(spans[-1].context.trace_id, "032x")
            assert span_id == format(spans[-1].context.span_id, "016x")
    if scenario == "routed":
        assert d_headers["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]
        assert d_headers["tracestate"] == s_headers["tracestate"] == "a=1"
    assert d_rec.errors == s_rec.errors


def _traced(incoming: str | None) -> Callable[[DecisionRecorder], dict[str, str]]:
    def run(rec: DecisionRecorder) -> dict[str, str]:
        headers = {} if incoming is None else {"traceparent": incoming, "tracestate": "a=1"}
        with rec.decide("r-6", incoming_headers=headers) as d:
            d.candidate("a", waiting=1)
            d.choose("a")
        with d.forward("http://a") as f:
            return dict(f.headers)
    return run


@pytest.mark.parametrize("incoming", [TRACEPARENT, UNSAMPLED, None])
@pytest.mark.parametrize("sampler", [DEFAULT_ON, ALWAYS_ON, ALWAYS_OFF,
                                     ParentBased(TraceIdRatioBased(0.0))],
                         ids=["default_on", "always_on", "always_off", "parent_ratio_0"])
def test_every_sampler_decides_the_same(sampler: Any, incoming: str | None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SCENARIOS, "traced", _traced(incoming))
    direct, d_headers, _ = _run("traced", True, sampler=sampler)
    sdk, s_headers, _ = _run("traced", False, sampler=sampler)
    assert _normalised(direct) == _normalised(sdk)
    assert [s.context.trace_flags for s in direct] == [s.context.trace_flags for s in sdk]
    # the flags and trace state sent on are the same too
    assert d_headers["traceparent"][-2:] == s_headers["traceparent"][-2:]
    assert d_headers.get("tracestate") == s_headers.get("tracestate")
    if incoming is not None:
        assert d_headers["traceparent"][3:35] == incoming[3:35]
    if sampler is ALWAYS_ON:
        kept = True
    elif sampler is DEFAULT_ON:  # as the parent did; a new trace is sampled
        kept = incoming != UNSAMPLED
    elif sampler is ALWAYS_OFF:
        kept = False
    else:  # ratio 0 for new traces, the parent's decision otherwise
        kept = incoming == TRACEPARENT
    assert len(direct) == (2 if kept else 0)


class _ReadsOnStart(SpanProcessor):
    def __init__(self) -> None:
        self.started: list[Any] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started.append(span)


def _decide(rec: DecisionRecorder) -> None:
    with rec.decide("x") as d:
        d.candidate("a", waiting=1)
        d.choose("a")


def test_a_processor_that_reads_open_spans_gets_the_sdk_path(
        otel: Any, sdk_starts: _SdkStarts) -> None:
    tp, exporter = otel
    tp.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))  # still export-only
    rec = DecisionRecorder("p", tracer_provider=tp)
    _decide(rec)
    assert sdk_starts.calls == 0
    reader = _ReadsOnStart()
    tp.add_span_processor(reader)  # added after the first decision: noticed
    _decide(rec)
    assert sdk_starts.calls == 1 and len(exporter.get_finished_spans()) == 2
    assert len(reader.started) == 1 and reader.started[0].name == sc.SPAN_DECISION


def test_a_value_length_limit_gets_the_sdk_path(sdk_starts: _SdkStarts) -> None:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(span_limits=SpanLimits(max_attribute_length=16))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    _decide(DecisionRecorder("p", tracer_provider=tp))
    (span,) = exporter.get_finished_spans()
    assert sdk_starts.calls == 1
    assert len(span.attributes[sc.DECISION_CANDIDATES]) == 16  # the SDK truncated it


def test_a_global_provider_set_after_the_recorder_is_used_directly(
        monkeypatch: pytest.MonkeyPatch, sdk_starts: _SdkStarts) -> None:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", trace.Once())
    rec = DecisionRecorder("p")  # before the SDK is set up: a no-op until then
    _decide(rec)
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tp)
    _decide(rec)
    (span,) = exporter.get_finished_spans()
    assert sdk_starts.calls == 0 and span.name == sc.SPAN_DECISION
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "routeaudit.router"
    tp.shutdown()
