"""The router's own SERVER span for one incoming request (:class:`Inbound`).

Made by :meth:`DecisionRecorder.serve` or by :class:`RouterMiddleware`. While an ``Inbound`` is
entered (``with``/``async with``, or by the middleware for the request's task), decisions opened
by ``rec.decide()`` in the same thread or task are its children and take its request id; their
``respond()`` and ``first_byte()`` land on it. That is the one context variable this package
sets, and only for the duration of the request (OpenTelemetry's current span is never touched).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from types import TracebackType
from typing import TYPE_CHECKING, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

import semconv as sc

if TYPE_CHECKING:
    from ._recorder import Decision, DecisionRecorder

__all__ = ["CLIENT_CLOSED_REQUEST", "Inbound", "current_inbound"]

CLIENT_CLOSED_REQUEST: Final = 499
"""Status recorded when the client went away before the response was complete (nginx's
convention; ``requests`` reads it as ``cancelled``)."""

_CURRENT: contextvars.ContextVar[Inbound | None] = contextvars.ContextVar(
    "routeaudit_router_inbound", default=None
)


def current_inbound() -> Inbound | None:
    """The ``Inbound`` entered in this thread or task, if any."""
    return _CURRENT.get()


class Inbound:
    """The router's handling of one request: a SERVER span with the router's answer.

    ``respond(status)`` records the status the router answered its client with, ``first_byte()``
    the instant the first response body byte left (``routeaudit.router.ttfb_ms``),
    ``cancelled()`` a client that went away before the response was complete (status 499).
    ``end()`` (or leaving the ``with`` block) ends the span and closes, with an error mark, any
    forward span of its decisions the router left open. Never raises into the router.
    """

    __slots__ = (
        "_rec", "_span", "_parent", "request_id", "_start_ns", "_status", "_first_byte",
        "_cancelled", "_complete_ns", "_ended", "_decisions", "_tokens",
    )

    def __init__(
        self, rec: DecisionRecorder, parent: Context | None, request_id: str, method: str,
        path: str | None,
    ) -> None:
        self._rec = rec
        self._parent = parent
        self.request_id = request_id
        self._status: int | None = None
        self._first_byte = False
        self._cancelled = False
        self._complete_ns = 0
        self._ended = False
        self._decisions: list[Decision] = []
        self._tokens: list[contextvars.Token[Inbound | None]] = []
        self._start_ns = time.time_ns()
        self._span: trace.Span = trace.INVALID_SPAN
        try:
            attrs = rec._base_attrs.copy()
            attrs[sc.REQUEST_ID] = request_id
            attrs[sc.HTTP_METHOD] = method
            if path is not None:
                attrs[sc.URL_PATH] = path
            name = f"{method} {path}" if path is not None else method
            self._span = rec._start_span(name, parent, SpanKind.SERVER, attrs, self._start_ns)
        except Exception as exc:
            self._span = trace.NonRecordingSpan(trace.get_current_span(parent).get_span_context())
            rec._fail(exc)

    @property
    def context(self) -> Context:
        """Context holding the server span (parent of the router's decisions)."""
        return trace.set_span_in_context(self._span, self._parent)

    def respond(self, status: int) -> None:
        """The HTTP status the router answers its client with (5xx marks the span an error)."""
        try:
            code = int(status)
            self._status = code
            if not self._cancelled and not self._ended:
                self._span.set_attribute(sc.HTTP_STATUS, code)
                if code >= 500:  # OTel HTTP semconv: only 5xx are errors on SERVER spans
                    self._span.set_status(Status(StatusCode.ERROR))
        except Exception as exc:
            self._rec._fail(exc)

    def first_byte(self) -> None:
        """Mark now as the first response body byte sent (only the first call counts)."""
        if self._first_byte or self._ended:
            return
        self._first_byte = True
        try:
            ms = (time.time_ns() - self._start_ns) / 1e6
            self._span.set_attribute(sc.ROUTER_TTFB_MS, ms)
        except Exception as exc:
            self._rec._fail(exc)

    def complete(self) -> None:
        """The answer is complete: call it just *before* sending its last bytes. Now becomes the
        span's end time (on true time the client cannot see the end earlier, which clock
        correction relies on: docs/clock.md), and a later disconnect is no cancel."""
        if not self._complete_ns:
            self._complete_ns = time.time_ns()

    def cancelled(self) -> None:
        """The client went away before the response was complete: status 499, ``error.type``
        ``cancelled`` (ignored once the response is complete)."""
        if self._cancelled or self._complete_ns or self._ended:
            return
        self._cancelled = True
        try:
            self._span.set_attribute(sc.HTTP_STATUS, CLIENT_CLOSED_REQUEST)
            self._span.set_attribute(sc.ERROR_TYPE, "cancelled")
        except Exception as exc:
            self._rec._fail(exc)

    def end(self, exc: BaseException | None = None) -> None:
        """End the server span (safe to call twice). ``exc``: the router failed with it."""
        if self._ended:
            return
        for d in self._decisions:
            fwd = d._forward
            if fwd is not None and not fwd._ended:
                fwd._abandon("the response it belongs to was complete")
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            self.cancelled()
            exc = None
        self._ended = True
        span = self._span
        try:
            if exc is not None and span.is_recording():
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
                if self._status is None:
                    span.set_attribute(sc.HTTP_STATUS, 500)
            span.end(self._complete_ns or None)
        except Exception as e:
            self._rec._fail(e)
        finally:
            self._decisions.clear()

    # -- context managers: enter makes it the inbound of this thread/task
    def _enter(self) -> Inbound:
        self._tokens.append(_CURRENT.set(self))
        return self

    def _exit(self, ev: BaseException | None) -> None:
        try:
            if self._tokens:
                _CURRENT.reset(self._tokens.pop())
        except ValueError:  # exited in another context than entered: nothing to restore there
            pass
        self.end(ev)

    def __enter__(self) -> Inbound:
        return self._enter()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exit(ev)

    async def __aenter__(self) -> Inbound:
        return self._enter()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exit(ev)

    def __repr__(self) -> str:
        return f"Inbound(request_id={self.request_id!r}, status={self._status!r})"
