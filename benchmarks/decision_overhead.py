"""Cost of DecisionRecorder: µs per decision (8 candidates) and router throughput ratio.

    python3 benchmarks/decision_overhead.py [--decisions 20000] [--requests 5000] [--workers 8]

For each candidate encoding (``json``, the default, and ``events``):

1. µs per decision with 8 candidates, OTel SDK + BatchSpanProcessor + a no-op exporter: the
   recorder as shipped (direct spans, collectors/router/_direct_spans.py), the recorder through
   the SDK's ``Tracer.start_span`` (``direct_spans=False``), and the same span (and events)
   written with ``Tracer.start_span`` from prebuilt values (what any instrumentation using the
   SDK's spans pays); the same for a decision followed by its forward span (with the
   trace-context headers); the recorder's whole work with an SDK provider that has no span
   processor (building the record and the spans, no export queue); and with no SDK at all
   (no-op: candidates are not even formatted).
2. Throughput of the minimal round-robin router of docs/instrument-your-router.md with
   instrumentation vs the same router without it, over real loopback sockets. Each router runs
   alone in its own process (uvicorn, one core's worth of Python); the fake worker (one process
   listening on ``--workers`` ports, so the router sees that many candidates) and the load
   generator (fixed request count and concurrency, keep-alive connections) are separate
   processes written against raw asyncio streams so that they cost little next to the router.
   Runs are interleaved (plain, json, json through the SDK's spans, events) × ``--rounds``;
   ratios instrumented/plain from the best round of each router, and the median of each round's
   own ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import multiprocessing as mp
import re
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import NoOpTracerProvider  # noqa: E402

import semconv as sc  # noqa: E402
from collectors.router import DecisionRecorder  # noqa: E402
from collectors.router._recorder import extract_context  # noqa: E402

N_CANDIDATES = 8
ENCODINGS = ("json", "events")
ROUTERS = ("plain", "json", "json-sdk", "events")


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


# --------------------------------------------------------------------------- µs per decision
def bench_decisions(n: int) -> dict[str, dict[str, float]]:
    """{encoding: {case: µs per decision}}; cases: recorder, raw, recorder_fwd, raw_fwd, noop."""
    tp = provider()
    tracer = tp.get_tracer("bench")
    replicas = [f"http://10.0.0.{i}:8000" for i in range(N_CANDIDATES)]
    now = time.time_ns()
    incoming = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

    def instrumented(rec: DecisionRecorder, forward: bool) -> None:
        with rec.decide("req", model="m", input_tokens=512, max_tokens=64) as d:
            for i, r in enumerate(replicas):
                d.candidate(r, waiting=i, running=3, kv_usage=0.5, telemetry_ts_ns=now,
                            pending=1, score=float(i))
            d.choose(replicas[3], "least_load")
        if forward:
            with d.forward(replicas[3] + "/v1/completions") as f:
                f.set_http_status(200)

    def instrumented_fwd(rec: DecisionRecorder) -> None:  # as a router does it: incoming trace
        with rec.decide(None, incoming_headers=incoming, model="m", input_tokens=512,
                        max_tokens=64) as d:
            for i, r in enumerate(replicas):
                d.candidate(r, waiting=i, running=3, kv_usage=0.5, telemetry_ts_ns=now,
                            pending=1, score=float(i))
            d.choose(replicas[3], "least_load")
        with d.forward(replicas[3] + "/v1/completions") as f:
            f.set_http_status(200)

    start_attrs = {
        sc.COMPONENT: "router", sc.ROUTER_POLICY: "least_load", sc.ROUTER_ID: "bench",
        sc.REQUEST_ID: "req", sc.ATTEMPT: 0, sc.REQUEST_MODEL: "m",
        sc.REQUEST_INPUT_TOKENS: 512, sc.REQUEST_MAX_TOKENS: 64}
    t_pre = time.time_ns()
    candidates_json = json.dumps([
        {"replica": r, "eligible": True, "waiting": i, "running": 3, "kv_usage": 0.5,
         "telemetry_ts_ns": now, "telemetry_age_ms": (t_pre - now) / 1e6, "pending": 1,
         "score": float(i), "chosen": i == 3}
        for i, r in enumerate(replicas)], separators=(",", ":"))

    def raw_sdk(encoding: str, forward: bool) -> None:
        # the same spans and events, by hand, from prebuilt attribute values
        from opentelemetry import propagate, trace
        ctx = extract_context(incoming) if forward else None
        span = tracer.start_span(sc.SPAN_DECISION, context=ctx, attributes=start_attrs)
        t = time.time_ns()
        final = {sc.DECISION_CHOSEN: replicas[3], sc.DECISION_REASON: "least_load",
                 sc.DECISION_OUTCOME: "routed", sc.DECISION_CANDIDATE_COUNT: 8,
                 sc.DECISION_TIME: t}
        if encoding == "events":
            for i, r in enumerate(replicas):
                span.add_event(sc.EVENT_CANDIDATE, {
                    sc.CANDIDATE_REPLICA: r, sc.CANDIDATE_ELIGIBLE: True, sc.CANDIDATE_WAITING: i,
                    sc.CANDIDATE_RUNNING: 3, sc.CANDIDATE_KV_USAGE: 0.5,
                    sc.CANDIDATE_TELEMETRY_TS: now,
                    sc.CANDIDATE_TELEMETRY_AGE_MS: (t - now) / 1e6,
                    sc.CANDIDATE_PENDING: 1, sc.CANDIDATE_SCORE: float(i),
                    sc.CANDIDATE_CHOSEN: i == 3}, t)
        else:
            final[sc.DECISION_CANDIDATES] = candidates_json
        span.set_attributes(final)
        span.end()
        if forward:
            fwd = tracer.start_span(
                sc.SPAN_FORWARD, context=trace.set_span_in_context(span, ctx),
                kind=trace.SpanKind.CLIENT, attributes={
                    sc.COMPONENT: "router", sc.REQUEST_ID: "req", sc.ATTEMPT: 0,
                    sc.HTTP_METHOD: "POST", sc.URL_FULL: replicas[3] + "/v1/completions",
                    sc.REPLICA_ID: replicas[3]})
            headers: dict[str, str] = {}
            propagate.inject(headers, context=trace.set_span_in_context(fwd, ctx))
            fwd.set_attribute(sc.HTTP_STATUS, 200)
            fwd.end()

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

    out: dict[str, dict[str, float]] = {}
    try:
        for enc in ENCODINGS:
            rec = DecisionRecorder("least_load", "bench", tp, candidate_encoding=enc)
            via_sdk = DecisionRecorder("least_load", "bench", tp, candidate_encoding=enc,
                                       direct_spans=False)
            unexported = DecisionRecorder("least_load", "bench", TracerProvider(),
                                          candidate_encoding=enc)
            noop = DecisionRecorder("least_load", "bench", NoOpTracerProvider(),
                                    candidate_encoding=enc)
            out[enc] = {
                "recorder": timed(lambda rec=rec: instrumented(rec, False)),
                "recorder_sdk": timed(lambda r=via_sdk: instrumented(r, False)),
                "raw": timed(lambda enc=enc: raw_sdk(enc, False)),
                "recorder_fwd": timed(lambda rec=rec: instrumented_fwd(rec)),
                "recorder_sdk_fwd": timed(lambda r=via_sdk: instrumented_fwd(r)),
                "raw_fwd": timed(lambda enc=enc: raw_sdk(enc, True)),
                "own": timed(lambda r=unexported: instrumented(r, False)),
                "own_fwd": timed(lambda r=unexported: instrumented_fwd(r)),
                "noop": timed(lambda noop=noop: instrumented(noop, False)),
            }
        return out
    finally:
        tp.shutdown()


# --------------------------------------------------------------------------- throughput
WORKER_BODY = json.dumps({"choices": [{"text": "ok", "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
WORKER_RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                   b"content-length: %d\r\n\r\n%s" % (len(WORKER_BODY), WORKER_BODY))


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """Read one HTTP/1.1 request with a content-length body; False at end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    if m:
        await reader.readexactly(int(m.group(1)))
    return True


def worker_main(ports: list[int], ready: Any) -> None:
    """The fake worker: a fixed completion on every port (raw asyncio, keep-alive)."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while await _read_request(reader):
                writer.write(WORKER_RESPONSE)
        writer.close()

    async def main() -> None:
        socks = []
        for port in ports:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            socks.append(s)
        servers = [await asyncio.start_server(handle, sock=s, backlog=512) for s in socks]
        ready.send([s.getsockname()[1] for s in socks])
        await asyncio.gather(*(srv.serve_forever() for srv in servers))

    asyncio.run(main())


def doc_router(workers: list[str], tp: TracerProvider, kind: str) -> Any:
    text = (ROOT / "docs" / "instrument-your-router.md").read_text()
    block = re.search(r"<!-- router-example:start -->\n```python\n(.*?)```", text, re.S)
    assert block is not None
    ns: dict[str, Any] = {"__name__": "doc_router"}
    exec(block.group(1), ns)
    # the doc's recorder, with this run's candidate encoding (and span path)
    encoding, _, path = kind.partition("-")
    ns["DecisionRecorder"] = functools.partial(DecisionRecorder, candidate_encoding=encoding,
                                               direct_spans=path != "sdk")
    return ns["make_app"](workers, tracer_provider=tp)


def plain_router(workers: list[str]) -> Any:
    """The doc router with the `# routeaudit` lines removed."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

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

    paths = ["/v1/completions", "/v1/chat/completions", "/generate"]
    return Starlette(routes=[Route(p, proxy, methods=["POST"]) for p in paths],
                     lifespan=lifespan)


def router_main(kind: str, workers: list[str], ready: Any) -> None:
    """One router under test, alone in this process: one of :data:`ROUTERS`."""
    import uvicorn

    tp = None
    if kind == "plain":
        app = plain_router(workers)
    else:
        tp = provider()
        app = doc_router(workers, tp, kind)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on",
                                           access_log=False, backlog=512))
    ready.send(sock.getsockname()[1])
    try:
        server.run(sockets=[sock])
    finally:
        if tp is not None:
            tp.shutdown()


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    if m:
        await reader.readexactly(int(m.group(1)))
    else:  # chunked (the routers stream the worker's answer back)
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


async def load(port: int, n: int, concurrency: int) -> float:
    """Requests per second for ``n`` requests over ``concurrency`` keep-alive connections."""
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 1}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
               b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
               % (len(body), body))
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    remaining = 0

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            writer.write(request)
            status = await _read_response(reader)
            assert status == 200, status

    try:
        remaining = min(n, 200)  # warm-up
        await asyncio.gather(*(client(r, w) for r, w in conns))
        remaining = n
        t0 = time.perf_counter()
        await asyncio.gather(*(client(r, w) for r, w in conns))
        return n / (time.perf_counter() - t0)
    finally:
        for _, w in conns:
            w.close()


def _start(ctx: Any, target: Any, *args: Any) -> tuple[Any, Any]:
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    if not parent.poll(60):
        raise RuntimeError(f"{target.__name__}{args} did not start")
    return proc, parent.recv()


def bench_throughput(n: int, concurrency: int, n_workers: int, rounds: int = 3
                     ) -> dict[str, list[float]]:
    """req/s of each of :data:`ROUTERS` in each of ``rounds`` interleaved rounds."""
    ctx = mp.get_context("spawn")
    procs = []
    try:
        worker, ports = _start(ctx, worker_main, [0] * n_workers)
        procs.append(worker)
        workers = [f"http://127.0.0.1:{p}" for p in ports]
        routers: dict[str, int] = {}
        for kind in ROUTERS:
            proc, port = _start(ctx, router_main, kind, workers)
            procs.append(proc)
            routers[kind] = port
        time.sleep(0.5)
        rates: dict[str, list[float]] = {k: [] for k in routers}
        for _ in range(rounds):  # interleave to share machine noise
            for kind, port in routers.items():
                rates[kind].append(asyncio.run(load(port, n, concurrency)))
        return rates
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--decisions", type=int, default=20000)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=N_CANDIDATES,
                    help="worker ports = candidates per decision in the router (default 8)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved throughput rounds (best and median of rounds reported)")
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()

    res = bench_decisions(args.decisions)
    print(f"decision with {N_CANDIDATES} candidates, SDK + BatchSpanProcessor + no-op exporter "
          f"(µs/decision, best of 3 × {args.decisions}):")
    for enc in ENCODINGS:
        r = res[enc]
        print(f"  candidate_encoding={enc!r}")
        print(f"    decision span:              recorder {r['recorder']:7.1f}   via SDK spans "
              f"{r['recorder_sdk']:7.1f}   hand-written SDK spans {r['raw']:7.1f}")
        print(f"    + forward span and headers: recorder {r['recorder_fwd']:7.1f}   via SDK spans "
              f"{r['recorder_sdk_fwd']:7.1f}   hand-written SDK spans {r['raw_fwd']:7.1f}")
        print(f"    recorder's whole work with an SDK provider without span processor: "
              f"decision span {r['own']:7.1f}, + forward {r['own_fwd']:7.1f}")
        print(f"    no SDK (no-op provider), decision span: {r['noop']:7.1f}")
    if args.skip_throughput:
        return
    runs = bench_throughput(args.requests, args.concurrency, args.workers, args.rounds)
    rates = {k: max(v) for k, v in runs.items()}
    print(f"minimal round-robin router of docs/instrument-your-router.md, each router in its own "
          f"process; {args.workers} worker ports (= candidates), {args.requests} requests, "
          f"concurrency {args.concurrency}, interleaved; best of {args.rounds}, and the median "
          f"of the {args.rounds} rounds' own ratios (each round runs every router once):")
    print(f"  without instrumentation        {rates['plain']:8.0f} req/s")
    for kind in ROUTERS[1:]:
        paired = statistics.median(a / b for a, b in zip(runs[kind], runs["plain"], strict=True))
        print(f"  instrumented, {kind:8s}         {rates[kind]:8.0f} req/s   "
              f"ratio instrumented/plain {rates[kind] / rates['plain']:.3f} (best), "
              f"{paired:.3f} (median of rounds)")


if __name__ == "__main__":
    main()
