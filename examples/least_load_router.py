"""Least-load router with prefix affinity over N OpenAI-compatible backends, streaming:
``python examples/least_load_router.py URL [URL ...]`` (listens on 127.0.0.1:8000).

Load: requests in flight per backend. A prompt whose first PREFIX_CHARS characters last went to
a backend goes there again (its prefix cache likely holds them) unless it carries more than
SLACK requests above the least loaded one. An unreachable backend gets 502 and is skipped for
DOWN_S s. ``# routeaudit`` marks the instrumentation (spans to OTLP/HTTP 127.0.0.1:4318)."""

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from collectors.router import DecisionRecorder, RouterMiddleware  # routeaudit

PREFIX_CHARS, SLACK, DOWN_S = 64, 2, 5.0


def make_app(backends: list[str], tracer_provider: Any = None) -> Any:
    load = dict.fromkeys(backends, 0)
    down_until = dict.fromkeys(backends, 0.0)
    affinity: dict[str, str] = {}
    http = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=2.0))
    rec = DecisionRecorder("least_load_prefix", "example-router", tracer_provider)  # routeaudit

    async def proxy(request: Request) -> Response:
        body = await request.body()
        req = json.loads(body or b"{}")
        prompt = str(req.get("prompt") or req.get("messages") or "")
        key = hashlib.sha256(prompt[:PREFIX_CHARS].encode()).hexdigest()[:16]
        up = [b for b in backends if down_until[b] <= time.monotonic()] or backends
        async with rec.decide(None, model=req.get("model"), max_tokens=req.get("max_tokens"),  # routeaudit
                              stream=bool(req.get("stream")), prefix_hashes=[key],  # routeaudit
                              endpoint=request.url.path) as d:  # routeaudit
            for b in backends:
                d.candidate(b, eligible=b in up, running=load[b], score=load[b],  # routeaudit
                            excluded_reason=None if b in up else "unreachable")  # routeaudit
            least = min(up, key=load.__getitem__)
            sticky = affinity.get(key)
            if sticky in up and sticky is not None and load[sticky] <= load[least] + SLACK:
                backend, reason = sticky, "prefix_affinity"
            else:
                backend, reason = least, "least_load"
            d.choose(backend, reason)  # routeaudit
        affinity[key] = backend
        load[backend] += 1
        url = backend + request.url.path
        try:
            async with d.forward(url) as fwd:  # routeaudit
                upstream = await http.send(http.build_request(
                    "POST", url, content=body,
                    headers={"content-type": "application/json", **fwd.headers}),  # routeaudit
                    stream=True)
                chunks = fwd.astream(upstream)  # routeaudit: ends the forward span with the body
        except httpx.TransportError as exc:
            load[backend] -= 1
            down_until[backend] = time.monotonic() + DOWN_S
            return JSONResponse({"error": f"{backend} unreachable: {exc!r}"}, status_code=502)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in chunks:
                    yield chunk
            finally:
                load[backend] -= 1

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await http.aclose()

    paths = ["/v1/completions", "/v1/chat/completions"]
    app = Starlette(routes=[Route(p, proxy, methods=["POST"]) for p in paths], lifespan=lifespan)
    return RouterMiddleware(app, rec)  # routeaudit: the router's server span, status, first byte


if __name__ == "__main__":
    import uvicorn
    from opentelemetry import trace  # routeaudit
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # routeaudit
    from opentelemetry.sdk.trace import TracerProvider  # routeaudit
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # routeaudit

    provider = TracerProvider()  # routeaudit
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # routeaudit
    trace.set_tracer_provider(provider)  # routeaudit
    uvicorn.run(make_app(sys.argv[1:]), host="127.0.0.1", port=8000)
