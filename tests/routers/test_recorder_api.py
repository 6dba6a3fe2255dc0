"""The router instrumentation API against the real OpenTelemetry SDK (in-memory exporter):
``async with``, relaying a body with ``Forward.stream()`` / ``astream()``, the router's server
span (``rec.serve()``, ``RouterMiddleware``) with its status and first byte, and misuse that is
counted and logged once, never raised."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import semconv as sc
from collectors.router import DecisionRecorder, RouterMiddleware

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C


@pytest.fixture
def otel() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    yield tp, exporter
    tp.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def chunks(n: int, fail_at: int | None = None) -> Iterator[bytes]:
    for i in range(n):
        if i == fail_at:
            raise ConnectionResetError("replica went away")
        yield f"data: {i}\n\n".encode()


async def achunks(n: int, fail_at: int | None = None) -> AsyncIterator[bytes]:
    for i in range(n):
        await asyncio.sleep(0)
        if i == fail_at:
            raise ConnectionResetError("replica went away")
        yield f"data: {i}\n\n".encode()


# ------------------------------------------------------------------------------ async with
def test_async_with_decision_and_forward(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("least_load", "r1", tp)

    async def route() -> dict[str, str]:
        async with rec.decide(None, incoming_headers={"traceparent": TRACEPARENT,
                                                      "x-request-id": "a-1"}) as d:
            d.candidate("http://a:1", running=1)
            d.candidate("http://b:1", running=0)
            d.choose("http://b:1", "least_load")
        async with d.forward("http://b:1/v1/completions") as f:
            f.set_http_status(200)
            return f.headers

    headers = asyncio.run(route())
    spans = by_name(exporter)
    dec, fwd = spans[sc.SPAN_DECISION], spans[sc.SPAN_FORWARD]
    assert attrs(dec)[sc.DECISION_CHOSEN] == "http://b:1"
    assert attrs(dec)[sc.REQUEST_ID] == "a-1" and dec.context.trace_id == TRACE_ID
    assert fwd.parent is not None and fwd.parent.span_id == dec.context.span_id
    assert headers["x-request-id"] == "a-1"
    assert f"{fwd.context.span_id:016x}" in headers["traceparent"]
    assert rec.errors == 0


def test_async_with_records_the_routers_exception(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)

    async def route() -> None:
        async with rec.decide("a-2") as d:
            d.candidate("x")
            raise ValueError("policy bug")

    with pytest.raises(ValueError, match="policy bug"):
        asyncio.run(route())
    dec = by_name(exporter)[sc.SPAN_DECISION]
    assert dec.status.status_code is StatusCode.ERROR
    assert attrs(dec)[sc.DECISION_OUTCOME] == "error"


# ------------------------------------------------------------------------------ stream wrappers
def _decision(rec: DecisionRecorder, rid: str) -> Any:
    with rec.decide(rid) as d:
        d.candidate("r")
        d.choose("r")
    return d


def test_sync_stream_ends_the_forward_on_completion(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    d = _decision(rec, "s-1")
    with d.forward("http://r/x") as f:
        relayed = f.stream(chunks(3))
    assert sc.SPAN_FORWARD not in by_name(exporter)  # the with block handed the end to the body
    assert list(relayed) == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    fwd = by_name(exporter)[sc.SPAN_FORWARD]
    assert fwd.status.status_code is StatusCode.UNSET and sc.ERROR_TYPE not in attrs(fwd)
    assert rec.errors == 0


def test_sync_stream_ends_the_forward_on_cancel(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    d = _decision(rec, "s-2")
    relayed = d.forward("http://r/x").stream(chunks(10))
    assert next(relayed) == b"data: 0\n\n"
    relayed.close()  # the consumer stops early: GeneratorExit inside the relay
    fwd = by_name(exporter)[sc.SPAN_FORWARD]
    assert fwd.status.status_code is StatusCode.ERROR
    assert attrs(fwd)[sc.ERROR_TYPE] == "cancelled"
    assert attrs(fwd)[sc.HTTP_STATUS] == 499  # no server span: the forward says the client left
    assert rec.errors == 0


def test_sync_stream_of_an_upstream_closed_under_it_is_a_cancel(otel: Any) -> None:
    """The router closed the replica's response before its body was read (httpx StreamClosed):
    the consumer is gone, not the replica."""
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    resp = httpx.Response(200, content=chunks(3))
    relayed = _decision(rec, "s-closed").forward("http://r/x").stream(resp)
    resp.close()
    with pytest.raises(httpx.StreamClosed):
        next(relayed)
    fwd = by_name(exporter)[sc.SPAN_FORWARD]
    assert attrs(fwd)[sc.ERROR_TYPE] == "cancelled" and attrs(fwd)[sc.HTTP_STATUS] == 499
    assert rec.errors == 0


def test_sync_stream_ends_the_forward_on_error(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    d = _decision(rec, "s-3")
    got = []
    with pytest.raises(ConnectionResetError):  # the body's error is the router's to handle
        for chunk in d.forward("http://r/x").stream(chunks(5, fail_at=2)):
            got.append(chunk)
    assert len(got) == 2
    fwd = by_name(exporter)[sc.SPAN_FORWARD]
    assert fwd.status.status_code is StatusCode.ERROR
    assert attrs(fwd)[sc.ERROR_TYPE] == "ConnectionResetError"
    assert [e.name for e in fwd.events] == ["exception"]


def test_async_stream_ends_the_forward_on_completion_error_and_aclose(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)

    async def run() -> None:
        ok = _decision(rec, "as-ok").forward("http://r/x").astream(achunks(3))
        assert [c async for c in ok] == [f"data: {i}\n\n".encode() for i in range(3)]
        broken = _decision(rec, "as-err").forward("http://r/x").astream(achunks(4, fail_at=1))
        with pytest.raises(ConnectionResetError):
            async for _ in broken:
                pass
        left = _decision(rec, "as-close").forward("http://r/x").astream(achunks(9))
        assert await left.__anext__() == b"data: 0\n\n"
        await left.aclose()

    asyncio.run(run())
    fwds = {attrs(s)[sc.REQUEST_ID]: s for s in exporter.get_finished_spans()
            if s.name == sc.SPAN_FORWARD}
    assert fwds["as-ok"].status.status_code is StatusCode.UNSET
    assert attrs(fwds["as-err"])[sc.ERROR_TYPE] == "ConnectionResetError"
    assert attrs(fwds["as-close"])[sc.ERROR_TYPE] == "cancelled"
    assert attrs(fwds["as-close"])[sc.HTTP_STATUS] == 499
    assert sc.HTTP_STATUS not in attrs(fwds["as-err"])  # an upstream error is not a cancel
    assert all(fwds[k].status.status_code is StatusCode.ERROR for k in ("as-err", "as-close"))


def test_async_stream_ends_the_forward_when_the_task_is_cancelled(otel: Any) -> None:
    """A server cancels the task of a client that went away: CancelledError inside the relay."""
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)

    async def slow() -> AsyncIterator[bytes]:
        yield b"first"
        await asyncio.sleep(3600)
        yield b"never"

    async def run() -> None:
        first = asyncio.Event()
        with rec.serve({"x-request-id": "as-cancel"}):
            d = _decision(rec, "as-cancel")

            async def consume() -> None:
                async for _ in d.forward("http://r/x").astream(slow()):
                    first.set()

            task = asyncio.create_task(consume())
            await first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    spans = by_name(exporter)
    fwd = spans[sc.SPAN_FORWARD]
    assert attrs(fwd)[sc.ERROR_TYPE] == "cancelled"
    assert sc.HTTP_STATUS not in attrs(fwd)  # the server span records the 499
    server = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert attrs(server)[sc.HTTP_STATUS] == 499 and attrs(server)[sc.ERROR_TYPE] == "cancelled"
    assert sc.ROUTER_TTFB_MS in attrs(server)  # the relay marked the first byte
    assert rec.errors == 0


def test_httpx_responses_are_relayed_closed_and_their_status_recorded(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    sync_resp = httpx.Response(503, content=chunks(2))
    assert list(_decision(rec, "hx-sync").forward("http://r/x").stream(sync_resp)) == [
        b"data: 0\n\n", b"data: 1\n\n"]
    assert sync_resp.is_closed

    async def run() -> httpx.Response:
        resp = httpx.Response(200, content=achunks(2))
        got = [c async for c in _decision(rec, "hx-async").forward("http://r/x").astream(resp)]
        assert got == [b"data: 0\n\n", b"data: 1\n\n"]
        return resp

    assert asyncio.run(run()).is_closed
    fwds = {attrs(s)[sc.REQUEST_ID]: s for s in exporter.get_finished_spans()
            if s.name == sc.SPAN_FORWARD}
    assert attrs(fwds["hx-sync"])[sc.HTTP_STATUS] == 503
    assert fwds["hx-sync"].status.status_code is StatusCode.ERROR
    assert attrs(fwds["hx-async"])[sc.HTTP_STATUS] == 200
    assert fwds["hx-async"].status.status_code is StatusCode.UNSET


# ------------------------------------------------------------------------------ server span
def test_serve_parents_decisions_and_carries_status_and_first_byte(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", "r1", tp)
    with rec.serve({"traceparent": TRACEPARENT, "x-request-id": "srv-1"},
                   path="/v1/completions") as inbound:
        with rec.decide(None) as d:
            d.candidate("r")
            d.choose("r")
        with d.forward("http://r/v1/completions") as f:
            f.set_http_status(200)
        d.respond(503)
        d.first_byte()
    spans = by_name(exporter)
    server = spans["POST /v1/completions"]
    dec = spans[sc.SPAN_DECISION]
    assert server.kind is SpanKind.SERVER and server.context.trace_id == TRACE_ID
    assert dec.parent is not None and dec.parent.span_id == server.context.span_id
    assert attrs(dec)[sc.REQUEST_ID] == inbound.request_id == "srv-1"
    a = attrs(server)
    assert a[sc.COMPONENT] == "router" and a[sc.REQUEST_ID] == "srv-1"
    assert a[sc.URL_PATH] == "/v1/completions" and a[sc.HTTP_METHOD] == "POST"
    assert a[sc.HTTP_STATUS] == 503 and server.status.status_code is StatusCode.ERROR
    assert 0 <= a[sc.ROUTER_TTFB_MS] <= (server.end_time - server.start_time) / 1e6  # type: ignore[operator]
    assert rec.errors == 0


def test_respond_without_a_server_span(otel: Any, caplog: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    with rec.decide("nr-1") as d:
        d.reject("admission_limit")
        d.respond(429)  # inside the block: on the decision span
    assert attrs(by_name(exporter)[sc.SPAN_DECISION])[sc.HTTP_STATUS] == 429
    with caplog.at_level(logging.WARNING, logger="collectors.router"):
        d.respond(429)  # after it, nothing can carry it: a misuse, not an exception
        d.first_byte()
    assert rec.misuse == {"respond_without_span": 2} and rec.errors == 2
    assert len(caplog.records) == 1 and "respond_without_span" in caplog.records[0].getMessage()


# ------------------------------------------------------------------------------ misuse
def test_misuse_is_counted_on_the_span_and_logged_once(otel: Any, caplog: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    with caplog.at_level(logging.WARNING, logger="collectors.router"):
        with rec.decide("m-1") as d:
            d.candidate(None)  # type: ignore[arg-type]
            d.candidate("a")
            d.choose(None)  # type: ignore[arg-type]
            d.choose("z", "typo")  # not a candidate
        with rec.decide("m-2") as late:
            late.candidate("a")
        late.choose("a", "too_late")
        late.choose("a", "too_late")
    decs = {attrs(s)[sc.REQUEST_ID]: attrs(s) for s in exporter.get_finished_spans()}
    assert decs["m-1"][sc.MISUSE] == ("none_replica", "none_replica", "chosen_not_candidate")
    assert decs["m-1"][sc.DECISION_CHOSEN] == "z"  # still recorded: it is what the router did
    assert decs["m-1"][sc.DECISION_CANDIDATE_COUNT] == 1
    assert decs["m-2"][sc.DECISION_OUTCOME] == "error"
    assert decs["m-2"][sc.DECISION_REASON] == "no_decision"
    assert rec.misuse == {"none_replica": 2, "chosen_not_candidate": 1, "decided_after_end": 2}
    assert rec.errors == 5
    kinds = sorted(r.getMessage().split("(", 1)[1].split(")", 1)[0] for r in caplog.records)
    assert kinds == ["chosen_not_candidate", "decided_after_end", "none_replica"]


def test_choose_after_the_block_lands_on_the_open_forward(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    with rec.decide("m-3") as d:
        d.candidate("a")
    f = d.forward("http://a/x")
    d.choose("a")
    f.end()
    fwd = by_name(exporter)[sc.SPAN_FORWARD]
    assert attrs(fwd)[sc.MISUSE] == ("decided_after_end",)
    assert rec.misuse == {"decided_after_end": 1}


def test_a_forward_never_ended_is_closed_with_an_error_mark(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    with rec.serve({"x-request-id": "m-4"}):
        d = _decision(rec, "m-4")
        d.forward("http://r/x")  # never ended: closed when the server span ends
    d = _decision(rec, "m-5")
    d.forward("http://r/x")
    del d
    gc.collect()  # closed when garbage-collected
    fwds = {attrs(s)[sc.REQUEST_ID]: s for s in exporter.get_finished_spans()
            if s.name == sc.SPAN_FORWARD}
    for rid in ("m-4", "m-5"):
        a = attrs(fwds[rid])
        assert a[sc.MISUSE] == ("forward_not_ended",) and a[sc.ERROR_TYPE] == "forward_not_ended"
        assert fwds[rid].status.status_code is StatusCode.ERROR
    assert rec.misuse == {"forward_not_ended": 2} and rec.errors == 2


# ------------------------------------------------------------------------------ middleware
def _app(rec: DecisionRecorder) -> Any:
    async def route(request: Request) -> Response:
        body = await request.json()
        async with rec.decide(None) as d:
            d.candidate("r")
            if body.get("reject"):
                d.reject("admission_limit")
                return JSONResponse({"error": "busy"}, status_code=429)
            d.choose("r", "only")
        if body.get("boom"):
            raise RuntimeError("router bug")
        fwd = d.forward("http://r/x")
        if body.get("leak"):
            return JSONResponse({"ok": True})  # forward never ended
        return StreamingResponse(fwd.astream(achunks(3)), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return RouterMiddleware(Starlette(routes=[Route("/v1/completions", route, methods=["POST"]),
                                              Route("/health", health)]), rec)


def test_middleware_records_the_routers_answer(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", "r1", tp)

    async def run() -> list[int]:
        transport = httpx.ASGITransport(app=_app(rec), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            codes = []
            for rid, body in [("mw-ok", {}), ("mw-429", {"reject": True}),
                              ("mw-500", {"boom": True}), ("mw-leak", {"leak": True})]:
                r = await client.post("/v1/completions", json=body,
                                      headers={"x-request-id": rid, "traceparent": TRACEPARENT})
                codes.append(r.status_code)
            codes.append((await client.get("/health")).status_code)
            return codes

    assert asyncio.run(run()) == [200, 429, 500, 200, 200]
    spans = exporter.get_finished_spans()
    servers = {attrs(s)[sc.REQUEST_ID]: s for s in spans if s.kind is SpanKind.SERVER}
    assert sorted(servers) == ["mw-429", "mw-500", "mw-leak", "mw-ok"]  # GET /health untraced
    assert {k: attrs(s)[sc.HTTP_STATUS] for k, s in servers.items()} == {
        "mw-ok": 200, "mw-429": 429, "mw-500": 500, "mw-leak": 200}
    assert servers["mw-500"].status.status_code is StatusCode.ERROR
    assert attrs(servers["mw-500"])[sc.ERROR_TYPE] == "RuntimeError"
    assert sc.ROUTER_TTFB_MS in attrs(servers["mw-ok"])
    for s in spans:
        if s.name == sc.SPAN_DECISION:
            rid = attrs(s)[sc.REQUEST_ID]
            assert s.parent is not None and s.parent.span_id == servers[rid].context.span_id
            assert s.context.trace_id == TRACE_ID
    fwds = {attrs(s)[sc.REQUEST_ID]: attrs(s) for s in spans if s.name == sc.SPAN_FORWARD}
    assert sorted(fwds) == ["mw-leak", "mw-ok"]
    assert fwds["mw-leak"][sc.MISUSE] == ("forward_not_ended",)
    assert sc.MISUSE not in fwds["mw-ok"]
    assert rec.misuse == {"forward_not_ended": 1}


# ------------------------------------------------------------------------------ nesting in time
def test_relay_ends_the_forward_before_the_last_bytes_go_out(otel: Any) -> None:
    """Clock correction needs the router's spans to end, on true time, before the client can see
    the end of the answer: the forward ends on the replica's last bytes, before relaying them."""
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)

    def ended() -> bool:
        return any(s.name == sc.SPAN_FORWARD for s in exporter.get_finished_spans())

    sse = [b"data: {}\n\n", b"data: {}\n\n", b"data: [DONE]\n\n"]
    seen = [(chunk, ended()) for chunk in _decision(rec, "n-1").forward("u").stream(iter(sse))]
    assert seen == [(sse[0], False), (sse[1], False), (sse[2], True)]
    exporter.clear()

    async def run() -> list[tuple[bytes, bool]]:
        resp = httpx.Response(200, headers={"content-length": "6"}, content=achunks_of(b"abc", b"def"))
        return [(c, ended()) async for c in _decision(rec, "n-2").forward("u").astream(resp)]

    assert asyncio.run(run()) == [(b"abc", False), (b"def", True)]


async def achunks_of(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        await asyncio.sleep(0)
        yield p


def test_middleware_ends_the_server_span_before_the_last_bytes_go_out(otel: Any) -> None:
    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                    "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    sent: list[tuple[bytes, int]] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body":
            sent.append((message["body"], time.time_ns()))

    async def receive() -> Any:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"x-request-id", b"n-3")]}
    asyncio.run(RouterMiddleware(app, rec)(scope, receive, send))
    server = exporter.get_finished_spans()[0]
    done_sent_at = next(t for body, t in sent if body.startswith(b"data: [DONE]"))
    assert server.end_time is not None and server.end_time <= done_sent_at
    assert attrs(server)[sc.HTTP_STATUS] == 200 and rec.errors == 0


def test_middleware_under_fastapi(otel: Any) -> None:
    """The same pure ASGI middleware, added the FastAPI way."""
    from fastapi import FastAPI

    tp, exporter = otel
    rec = DecisionRecorder("p", tracer_provider=tp)
    api = FastAPI()

    @api.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        async with rec.decide(None) as d:
            d.candidate("r")
            d.choose("r", "only")
        async with d.forward("http://r/v1/completions") as fwd:
            chunks = fwd.astream(achunks_of(b"data: 1\n\n", b"data: [DONE]\n\n"))
        return StreamingResponse(chunks, media_type="text/event-stream")

    api.add_middleware(RouterMiddleware, recorder=rec)

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            return await client.post("/v1/completions", json={},
                                     headers={"x-request-id": "fa-1"})

    assert asyncio.run(run()).text.endswith("data: [DONE]\n\n")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    server = spans["POST /v1/completions"]
    assert attrs(server)[sc.HTTP_STATUS] == 200 and attrs(server)[sc.REQUEST_ID] == "fa-1"
    assert sc.ROUTER_TTFB_MS in attrs(server)
    dec, fwd = spans[sc.SPAN_DECISION], spans[sc.SPAN_FORWARD]
    assert dec.parent is not None and dec.parent.span_id == server.context.span_id
    assert fwd.status.status_code is StatusCode.UNSET and rec.errors == 0
