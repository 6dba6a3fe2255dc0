"""The vLLM-format ``llm_request`` span, emitted after the fact with explicit timestamps."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, TypedDict

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

import semconv as sc

INSTRUMENTATION_NAME: Final = "routeaudit.replica"
"""Instrumentation scope name of the replica spans."""

_LOG = logging.getLogger("collectors.replica")


class ReplicaFacts(TypedDict, total=False):
    """Engine facts a served app reports for one request (all optional).

    Times are Unix ns on the replica's clock. Anything left out is taken from what the
    middleware sees (request body, response body / SSE stream, send times).
    """

    request_id: str
    """Pre-filled by the middleware (``X-Request-Id`` or generated); the app may read it."""
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    """Prompt tokens served from the prefix cache."""
    finish_reason: str
    preemptions: int
    max_tokens: int
    model: str
    dp_rank: int
    queued_ns: int
    """When the engine queued the request (default: when the middleware received it)."""
    scheduled_ns: int
    """When the scheduler first ran it (end of queueing, start of prefill)."""
    first_token_ns: int
    last_token_ns: int


def vllm_request_id(endpoint: str | None, request_id: str) -> str:
    """``gen_ai.request.id`` as vLLM writes it with ``--enable-request-id-headers``."""
    if endpoint and endpoint.endswith("/chat/completions"):
        return f"chatcmpl-{request_id}"
    if endpoint and endpoint.endswith("/completions"):
        return f"cmpl-{request_id}-0"
    return request_id


def _s(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else max(0, b - a) / 1e9


def execution_attributes(
    *, request_id: str, replica_id: str | None, endpoint: str | None, start_ns: int, end_ns: int,
    prompt_tokens: int | None = None, completion_tokens: int | None = None,
    cached_tokens: int | None = None, finish_reason: str | None = None,
    max_tokens: int | None = None, model: str | None = None, queued_ns: int | None = None,
    scheduled_ns: int | None = None, first_token_ns: int | None = None,
    last_token_ns: int | None = None, preemptions: int | None = None, dp_rank: int | None = None,
    http_status: int | None = None, status: str | None = None,
) -> dict[str, Any]:
    """Attributes of an ``llm_request`` span (vLLM's set plus routeaudit's additions)."""
    arrival = queued_ns if queued_ns is not None else start_ns
    attrs: dict[str, Any] = {
        sc.COMPONENT: "replica",
        sc.REQUEST_ID: request_id,
        sc.GEN_AI_REQUEST_ID: vllm_request_id(endpoint, request_id),
    }
    if replica_id is not None:
        attrs[sc.REPLICA_ID] = replica_id
    if endpoint is not None:
        attrs[sc.REQUEST_ENDPOINT] = endpoint
    if model is not None:
        attrs[sc.REQUEST_MODEL] = model
    if max_tokens is not None:
        attrs[sc.REQUEST_MAX_TOKENS] = int(max_tokens)
    if prompt_tokens is not None:
        attrs[sc.USAGE_PROMPT_TOKENS] = int(prompt_tokens)
    if completion_tokens is not None:
        attrs[sc.USAGE_COMPLETION_TOKENS] = int(completion_tokens)
    if cached_tokens is not None:
        attrs[sc.USAGE_CACHE_READ_INPUT_TOKENS] = int(cached_tokens)
    if finish_reason is not None:
        attrs[sc.RESPONSE_FINISH_REASONS] = [str(finish_reason)]
    if preemptions is not None:
        attrs[sc.REPLICA_PREEMPTIONS] = int(preemptions)
    if dp_rank is not None:
        attrs[sc.REPLICA_DP_RANK] = int(dp_rank)
    if http_status is not None:
        attrs[sc.HTTP_STATUS] = int(http_status)
    if status is not None:
        attrs[sc.STATUS] = status
    latencies: Sequence[tuple[str, float | None]] = (
        (sc.LATENCY_TTFT_S, _s(arrival, first_token_ns)),
        (sc.LATENCY_E2E_S, _s(arrival, end_ns)),
        (sc.LATENCY_QUEUE_S, _s(arrival, scheduled_ns)),
        (sc.LATENCY_PREFILL_S, _s(scheduled_ns, first_token_ns)),
        (sc.LATENCY_DECODE_S, _s(first_token_ns, last_token_ns)),
        (sc.LATENCY_INFERENCE_S, _s(scheduled_ns, last_token_ns)),
    )
    for key, value in latencies:
        if value is not None:
            attrs[key] = value
    return attrs


def record_execution(
    *,
    request_id: str,
    replica_id: str | None,
    start_ns: int,
    end_ns: int,
    parent_context: Context | None = None,
    endpoint: str | None = "/v1/completions",
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    cached_tokens: int | None = None,
    finish_reason: str | None = None,
    max_tokens: int | None = None,
    model: str | None = None,
    queued_ns: int | None = None,
    scheduled_ns: int | None = None,
    first_token_ns: int | None = None,
    last_token_ns: int | None = None,
    preemptions: int | None = None,
    dp_rank: int | None = None,
    http_status: int | None = None,
    status: str | None = "ok",
    tracer_provider: trace.TracerProvider | None = None,
    tracer: trace.Tracer | None = None,
) -> Context | None:
    """Emit one ``llm_request`` SERVER span with explicit times (Unix ns, replica clock).

    ``parent_context`` is normally the Context returned by ``DecisionRecorder.record`` (the
    forward span). Latencies follow vLLM: queue = scheduled − queued, prefill = first token −
    scheduled, decode = last token − first token, TTFT and e2e from ``queued_ns`` (default
    ``start_ns``). Returns the Context holding the span, or None on failure (never raises).
    """
    try:
        if tracer is None:
            tracer = trace.get_tracer(INSTRUMENTATION_NAME, "0.1.0", tracer_provider)
        attrs = execution_attributes(
            request_id=request_id, replica_id=replica_id, endpoint=endpoint, start_ns=start_ns,
            end_ns=end_ns, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
            cached_tokens=cached_tokens, finish_reason=finish_reason, max_tokens=max_tokens,
            model=model, queued_ns=queued_ns, scheduled_ns=scheduled_ns,
            first_token_ns=first_token_ns, last_token_ns=last_token_ns, preemptions=preemptions,
            dp_rank=dp_rank, http_status=http_status, status=status,
        )
        span = tracer.start_span(sc.SPAN_VLLM_REQUEST, context=parent_context,
                                 kind=SpanKind.SERVER, attributes=attrs, start_time=int(start_ns))
        if first_token_ns is not None:
            span.add_event(sc.EVENT_FIRST_TOKEN, timestamp=int(first_token_ns))
        if (http_status is not None and http_status >= 500) or status == "error":
            span.set_status(Status(StatusCode.ERROR))
        span.end(int(end_ns))
        return trace.set_span_in_context(span, parent_context)
    except Exception:
        _LOG.warning("record_execution failed (ignored)", exc_info=True)
        return None
