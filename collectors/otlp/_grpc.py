"""OTLP/gRPC transport: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

The servicer implements opentelemetry-proto's ``TraceServiceServicer``, but it is registered
with a raw-bytes request deserializer: grpcio answers a body it cannot deserialize with
``INTERNAL`` before any servicer code runs, whereas OTLP wants ``INVALID_ARGUMENT`` (not
retried) for an undecodable request. So the handler decodes the bytes itself, with the native
decoder when it is built (no upb parse at all; see ``collectors.otlp._decode.decode_protobuf``).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from collectors.otlp._decode import DecodedBatch
from collectors.otlp._errors import StartError, Unauthenticated
from collectors.otlp._export import Exporter, decode_protobuf_request, decode_request
from collectors.otlp._metrics import Metrics
from collectors.otlp._status import grpc_answer, is_refusal

log = logging.getLogger("routeaudit.collector")

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Answers Export only after the commit holding the spans returned (blocks a pool thread)."""

    def __init__(self, exporter: Exporter, metrics: Metrics, token: str | None,
                 retry_after_s: int, *, keep_prompts: bool = False) -> None:
        self._keep_prompts = keep_prompts
        self._exporter = exporter
        self._metrics = metrics
        self._token = token.encode() if token else None
        self._retry_after_s = retry_after_s

    def Export(self, request: ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        return self._answer(context, lambda: decode_request(request, self._metrics,
                                                            keep_prompts=self._keep_prompts))

    def export_bytes(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        return self._answer(context, lambda: decode_protobuf_request(body, self._metrics,
                                                                     keep_prompts=self._keep_prompts))

    def _answer(self, context: grpc.ServicerContext,
                get_batch: Callable[[], DecodedBatch]) -> ExportTraceServiceResponse:
        try:
            self._check_auth(context)
            batch = get_batch()
            result = self._exporter.export(batch)
        except Exception as exc:
            if not is_refusal(exc):
                log.exception("unexpected error answering an OTLP/gRPC export")
                self._metrics.inc("internal_errors")
            answer = grpc_answer(exc, self._retry_after_s)
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

    def __init__(self, receiver: GrpcReceiver, host: str, port: int, *, max_workers: int,
                 max_message_bytes: int) -> None:
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Export": grpc.unary_unary_rpc_method_handler(
                receiver.export_bytes,
                request_deserializer=None,  # raw bytes: see the module docstring
                response_serializer=ExportTraceServiceResponse.SerializeToString,
            ),
        })
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_message_bytes),
            # Without this grpcio sets SO_REUSEPORT and two collectors could share one port.
            ("grpc.so_reuseport", 0),
        ]
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="routeaudit-grpc"),
            handlers=[handler], options=options,
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
        self._stopped = False

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float) -> None:
        """Refuse new RPCs, let running ones finish for ``grace_s``. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._server.stop(grace_s).wait(grace_s + 1)
