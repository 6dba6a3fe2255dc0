"""The one export both transports call.

HTTP and gRPC only decode the request and encode the answer; :class:`Exporter` hands the decoded
spans to the writer and answers only after the commit holding them returned, so an acknowledged
span is durable. Refusals are raised as :mod:`collectors.otlp._errors` exceptions and mapped to
statuses by :mod:`collectors.otlp._status`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from collectors.otlp._decode import DecodedBatch, PayloadError, decode, decode_protobuf
from collectors.otlp._errors import WriterUnavailable
from collectors.otlp._metrics import Metrics

log = logging.getLogger("routeaudit.collector")

MAX_REASONS = 5
"""Rejection reasons spelled out in ``partial_success.error_message``; the rest are counted."""


class Consumer(Protocol):
    """The stage after the receiver (the writer, or a test sink)."""

    def submit(self, spans: pa.Table | None = None, events: pa.Table | None = None,
               snapshots: pa.Table | None = None) -> concurrent.futures.Future[None]: ...


@dataclass(frozen=True)
class ExportResult:
    """What the client is told: spans stored (or already stored) and spans rejected, with why."""

    accepted: int
    rejected: int
    error_message: str

    def response(self) -> ExportTraceServiceResponse:
        """``ExportTraceServiceResponse``; ``partial_success`` only when spans were rejected."""
        resp = ExportTraceServiceResponse()
        if self.rejected or self.error_message:
            resp.partial_success.CopyFrom(ExportTracePartialSuccess(
                rejected_spans=self.rejected, error_message=self.error_message))
        return resp


class Exporter:
    """Decoded batch in, acknowledgement out once durable. Thread-safe."""

    def __init__(self, consumer: Consumer, metrics: Metrics, timeout_s: float) -> None:
        self._consumer = consumer
        self._metrics = metrics
        self._timeout_s = timeout_s

    def _submit(self, batch: DecodedBatch) -> concurrent.futures.Future[None] | None:
        self._metrics.inc("spans_rejected", _rejected(batch))
        self._metrics.inc("values_truncated", batch.truncated_values)
        if batch.candidate_json_malformed:
            self._metrics.inc("candidate_texts_malformed", batch.candidate_json_malformed)
        if batch.prompt_values_dropped:
            self._metrics.inc("prompt_values_dropped", batch.prompt_values_dropped)
        if batch.duplicate_spans:  # copies within the request: ignored like stored duplicates
            self._metrics.inc("spans_duplicate", batch.duplicate_spans)
        if not batch.accepted:
            return None
        fut = self._consumer.submit(spans=batch.spans, events=batch.events)
        self._metrics.inc("spans_received", batch.accepted)
        return fut

    def export(self, batch: DecodedBatch) -> ExportResult:
        """Blocking: enqueue, wait for the commit. Raises QueueFull / WriterUnavailable."""
        fut = self._submit(batch)
        if fut is not None:
            try:
                fut.result(self._timeout_s)
            except concurrent.futures.TimeoutError as exc:
                raise WriterUnavailable(
                    f"commit did not finish within {self._timeout_s:g} s; retry later") from exc
        return _result(batch)

    async def export_async(self, batch: DecodedBatch) -> ExportResult:
        """Same as :meth:`export` without blocking the event loop."""
        fut = self._submit(batch)
        if fut is not None:
            try:
                await asyncio.wait_for(asyncio.wrap_future(fut), self._timeout_s)
            except TimeoutError as exc:
                raise WriterUnavailable(
                    f"commit did not finish within {self._timeout_s:g} s; retry later") from exc
        return _result(batch)


def decode_request(req: ExportTraceServiceRequest, metrics: Metrics, *,
                   keep_prompts: bool = False, drop_attributes: tuple[str, ...] = ()) -> DecodedBatch:
    """Decode a parsed request; a decoder crash is logged, counted and answered as undecodable.

    The decoder is meant to reject bad input span by span; an exception escaping it is our bug,
    but the client's data triggered it, so it is answered 400 / INVALID_ARGUMENT (not retried)
    and counted in ``internal_errors`` so tests and operators see it.
    """
    try:
        return decode(req, time.time_ns(), keep_prompts=keep_prompts, drop_attributes=drop_attributes)
    except Exception as exc:
        log.exception("decoder crashed on a request")
        metrics.inc("internal_errors")
        raise PayloadError(f"request could not be decoded: {type(exc).__name__}") from exc


def decode_protobuf_request(body: bytes, metrics: Metrics, *, keep_prompts: bool = False,
                            drop_attributes: tuple[str, ...] = ()) -> DecodedBatch:
    """Decode a binary request body.

    :class:`PayloadError` for an undecodable body passes through; any other exception is a
    decoder crash, handled as in :func:`decode_request`.
    """
    try:
        return decode_protobuf(body, time.time_ns(), keep_prompts=keep_prompts,
                               drop_attributes=drop_attributes)
    except PayloadError:
        raise
    except Exception as exc:
        log.exception("decoder crashed on a request")
        metrics.inc("internal_errors")
        raise PayloadError(f"request could not be decoded: {type(exc).__name__}") from exc


def _rejected(batch: DecodedBatch) -> int:
    """Spans rejected: a reason may cover several spans ("3 span(s) rejected: resource ...")."""
    total = 0
    for reason in batch.rejected:
        head = reason.split(" ", 1)[0]
        if reason.split(" ", 2)[1:2] == ["span(s)"] and head.isdigit():
            total += int(head)
        else:
            total += 1
    return total


def _result(batch: DecodedBatch) -> ExportResult:
    rejected = _rejected(batch)
    if not batch.rejected:
        return ExportResult(batch.accepted, 0, "")
    reasons = batch.rejected[:MAX_REASONS]
    message = "; ".join(reasons)
    if len(batch.rejected) > MAX_REASONS:
        message += f"; and {len(batch.rejected) - MAX_REASONS} more"
    return ExportResult(batch.accepted, rejected, message)
