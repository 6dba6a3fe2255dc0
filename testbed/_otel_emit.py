"""OTel implementation of :class:`~testbed.emit.SpanEmitter`.

One ``TracerProvider`` per emitting component (the client, each router, each replica), each with
resource attributes ``service.name``, ``service.instance.id``, ``routeaudit.run.id`` and
``routeaudit.replica.id`` / ``routeaudit.router.id``, all exporting to one ``SpanExporter``.
Spans carry simulated timestamps; collectors' after-the-fact APIs build them, so the spans are
the same shape a live fleet would send.

Why direct spans: the SDK's ``Tracer.start_span`` + ``Span.end`` (attribute validation under a
lock, the mutable span) and a ``get_tracer`` per call were most of the emission cost, in virtual
time where a run emits thousands of spans per wall second. With ``direct_spans`` (the default)
every component's tracer starts its spans through ``collectors.router``'s direct spans, which
decide, identify and export them exactly as the SDK would (same sampler, id generator, span
processors, resource and scope) wherever that is equivalent, and fall back to the SDK path
otherwise. ``tests/testbed/test_otel_emit.py`` compares both paths' exported spans.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import semconv as sc

if TYPE_CHECKING:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from .emit import RequestTrace

__all__ = ["OTelEmitter"]

_LOG = logging.getLogger("testbed.emit")


_QUEUE_SPANS = 1 << 16
"""Span queue of each component's processor (the SDK's default, 2048, overflows here)."""
_FLUSH_EVERY = 1000
"""Requests emitted between two flushes: the simulator waits for the exporter (backpressure)."""


@functools.cache
def _unclosable_type() -> Callable[[SpanExporter], SpanExporter]:
    """The ``_Unclosable`` exporter class, defined on first use so that importing this module
    does not import the OpenTelemetry SDK."""
    from opentelemetry.sdk.trace.export import SpanExporter

    class _Unclosable(SpanExporter):
        """The one exporter every provider shares: providers may flush it, only the emitter
        closes it."""

        def __init__(self, exporter: SpanExporter) -> None:
            self._exporter = exporter

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return self._exporter.export(spans)

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return bool(self._exporter.force_flush(timeout_millis))

        def shutdown(self) -> None:
            pass

    return _Unclosable


@functools.cache
def _direct_types() -> tuple[Any, Any]:
    """``(_DirectProvider, _DirectTracer)``, defined on first use (they subclass API classes)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import Tracer as SdkTracer

    from collectors.router import DirectSpans

    class _DirectTracer(trace.Tracer):
        """An SDK tracer whose spans start as direct spans while that gives the SDK's spans."""

        def __init__(self, tracer: SdkTracer) -> None:
            self._tracer = tracer
            self._direct = DirectSpans.of(tracer)

        def start_span(self, name: str, context: Any = None,
                       kind: trace.SpanKind = trace.SpanKind.INTERNAL, attributes: Any = None,
                       links: Any = None, start_time: int | None = None,
                       record_exception: bool = True,
                       set_status_on_exception: bool = True) -> trace.Span:
            d = self._direct
            if d is not None and not links and d.usable():
                if attributes:
                    # a list of strings is kept as the tuple the SDK would make of it, which
                    # lets the direct span take its copy-only path
                    attributes = {k: tuple(v) if type(v) is list and all(type(x) is str for x in v)
                                  else v for k, v in attributes.items()}
                return d.start(name, context, kind, attributes or {}, start_time)
            return self._tracer.start_span(name, context, kind, attributes, links, start_time,
                                           record_exception, set_status_on_exception)

        def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
            return self._tracer.start_as_current_span(*args, **kwargs)

    class _DirectProvider(trace.TracerProvider):
        """One component's provider: one cached :class:`_DirectTracer` per scope."""

        def __init__(self, provider: TracerProvider) -> None:
            self._provider = provider
            self._tracers: dict[tuple[str, str | None, str | None], _DirectTracer] = {}

        def get_tracer(self, instrumenting_module_name: str,
                       instrumenting_library_version: str | None = None,
                       schema_url: str | None = None, attributes: Any = None) -> trace.Tracer:
            key = (instrumenting_module_name, instrumenting_library_version, schema_url)
            t = self._tracers.get(key)
            if t is None:
                t = _DirectTracer(self._provider.get_tracer(  # type: ignore[arg-type]
                    instrumenting_module_name, instrumenting_library_version, schema_url,
                    attributes))
                if attributes is None:  # a scope with attributes is not cached
                    self._tracers[key] = t
            return t

    return _DirectProvider, _DirectTracer


class OTelEmitter:
    """Emit client, decision + forward, and replica spans for each finished request.

    ``exporter``: any SDK ``SpanExporter`` (OTLP to a collector, or ``InMemorySpanExporter``).
    ``batch``: use a ``BatchSpanProcessor`` (else ``SimpleSpanProcessor``, synchronous).
    ``direct_spans``: start spans as direct spans (module docstring); False takes the SDK's
    ``start_span`` for every span. Failures are logged and counted in ``errors``; they never
    reach the simulator.
    """

    def __init__(self, exporter: SpanExporter, *, batch: bool = True, endpoint: str = "/v1/completions",
                 direct_spans: bool = True) -> None:
        self.exporter = exporter
        self.batch = batch
        self.endpoint = endpoint
        self.direct_spans = direct_spans
        self.errors = 0
        self._providers: dict[tuple[str, str], TracerProvider] = {}
        self._emitting: dict[tuple[str, str], trace.TracerProvider] = {}
        self._recorders: dict[str, Any] = {}
        self._closed = False
        self._emitted = 0

    def _provider(self, component: str, instance: str, run_id: str) -> trace.TracerProvider:
        """The provider ``component``'s spans are emitted through (created on first use)."""
        key = (component, instance)
        emitting = self._emitting.get(key)
        if emitting is not None:
            return emitting
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        attrs: dict[str, Any] = {
            sc.SERVICE_NAME: f"testbed-{component}",
            sc.SERVICE_INSTANCE_ID: instance,
            sc.RUN_ID: run_id,
            sc.HOST_NAME: instance,  # one virtual clock, but one "host" per component
        }
        if component == "replica":
            attrs[sc.REPLICA_ID] = instance
        elif component == "router":
            attrs[sc.ROUTER_ID] = instance
        tp = TracerProvider(resource=Resource.create(attrs))
        shared = _unclosable_type()(self.exporter)
        # Virtual time emits far faster than real time: a queue that overflows drops spans
        # silently, so the queue is large and emit() drains it every FLUSH_EVERY requests.
        proc = (BatchSpanProcessor(shared, max_queue_size=_QUEUE_SPANS,
                                   max_export_batch_size=1024, schedule_delay_millis=200)
                if self.batch else SimpleSpanProcessor(shared))
        tp.add_span_processor(proc)
        self._providers[key] = tp
        self._emitting[key] = _direct_types()[0](tp) if self.direct_spans else tp
        return self._emitting[key]

    def emit(self, t: RequestTrace) -> None:
        if self._closed:
            return
        self._emitted += 1
        if self.batch and self._emitted % _FLUSH_EVERY == 0:
            self._flush()
        try:
            self._emit(t)
        except Exception:  # never break the simulation
            self.errors += 1
            _LOG.warning("OTelEmitter: emitting %s failed", t.request_id, exc_info=True)

    def _emit(self, t: RequestTrace) -> None:
        from collectors.client import record_client_request
        from collectors.replica import record_execution
        from collectors.router import Candidate, DecisionRecord, DecisionRecorder

        client_tp = self._provider("client", "client-0", t.run_id)
        ctx = record_client_request(
            t.request_id, start_ns=t.send_ns, end_ns=t.end_ns, first_token_ns=t.first_token_ns,
            output_tokens=t.output_tokens, prompt_tokens=t.input_tokens,
            cached_tokens=t.cached_tokens, finish_reason=t.finish_reason, status=t.status,
            http_status=429 if t.status == "rejected" else 200, endpoint=self.endpoint,
            model=t.model, max_tokens=t.max_tokens, input_tokens=t.input_tokens,
            run_id=t.run_id, tracer_provider=client_tp,
        )
        rec = self._recorders.get(t.router_id)
        if rec is None:
            rec = DecisionRecorder(policy=t.policy, router_id=t.router_id,
                                   tracer_provider=self._providers_sdk("router", t.router_id, t.run_id),
                                   direct_spans=self.direct_spans)
            self._recorders[t.router_id] = rec
        cands = [
            Candidate(
                replica=c.replica, eligible=c.eligible, excluded_reason=c.excluded_reason,
                waiting=c.waiting, running=c.running, kv_usage=c.kv_usage,
                remaining_tokens=c.remaining_tokens, telemetry_ts_ns=c.telemetry_ts_ns,
                pending=c.pending, predicted_cached_tokens=c.predicted_cached_tokens,
                est_queue_ms=c.est_queue_ms, est_prefill_ms=c.est_prefill_ms, score=c.score,
            )
            for c in t.candidates
        ]
        routed = t.outcome == "routed"
        fwd_end = t.replica_finish_ns if routed else None
        dctx = rec.record(
            DecisionRecord(
                request_id=t.request_id, decided_ns=t.decided_ns, candidates=cands,
                chosen=t.chosen, reason=t.reason, outcome=t.outcome, attempt=0, model=t.model,
                input_tokens=t.input_tokens, max_tokens=t.max_tokens,
                prefix_hashes=list(t.prefix_hashes), stream=True, endpoint=self.endpoint,
                parent_context=ctx,
                forward_url=f"http://{t.chosen}{self.endpoint}" if routed else None,
                forward_start_ns=t.decided_ns if routed else None, forward_end_ns=fwd_end,
                forward_http_status=200 if routed else None,
                start_ns=t.send_ns, end_ns=t.decided_ns,
            )
        )
        if not routed or t.replica is None or t.replica_arrival_ns is None:
            return
        record_execution(
            request_id=t.request_id, replica_id=t.replica, start_ns=t.replica_arrival_ns,
            end_ns=t.replica_finish_ns or t.end_ns, parent_context=dctx, endpoint=self.endpoint,
            prompt_tokens=t.input_tokens, completion_tokens=t.output_tokens,
            cached_tokens=t.cached_tokens, finish_reason=t.finish_reason,
            max_tokens=t.max_tokens, model=t.model, queued_ns=t.replica_arrival_ns,
            scheduled_ns=t.replica_admit_ns, first_token_ns=t.replica_first_token_ns,
            last_token_ns=t.replica_finish_ns, preemptions=t.preemptions,
            status="ok" if t.status == "ok" else "cancelled",
            tracer_provider=self._provider("replica", t.replica, t.run_id),
        )

    def _providers_sdk(self, component: str, instance: str, run_id: str) -> TracerProvider:
        """The SDK provider itself (the decision recorder has its own direct spans)."""
        self._provider(component, instance, run_id)
        return self._providers[(component, instance)]

    def _flush(self) -> None:
        for tp in self._providers.values():
            try:
                if not tp.force_flush():
                    self.errors += 1
                    _LOG.warning("OTelEmitter: flush timed out; spans may be missing")
            except Exception:
                self.errors += 1
                _LOG.warning("OTelEmitter: flush failed", exc_info=True)

    def close(self) -> None:
        """Flush and shut down every provider (idempotent)."""
        if self._closed:
            return
        self._closed = True
        # Every provider shares one exporter: flush them all before any shutdown closes it.
        self._flush()
        for tp in self._providers.values():
            try:
                tp.shutdown()
            except Exception:
                self.errors += 1
                _LOG.warning("OTelEmitter: shutdown failed", exc_info=True)
        try:
            self.exporter.shutdown()
        except Exception:
            self.errors += 1
            _LOG.warning("OTelEmitter: exporter shutdown failed", exc_info=True)
