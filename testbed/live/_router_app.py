"""The live reference router: an OpenAI-compatible proxy choosing replicas with a testbed policy.

Telemetry is real here: a poller scrapes every replica's ``/metrics`` each
``telemetry_interval_s`` (all replicas concurrently) and hands the snapshots, stamped with the
router's clock at the start of the scrape, to a :class:`testbed._router.Router` (the same class
the virtual-time testbed uses: policy, pending assignments, approximate prefix tree, rng).
Pending correction forgets an assignment once a snapshot whose scrape started after the forward
was sent arrives (the request can still be on the wire for a moment: a small, real race).

Remaining work comes from the replicas' ``routeaudit:remaining_prefill_tokens`` /
``routeaudit:remaining_decode_tokens`` gauges when present (the testbed replicas export them);
against a real vLLM these are absent and count as 0, so token-based policies see only pending
work.

Every attempt is one :class:`collectors.router.DecisionRecorder` decision with one candidate per
replica; the forward span's headers go to the replica, so the replica's span is its child. A
connection error on attempt 0 is retried once as attempt 1 on another replica (the failed one is
excluded as ``connect_error``); a replica whose scrape failed is excluded as ``unhealthy``. When
the admission limit leaves no eligible replica the answer is 429 (``admission_limit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
from opentelemetry import trace
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from collectors.router import DecisionRecorder, Forward

from .._config import CostModel, ReplicaConfig, RouterConfig
from .._replica import Snapshot
from .._router import Router
from ._replica_app import DEFAULT_MAX_TOKENS
from ._tokens import DEFAULT_BLOCK_TOKENS, prompt_info

__all__ = ["LiveRouter", "parse_snapshot", "replica_id_of"]

_LOG = logging.getLogger("testbed.live.router")
_GEN_PATHS = ("/v1/completions", "/v1/chat/completions", "/generate")
_PASS_HEADERS = ("content-type", "x-request-id", "retry-after", "cache-control")


def replica_id_of(url: str) -> str:
    """``host:port`` of a replica base URL (the id used in candidates and replica spans)."""
    u = httpx.URL(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    return f"{u.host}:{port}"


def parse_snapshot(text: str, replica: str, ts: float) -> Snapshot:
    """A :class:`Snapshot` from Prometheus text (vLLM names; summed over engines)."""
    vals: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            vals[s.name] = vals.get(s.name, 0.0) + float(s.value)
    return Snapshot(
        replica=replica, ts=ts,
        waiting=int(vals.get("vllm:num_requests_waiting", 0)),
        running=int(vals.get("vllm:num_requests_running", 0)),
        kv_usage=float(vals.get("vllm:kv_cache_usage_perc", 0.0)),
        remaining_prefill_tokens=int(vals.get("routeaudit:remaining_prefill_tokens", 0)),
        remaining_decode_tokens=int(vals.get("routeaudit:remaining_decode_tokens", 0)),
    )


def _error(status: int, message: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse({"object": "error", "message": message, "code": status},
                        status_code=status, headers=headers)


class LiveRouter:
    """Reference router over ``replica_urls`` (base URLs). :attr:`app` is the ASGI app."""

    def __init__(
        self, replica_urls: Sequence[str], *, router: RouterConfig | None = None,
        router_id: str = "router-0", seed: int = 0, cost: CostModel | None = None,
        replica: ReplicaConfig | None = None, block_tokens: int = DEFAULT_BLOCK_TOKENS,
        tracer_provider: trace.TracerProvider | None = None, connect_retries: int = 1,
        forward_timeout_s: float = 600.0,
    ) -> None:
        if not replica_urls:
            raise ValueError("a router needs at least one replica URL")
        self.cfg = router or RouterConfig(policy="round_robin")
        self.cfg.validate()
        rcfg = replica or ReplicaConfig()
        self.urls = [u.rstrip("/") for u in replica_urls]
        self.ids = [replica_id_of(u) for u in self.urls]
        self.router_id = router_id
        self.block_tokens = block_tokens
        self.connect_retries = connect_retries
        self.forward_timeout_s = forward_timeout_s
        self.core = Router(0, router_id, self.cfg, cost or CostModel(), len(self.urls),
                           rcfg.max_batched_tokens, rcfg.expected_output_tokens,
                           random.Random(seed))
        now = time.time()
        self.core.snapshots = [Snapshot(r, now, 0, 0, 0.0, 0, 0) for r in self.ids]
        self.healthy = [False] * len(self.urls)
        self.scrape_failures = [0] * len(self.urls)
        self.recorder = DecisionRecorder(self.cfg.policy, router_id, tracer_provider)
        self.counts: dict[str, int] = {}
        self._ids = itertools.count()
        self._http: httpx.AsyncClient | None = None
        self._poller: asyncio.Task[None] | None = None
        routes = [Route(p, self._route, methods=["POST"]) for p in _GEN_PATHS] + [
            Route("/health", self._health, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
        ]
        self.app = Starlette(routes=routes, lifespan=self._lifespan)

    # ------------------------------------------------------------------ lifecycle, telemetry
    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.forward_timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
        )
        await self.poll_once()  # serve with telemetry from the start
        self._poller = asyncio.get_running_loop().create_task(self._poll_loop())
        try:
            yield
        finally:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            await self._http.aclose()

    async def _scrape(self, i: int) -> Snapshot | None:
        assert self._http is not None
        ts = time.time()
        try:
            r = await self._http.get(self.urls[i] + "/metrics",
                                     timeout=max(0.5, 4 * self.cfg.telemetry_interval_s))
            r.raise_for_status()
            return parse_snapshot(r.text, self.ids[i], ts)
        except Exception as exc:  # noqa: BLE001 - a failed scrape only makes it ineligible
            _LOG.debug("scrape of %s failed: %s", self.urls[i], exc)
            return None

    async def poll_once(self) -> None:
        """Scrape every replica once and hand the snapshots to the policy's router."""
        got = await asyncio.gather(*(self._scrape(i) for i in range(len(self.urls))))
        snaps = list(self.core.snapshots)
        for i, s in enumerate(got):
            if s is None:
                self.scrape_failures[i] += 1
                self.healthy[i] = False
            else:
                self.scrape_failures[i] = 0
                self.healthy[i] = True
                snaps[i] = s
        self.core.on_telemetry(snaps, time.time())

    async def _poll_loop(self) -> None:
        interval = self.cfg.telemetry_interval_s
        nxt = time.monotonic()
        while True:
            nxt += interval
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            try:
                await self.poll_once()
            except Exception:  # never let the poller die  # noqa: BLE001
                _LOG.warning("telemetry poll failed", exc_info=True)

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    # ------------------------------------------------------------------ small endpoints
    async def _health(self, request: HttpRequest) -> Response:
        return Response(status_code=200 if any(self.healthy) else 503)

    async def _models(self, request: HttpRequest) -> Response:
        assert self._http is not None
        for i, url in enumerate(self.urls):
            if self.healthy[i]:
                with contextlib.suppress(Exception):
                    r = await self._http.get(url + "/v1/models")
                    return Response(r.content, status_code=r.status_code,
                                    media_type="application/json")
        return _error(503, "no healthy replica")

    async def _metrics(self, request: HttpRequest) -> Response:
        lines = ["# TYPE routeaudit_router_requests counter\n"]
        for k, v in sorted(self.counts.items()):
            lines.append(f'routeaudit_router_requests_total{{outcome="{k}",router="{self.router_id}"}} {float(v)!r}\n')
        lines.append("# TYPE routeaudit_router_replica_healthy gauge\n")
        for rid, ok in zip(self.ids, self.healthy, strict=True):
            lines.append(f'routeaudit_router_replica_healthy{{replica="{rid}"}} {1.0 if ok else 0.0}\n')
        return PlainTextResponse("".join(lines), media_type="text/plain; version=0.0.4")

    # ------------------------------------------------------------------ routing
    async def _route(self, request: HttpRequest) -> Response:
        raw = await request.body()
        endpoint = request.url.path
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise TypeError("not a JSON object")
            info = prompt_info(body, self.block_tokens)
        except (ValueError, TypeError) as exc:
            self._count("bad_request")
            return _error(400, f"bad request body: {exc}")
        params = body.get("sampling_params") if endpoint == "/generate" else body
        params = params if isinstance(params, dict) else {}
        mt = params.get("max_new_tokens" if endpoint == "/generate" else "max_tokens")
        if mt is None:
            mt = body.get("max_completion_tokens")
        max_tokens = mt if isinstance(mt, int) and not isinstance(mt, bool) and mt > 0 \
            else DEFAULT_MAX_TOKENS
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        req = info.request(f"{rid}#{next(self._ids)}", max_tokens)
        stream = bool(body.get("stream"))
        model = body.get("model") if isinstance(body.get("model"), str) else None
        hashes = req.prefix_hashes()
        excluded: dict[int, str] = {}
        assert self._http is not None
        for attempt in range(1 + max(0, self.connect_retries)):
            with self.recorder.decide(
                rid, model=model, input_tokens=req.input_tokens, max_tokens=max_tokens,
                prefix_hashes=hashes, stream=stream, endpoint=endpoint, attempt=attempt,
                incoming_headers=request.headers,
            ) as d:
                now = time.time()
                predicted = self.core.predicted(req)
                views = self.core.views(req, now, predicted)
                reasons: list[str | None] = []
                for i, v in enumerate(views):
                    why = excluded.get(i) or (None if self.healthy[i] else "unhealthy")
                    if why is not None and v.eligible:
                        views[i] = replace(v, eligible=False)
                    elif why is None and not v.eligible:
                        why = "full"
                    reasons.append(why)
                choice = self.core.policy.decide(self.core.request_view(req), views, self.core.rng)
                scores = choice.scores
                for i, v in enumerate(views):
                    d.candidate(
                        v.replica, eligible=v.eligible, excluded_reason=reasons[i],
                        waiting=v.waiting, running=v.running, kv_usage=v.kv_usage,
                        remaining_tokens=v.remaining_tokens,
                        telemetry_ts_ns=round(v.telemetry_ts * 1e9), pending=v.pending,
                        predicted_cached_tokens=v.predicted_cached_tokens,
                        est_queue_ms=v.est_queue_ms, est_prefill_ms=v.est_prefill_ms,
                        score=scores[i] if i < len(scores) else None,
                    )
                if choice.index is None:
                    full = any(r == "full" for r in reasons)
                    reason = "admission_limit" if full else "no_eligible_replica"
                    d.reject(reason)
                    self.core.policy.commit(choice)
                    self._count("rejected")
                    return _error(429 if full else 503, f"no replica can take the request ({reason})")
                i = choice.index
                d.choose(self.ids[i], choice.reason)
                self.core.commit(req, choice, predicted, now)
                fwd = d.forward(self.urls[i] + endpoint)
            headers = dict(fwd.headers)
            headers["content-type"] = "application/json"
            up = self._http.build_request("POST", self.urls[i] + endpoint, content=raw,
                                          headers=headers)
            try:
                resp = await self._http.send(up, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                fwd.set_error(f"connect error: {exc}")
                fwd.end()
                self._forget(i)
                excluded[i] = "connect_error"
                self.healthy[i] = False
                self._count("connect_error")
                continue
            except BaseException as exc:
                fwd.end(exc if isinstance(exc, Exception) else None)
                raise
            fwd.set_http_status(resp.status_code)
            self._count("routed" if resp.status_code < 400 else f"http_{resp.status_code}")
            out_headers = {k: v for k, v in resp.headers.items() if k.lower() in _PASS_HEADERS}
            return _Relay(resp, fwd, out_headers)
        self._count("failed")
        return _error(502, "every replica tried refused the connection")

    def _forget(self, i: int) -> None:
        """Undo the pending entry of a forward that never reached replica ``i``."""
        dq = self.core.pending[i]
        if dq:
            dq.pop()


class _Relay(StreamingResponse):
    """Streams the replica's answer through unchanged; ends the forward span when done (or
    marks it failed when the client went away first)."""

    def __init__(self, resp: httpx.Response, fwd: Forward, headers: dict[str, str]) -> None:
        self._resp = resp
        self._fwd = fwd
        self._complete = False
        super().__init__(self._relay(), status_code=resp.status_code, headers=headers)

    async def _relay(self) -> AsyncIterator[bytes]:
        # End the forward span as soon as the replica's answer is complete, *before* passing the
        # last bytes on: the client cannot finish (and end its span) earlier, so the forward
        # span nests inside the client span on true time, as clock-offset estimation assumes.
        clen = self._resp.headers.get("content-length")
        total = int(clen) if clen is not None and clen.isdigit() else None
        seen = 0
        async for chunk in self._resp.aiter_raw():
            seen += len(chunk)
            if (total is not None and seen >= total) or chunk.rstrip().endswith(b"data: [DONE]"):
                self._complete = True
                self._fwd.end()
            yield chunk
        self._complete = True

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._complete:
                self._fwd.set_error("client disconnected before the response ended")
            with contextlib.suppress(Exception):
                await self._resp.aclose()
            self._fwd.end()
