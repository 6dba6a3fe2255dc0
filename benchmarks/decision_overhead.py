"""Cost of DecisionRecorder: µs per decision (8 candidates) and router throughput ratio.

    python3 benchmarks/decision_overhead.py [--decisions 20000] [--requests 2000]

1. µs per decision with 8 candidates, OTel SDK + BatchSpanProcessor + a no-op exporter, against
   the same span and 8 events written directly with the SDK (the floor any instrumentation pays).
2. Throughput of the minimal round-robin router of docs/instrument-your-router.md with
   instrumentation vs the same router without it, over real loopback sockets (one fake worker,
   fixed request count and concurrency), as a ratio measured in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audit import semconv as sc  # noqa: E402
from collectors.router import DecisionRecorder  # noqa: E402

N_CANDIDATES = 8


class NullExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def provider() -> TracerProvider:
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(NullExporter(), max_queue_size=65536,
                                             max_export_batch_size=2048))
    return tp


def bench_decisions(n: int) -> tuple[float, float, float]:
    tp = provider()
    rec = DecisionRecorder("least_load", "bench", tp)
    noop = DecisionRecorder("least_load", "bench", NoOpTracerProvider())
    replicas = [f"http://10.0.0.{i}:8000" for i in range(N_CANDIDATES)]
    now = time.time_ns()

    def instrumented(rec: DecisionRecorder = rec) -> None:
        with rec.decide("req", model="m", input_tokens=512, max_tokens=64) as d:
            for i, r in enumerate(replicas):
                d.candidate(r, waiting=i, running=3, kv_usage=0.5, telemetry_ts_ns=now,
                            pending=1, score=float(i))
            d.choose(replicas[3], "least_load")

    tracer = tp.get_tracer("bench")

    def raw_sdk() -> None:  # the same span and events, by hand, prebuilt attribute values
        span = tracer.start_span(sc.SPAN_DECISION, attributes={
            sc.COMPONENT: "router", sc.REQUEST_ID: "req", sc.ATTEMPT: 0,
            sc.ROUTER_POLICY: "least_load", sc.ROUTER_ID: "bench", sc.REQUEST_MODEL: "m",
            sc.REQUEST_INPUT_TOKENS: 512, sc.REQUEST_MAX_TOKENS: 64})
        t = time.time_ns()
        for i, r in enumerate(replicas):
            span.add_event(sc.EVENT_CANDIDATE, {
                sc.CANDIDATE_REPLICA: r, sc.CANDIDATE_ELIGIBLE: True, sc.CANDIDATE_WAITING: i,
                sc.CANDIDATE_RUNNING: 3, sc.CANDIDATE_KV_USAGE: 0.5,
                sc.CANDIDATE_TELEMETRY_TS: now, sc.CANDIDATE_TELEMETRY_AGE_MS: (t - now) / 1e6,
                sc.CANDIDATE_PENDING: 1, sc.CANDIDATE_SCORE: float(i),
                sc.CANDIDATE_CHOSEN: i == 3}, t)
        span.set_attributes({sc.DECISION_CHOSEN: replicas[3], sc.DECISION_REASON: "least_load",
                             sc.DECISION_OUTCOME: "routed", sc.DECISION_CANDIDATE_COUNT: 8,
                             sc.DECISION_TIME: t})
        span.end()

    def timed(fn: Any) -> float:
        for _ in range(min(n, 2000)):
            fn()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
            tp.force_flush()
        return best

    try:
        return (timed(instrumented), timed(raw_sdk),
                timed(lambda: instrumented(noop)))
    finally:
        tp.shutdown()


# --------------------------------------------------------------------------- throughput
@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def worker_app() -> Starlette:
    async def completions(request: Request) -> Response:
        await request.body()
        return JSONResponse({"choices": [{"text": "ok", "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def doc_router(workers: list[str], tp: TracerProvider) -> Any:
    text = (ROOT / "docs" / "instrument-your-router.md").read_text()
    block = re.search(r"<!-- router-example:start -->\n```python\n(.*?)```", text, re.S)
    assert block is not None
    ns: dict[str, Any] = {"__name__": "doc_router"}
    exec(block.group(1), ns)
    return ns["make_app"](workers, tracer_provider=tp)


def plain_router(workers: list[str]) -> Starlette:
    """The doc router with the `# routeaudit` lines removed."""
    import json

    rr = itertools.cycle(workers)
    http = httpx.AsyncClient(timeout=None)

    async def proxy(request: Request) -> Response:
        body = await request.body()
        max_tokens = json.loads(body or b"{}").get("max_tokens") or 0
        if max_tokens > 4096:
            return JSONResponse({"error": "over admission limit"}, status_code=429)
        worker = next(rr)
        url = worker + request.url.path
        upstream = await http.send(http.build_request(
            "POST", url, content=body, headers={"content-type": "application/json"}), stream=True)

        async def relay() -> Any:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        await http.aclose()

    return Starlette(routes=[Route("/v1/completions", proxy, methods=["POST"])],
                     lifespan=lifespan)


async def load(url: str, n: int, concurrency: int) -> float:
    body = {"model": "m", "prompt": "hello", "max_tokens": 1}
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency)) as c:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                r = await c.post(url + "/v1/completions", json=body)
                assert r.status_code == 200

        await asyncio.gather(*(one() for _ in range(min(n, 100))))  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return n / (time.perf_counter() - t0)


def bench_throughput(n: int, concurrency: int) -> tuple[float, float]:
    tp = provider()
    try:
        with serve(worker_app()) as worker:
            rates: dict[str, list[float]] = {"plain": [], "instrumented": []}
            with serve(plain_router([worker])) as plain, \
                    serve(doc_router([worker], tp)) as inst:
                for _ in range(3):  # interleave to share machine noise
                    rates["plain"].append(asyncio.run(load(plain, n, concurrency)))
                    rates["instrumented"].append(asyncio.run(load(inst, n, concurrency)))
        return max(rates["plain"]), max(rates["instrumented"])
    finally:
        tp.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=20000)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()

    inst, raw, noop = bench_decisions(args.decisions)
    print(f"decision with {N_CANDIDATES} candidates, SDK + BatchSpanProcessor + no-op exporter:")
    print(f"  DecisionRecorder      {inst:8.1f} µs/decision")
    print(f"  same spans, raw SDK   {raw:8.1f} µs/decision")
    print(f"  recorder overhead     {inst - raw:8.1f} µs/decision beyond the SDK "
          f"(ratio {inst / raw:.2f})")
    print(f"  recorder, no SDK      {noop:8.1f} µs/decision (recorder's own work, no spans)")
    plain, instrumented = bench_throughput(args.requests, args.concurrency)
    print(f"minimal round-robin router, 1 worker, {args.requests} requests, "
          f"concurrency {args.concurrency} (best of 3):")
    print(f"  without instrumentation  {plain:8.0f} req/s")
    print(f"  with instrumentation     {instrumented:8.0f} req/s")
    print(f"  ratio instrumented/plain {instrumented / plain:8.3f}")


if __name__ == "__main__":
    main()
