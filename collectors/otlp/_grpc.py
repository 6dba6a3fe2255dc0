"""OTLP/gRPC transport: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

The servicer implements opentelemetry-proto's ``TraceServiceServicer``, but it is registered
with a raw-bytes request deserializer: grpcio answers a body it cannot deserialize with
``INTERNAL`` before any servicer code runs, whereas OTLP wants ``INVALID_ARGUMENT`` (not
retried) for an undecodable request. So the handler decodes the bytes itself, with the native
decoder when it is built (no upb parse at all; see ``collectors.otlp._decode.decode_protobuf``).

Limits (``GrpcLimits``): grpcio receives and decompresses a message before any handler runs,
so the in-flight byte budget can only account for it afterwards; what bounds gRPC memory before
that is that a message is received only once a handler thread takes its call: at most
``grpc_max_workers`` messages of ``max_decompressed_bytes`` at once. Calls beyond
``grpc_max_concurrent_rpcs`` (running or queued) are refused at once with ``RESOURCE_EXHAUSTED``
by grpcio; connections beyond ``max_connections`` are closed by grpcio on accept; a connection
that has not finished its HTTP/2 handshake within ``header_timeout_s`` is closed; an idle one is
sent GOAWAY after ``idle_timeout_s``; every connection is recycled after ``MAX_CONNECTION_AGE_S``
(with a grace that lets a call finish), which also ends a call whose body trickles in; clients
may not ping more often than every ``MIN_PING_INTERVAL_S`` without calls.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from collectors.otlp._decode import DecodedBatch
from collectors.otlp._errors import Overloaded, StartError, Unauthenticated
from collectors.otlp._export import Exporter, decode_protobuf_request, decode_request
from collectors.otlp._limits import ByteBudget, drop_frames
from collectors.otlp._metrics import Metrics
from collectors.otlp._status import grpc_answer, is_refusal

log = logging.getLogger("routeaudit.collector")

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"

MAX_CONNECTION_AGE_S: Final = 600.0
"""A gRPC connection is sent GOAWAY after this long, whatever it does (senders reconnect)."""
MIN_PING_INTERVAL_S: Final = 10.0
"""Keepalive pings closer than this (without calls) count as strikes; two close the connection."""


@dataclass(frozen=True)
class GrpcLimits:
    """What grpcio enforces for us (see the module docstring)."""

    max_workers: int
    max_message_bytes: int
    max_concurrent_rpcs: int
    max_connections: int
    handshake_timeout_s: float
    idle_timeout_s: float
    connection_age_grace_s: float

    def options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            # Without this grpcio sets SO_REUSEPORT and two collectors could share one port.
            ("grpc.so_reuseport", 0),
            ("grpc.max_allowed_incoming_connections", self.max_connections),
            ("grpc.server_handshake_timeout_ms", _ms(self.handshake_timeout_s)),
            ("grpc.max_connection_idle_ms", _ms(self.idle_timeout_s)),
            ("grpc.max_connection_age_ms", _ms(MAX_CONNECTION_AGE_S)),
            ("grpc.max_connection_age_grace_ms", _ms(self.connection_age_grace_s)),
            ("grpc.max_concurrent_streams", self.max_concurrent_rpcs),
            ("grpc.http2.min_ping_interval_without_data_ms", _ms(MIN_PING_INTERVAL_S)),
            ("grpc.http2.max_ping_strikes", 2),
            ("grpc.max_metadata_size", 16 * 1024),
        ]


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Answers Export only after the commit holding the spans returned (blocks a pool thread)."""

    def __init__(self, exporter: Exporter, metrics: Metrics, token: str | None,
                 retry_after_s: int, *, keep_prompts: bool = False,
                 drop_attributes: tuple[str, ...] = (),
                 budget: ByteBudget | None = None) -> None:
        self._keep_prompts = keep_prompts
        self._drop = drop_attributes
        self._budget = budget
        self._exporter = exporter
        self._metrics = metrics
        self._token = token.encode() if token else None
        self._retry_after_s = retry_after_s

    def Export(self, request: ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        return self._answer(context, lambda: decode_request(request, self._metrics,
                                                            keep_prompts=self._keep_prompts,
                                                            drop_attributes=self._drop))

    def export_bytes(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        def get_batch() -> DecodedBatch:
            if self._budget is None:
                return decode_protobuf_request(body, self._metrics, keep_prompts=self._keep_prompts,
                                               drop_attributes=self._drop)
            with self._budget.hold() as hold:
                hold.take(2 * len(body))  # the message grpcio holds, and the decoder's work
                return decode_protobuf_request(body, self._metrics, keep_prompts=self._keep_prompts,
                                               drop_attributes=self._drop)

        return self._answer(context, get_batch)

    def _answer(self, context: grpc.ServicerContext,
                get_batch: Callable[[], DecodedBatch]) -> ExportTraceServiceResponse:
        try:
            self._check_auth(context)
            batch = get_batch()
            result = self._exporter.export(batch)
        except Exception as exc:
            if isinstance(exc, Overloaded):
                self._metrics.inc("overload_refusals")
            if not is_refusal(exc):
                log.exception("unexpected error answering an OTLP/gRPC export")
                self._metrics.inc("internal_errors")
            answer = grpc_answer(exc, self._retry_after_s)
            drop_frames(exc)
            self._metrics.request("grpc", answer.code.name)
            if answer.trailing_metadata:
                context.set_trailing_metadata(answer.trailing_metadata)
            context.abort(answer.code, answer.message)
            raise AssertionError("unreachable") from exc  # abort raises
        self._metrics.request("grpc", "OK")
        return result.response()

    def _check_auth(self, context: grpc.ServicerContext) -> None:
        if self._token is None:
            return
        value = ""
        for key, val in context.invocation_metadata():
            if key == "authorization":
                value = val if isinstance(val, str) else val.decode("latin-1")
        scheme, _, cred = value.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(cred.strip().encode(), self._token):
            raise Unauthenticated("missing or wrong bearer token")


class GrpcServer:
    """A grpcio server bound at construction (so "port in use" fails start()), started later."""

    def __init__(self, receiver: GrpcReceiver, host: str, port: int, limits: GrpcLimits) -> None:
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Export": grpc.unary_unary_rpc_method_handler(
                receiver.export_bytes,
                request_deserializer=None,  # raw bytes: see the module docstring
                response_serializer=ExportTraceServiceResponse.SerializeToString,
            ),
        })
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=limits.max_workers, thread_name_prefix="routeaudit-grpc"),
            handlers=[handler], options=limits.options(),
            maximum_concurrent_rpcs=limits.max_concurrent_rpcs,
        )
        address = f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            bound = 0
            reason = str(exc)
        else:
            reason = "address in use or not available"
        if not bound:
            self._server.stop(None)
            raise StartError(f"cannot listen for OTLP/gRPC on {address}: {reason}")
        self.port: int = bound
        self._stopped: threading.Event | None = None

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float) -> None:
        """Refuse new RPCs, let running ones finish for ``grace_s``. Safe to call twice."""
        self.begin_stop(grace_s).wait(grace_s + 1)

    def begin_stop(self, grace_s: float) -> threading.Event:
        """:meth:`stop` without waiting: the event is set once the server has stopped."""
        if self._stopped is not None:
            return self._stopped
        self._stopped = self._server.stop(grace_s)
        return self._stopped
