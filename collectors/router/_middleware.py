"""RouterMiddleware: the router's server span for any ASGI app (Starlette, FastAPI, ...)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

from ._inbound import _CURRENT
from ._recorder import DecisionRecorder

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
    ends the span, closing with an error mark any forward span the handler left open. The
    recorder's rule holds: nothing here raises into the app; the app's own exceptions pass
    through unchanged.
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

        async def send_watching(message: Message) -> None:
            kind = message.get("type")
            if kind == "http.response.start":
                inbound.respond(message.get("status", 200))
            elif kind == "http.response.body":
                if message.get("body"):
                    inbound.first_byte()
                if not message.get("more_body", False):
                    inbound.complete()
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
