"""Status mapping, in one module: which refusal becomes which HTTP status / gRPC code.

Follows the OTLP specification ("OTLP/HTTP Response", "OTLP/gRPC Response"): 400 /
``INVALID_ARGUMENT`` for data that will never be accepted (not retried by clients); 429 /
``RESOURCE_EXHAUSTED`` and 503 / ``UNAVAILABLE`` for conditions that pass (retried, after the
delay we suggest: ``Retry-After`` over HTTP, ``google.rpc.RetryInfo`` over gRPC).

Over gRPC the retry delay is sent twice in the trailing metadata: as a ``google.rpc.Status``
with a ``RetryInfo`` detail in ``grpc-status-details-bin`` (the standard rich-status channel,
what the Go collector and grpc-status readers look at), and as a bare ``RetryInfo`` in
``google.rpc.retryinfo-bin``, which is the key the OpenTelemetry Python gRPC exporter reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.protobuf.any_pb2 import Any as AnyPb
from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2, error_details_pb2, status_pb2

from collectors.otlp._decode import PayloadError
from collectors.otlp._errors import (
    BadRequest,
    BodyTimeout,
    BodyTooLarge,
    ExportRefused,
    Forbidden,
    Overloaded,
    QueueFull,
    Unauthenticated,
    UnsupportedMediaType,
    WriterUnavailable,
)


@dataclass(frozen=True)
class HttpAnswer:
    """Status, one-line message and extra headers for an HTTP refusal."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    grpc_code: int = code_pb2.UNKNOWN
    """The google.rpc code put in the OTLP ``Status`` body."""


@dataclass(frozen=True)
class GrpcAnswer:
    """Code, details and trailing metadata for a gRPC refusal."""

    code: grpc.StatusCode
    message: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()


def one_line(exc: BaseException | str) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:1000] if text else type(exc).__name__


def http_answer(exc: BaseException, retry_after_s: int) -> HttpAnswer:
    """Map a refusal (or :class:`PayloadError`) to its HTTP answer."""
    msg = one_line(exc)
    if isinstance(exc, BodyTimeout):
        # The rest of the body may still be on its way: close the connection after answering.
        return HttpAnswer(408, msg, {"connection": "close"}, grpc_code=code_pb2.DEADLINE_EXCEEDED)
    if isinstance(exc, (PayloadError, BadRequest)):
        return HttpAnswer(400, msg, grpc_code=code_pb2.INVALID_ARGUMENT)
    if isinstance(exc, Unauthenticated):
        return HttpAnswer(401, msg, {"www-authenticate": 'Bearer realm="routeaudit"'},
                          grpc_code=code_pb2.UNAUTHENTICATED)
    if isinstance(exc, Forbidden):
        return HttpAnswer(403, msg, grpc_code=code_pb2.PERMISSION_DENIED)
    if isinstance(exc, BodyTooLarge):
        return HttpAnswer(413, msg, grpc_code=code_pb2.RESOURCE_EXHAUSTED)
    if isinstance(exc, UnsupportedMediaType):
        return HttpAnswer(415, msg, grpc_code=code_pb2.INVALID_ARGUMENT)
    if isinstance(exc, (QueueFull, Overloaded)):
        return HttpAnswer(429, msg, {"retry-after": str(retry_after_s)},
                          grpc_code=code_pb2.RESOURCE_EXHAUSTED)
    if isinstance(exc, WriterUnavailable):
        return HttpAnswer(503, msg, {"retry-after": str(retry_after_s)},
                          grpc_code=code_pb2.UNAVAILABLE)
    # Anything else is our bug: answered 500 (the caller logs it), never retried blindly.
    return HttpAnswer(500, f"internal error: {msg}", grpc_code=code_pb2.INTERNAL)


def grpc_answer(exc: BaseException, retry_after_s: int) -> GrpcAnswer:
    """Map a refusal (or :class:`PayloadError`) to its gRPC answer."""
    msg = one_line(exc)
    if isinstance(exc, (PayloadError, BadRequest, UnsupportedMediaType)):
        return GrpcAnswer(grpc.StatusCode.INVALID_ARGUMENT, msg)
    if isinstance(exc, Unauthenticated):
        return GrpcAnswer(grpc.StatusCode.UNAUTHENTICATED, msg)
    if isinstance(exc, BodyTooLarge):
        # Not retryable: no RetryInfo (OTLP: RESOURCE_EXHAUSTED is retried only with RetryInfo).
        return GrpcAnswer(grpc.StatusCode.RESOURCE_EXHAUSTED, msg)
    if isinstance(exc, Forbidden):
        return GrpcAnswer(grpc.StatusCode.PERMISSION_DENIED, msg)
    if isinstance(exc, (QueueFull, Overloaded)):
        return GrpcAnswer(grpc.StatusCode.RESOURCE_EXHAUSTED, msg,
                          _retry_metadata(code_pb2.RESOURCE_EXHAUSTED, msg, retry_after_s))
    if isinstance(exc, WriterUnavailable):
        return GrpcAnswer(grpc.StatusCode.UNAVAILABLE, msg,
                          _retry_metadata(code_pb2.UNAVAILABLE, msg, retry_after_s))
    return GrpcAnswer(grpc.StatusCode.INTERNAL, f"internal error: {msg}")


def is_refusal(exc: BaseException) -> bool:
    """True for the exceptions this module maps on purpose (anything else is a bug)."""
    return isinstance(exc, (ExportRefused, PayloadError))


def status_message(answer: HttpAnswer) -> status_pb2.Status:
    """The OTLP/HTTP error body: a ``google.rpc.Status``."""
    return status_pb2.Status(code=answer.grpc_code, message=answer.message)


def _retry_metadata(code: int, msg: str, retry_after_s: int) -> tuple[tuple[str, bytes], ...]:
    info = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=retry_after_s))
    detail = AnyPb()
    detail.Pack(info)
    status = status_pb2.Status(code=code, message=msg, details=[detail])
    return (
        ("grpc-status-details-bin", status.SerializeToString()),
        ("google.rpc.retryinfo-bin", info.SerializeToString()),
    )
