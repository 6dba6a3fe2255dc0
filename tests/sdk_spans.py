"""Spans made by the real OpenTelemetry SDK, for tests that send them to a collector."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def finished_spans(n: int, tracer: str = "tests") -> list[ReadableSpan]:
    """``n`` ended root spans named ``s0`` .. ``s<n-1>``, each its own trace."""
    mem = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(mem))
    t = provider.get_tracer(tracer)
    for i in range(n):
        with t.start_as_current_span(f"s{i}"):
            pass
    provider.shutdown()
    return list(mem.get_finished_spans())
