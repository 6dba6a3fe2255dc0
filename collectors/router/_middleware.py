"""RouterMiddleware: the router's server span for any ASGI app (Starlette, FastAPI, ...)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

from ._inbound import _CURRENT
from ._recorder import DecisionRecorder
from ._streams import answer_complete

__all__ = ["RouterMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RouterMiddleware:
    """Pure ASGI middleware giving each routed request the router's SERVER span.

    ``app = RouterMiddleware(app, rec)``. For each HTTP request whose method is in ``methods``
    (default: POST, the inference APIs) it opens ``rec.serve()`` from the request's headers and
    path, so ``rec.decide()`` inside the handler is its child with the same request id (the
    client's ``X-Request-Id``, else generated); it records the status the router answers
    (``http.response.status_code``), its first body byte (``routeaudit.router.ttfb_ms``), a
    client that went away before the response was complete (status 499, ``error.type``
    ``cancelled``), an exception escaping the app (status 500 unless already answered); and it
    ends the span, closing with an error mark any forward span the handler left open. The span
    ends as soon as the answer is complete (``data: [DONE]``, the Content-Length reached, or the
    last body message), *before* those bytes are sent: on true time the client cannot see the
    end earlier, which clock correction relies on (docs/clock.md). The recorder's rule holds:
    nothing here raises into the app; the app's own exceptions pass through unchanged.
    """

    def __init__(
        self, app: ASGIApp, recorder: DecisionRecorder, *, methods: Collection[str] = ("POST",)
    ) -> None:
        self.app = app
        self.recorder = recorder
        self.methods = frozenset(m.upper() for m in methods)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") not in self.methods:
            await self.app(scope, receive, send)
            return
        inbound = self.recorder.serve(
            scope.get("headers") or (), method=str(scope["method"]), path=scope.get("path"))

        async def receive_watching() -> Message:
            message = await receive()
            if message.get("type") == "http.disconnect":
                inbound.cancelled()  # ignored once the response is complete
            return message

        total: int | None = None
        seen = 0

        async def send_watching(message: Message) -> None:
            nonlocal total, seen
            kind = message.get("type")
            if kind == "http.response.start":
                inbound.respond(message.get("status", 200))
                for name, value in message.get("headers") or ():
                    if name.lower() == b"content-length" and value.isdigit():
                        total = int(value)
            elif kind == "http.response.body":
                body = message.get("body") or b""
                if body:
                    inbound.first_byte()
                    seen += len(body)
                if not message.get("more_body", False) or answer_complete(body, seen, total):
                    inbound.complete()  # the span's end time: the bytes are not sent yet
            try:
                await send(message)
            except OSError:  # the client's connection is gone (ASGI 2.4 servers raise this)
                inbound.cancelled()
                raise

        token = _CURRENT.set(inbound)
        try:
            await self.app(scope, receive_watching, send_watching)
        except BaseException as exc:
            inbound.end(exc)
            raise
        finally:
            _CURRENT.reset(token)
            inbound.end()
