"""Tracer providers for live components, and a skewed-clock exporter.

Each component (replica, router, client) gets its own ``TracerProvider`` whose resource names it
(``service.name``, ``service.instance.id``, ``host.name``, ``routeaudit.run.id`` and
``routeaudit.replica.id`` / ``routeaudit.router.id``). ``host.name`` is the component's own id so
that the audit treats each one as a separate clock domain, as it would on separate machines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

import semconv as sc

__all__ = ["SkewedExporter", "make_tracer_provider"]


class SkewedExporter(SpanExporter):
    """Shifts every timestamp (span start/end, event times) by ``offset_ns`` before handing the
    spans to ``inner``: the spans look as if stamped by a host whose clock is ``offset_ns``
    ahead (negative: behind). Models clock skew between hosts of a real fleet."""

    def __init__(self, inner: SpanExporter, offset_ns: int) -> None:
        self.inner = inner
        self.offset_ns = int(offset_ns)

    def _shift(self, s: ReadableSpan) -> ReadableSpan:
        d = self.offset_ns
        events = tuple(Event(e.name, e.attributes, e.timestamp + d) for e in s.events)
        return ReadableSpan(
            name=s.name, context=s.context, parent=s.parent, resource=s.resource,
            attributes=s.attributes, events=events, links=s.links, kind=s.kind,
            status=s.status, instrumentation_scope=s.instrumentation_scope,
            start_time=None if s.start_time is None else s.start_time + d,
            end_time=None if s.end_time is None else s.end_time + d,
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.offset_ns:
            return self.inner.export(spans)
        return self.inner.export([self._shift(s) for s in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _Shared(SpanExporter):
    """A shared exporter behind several providers: shutting one provider down must not shut the
    exporter down for the others (the owner of the exporter does that)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export(spans)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def make_tracer_provider(
    component: str, instance: str, *, otlp_endpoint: str | None = None,
    exporter: SpanExporter | None = None, run_id: str | None = None,
    clock_offset_s: float = 0.0, batch: bool = True,
) -> TracerProvider | None:
    """A provider for one live component exporting to ``otlp_endpoint`` (OTLP/HTTP, the full
    ``.../v1/traces`` URL) or to ``exporter`` (shared, e.g. ``InMemorySpanExporter``; not shut
    down with the provider). None when neither is given (no tracing)."""
    if exporter is not None:
        inner: SpanExporter = _Shared(exporter)
    elif otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        inner = OTLPSpanExporter(endpoint=otlp_endpoint, timeout=10)
    else:
        return None
    if clock_offset_s:
        inner = SkewedExporter(inner, round(clock_offset_s * 1e9))
    attrs: dict[str, Any] = {
        sc.SERVICE_NAME: f"testbed-live-{component}",
        sc.SERVICE_INSTANCE_ID: instance,
        sc.HOST_NAME: instance,
    }
    if run_id is not None:
        attrs[sc.RUN_ID] = run_id
    if component == "replica":
        attrs[sc.REPLICA_ID] = instance
    elif component == "router":
        attrs[sc.ROUTER_ID] = instance
    tp = TracerProvider(resource=Resource.create(attrs))
    proc = (BatchSpanProcessor(inner, schedule_delay_millis=200) if batch
            else SimpleSpanProcessor(inner))
    tp.add_span_processor(proc)
    return tp
