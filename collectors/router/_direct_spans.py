"""Direct spans: the recorder's spans handed straight to an SDK provider's export processors.

Why: on the project machine the SDK's ``Tracer.start_span`` + ``Span.end`` cost 35–50 µs per
span, most of it validating each attribute under a lock and building the mutable span; a routed
request has two spans (decision and forward), which made the SDK most of a minimal router's
instrumentation cost (docs/performance.md, "Decision-record overhead"). The recorder builds its
attribute values itself, with checked types, so it can skip that work. It keeps everything else
of the SDK: the provider's sampler and id generator decide and name the span exactly as
``Tracer.start_span`` does, and the finished span is an SDK ``ReadableSpan`` given to the
provider's span processor, so batching, export, resource and instrumentation scope are the SDK's.

Used only where the exported span is the same as the SDK's (:meth:`DirectSpans.of`):

* the tracer is the OpenTelemetry SDK's, enabled, with its internal metrics off;
* every span processor is the SDK's ``BatchSpanProcessor`` or ``SimpleSpanProcessor``, whose
  ``on_start`` and ``_on_ending`` do nothing (a processor that reads or changes spans while they
  are open needs the SDK's mutable span);
* no attribute value-length limit is set (the SDK would truncate the candidates JSON).

Anything else takes the SDK path unchanged; the choice is re-checked when processors are added.
``tests/collectors/test_router_recorder.py`` compares the two paths' exported spans field by
field, so an SDK release that changes what ``start_span`` produces fails there, not in a store.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

__all__ = ["DirectSpan", "DirectSpans"]

_PRIMITIVE: Final = frozenset({str, bool, int, float})
_INTERNAL_METRICS_ENV: Final = "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"


def _clean(attributes: Mapping[str, Any] | None, max_count: int) -> MutableMapping[str, Any]:
    """``attributes`` as the SDK would keep them: a plain copy when every value already is a
    valid attribute value (the recorder's own) and they fit, else the SDK's own
    ``BoundedAttributes`` (which drops and logs invalid values and counts what the limit drops,
    exactly as on the SDK path)."""
    if not attributes:
        return {}
    if len(attributes) <= max_count:
        for v in attributes.values():
            t = type(v)
            if t not in _PRIMITIVE and not (t is tuple and all(type(x) is str for x in v)):
                break
        else:
            return dict(attributes)
    return BoundedAttributes(max_count, attributes, immutable=False)


class DirectSpans:
    """Starts :class:`DirectSpan` s for one SDK tracer; build with :meth:`of`."""

    __slots__ = (
        "_tracer", "_sampler", "_ids", "_processor", "_scope", "_info",
        "_checked", "_ok", "_max_attributes", "_max_events", "_max_event_attributes",
        "_readable_span", "_event", "_parent_based", "_max_links", "_max_link_attributes",
        "_record_exception",
    )

    def __init__(self, tracer: Any) -> None:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.trace import Span as SdkSpan
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, DEFAULT_ON

        self._readable_span = ReadableSpan
        self._event = Event
        # the SDK's own exception event (type, message, stack trace), written via add_event
        self._record_exception: Any = SdkSpan.record_exception
        self._tracer = tracer
        self._sampler = tracer.sampler
        # The SDK's default sampler (and ALWAYS_ON) decided inline, by their own rule: sample
        # as the parent did (DEFAULT_ON) or always; the parent's trace state carries over.
        self._parent_based: bool | None = (
            True if self._sampler is DEFAULT_ON else False if self._sampler is ALWAYS_ON else None
        )
        self._ids = tracer.id_generator
        self._processor = tracer.span_processor
        self._scope = tracer._instrumentation_scope
        self._info = tracer.instrumentation_info
        limits = tracer._span_limits
        self._max_attributes = _limit(limits.max_span_attributes)
        self._max_events = _limit(limits.max_events)
        self._max_event_attributes = _limit(limits.max_event_attributes)
        self._max_links = _limit(limits.max_links)
        self._max_link_attributes = _limit(limits.max_link_attributes)
        self._checked: tuple[Any, ...] | None = None
        self._ok = False

    @classmethod
    def of(cls, tracer: Any) -> DirectSpans | None:
        """Direct spans for ``tracer``, or None when only the SDK path gives the SDK's spans."""
        try:
            from opentelemetry.sdk.trace import Tracer as SdkTracer
        except ImportError:  # the API without the SDK: nothing is recorded anyway
            return None
        if type(tracer) is not SdkTracer:
            return None
        if os.environ.get(_INTERNAL_METRICS_ENV, "").strip().lower() == "true":
            return None
        try:
            limits = tracer._span_limits
            if limits.max_attribute_length is not None or (
                limits.max_span_attribute_length is not None
            ):
                return None
            spans = cls(tracer)
        except AttributeError:  # an SDK whose tracer is laid out differently
            return None
        return spans if spans.usable() else None

    def usable(self) -> bool:
        """Still equivalent to the SDK path: processors unchanged or still export-only."""
        processors = getattr(self._processor, "_span_processors", None)
        if processors is not self._checked:
            self._checked = processors
            self._ok = processors is not None and _export_only(processors)
        if not self._ok:
            return False
        enabled = getattr(self._tracer, "_is_enabled", None)
        return enabled is None or bool(enabled())

    def start(
        self,
        name: str,
        context: Context | None,
        kind: SpanKind,
        attributes: Mapping[str, Any],
        start_time: int | None = None,
    ) -> trace.Span:
        """A started span, decided and identified as ``Tracer.start_span`` would."""
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            trace_id = parent.trace_id
            random_id = bool(parent.trace_flags & 0x02)
            parent_ctx: SpanContext | None = parent
        else:
            trace_id = self._ids.generate_trace_id()
            is_random = getattr(self._ids, "is_trace_id_random", None)
            random_id = bool(is_random()) if is_random is not None else False
            parent_ctx = None
        parent_based = self._parent_based
        if parent_based is not None:
            if parent_based and parent_ctx is not None:  # DEFAULT_ON under a parent
                sampled = bool(parent.trace_flags & TraceFlags.SAMPLED)
            else:  # ALWAYS_ON, or DEFAULT_ON's root sampler
                sampled = True
            recording = sampled
            trace_state = parent.trace_state if parent_ctx is not None else None
        else:
            result = self._sampler.should_sample(context, trace_id, name, kind, attributes, ())
            sampled, recording = result.decision.is_sampled(), result.decision.is_recording()
            trace_state, attributes = result.trace_state, result.attributes
        flags = TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT
        if random_id:
            flags |= 0x02
        ctx = SpanContext(trace_id, self._ids.generate_span_id(), is_remote=False,
                          trace_flags=TraceFlags(flags), trace_state=trace_state)
        if not recording:
            return trace.NonRecordingSpan(ctx)
        return DirectSpan(self, name, ctx, parent_ctx, kind,
                          _clean(attributes, self._max_attributes),
                          start_time if start_time is not None else time.time_ns())


def _limit(value: int | None) -> int:
    """A count limit of ``SpanLimits``; None there means unlimited."""
    return sys.maxsize if value is None else value


def _append_latest(items: Any, limit: int, item: Any) -> Any:
    """``items`` with ``item`` appended: a plain list while it fits, then the SDK's
    ``BoundedList``, which keeps the latest ``limit`` and counts the dropped (the span's
    ``dropped_events`` / ``dropped_links``)."""
    if type(items) is list and len(items) >= limit:
        from opentelemetry.sdk.util import BoundedList

        items = BoundedList.from_seq(limit, items)
    items.append(item)
    return items


def _export_only(processors: Sequence[Any]) -> bool:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    return all(type(p) in (BatchSpanProcessor, SimpleSpanProcessor) for p in processors)


class DirectSpan(trace.Span):
    """A recording span that becomes an SDK ``ReadableSpan`` when it ends.

    Implements the whole API span (values are validated like the SDK's); not thread-safe: like a
    :class:`~collectors.router.Decision`, it belongs to one request in one thread or task.
    """

    __slots__ = ("_spans", "_name", "_ctx", "_parent", "_kind", "_attrs", "_events", "_links",
                 "_status", "_start", "_ended")

    def __init__(self, spans: DirectSpans, name: str, ctx: SpanContext, parent: SpanContext | None,
                 kind: SpanKind, attributes: MutableMapping[str, Any], start_time: int) -> None:
        self._spans = spans
        self._name = name
        self._ctx = ctx
        self._parent = parent
        self._kind = kind
        self._attrs = attributes
        self._events: list[Any] = []  # a BoundedList once the limit drops one
        self._links: list[Any] = []
        self._status = Status(StatusCode.UNSET)
        self._start = start_time
        self._ended = False

    def get_span_context(self) -> SpanContext:
        return self._ctx

    def is_recording(self) -> bool:
        return not self._ended

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._ended:
            return
        limit = self._spans._max_attributes
        new = _clean(attributes, sys.maxsize)  # validated; the span's own limit applies below
        if not isinstance(self._attrs, BoundedAttributes) and len(self._attrs) + len(new) > limit:
            self._attrs = BoundedAttributes(limit, self._attrs, immutable=False)
        # BoundedAttributes keeps the latest ones and counts the dropped, as the SDK does
        self._attrs.update(new)

    def set_attribute(self, key: str, value: Any) -> None:
        self.set_attributes({key: value})

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None,
                  timestamp: int | None = None) -> None:
        spans = self._spans
        if not self._ended:
            self._events = _append_latest(self._events, spans._max_events, spans._event(
                name, _clean(attributes, spans._max_event_attributes),
                timestamp if timestamp is not None else time.time_ns()))

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None
                 ) -> None:
        # the SDK's rule: a link needs a valid context, or attributes or a trace state
        if self._ended or not (context and (context.is_valid or attributes
                                            or context.trace_state)):
            return
        spans = self._spans
        self._links = _append_latest(
            self._links, spans._max_links,
            trace.Link(context, _clean(attributes, spans._max_link_attributes)))

    def update_name(self, name: str) -> None:
        if not self._ended:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # The SDK's rules: OK is final, UNSET is ignored.
        if self._ended or self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is not StatusCode.UNSET:
                self._status = status
        elif status is not StatusCode.UNSET:
            self._status = Status(status, description)

    def record_exception(self, exception: BaseException,
                         attributes: Mapping[str, Any] | None = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        self._spans._record_exception(self, exception, attributes, timestamp, escaped)

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        spans = self._spans
        spans._processor.on_end(spans._readable_span(
            name=self._name, context=self._ctx, parent=self._parent,
            resource=spans._tracer.resource,  # read per span, as the SDK does
            attributes=self._attrs, events=self._events, links=self._links,
            kind=self._kind,
            instrumentation_info=spans._info, status=self._status, start_time=self._start,
            end_time=end_time if end_time is not None else time.time_ns(),
            instrumentation_scope=spans._scope,
        ))
