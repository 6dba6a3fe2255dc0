"""ASGI middleware emitting a vLLM-format ``llm_request`` span per generation request.

Hook for the served app (simple on purpose): the middleware puts a plain dict
(:class:`ReplicaFacts`) at ``scope["state"]["routeaudit"]`` before calling the app; with
Starlette/FastAPI that is ``request.state.routeaudit``. The app writes what its engine knows
(``cached_tokens``, ``preemptions``, ``scheduled_ns``...); everything else is taken from the
request body (``max_tokens``, ``model``), the response (``usage``, ``finish_reason``, one token
per SSE content chunk) and send times. The span is emitted when the response ends, continuing
the incoming ``traceparent``. The middleware never breaks a request: its own failures are
logged and the app's answer goes through unchanged (exceptions of the app are recorded on the
span and re-raised).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter

from ._emit import INSTRUMENTATION_NAME, ReplicaFacts, record_execution

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_PATHS: Final = ("/v1/completions", "/v1/chat/completions", "/generate")
"""Paths that get an ``llm_request`` span."""

STATE_KEY: Final = "routeaudit"
"""Key of the :class:`ReplicaFacts` dict in ``scope["state"]``."""

_BODY_CAP: Final = 1 << 20  # request/response bytes kept for parsing; beyond that, not parsed
_LOG = logging.getLogger("collectors.replica")


class _AsgiHeaderGetter(Getter[Iterable[tuple[bytes, bytes]]]):
    def get(self, carrier: Iterable[tuple[bytes, bytes]], key: str) -> list[str] | None:
        k = key.encode("latin-1")
        found = [v.decode("latin-1") for n, v in carrier if n.lower() == k]
        return found or None

    def keys(self, carrier: Iterable[tuple[bytes, bytes]]) -> list[str]:
        return [n.decode("latin-1") for n, _ in carrier]


_GETTER: Final = _AsgiHeaderGetter()


def engine_facts(request_or_scope: Any) -> ReplicaFacts:
    """The facts dict of the current request, from a Starlette ``Request`` or an ASGI scope.

    Returns a throwaway dict when the middleware is not installed, so apps can call it always.
    """
    scope = getattr(request_or_scope, "scope", request_or_scope)
    try:
        facts = scope["state"][STATE_KEY]
        if isinstance(facts, dict):
            return facts  # type: ignore[return-value]
    except (KeyError, TypeError):
        pass
    return ReplicaFacts()


class _Observed:
    """What the middleware itself sees of one request and its response."""

    __slots__ = (
        "req_body", "status", "sse", "buf", "resp_body", "tokens", "first_ns", "last_ns",
        "usage", "finish_reason", "end_ns", "content_length", "body_bytes", "done",
    )

    def __init__(self) -> None:
        self.req_body = bytearray()
        self.status: int | None = None
        self.sse = False
        self.buf = b""
        self.resp_body = bytearray()
        self.tokens = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.end_ns: int | None = None
        self.content_length: int | None = None
        self.body_bytes = 0
        self.done = False
        """``data: [DONE]`` seen: the stream's answer is complete."""

    def feed_sse(self, chunk: bytes, now: int) -> None:
        data = self.buf + chunk
        lines = data.split(b"\n")
        self.buf = lines.pop()
        if len(self.buf) > _BODY_CAP:
            self.buf = b""
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                continue
            if isinstance(obj, dict):
                self._chunk(obj, now)

    def _chunk(self, obj: dict[str, Any], now: int) -> None:
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices")
        content = None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            ch = choices[0]
            delta = ch.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else ch.get("text")
            if ch.get("finish_reason"):
                self.finish_reason = str(ch["finish_reason"])
        if content:
            self.tokens += 1
            if self.first_ns is None:
                self.first_ns = now
            self.last_ns = now

    def parse_body(self) -> None:
        try:
            obj = json.loads(bytes(self.resp_body))
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            fr = choices[0].get("finish_reason")
            if fr:
                self.finish_reason = str(fr)
        meta = obj.get("meta_info")  # SGLang /generate
        if isinstance(meta, dict):
            self.usage = {k: meta.get(k) for k in ("prompt_tokens", "completion_tokens")}
            fr = meta.get("finish_reason")
            if isinstance(fr, dict):
                fr = fr.get("type")
            if fr:
                self.finish_reason = str(fr)

    def request_json(self) -> dict[str, Any]:
        if not self.req_body or len(self.req_body) >= _BODY_CAP:
            return {}
        try:
            obj = json.loads(bytes(self.req_body))
        except ValueError:
            return {}
        return obj if isinstance(obj, dict) else {}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class ReplicaMiddleware:
    """ASGI middleware for a Python-served OpenAI-compatible replica.

    ``replica_id`` names this replica in ``routeaudit.replica.id`` (use the host:port the router
    knows it by). ``tracer_provider`` None means the global one.
    """

    def __init__(
        self, app: ASGIApp, *, replica_id: str,
        tracer_provider: trace.TracerProvider | None = None,
        paths: Iterable[str] = DEFAULT_PATHS, dp_rank: int | None = None,
    ) -> None:
        self.app = app
        self.replica_id = replica_id
        self.paths = frozenset(paths)
        self.dp_rank = dp_rank
        self._tracer = trace.get_tracer(INSTRUMENTATION_NAME, "0.1.0", tracer_provider)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        start_ns = time.time_ns()
        try:
            headers = list(scope.get("headers") or ())
            parent: Context | None = propagate.extract(headers, getter=_GETTER)
            rid_values = _GETTER.get(headers, "x-request-id")
            request_id = rid_values[0] if rid_values else uuid.uuid4().hex
            facts: ReplicaFacts = {"request_id": request_id}
            state = scope.get("state")
            if state is None:
                state = scope["state"] = {}
            state[STATE_KEY] = facts
        except Exception:
            _LOG.warning("replica middleware setup failed; request not traced", exc_info=True)
            await self.app(scope, receive, send)
            return
        seen = _Observed()

        async def wrapped_receive() -> Message:
            msg = await receive()
            if msg.get("type") == "http.request" and len(seen.req_body) < _BODY_CAP:
                seen.req_body += msg.get("body", b"")
            return msg

        async def wrapped_send(msg: Message) -> None:
            try:
                kind = msg.get("type")
                if kind == "http.response.start":
                    seen.status = int(msg.get("status", 200))
                    hs = list(msg.get("headers") or ())
                    for n, v in hs:
                        if n.lower() == b"content-type" and b"text/event-stream" in v.lower():
                            seen.sse = True
                        elif n.lower() == b"content-length" and v.strip().isdigit():
                            seen.content_length = int(v)
                    if not any(n.lower() == b"x-request-id" for n, _ in hs):
                        hs.append((b"x-request-id", request_id.encode("latin-1")))
                        msg["headers"] = hs
                elif kind == "http.response.body":
                    now = time.time_ns()
                    body = msg.get("body", b"")
                    if body:
                        seen.body_bytes += len(body)
                        if seen.sse:
                            seen.feed_sse(body, now)
                        elif len(seen.resp_body) < _BODY_CAP:
                            seen.resp_body += body
                    # The span ends when the answer is complete, before those bytes leave: a
                    # router ends its forward span on the same bytes ([DONE], or Content-Length
                    # reached), and Starlette sends an empty closing message after them, so
                    # ending at that message let this span outlive its caller's now and then,
                    # and clock-offset estimation then flags the whole router domain.
                    complete = seen.done or (
                        seen.content_length is not None and seen.body_bytes >= seen.content_length)
                    if seen.end_ns is None and (complete or not msg.get("more_body", False)):
                        seen.end_ns = now
            except Exception:
                _LOG.warning("replica middleware: response inspection failed", exc_info=True)
            await send(msg)

        error: BaseException | None = None
        try:
            await self.app(scope, wrapped_receive, wrapped_send)
        except BaseException as exc:  # includes cancellation on client disconnect
            error = exc
            raise
        finally:
            self._emit(seen, facts, parent, request_id, scope.get("path"), start_ns, error)

    def _emit(
        self, seen: _Observed, facts: ReplicaFacts, parent: Context | None, request_id: str,
        endpoint: str | None, start_ns: int, error: BaseException | None,
    ) -> None:
        try:
            if not seen.sse and seen.resp_body:
                seen.parse_body()
            req = seen.request_json()
            usage = seen.usage or {}
            completion = _int(facts.get("completion_tokens"))
            if completion is None:
                completion = _int(usage.get("completion_tokens"))
            if completion is None and seen.sse:
                completion = seen.tokens
            cached = _int(facts.get("cached_tokens"))
            if cached is None and isinstance(usage.get("prompt_tokens_details"), dict):
                cached = _int(usage["prompt_tokens_details"].get("cached_tokens"))
            finish = facts.get("finish_reason") or seen.finish_reason
            status = "ok"
            if error is not None:
                status = "error" if isinstance(error, Exception) else "cancelled"
                finish = finish or "abort"
            elif seen.status is not None and seen.status >= 400:
                status = "rejected" if seen.status in (429, 503) else "error"
            prompt = _int(facts.get("prompt_tokens"))
            if prompt is None:
                prompt = _int(usage.get("prompt_tokens"))
            max_tokens = _int(facts.get("max_tokens"))
            if max_tokens is None:
                max_tokens = _int(req.get("max_tokens")) or _int(req.get("max_completion_tokens"))
            model = facts.get("model") or req.get("model")
            dp_rank = _int(facts.get("dp_rank"))
            record_execution(
                request_id=facts.get("request_id") or request_id, replica_id=self.replica_id,
                start_ns=start_ns, end_ns=seen.end_ns or time.time_ns(), parent_context=parent,
                endpoint=endpoint, prompt_tokens=prompt, completion_tokens=completion,
                cached_tokens=cached, finish_reason=finish, max_tokens=max_tokens,
                model=model if isinstance(model, str) else None,
                queued_ns=_int(facts.get("queued_ns")),
                scheduled_ns=_int(facts.get("scheduled_ns")),
                first_token_ns=_int(facts.get("first_token_ns")) or seen.first_ns,
                last_token_ns=_int(facts.get("last_token_ns")) or seen.last_ns,
                preemptions=_int(facts.get("preemptions")),
                dp_rank=dp_rank if dp_rank is not None else self.dp_rank,
                http_status=seen.status if seen.status is not None else (
                    500 if error is not None else None),
                status=status, tracer=self._tracer,
            )
        except Exception:
            _LOG.warning("replica middleware: span emission failed (ignored)", exc_info=True)
