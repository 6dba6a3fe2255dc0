"""End to end over real loopback HTTP: instrumented client → router → two replica servers.

The round-robin router is the one in docs/instrument-your-router.md (extracted and executed);
a second, least-loaded router uses snapshots from the real Scraper, to check telemetry age.
All components share one SDK TracerProvider with an in-memory exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
import uvicorn
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

import semconv as sc
from collectors.client import AsyncInstrumentedClient, InstrumentedClient, run_load
from collectors.replica import ReplicaMiddleware, engine_facts
from collectors.router import DecisionRecorder
from collectors.scrape import Scraper

DOC = Path(__file__).resolve().parents[2] / "docs" / "instrument-your-router.md"
TOKEN_DELAY_S = 0.01


# ------------------------------------------------------------------------------ servers
@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free loopback port in a thread; stop it afterwards."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive()


def make_replica(name: str, tp: TracerProvider) -> Any:
    """A fake OpenAI-compatible engine: one token per 10 ms, a toy prefix cache, /metrics."""
    seen_prefixes: set[str] = set()
    running = [0]

    async def generate(request: Request) -> Response:
        body = await request.json()
        facts = engine_facts(request)
        chat = request.url.path.endswith("/chat/completions")
        text = body["messages"][-1]["content"] if chat else body["prompt"]
        words = text.split()
        prefix = " ".join(words[:8])
        cached = min(8, len(words)) if prefix in seen_prefixes else 0
        seen_prefixes.add(prefix)
        n = int(body.get("max_tokens") or 4)
        usage = {"prompt_tokens": len(words), "completion_tokens": n,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        facts.update(cached_tokens=cached, preemptions=0, prompt_tokens=len(words),
                     scheduled_ns=time.time_ns())
        rid = facts["request_id"]
        oid = f"chatcmpl-{rid}" if chat else f"cmpl-{rid}-0"

        def choice(tok: str | None, finish: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": tok} if tok else {},
                        "finish_reason": finish}
            return {"index": 0, "text": tok or "", "finish_reason": finish}

        if not body.get("stream"):
            running[0] += 1
            await asyncio.sleep(TOKEN_DELAY_S)
            facts["first_token_ns"] = time.time_ns()
            await asyncio.sleep(TOKEN_DELAY_S * (n - 1))
            facts["last_token_ns"] = time.time_ns()
            running[0] -= 1
            out = " ".join(f"t{i}" for i in range(n))
            ch = ({"index": 0, "message": {"role": "assistant", "content": out},
                   "finish_reason": "length"} if chat else
                  {"index": 0, "text": out, "finish_reason": "length"})
            return JSONResponse({"id": oid, "choices": [ch], "usage": usage})

        async def sse() -> AsyncIterator[bytes]:
            running[0] += 1
            try:
                for i in range(n):
                    await asyncio.sleep(TOKEN_DELAY_S)
                    last = i == n - 1
                    chunk = {"id": oid, "choices": [choice(f"t{i} ", "length" if last else None)]}
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield f"data: {json.dumps({'id': oid, 'choices': [], 'usage': usage})}\n\n".encode()
                yield b"data: [DONE]\n\n"
            finally:
                running[0] -= 1

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {running[0]}.0\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        )

    routes = [Route(p, generate, methods=["POST"])
              for p in ("/v1/completions", "/v1/chat/completions")]
    routes.append(Route("/metrics", metrics))
    return ReplicaMiddleware(Starlette(routes=routes), replica_id=name, tracer_provider=tp)


def doc_router_module() -> dict[str, Any]:
    text = DOC.read_text()
    block = re.search(r"<!-- router-example:start -->\n```python\n(.*?)```", text, re.S)
    assert block, "router example not found in docs"
    ns: dict[str, Any] = {"__name__": "doc_router"}
    exec(compile(block.group(1), str(DOC), "exec"), ns)
    return ns


def make_least_loaded_router(workers: list[str], snapshots: dict[str, dict[str, Any]],
                             tp: TracerProvider) -> Starlette:
    """Least-running router fed by the Scraper's snapshots (telemetry with a timestamp)."""
    rec = DecisionRecorder("least_load", "ll-1", tp)
    http = httpx.AsyncClient(timeout=None)
    tie = itertools.count()

    async def proxy(request: Request) -> Response:
        body = await request.body()
        with rec.decide(None, incoming_headers=request.headers) as d:
            best = None
            for w in workers:
                snap = snapshots.get(w.removeprefix("http://"), {})
                d.candidate(w, running=snap.get("running"), waiting=snap.get("waiting"),
                            kv_usage=snap.get("kv_usage"), telemetry_ts_ns=snap.get("scraped_ns"),
                            score=snap.get("running"))
                key = (snap.get("running") or 0, next(tie) % len(workers))
                if best is None or key < best[0]:
                    best = (key, w)
            assert best is not None
            d.choose(best[1], "least_load")
        with d.forward(best[1] + request.url.path) as f:
            resp = await http.post(best[1] + request.url.path, content=body,
                                   headers={"content-type": "application/json", **f.headers})
            f.set_http_status(resp.status_code)
        return Response(resp.content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await http.aclose()

    return Starlette(routes=[Route("/v1/completions", proxy, methods=["POST"])],
                     lifespan=lifespan)


# ------------------------------------------------------------------------------ helpers
def by_rid(spans: list[ReadableSpan], rid: str) -> dict[str, ReadableSpan]:
    out: dict[str, ReadableSpan] = {}
    for s in spans:
        if (s.attributes or {}).get(sc.REQUEST_ID) == rid:
            out[s.name] = s
    return out


def wait_for(exporter: InMemorySpanExporter, rid: str, names: set[str],
             timeout: float = 5.0) -> dict[str, ReadableSpan]:
    deadline = time.monotonic() + timeout
    while True:
        got = by_rid(list(exporter.get_finished_spans()), rid)
        if names <= set(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


ALL = {sc.SPAN_CLIENT, sc.SPAN_DECISION, sc.SPAN_FORWARD, sc.SPAN_VLLM_REQUEST}


@pytest.fixture
def otel() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    yield tp, exporter
    tp.shutdown()


@pytest.fixture
def fleet(otel: tuple[TracerProvider, InMemorySpanExporter]) -> Iterator[list[str]]:
    tp, _ = otel
    with serve(make_replica("replica-a", tp)) as a, serve(make_replica("replica-b", tp)) as b:
        yield [a, b]


def assert_one_trace(spans: dict[str, ReadableSpan]) -> None:
    client, dec = spans[sc.SPAN_CLIENT], spans[sc.SPAN_DECISION]
    fwd, rep = spans[sc.SPAN_FORWARD], spans[sc.SPAN_VLLM_REQUEST]
    assert len({s.context.trace_id for s in spans.values()}) == 1
    assert client.parent is None
    assert dec.parent is not None and dec.parent.span_id == client.context.span_id
    assert fwd.parent is not None and fwd.parent.span_id == dec.context.span_id
    assert rep.parent is not None and rep.parent.span_id == fwd.context.span_id
    assert (client.kind, dec.kind, fwd.kind, rep.kind) == (
        SpanKind.CLIENT, SpanKind.INTERNAL, SpanKind.CLIENT, SpanKind.SERVER)


class _CancelAfterLines(threading.Event):
    """A cancel event that sets itself once the client has asked it ``n`` times: the client
    asks before each streamed line, so the stream ends after its first lines."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self._left = n

    def is_set(self) -> bool:
        self._left -= 1
        if self._left < 0:
            self.set()
        return super().is_set()


# ------------------------------------------------------------------------------ tests
def test_doc_router_end_to_end(otel: tuple[TracerProvider, InMemorySpanExporter],
                               fleet: list[str]) -> None:
    tp, exporter = otel
    router_app = doc_router_module()["make_app"](fleet, tracer_provider=tp)
    with serve(router_app) as router, InstrumentedClient(router, model="m",
                                                         tracer_provider=tp) as client:
        r1 = client.completions("alpha beta gamma delta eps zeta eta theta iota", max_tokens=5,
                                request_id="req-1")
        r2 = client.chat([{"role": "user", "content": "alpha beta gamma delta eps zeta eta "
                           "theta kappa"}], max_tokens=6, stream=True, request_id="req-2")
        # cancelled after its first streamed lines, not after a fixed time: on a loaded
        # machine the first token can take longer than any fixed delay
        cancel = _CancelAfterLines(6)
        r3 = client.completions("cancel me please", max_tokens=60, stream=True,
                                request_id="req-3", cancel=cancel)
        r4 = client.completions("too long", max_tokens=100_000, request_id="req-4")

        async def async_one() -> Any:
            async with AsyncInstrumentedClient(router, model="m", tracer_provider=tp) as ac:
                return await ac.completions("async one", max_tokens=3, stream=True,
                                            request_id="req-5")
        r5 = asyncio.run(async_one())

        # 1. non-streaming completion
        assert (r1.status, r1.http_status, r1.finish_reason) == ("ok", 200, "length")
        assert r1.output_tokens == 5 and r1.ttft_ms is None and r1.cached_tokens == 0
        s1 = wait_for(exporter, "req-1", ALL)
        assert set(s1) == ALL
        assert_one_trace(s1)
        dec = s1[sc.SPAN_DECISION].attributes or {}
        assert dec[sc.COMPONENT] == "router" and dec[sc.ROUTER_POLICY] == "round_robin"
        assert dec[sc.DECISION_OUTCOME] == "routed" and dec[sc.DECISION_REASON] == "round_robin"
        assert dec[sc.DECISION_CANDIDATE_COUNT] == 2 and dec[sc.REQUEST_MAX_TOKENS] == 5
        assert s1[sc.SPAN_DECISION].events == ()  # the default: candidates as one JSON attribute
        cands = json.loads(dec[sc.DECISION_CANDIDATES])
        assert len(cands) == 2 and all(c["eligible"] is True for c in cands)
        assert [c["replica"] for c in cands if c["chosen"]] == [dec[sc.DECISION_CHOSEN]]
        fwd = s1[sc.SPAN_FORWARD].attributes or {}
        assert fwd[sc.URL_FULL] == dec[sc.DECISION_CHOSEN] + "/v1/completions"
        assert fwd[sc.HTTP_STATUS] == 200
        rep = s1[sc.SPAN_VLLM_REQUEST].attributes or {}
        assert rep[sc.GEN_AI_REQUEST_ID] == "cmpl-req-1-0"
        assert rep[sc.COMPONENT] == "replica"
        assert (rep[sc.USAGE_PROMPT_TOKENS], rep[sc.USAGE_COMPLETION_TOKENS]) == (9, 5)
        assert rep[sc.RESPONSE_FINISH_REASONS] == ("length",)
        assert rep[sc.USAGE_CACHE_READ_INPUT_TOKENS] == 0 and rep[sc.REPLICA_PREEMPTIONS] == 0
        assert rep[sc.REQUEST_MAX_TOKENS] == 5 and rep[sc.LATENCY_TTFT_S] > 0
        assert rep[sc.LATENCY_DECODE_S] > 0 and rep[sc.LATENCY_E2E_S] >= rep[sc.LATENCY_TTFT_S]
        cli = s1[sc.SPAN_CLIENT].attributes or {}
        assert cli[sc.COMPONENT] == "client" and cli[sc.STATUS] == "ok"
        assert cli[sc.USAGE_OUTPUT_TOKENS] == 5 and cli[sc.CLIENT_CACHED_TOKENS] == 0

        # 2. streaming chat, other replica (round robin), prefix cached by... the other replica
        assert r2.status == "ok" and r2.output_tokens == 6 and r2.finish_reason == "length"
        assert r2.ttft_ms is not None and r2.ttft_ms > 0 and len(r2.itl_ms) == 5
        assert r2.tpot_ms == pytest.approx((r2.e2e_ms - r2.ttft_ms) / 5)
        s2 = wait_for(exporter, "req-2", ALL)
        assert_one_trace(s2)
        assert (s2[sc.SPAN_DECISION].attributes[sc.DECISION_CHOSEN]
                != dec[sc.DECISION_CHOSEN])
        rep2 = s2[sc.SPAN_VLLM_REQUEST].attributes
        assert rep2[sc.GEN_AI_REQUEST_ID] == "chatcmpl-req-2"
        assert rep2[sc.USAGE_COMPLETION_TOKENS] == 6
        assert rep2[sc.RESPONSE_FINISH_REASONS] == ("length",)
        cli2 = s2[sc.SPAN_CLIENT].attributes
        assert cli2[sc.CLIENT_TTFT_MS] > 0 and cli2[sc.CLIENT_TPOT_MS] > 0
        assert len(cli2[sc.CLIENT_ITL_MS]) == 5 and cli2[sc.REQUEST_STREAM] is True
        assert [e.name for e in s2[sc.SPAN_CLIENT].events] == [sc.EVENT_FIRST_TOKEN]

        # 3. cancelled stream
        assert r3.status == "cancelled" and r3.finish_reason == "abort"
        assert r3.output_tokens is not None and 0 < r3.output_tokens < 60
        s3 = wait_for(exporter, "req-3", {sc.SPAN_CLIENT, sc.SPAN_DECISION})
        assert s3[sc.SPAN_CLIENT].attributes[sc.STATUS] == "cancelled"

        # 4. rejected at the router's admission limit
        assert (r4.status, r4.http_status) == ("rejected", 429)
        s4 = wait_for(exporter, "req-4", {sc.SPAN_CLIENT, sc.SPAN_DECISION}, timeout=1)
        assert set(s4) == {sc.SPAN_CLIENT, sc.SPAN_DECISION}
        d4 = s4[sc.SPAN_DECISION].attributes
        assert d4[sc.DECISION_OUTCOME] == "rejected" and d4[sc.DECISION_REASON] == "admission_limit"
        assert sc.DECISION_CHOSEN not in d4
        assert s4[sc.SPAN_CLIENT].attributes[sc.HTTP_STATUS] == 429

        # 5. async client, streaming completion
        assert r5.status == "ok" and r5.output_tokens == 3
        assert_one_trace(wait_for(exporter, "req-5", ALL))

        # second use of the same prefix on the replica that saw it: cached tokens flow through
        served_1 = dec[sc.DECISION_CHOSEN]
        # round robin: two more requests, one lands on served_1
        for i in range(2):
            client.completions("alpha beta gamma delta eps zeta eta theta again", max_tokens=2,
                               request_id=f"req-c{i}")
        spans_c = [wait_for(exporter, f"req-c{i}", ALL) for i in range(2)]
        on_1 = [s for s in spans_c
                if s[sc.SPAN_DECISION].attributes[sc.DECISION_CHOSEN] == served_1]
        assert len(on_1) == 1
        assert on_1[0][sc.SPAN_VLLM_REQUEST].attributes[sc.USAGE_CACHE_READ_INPUT_TOKENS] == 8
        assert on_1[0][sc.SPAN_CLIENT].attributes[sc.CLIENT_CACHED_TOKENS] == 8
    assert router_app is not None


def test_least_loaded_router_with_scraped_telemetry(
        otel: tuple[TracerProvider, InMemorySpanExporter], fleet: list[str]) -> None:
    tp, exporter = otel
    snapshots: dict[str, dict[str, Any]] = {}

    def sink(table: pa.Table) -> None:
        for row in table.to_pylist():
            if row["ok"]:
                snapshots[row["replica"]] = row

    scraper = Scraper(fleet, 0.05, sink)
    scraper.start()
    try:
        deadline = time.monotonic() + 5
        while len(snapshots) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(snapshots) == 2
        with serve(make_least_loaded_router(fleet, snapshots, tp)) as router:
            results = run_load(router, [
                {"request_id": f"ll-{i}", "at_s": 0.01 * i, "prompt": f"hello {i}",
                 "max_tokens": 3, "stream": i % 2 == 0, "model": "m"}
                for i in range(6)
            ], concurrency=3, progress=False, tracer_provider=tp)
    finally:
        scraper.stop()
    assert sorted(r.request_id for r in results) == [f"ll-{i}" for i in range(6)]
    assert all(r.status == "ok" for r in results)
    for i in range(6):
        spans = wait_for(exporter, f"ll-{i}", ALL)
        assert_one_trace(spans)
        dec = spans[sc.SPAN_DECISION]
        decided = dec.attributes[sc.DECISION_TIME]
        cands = json.loads(dec.attributes[sc.DECISION_CANDIDATES])
        assert len(cands) == 2
        for c in cands:
            assert c["kv_usage"] == 0.25
            assert c["telemetry_age_ms"] == pytest.approx((decided - c["telemetry_ts_ns"]) / 1e6)
            assert 0 <= c["telemetry_age_ms"] < 2000
    assert scraper.rounds >= 1 and scraper.sink_errors == 0
