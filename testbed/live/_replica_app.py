"""A live replica: an OpenAI-compatible HTTP server over the testbed replica model.

Endpoints: ``POST /v1/completions``, ``/v1/chat/completions`` (SSE when ``stream: true``;
``stream_options.include_usage`` adds a final usage chunk), ``/generate`` (SGLang-style, minimal);
``GET /health``, ``/v1/models``, ``/get_server_info``, ``/get_model_info``, ``/metrics`` (vLLM
names, labels ``engine="0"`` and ``model_name``, plus two ``routeaudit:`` gauges of remaining work
that the reference router reads when present).

Behaviour like vLLM started with ``--enable-request-id-headers --enable-prompt-tokens-details``:
the ``X-Request-Id`` header becomes the request id (response ``id`` ``cmpl-<id>`` /
``chatcmpl-<id>``, echoed in the response header), usage has
``prompt_tokens_details.cached_tokens``. Output: ``max_tokens`` tokens (default 16; the model
never emits EOS, like ``ignore_eos``) unless the body carries the extension field
``routeaudit_output_tokens``, which makes it stop earlier (finish reason ``stop``). A client that
disconnects aborts its request in the engine (finish reason ``abort``). When ``max_waiting``
requests are already queued, a new one is refused with 503 (``Retry-After: 1``).

Spans: :class:`collectors.replica.ReplicaMiddleware` emits the vLLM-format ``llm_request`` span;
the app reports the engine's facts (cached tokens, scheduling and token times, finish reason,
preemptions) through :func:`collectors.replica.engine_facts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from collectors.replica import ReplicaMiddleware, engine_facts

from .._config import CostModel, ReplicaConfig
from ._engine import LiveEngine, LiveSeq
from ._tokens import DEFAULT_BLOCK_TOKENS, prompt_info

__all__ = ["LiveReplica"]

DEFAULT_MAX_TOKENS = 16
"""Output length when the body gives no ``max_tokens`` (OpenAI's completions default)."""

_TOKEN_WORDS = (" the", " model", " replica", " cache", " token", " batch", " queue", " serve")
_MIN_TICK_S = 0.001


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse({"object": "error", "message": message, "type": kind, "code": status},
                        status_code=status, headers=headers)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class LiveReplica:
    """One replica: engine + Starlette app; :attr:`asgi` is the app wrapped in the middleware.

    ``replica_id`` should be the ``host:port`` the router knows the replica by.
    """

    def __init__(
        self, replica_id: str, *, replica: ReplicaConfig | None = None,
        cost: CostModel | None = None, time_scale: float = 0.05, model: str = "sim-8b",
        max_waiting: int | None = None, block_tokens: int = DEFAULT_BLOCK_TOKENS,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.cfg = replica or ReplicaConfig()
        self.model = model
        self.max_waiting = max_waiting
        self.block_tokens = block_tokens
        self.engine = LiveEngine(replica_id, self.cfg, cost or CostModel(), time_scale=time_scale)
        self._ids = itertools.count()
        self._tick_s = max(_MIN_TICK_S, self.engine.replica.cost.step_overhead_ms / 1000.0
                           * time_scale / self.cfg.speed)
        self.rejected = 0
        routes = [
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/generate", self._generate, methods=["POST"]),
            Route("/health", self._health, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/get_server_info", self._server_info, methods=["GET"]),
            Route("/get_model_info", self._model_info, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
        ]
        self.app = Starlette(routes=routes, lifespan=self._lifespan)
        self.asgi = ReplicaMiddleware(self.app, replica_id=replica_id,
                                      tracer_provider=tracer_provider, dp_rank=0)

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.engine.start()
        try:
            yield
        finally:
            await self.engine.stop()

    # ------------------------------------------------------------------ info endpoints
    async def _health(self, request: HttpRequest) -> Response:
        return Response(status_code=200)

    async def _models(self, request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": int(time.time()),
            "owned_by": "routeaudit-testbed", "root": self.model, "max_model_len": 131072,
        }]})

    async def _server_info(self, request: HttpRequest) -> Response:
        c = self.cfg
        return JSONResponse({
            "model_path": self.model, "served_model_name": self.model,
            "max_num_batched_tokens": c.max_batched_tokens, "max_running_requests": c.max_running,
            "page_size": c.block_size, "max_total_num_tokens": c.kv_capacity_tokens,
            "time_scale": self.engine.time_scale, "speed": c.speed, "dp_size": 1,
            "routeaudit_replica_id": self.replica_id,
        })

    async def _model_info(self, request: HttpRequest) -> Response:
        return JSONResponse({"model_path": self.model, "tokenizer_path": None,
                             "is_generation": True})

    def metrics_text(self) -> str:
        """Prometheus text of the engine's current state."""
        e = self.engine
        snap = e.snapshot()
        lab = f'{{engine="0",model_name="{self.model}"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", snap.running),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", snap.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", snap.kv_usage),
            ("vllm:prefix_cache_queries_total", "counter",
             "Prefix cache queries, in terms of number of queried tokens.", e.prefix_queries),
            ("vllm:prefix_cache_hits_total", "counter",
             "Prefix cache hits, in terms of number of cached tokens.", e.prefix_hits),
            ("vllm:num_preemptions_total", "counter",
             "Cumulative number of preemption from the engine.", e.replica.preemptions),
            ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", e.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", e.generation_tokens),
            ("routeaudit:remaining_prefill_tokens", "gauge",
             "Testbed extension: prompt tokens still to prefill (waiting and running).",
             snap.remaining_prefill_tokens),
            ("routeaudit:remaining_decode_tokens", "gauge",
             "Testbed extension: expected output tokens still to generate.", snap.remaining_decode_tokens),
        ]
        out = []
        for name, kind, help_, value in rows:
            out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n{name}{lab} {float(value)!r}\n")
        out.append("# HELP vllm:request_success_total Count of successfully processed requests.\n"
                   "# TYPE vllm:request_success_total counter\n")
        for reason in ("abort", "length", "stop"):
            out.append(f'vllm:request_success_total{{engine="0",finished_reason="{reason}",'
                       f'model_name="{self.model}"}} {float(e.finished.get(reason, 0))!r}\n')
        return "".join(out)

    async def _metrics(self, request: HttpRequest) -> Response:
        return PlainTextResponse(self.metrics_text(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ generation
    async def _completions(self, request: HttpRequest) -> Response:
        return await self._handle(request, "completions")

    async def _chat(self, request: HttpRequest) -> Response:
        return await self._handle(request, "chat")

    async def _generate(self, request: HttpRequest) -> Response:
        return await self._handle(request, "generate")

    async def _handle(self, request: HttpRequest, kind: str) -> Response:
        facts = engine_facts(request)
        rid = facts.get("request_id") or request.headers.get("x-request-id") or uuid.uuid4().hex
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        try:
            info = prompt_info(body, self.block_tokens)
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc))
        params = body.get("sampling_params") if kind == "generate" else body
        params = params if isinstance(params, dict) else {}
        max_tokens = params.get("max_new_tokens" if kind == "generate" else "max_tokens")
        if max_tokens is None and kind == "chat":
            max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return _error(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
        out = body.get("routeaudit_output_tokens")
        if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
            return _error(400, "routeaudit_output_tokens must be a positive integer")
        model = body["model"] if isinstance(body.get("model"), str) else self.model
        stream = bool(body.get("stream"))
        opts = body.get("stream_options")
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        facts["prompt_tokens"] = info.input_tokens
        facts["max_tokens"] = max_tokens
        facts["model"] = model
        if self.max_waiting is not None and self.engine.waiting >= self.max_waiting:
            self.rejected += 1
            return _error(503, f"replica queue full ({self.engine.waiting} waiting)",
                          "ServiceUnavailableError")
        ls = self.engine.submit(info.request(f"{rid}#{next(self._ids)}", max_tokens, out))
        ctx = _Gen(self, kind, rid, model, ls, facts, include_usage)
        if stream:
            return _EngineStream(ctx)
        try:
            while not ls.done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ls.done.wait(), 0.05)
                if not ls.done.is_set() and await request.is_disconnected():
                    break
        finally:
            ctx.close()
        return JSONResponse(ctx.full_body())


class _EngineStream(StreamingResponse):
    """SSE response that aborts the request in the engine as soon as the response ends for
    any reason (client disconnect included), before the middleware emits the span."""

    def __init__(self, gen: _Gen) -> None:
        self._gen = gen
        self._iter = gen.sse()
        super().__init__(self._iter, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._gen.close()
            with contextlib.suppress(Exception):
                await self._iter.aclose()


class _Gen:
    """Response building for one request (body shapes per endpoint kind)."""

    def __init__(self, rep: LiveReplica, kind: str, rid: str, model: str, ls: LiveSeq,
                 facts: Any, include_usage: bool) -> None:
        self.rep = rep
        self.kind = kind
        self.rid = rid
        self.model = model
        self.ls = ls
        self.facts = facts
        self.include_usage = include_usage
        self.created = int(time.time())
        self.id = f"chatcmpl-{rid}" if kind == "chat" else f"cmpl-{rid}"
        self._closed = False

    # -- facts
    def close(self) -> None:
        """Abort in the engine if unfinished, then report the engine's facts (idempotent)."""
        if self._closed:
            return
        self._closed = True
        ls, eng, f = self.ls, self.rep.engine, self.facts
        if not ls.done.is_set():
            eng.abort(ls)
        s = ls.seq
        f["finish_reason"] = s.finish_reason or "abort"
        f["completion_tokens"] = s.generated
        f["preemptions"] = s.preemptions
        if s.cached_first is not None:
            f["cached_tokens"] = s.cached_first
        f["queued_ns"] = eng.wall_ns(s.t_arrival)
        if s.t_admit is not None:
            f["scheduled_ns"] = eng.wall_ns(s.t_admit)
        if s.t_first_token is not None:
            f["first_token_ns"] = eng.wall_ns(s.t_first_token)
            f["last_token_ns"] = eng.wall_ns(s.t_finish if s.t_finish is not None
                                             else eng.env.now)

    def usage(self) -> dict[str, Any]:
        s = self.ls.seq
        p = s.req.input_tokens
        return {"prompt_tokens": p, "completion_tokens": s.generated,
                "total_tokens": p + s.generated,
                "prompt_tokens_details": {"cached_tokens": s.cached_first or 0}}

    def finish_reason(self) -> str:
        return self.ls.seq.finish_reason or "abort"

    @staticmethod
    def token(i: int) -> str:
        return _TOKEN_WORDS[i % len(_TOKEN_WORDS)]

    def meta(self) -> dict[str, Any]:
        s = self.ls.seq
        fr = self.finish_reason()
        return {"id": self.rid, "prompt_tokens": s.req.input_tokens,
                "completion_tokens": s.generated, "cached_tokens": s.cached_first or 0,
                "finish_reason": {"type": fr, "length": s.generated} if fr == "length"
                else {"type": fr}}

    def full_body(self) -> dict[str, Any]:
        text = "".join(self.token(i) for i in range(self.ls.seq.generated))
        if self.kind == "generate":
            return {"text": text, "meta_info": self.meta()}
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                              "content": text},
                                      "logprobs": None, "finish_reason": self.finish_reason()}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": self.finish_reason(), "stop_reason": None}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage()}

    # -- streaming
    def _chunk(self, text: str | None, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        if self.kind == "generate":
            obj: dict[str, Any] = {"text": text or "", "meta_info": {"id": self.rid}}
            if finish is not None:
                obj["meta_info"] = self.meta()
            return obj
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                {"content": text} if text else {})
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish}
            obj_name = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
            obj_name = "text_completion"
        out: dict[str, Any] = {"id": self.id, "object": obj_name, "created": self.created,
                               "model": self.model, "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    async def sse(self) -> AsyncGenerator[bytes, None]:
        ls, eng = self.ls, self.rep.engine
        sent = 0
        try:
            if self.kind == "chat":
                yield _sse(self._chunk(None, None, role=True))
            while True:
                eng.advance()
                done = ls.done.is_set()
                n = ls.seq.generated if done else eng.tokens_now(ls)
                if n > sent:
                    yield b"".join(_sse(self._chunk(self.token(i), None)) for i in range(sent, n))
                    sent = n
                if done:
                    break
                ls.changed.clear()
                timeout = self.rep._tick_s if ls.first.is_set() else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ls.changed.wait(), timeout)
            self.close()
            yield _sse(self._chunk(None, self.finish_reason()))
            if self.include_usage and self.kind != "generate":
                yield _sse({"id": self.id, "object": "chat.completion.chunk" if self.kind == "chat"
                            else "text_completion", "created": self.created, "model": self.model,
                            "choices": [], "usage": self.usage()})
            yield b"data: [DONE]\n\n"
        finally:
            self.close()
