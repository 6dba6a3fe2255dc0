"""Replica middleware and record_execution against the real OTel SDK."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import collectors.replica as replica_pkg
import semconv as sc
from collectors.replica import ReplicaMiddleware, engine_facts, record_execution

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_public_surface() -> None:
    assert sorted(replica_pkg.__all__) == sorted(
        n for n in dir(replica_pkg) if not n.startswith("_"))


def test_record_execution(otel: Any) -> None:
    tp, exporter = otel
    t = 1_700_000_000_000_000_000
    parent = trace.set_span_in_context(trace.NonRecordingSpan(trace.SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1))))
    ctx = record_execution(
        request_id="r1", replica_id="10.0.0.5:8000", start_ns=t, end_ns=t + 900_000_000,
        parent_context=parent, endpoint="/v1/chat/completions", prompt_tokens=100,
        completion_tokens=20, cached_tokens=64, finish_reason="stop", max_tokens=32,
        scheduled_ns=t + 100_000_000, first_token_ns=t + 300_000_000,
        last_token_ns=t + 850_000_000, preemptions=1, dp_rank=2, http_status=200,
        tracer_provider=tp)
    assert ctx is not None
    (s,) = exporter.get_finished_spans()
    assert s.name == "llm_request" and s.kind == SpanKind.SERVER
    assert s.context.trace_id == 0xABC and s.parent.span_id == 0xDEF
    a = s.attributes
    assert a[sc.GEN_AI_REQUEST_ID] == "chatcmpl-r1" and a[sc.REQUEST_ID] == "r1"
    assert a[sc.COMPONENT] == "replica" and a[sc.REPLICA_ID] == "10.0.0.5:8000"
    assert a[sc.USAGE_PROMPT_TOKENS] == 100 and a[sc.USAGE_COMPLETION_TOKENS] == 20
    assert a[sc.USAGE_CACHE_READ_INPUT_TOKENS] == 64 and a[sc.REPLICA_PREEMPTIONS] == 1
    assert a[sc.RESPONSE_FINISH_REASONS] == ("stop",) and a[sc.REPLICA_DP_RANK] == 2
    assert a[sc.LATENCY_QUEUE_S] == pytest.approx(0.1)
    assert a[sc.LATENCY_PREFILL_S] == pytest.approx(0.2)
    assert a[sc.LATENCY_DECODE_S] == pytest.approx(0.55)
    assert a[sc.LATENCY_INFERENCE_S] == pytest.approx(0.75)
    assert a[sc.LATENCY_TTFT_S] == pytest.approx(0.3)
    assert a[sc.LATENCY_E2E_S] == pytest.approx(0.9)
    assert (s.start_time, s.end_time) == (t, t + 900_000_000)
    assert record_execution(request_id="x", replica_id=None, start_ns="bad",  # type: ignore
                            end_ns=0, tracer_provider=tp) is None


def app_under_test(report: bool) -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        if report:
            facts = engine_facts(request)
            facts.update(cached_tokens=16, preemptions=2, finish_reason="stop")
        if body.get("fail"):
            raise RuntimeError("engine died")
        if body.get("busy"):
            return JSONResponse({"error": "busy"}, status_code=503)
        if body.get("stream"):
            async def gen() -> Any:
                for i in range(3):
                    choice = {"text": f"t{i}", "finish_reason": "length" if i == 2 else None}
                    yield f'data: {json.dumps({"choices": [choice]})}\n\n'
                yield 'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}\n\n'
                yield "data: [DONE]\n\n"
            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse({"choices": [{"text": "ab", "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 4, "completion_tokens": 2,
                                       "prompt_tokens_details": {"cached_tokens": 4}}})

    async def health(request: Request) -> Response:
        return Response("ok")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/health", health)])


async def call(app: Any, body: dict[str, Any], headers: dict[str, str] | None = None,
               path: str = "/v1/completions") -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as c:
        return await c.post(path, json=body, headers=headers or {})


def test_middleware_from_response_only(otel: Any) -> None:
    tp, exporter = otel
    app = ReplicaMiddleware(app_under_test(report=False), replica_id="rep-1",
                            tracer_provider=tp)
    r = asyncio.run(call(app, {"prompt": "x", "max_tokens": 2, "model": "m"},
                         {"traceparent": TRACEPARENT, "X-Request-Id": "abc"}))
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc"
    r2 = asyncio.run(call(app, {"prompt": "x", "max_tokens": 3, "stream": True}))
    assert r2.status_code == 200
    s1, s2 = exporter.get_finished_spans()
    a = s1.attributes
    assert format(s1.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert a[sc.GEN_AI_REQUEST_ID] == "cmpl-abc-0" and a[sc.REQUEST_MAX_TOKENS] == 2
    assert a[sc.REQUEST_MODEL] == "m" and a[sc.USAGE_CACHE_READ_INPUT_TOKENS] == 4
    assert a[sc.USAGE_COMPLETION_TOKENS] == 2 and a[sc.RESPONSE_FINISH_REASONS] == ("length",)
    assert a[sc.HTTP_STATUS] == 200 and a[sc.STATUS] == "ok"
    b = s2.attributes
    assert b[sc.USAGE_COMPLETION_TOKENS] == 3 and b[sc.USAGE_PROMPT_TOKENS] == 4
    assert b[sc.RESPONSE_FINISH_REASONS] == ("length",) and b[sc.LATENCY_TTFT_S] >= 0
    assert b[sc.LATENCY_DECODE_S] >= 0
    assert len(b[sc.REQUEST_ID]) == 32 and s2.parent is None


def test_middleware_facts_errors_and_passthrough(otel: Any) -> None:
    tp, exporter = otel
    app = ReplicaMiddleware(app_under_test(report=True), replica_id="rep-1", tracer_provider=tp,
                            dp_rank=1)
    asyncio.run(call(app, {"prompt": "x"}))
    assert asyncio.run(call(app, {"busy": True})).status_code == 503
    assert asyncio.run(call(app, {"fail": True})).status_code == 500
    transport = httpx.ASGITransport(app=app)

    async def health() -> int:
        async with httpx.AsyncClient(transport=transport, base_url="http://r") as c:
            return (await c.get("/health")).status_code
    assert asyncio.run(health()) == 200
    ok, busy, failed = exporter.get_finished_spans()  # /health: no span
    assert ok.attributes[sc.USAGE_CACHE_READ_INPUT_TOKENS] == 16  # app's facts win
    assert ok.attributes[sc.RESPONSE_FINISH_REASONS] == ("stop",)
    assert ok.attributes[sc.REPLICA_PREEMPTIONS] == 2 and ok.attributes[sc.REPLICA_DP_RANK] == 1
    assert busy.attributes[sc.STATUS] == "rejected" and busy.attributes[sc.HTTP_STATUS] == 503
    assert failed.attributes[sc.STATUS] == "error"
    assert failed.status.status_code == StatusCode.ERROR


def test_engine_facts_without_middleware() -> None:
    assert engine_facts({"type": "http"}) == {}


@pytest.mark.parametrize("form", ["sse", "content-length"])
def test_the_span_ends_when_the_answer_is_complete_not_at_the_closing_message(
        otel: Any, form: str) -> None:
    """A router ends its forward span on the bytes that complete the answer (``[DONE]``, or
    Content-Length reached); Starlette sends an empty closing message after them. A span ended
    at that message could outlive its caller (here the app pauses 200 ms before it), and one
    such pair makes clock-offset estimation flag every request through the router."""
    import time

    tp, exporter = otel
    sse = form == "sse"
    answer = (b'data: {"choices": [{"text": "a", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n' if sse
              else json.dumps({"choices": [{"text": "a", "finish_reason": "stop"}]}).encode())
    headers = [(b"content-type", b"text/event-stream" if sse else b"application/json")]
    if not sse:
        headers.append((b"content-length", str(len(answer)).encode()))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer, "more_body": True})
        await asyncio.sleep(0.2)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    complete_ns: list[int] = []

    async def send(msg: Any) -> None:
        if msg.get("body"):
            complete_ns.append(time.time_ns())  # when the answer's last bytes leave

    async def receive() -> Any:
        return {"type": "http.request", "body": b'{"prompt": "x"}', "more_body": False}

    mw = ReplicaMiddleware(app, replica_id="rep-1", tracer_provider=tp)
    asyncio.run(mw({"type": "http", "path": "/v1/completions", "headers": []}, receive, send))
    (span,) = exporter.get_finished_spans()
    assert span.end_time is not None and span.end_time <= complete_ns[-1]
    assert span.attributes[sc.RESPONSE_FINISH_REASONS] == ("stop",)
