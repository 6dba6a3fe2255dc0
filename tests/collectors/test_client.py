"""Instrumented client: figures, statuses and spans (httpx transports, real OTel SDK)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

import collectors.client as client_pkg
import semconv as sc
from collectors.client import (
    AsyncInstrumentedClient,
    InstrumentedClient,
    record_client_request,
)
from collectors.client._result import summarize


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def test_public_surface() -> None:
    assert sorted(client_pkg.__all__) == sorted(
        n for n in dir(client_pkg) if not n.startswith("_"))


def test_summarize() -> None:
    ttft, tpot, e2e, itl, n = summarize(0, 100_000_000, [10_000_000, 30_000_000, 60_000_000],
                                        None)
    assert (ttft, e2e, itl, n) == (10.0, 100.0, [20.0, 30.0], 3)
    assert tpot == pytest.approx(45.0)
    assert summarize(0, 5_000_000, [1_000_000], None)[1] is None  # n < 2
    assert summarize(0, 5_000_000, [1_000_000], 5)[1] == pytest.approx(1.0)  # usage says 5
    assert summarize(0, 5_000_000, [], None)[:2] == (None, None)


def test_streaming_chat(otel: Any) -> None:
    tp, exporter = otel
    sent: dict[str, Any] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        sent["headers"] = dict(request.headers)
        sent["body"] = json.loads(request.content)
        body = sse(
            {"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]},
            {"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]},
            {"choices": [{"delta": {"content": "lo"}, "finish_reason": None}]},
            {"choices": [{"delta": {"content": "!"}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4,
                                      "prompt_tokens_details": {"cached_tokens": 5}}},
        )
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    with InstrumentedClient("http://router", model="m", tracer_provider=tp,
                            http_client=http) as c:
        r = c.chat([{"role": "user", "content": "hi"}], max_tokens=8, stream=True,
                   request_id="rid-1", input_tokens=7)
    http.close()
    assert r.status == "ok" and r.text == "Hello!" and r.finish_reason == "stop"
    assert r.output_tokens == 4 and r.prompt_tokens == 7 and r.cached_tokens == 5
    assert r.ttft_ms is not None and len(r.itl_ms) == 2
    assert r.tpot_ms == pytest.approx((r.e2e_ms - r.ttft_ms) / 3)
    assert sent["body"]["stream_options"] == {"include_usage": True}
    assert sent["body"]["model"] == "m" and sent["body"]["max_tokens"] == 8
    assert sent["headers"]["x-request-id"] == "rid-1"
    (span,) = exporter.get_finished_spans()
    assert span.name == sc.SPAN_CLIENT and span.kind == SpanKind.CLIENT
    assert sent["headers"]["traceparent"].split("-")[2] == format(span.context.span_id, "016x")
    a = span.attributes
    assert a[sc.COMPONENT] == "client" and a[sc.REQUEST_ID] == "rid-1"
    assert a[sc.STATUS] == "ok" and a[sc.HTTP_STATUS] == 200
    assert a[sc.USAGE_OUTPUT_TOKENS] == 4 and a[sc.USAGE_INPUT_TOKENS] == 7
    assert a[sc.CLIENT_CACHED_TOKENS] == 5 and a[sc.RESPONSE_FINISH_REASONS] == ("stop",)
    assert a[sc.REQUEST_ENDPOINT] == "/v1/chat/completions" and a[sc.REQUEST_STREAM] is True
    assert a[sc.REQUEST_INPUT_TOKENS] == 7 and a[sc.REQUEST_MODEL] == "m"
    assert a[sc.CLIENT_TTFT_MS] == r.ttft_ms and a[sc.CLIENT_TPOT_MS] == r.tpot_ms
    assert a[sc.CLIENT_ITL_MAX_MS] == max(r.itl_ms)
    assert span.start_time == r.start_ns and span.end_time == r.end_ns


@pytest.mark.parametrize(("code", "status"), [(429, "rejected"), (503, "rejected"),
                                              (500, "error"), (400, "error")])
def test_http_errors(otel: Any, code: int, status: str) -> None:
    tp, exporter = otel
    http = httpx.Client(transport=httpx.MockTransport(
        lambda req: httpx.Response(code, json={"error": "x"})))
    r = InstrumentedClient("http://r", tracer_provider=tp, http_client=http).completions(
        "p", max_tokens=2)
    http.close()
    assert (r.status, r.http_status) == (status, code) and r.error is not None
    (span,) = exporter.get_finished_spans()
    assert span.attributes[sc.STATUS] == status and span.attributes[sc.HTTP_STATUS] == code
    assert span.status.status_code == StatusCode.ERROR
    assert len(r.request_id) == 32


def test_timeout_and_connection_error(otel: Any) -> None:
    tp, exporter = otel

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    for handler, status in ((slow, "timeout"), (refused, "error")):
        http = httpx.Client(transport=httpx.MockTransport(handler))
        r = InstrumentedClient("http://r", tracer_provider=tp, http_client=http).completions("p")
        http.close()
        assert r.status == status and r.http_status is None
    assert [s.attributes[sc.STATUS] for s in exporter.get_finished_spans()] == ["timeout",
                                                                                 "error"]


def test_non_streaming_completion_and_async(otel: Any) -> None:
    tp, exporter = otel
    body = {"choices": [{"text": "abc", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                      "prompt_tokens_details": None}}
    transport = httpx.MockTransport(lambda req: httpx.Response(200, json=body))
    http = httpx.Client(transport=transport)
    r = InstrumentedClient("http://r", tracer_provider=tp, http_client=http).completions(
        "p", max_tokens=2)
    http.close()
    assert (r.status, r.output_tokens, r.finish_reason, r.text) == ("ok", 2, "length", "abc")
    assert r.ttft_ms is None and r.tpot_ms is None and r.cached_tokens is None

    async def go() -> Any:
        async with httpx.AsyncClient(transport=transport) as ah:
            return await AsyncInstrumentedClient("http://r", tracer_provider=tp,
                                                 http_client=ah).completions("p", max_tokens=2)
    r2 = asyncio.run(go())
    assert r2.status == "ok" and r2.output_tokens == 2
    assert len(exporter.get_finished_spans()) == 2


def test_async_cancellation_records_cancelled(otel: Any) -> None:
    tp, exporter = otel

    class Stream(httpx.AsyncByteStream):
        closed = False

        async def __aiter__(self) -> Any:
            yield b'data: {"choices": [{"text": "a", "finish_reason": null}]}\n\n'
            await asyncio.sleep(30)
            yield b"data: [DONE]\n\n"

        async def aclose(self) -> None:
            Stream.closed = True

    transport = httpx.MockTransport(lambda req: httpx.Response(
        200, stream=Stream(), headers={"content-type": "text/event-stream"}))

    async def go() -> None:
        async with httpx.AsyncClient(transport=transport) as ah:
            c = AsyncInstrumentedClient("http://r", tracer_provider=tp, http_client=ah)
            task = asyncio.create_task(c.completions("p", stream=True, request_id="c1"))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    assert Stream.closed
    (span,) = exporter.get_finished_spans()
    a = span.attributes
    assert a[sc.STATUS] == "cancelled" and a[sc.RESPONSE_FINISH_REASONS] == ("abort",)
    assert a[sc.CLIENT_TTFT_MS] > 0 and a[sc.USAGE_OUTPUT_TOKENS] == 1


def test_record_client_request(otel: Any) -> None:
    tp, exporter = otel
    t = 1_700_000_000_000_000_000
    ctx = record_client_request(
        "v-1", start_ns=t, end_ns=t + 1_000_000_000, token_ns=[t + 200_000_000,
                                                               t + 300_000_000],
        output_tokens=9, prompt_tokens=100, cached_tokens=64, finish_reason="stop",
        model="m", max_tokens=9, input_tokens=100, run_id="run-1", tracer_provider=tp)
    assert ctx is not None
    (span,) = exporter.get_finished_spans()
    assert (span.start_time, span.end_time) == (t, t + 1_000_000_000)
    assert trace.get_current_span(ctx).get_span_context().span_id == span.context.span_id
    a = span.attributes
    assert a[sc.CLIENT_TTFT_MS] == 200.0 and a[sc.CLIENT_E2E_MS] == 1000.0
    assert a[sc.CLIENT_TPOT_MS] == pytest.approx(100.0)  # (1000 - 200) / 8
    assert a[sc.USAGE_OUTPUT_TOKENS] == 9 and a[sc.CLIENT_CACHED_TOKENS] == 64
    assert a[sc.RUN_ID] == "run-1" and a[sc.STATUS] == "ok"
    assert span.events[0].name == sc.EVENT_FIRST_TOKEN
    assert span.events[0].timestamp == t + 200_000_000
    assert record_client_request("bad", start_ns="x", end_ns=0,  # type: ignore[arg-type]
                                 tracer_provider=tp) is None
