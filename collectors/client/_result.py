"""The client span and its figures, shared by the live clients and ``record_client_request``."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Final

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

import semconv as sc

INSTRUMENTATION_NAME: Final = "routeaudit.client"
"""Instrumentation scope name of the client spans."""

ITL_CAP: Final = 4096
"""At most this many inter-token gaps are put on a span (``routeaudit.client.itl_ms``)."""

REJECTED_STATUSES: Final = frozenset({429, 503})
"""HTTP statuses that mean the fleet refused the request (status ``rejected``)."""


@dataclass(slots=True)
class ClientResult:
    """What the client saw for one request. Times are Unix ns on the client's clock."""

    request_id: str
    endpoint: str
    stream: bool
    status: str
    """``ok``, ``error``, ``timeout``, ``cancelled`` or ``rejected`` (HTTP 429/503)."""
    http_status: int | None
    start_ns: int
    end_ns: int
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float
    itl_ms: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    error: str | None = None
    trace_id: str | None = None


def new_request_id() -> str:
    """A fresh request id (32 hex digits)."""
    return uuid.uuid4().hex


def summarize(
    start_ns: int, end_ns: int, token_ns: list[int], usage_tokens: int | None
) -> tuple[float | None, float | None, float, list[float], int | None]:
    """(ttft_ms, tpot_ms, e2e_ms, itl_ms, output_tokens) from token arrival times.

    TPOT is the per-request mean excluding the first token, (e2e − ttft)/(n − 1), where n is the
    server's ``usage.completion_tokens`` when known, else the number of content chunks; None
    when n < 2 or no first token was seen.
    """
    e2e = (end_ns - start_ns) / 1e6
    ttft = (token_ns[0] - start_ns) / 1e6 if token_ns else None
    itl = [(b - a) / 1e6 for a, b in pairwise(token_ns)]
    n = usage_tokens if usage_tokens is not None else (len(token_ns) if token_ns else None)
    tpot = (e2e - ttft) / (n - 1) if (ttft is not None and n is not None and n >= 2) else None
    return ttft, tpot, e2e, itl, n


class SpanCall:
    """One client request being traced: opens the span, collects facts, closes it.

    Used by the sync and async clients (no I/O here) and by ``record_client_request``.
    """

    __slots__ = (
        "span", "request_id", "endpoint", "stream", "start_ns", "http_status", "token_ns",
        "usage_tokens", "prompt_tokens", "cached_tokens", "finish_reason", "text_parts",
        "headers", "_parent",
    )

    def __init__(
        self, tracer: trace.Tracer, *, request_id: str, endpoint: str, stream: bool,
        url: str | None, model: str | None, max_tokens: int | None, input_tokens: int | None,
        run_id: str | None, parent_context: Context | None, start_ns: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.endpoint = endpoint
        self.stream = stream
        self.http_status: int | None = None
        self.token_ns: list[int] = []
        self.usage_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.finish_reason: str | None = None
        self.text_parts: list[str] = []
        self._parent = parent_context
        attrs: dict[str, Any] = {
            sc.COMPONENT: "client", sc.REQUEST_ID: request_id, sc.REQUEST_ENDPOINT: endpoint,
            sc.REQUEST_STREAM: stream, sc.HTTP_METHOD: "POST",
        }
        if url is not None:
            attrs[sc.URL_FULL] = url
        if model is not None:
            attrs[sc.REQUEST_MODEL] = model
        if max_tokens is not None:
            attrs[sc.REQUEST_MAX_TOKENS] = int(max_tokens)
        if input_tokens is not None:
            attrs[sc.REQUEST_INPUT_TOKENS] = int(input_tokens)
        if run_id is not None:
            attrs[sc.RUN_ID] = run_id
        self.start_ns = time.time_ns() if start_ns is None else int(start_ns)
        self.span = tracer.start_span(
            sc.SPAN_CLIENT, context=parent_context, kind=SpanKind.CLIENT, attributes=attrs,
            start_time=self.start_ns,
        )
        self.headers: dict[str, str] = {}
        propagate.inject(self.headers, context=self.context)
        self.headers["x-request-id"] = request_id

    @property
    def context(self) -> Context:
        """Context holding the client span."""
        return trace.set_span_in_context(self.span, self._parent)

    # -- facts from the response
    def usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        if isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            self.cached_tokens = details["cached_tokens"]

    def chunk(self, data: Any, now_ns: int) -> None:
        """One streamed (SSE) JSON chunk; a chunk with content is one token."""
        if not isinstance(data, dict):
            return
        self.usage(data.get("usage"))
        content = None
        choices = data.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        elif isinstance(data.get("text"), str):  # SGLang /generate
            content = data["text"]
            self._meta(data.get("meta_info"))
        if content:
            self.token_ns.append(now_ns)
            self.text_parts.append(content)

    def body(self, data: Any) -> None:
        """A non-streamed JSON response body."""
        if not isinstance(data, dict):
            return
        self.usage(data.get("usage"))
        choices = data.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            msg = choice.get("message")
            text = msg.get("content") if isinstance(msg, dict) else choice.get("text")
            if isinstance(text, str):
                self.text_parts.append(text)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        elif isinstance(data.get("text"), str):
            self.text_parts.append(data["text"])
            self._meta(data.get("meta_info"))

    def _meta(self, meta: Any) -> None:
        if not isinstance(meta, dict):
            return
        if isinstance(meta.get("completion_tokens"), int):
            self.usage_tokens = meta["completion_tokens"]
        if isinstance(meta.get("prompt_tokens"), int):
            self.prompt_tokens = meta["prompt_tokens"]
        if isinstance(meta.get("cached_tokens"), int):
            self.cached_tokens = meta["cached_tokens"]
        fr = meta.get("finish_reason")
        if isinstance(fr, dict) and fr.get("type"):
            self.finish_reason = str(fr["type"])
        elif isinstance(fr, str):
            self.finish_reason = fr

    # -- close
    def finish(self, status: str, error: str | None = None, end_ns: int | None = None) -> ClientResult:
        end = time.time_ns() if end_ns is None else int(end_ns)
        ttft, tpot, e2e, itl, n = summarize(self.start_ns, end, self.token_ns, self.usage_tokens)
        if status == "cancelled" and self.finish_reason is None:
            self.finish_reason = "abort"
        result = ClientResult(
            request_id=self.request_id, endpoint=self.endpoint, stream=self.stream,
            status=status, http_status=self.http_status, start_ns=self.start_ns, end_ns=end,
            ttft_ms=ttft, tpot_ms=tpot, e2e_ms=e2e, itl_ms=itl, output_tokens=n,
            prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
            finish_reason=self.finish_reason, text="".join(self.text_parts), error=error,
            trace_id=format(self.span.get_span_context().trace_id, "032x"),
        )
        span = self.span
        if span.is_recording():
            if self.token_ns:
                span.add_event(sc.EVENT_FIRST_TOKEN, timestamp=self.token_ns[0])
            span.set_attributes(attributes(result))
            if status != "ok":
                span.set_status(Status(StatusCode.ERROR, error or status))
        span.end(end)
        return result


def attributes(r: ClientResult) -> dict[str, Any]:
    """The outcome attributes of a client span."""
    attrs: dict[str, Any] = {sc.STATUS: r.status, sc.CLIENT_E2E_MS: r.e2e_ms}
    if r.http_status is not None:
        attrs[sc.HTTP_STATUS] = r.http_status
    if r.ttft_ms is not None:
        attrs[sc.CLIENT_TTFT_MS] = r.ttft_ms
    if r.tpot_ms is not None:
        attrs[sc.CLIENT_TPOT_MS] = r.tpot_ms
    if r.itl_ms:
        attrs[sc.CLIENT_ITL_MAX_MS] = max(r.itl_ms)
        attrs[sc.CLIENT_ITL_MS] = r.itl_ms[:ITL_CAP]
    if r.output_tokens is not None:
        attrs[sc.USAGE_OUTPUT_TOKENS] = r.output_tokens
    if r.prompt_tokens is not None:
        attrs[sc.USAGE_INPUT_TOKENS] = r.prompt_tokens
    if r.cached_tokens is not None:
        attrs[sc.CLIENT_CACHED_TOKENS] = r.cached_tokens
        attrs[sc.USAGE_CACHE_READ_INPUT_TOKENS] = r.cached_tokens
    if r.finish_reason is not None:
        attrs[sc.RESPONSE_FINISH_REASONS] = [r.finish_reason]
    if r.error is not None:
        attrs[sc.CLIENT_ERROR] = r.error[:500]
    return attrs


def record_client_request(
    request_id: str,
    *,
    start_ns: int,
    end_ns: int,
    token_ns: list[int] | None = None,
    first_token_ns: int | None = None,
    output_tokens: int | None = None,
    prompt_tokens: int | None = None,
    cached_tokens: int | None = None,
    finish_reason: str | None = None,
    status: str = "ok",
    http_status: int | None = 200,
    error: str | None = None,
    endpoint: str = "/v1/completions",
    stream: bool = True,
    model: str | None = None,
    max_tokens: int | None = None,
    input_tokens: int | None = None,
    url: str | None = None,
    run_id: str | None = None,
    parent_context: Context | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> Context | None:
    """Emit a client span after the fact, with explicit times (virtual-time testbed).

    ``token_ns`` are the arrival times of the output tokens (Unix ns); when only
    ``first_token_ns`` is known, give that. ``output_tokens`` overrides the count (as the
    server's usage would). Returns the Context holding the client span (parent for the router's
    decision span), or None if recording failed (never raises).
    """
    try:
        tracer = trace.get_tracer(INSTRUMENTATION_NAME, "0.1.0", tracer_provider)
        call = SpanCall(
            tracer, request_id=request_id, endpoint=endpoint, stream=stream, url=url, model=model,
            max_tokens=max_tokens, input_tokens=input_tokens, run_id=run_id,
            parent_context=parent_context, start_ns=start_ns,
        )
        if token_ns:
            call.token_ns = [int(t) for t in token_ns]
        elif first_token_ns is not None:
            call.token_ns = [int(first_token_ns)]
        call.usage_tokens = output_tokens
        call.prompt_tokens = prompt_tokens
        call.cached_tokens = cached_tokens
        call.finish_reason = finish_reason
        call.http_status = http_status
        ctx = call.context
        call.finish(status, error, end_ns=end_ns)
        return ctx
    except Exception:  # after-the-fact recording must not break a simulation
        import logging

        logging.getLogger("collectors.client").warning("record_client_request failed",
                                                       exc_info=True)
        return None
