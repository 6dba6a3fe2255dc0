"""The receiver's exception tree, in one module. Every message is one line and never holds the
token. :mod:`collectors.otlp._status` maps the refusals to HTTP and gRPC statuses.

    audit.AuditError
    └── CollectorError          the collector cannot start as configured
        ├── ConfigError         the configuration cannot work (raised before binding anything)
        └── StartError          a port is in use, the store is locked, the server failed to start

    ExportRefused               an export is answered with an error status (never raised to users)
    ├── Unauthenticated         missing or wrong bearer token               → 401 / UNAUTHENTICATED
    ├── Forbidden               Host, Origin or query header not allowed     → 403
    ├── UnsupportedMediaType    not protobuf/JSON, or unknown Content-Encoding → 415
    ├── BodyTooLarge            over max_body_bytes or max_decompressed_bytes → 413
    ├── BadRequest              undecodable body (also _decode.PayloadError) → 400 / INVALID_ARGUMENT
    │   └── BodyTimeout         the body did not arrive within body_timeout_s → 408
    ├── QueueFull               the writer's queue is full (retryable)       → 429 / RESOURCE_EXHAUSTED
    ├── Overloaded              the in-flight byte budget is spent (retryable) → 429 / RESOURCE_EXHAUSTED
    └── WriterUnavailable       the writer failed, timed out or is stopping (retryable) → 503 / UNAVAILABLE

    SpoolError                  the spool folder cannot be used (the writer then writes to the store)
"""

from __future__ import annotations

from audit import AuditError


class CollectorError(AuditError):
    """The collector cannot start as configured."""


class ConfigError(CollectorError, ValueError):
    """The configuration cannot work; raised by ``CollectorConfig.validate`` before binding."""


class StartError(CollectorError):
    """Starting failed: port in use, store locked or unreadable, server failed."""


class ExportRefused(Exception):
    """Base of every refusal an export request is answered with."""


class Unauthenticated(ExportRefused):
    """Bearer token missing or wrong."""


class Forbidden(ExportRefused):
    """The request cannot come from where it says: a ``Host`` that is not ours (DNS rebinding),
    an ``Origin`` that is not allowed, or a query without its custom header (a browser form)."""


class UnsupportedMediaType(ExportRefused):
    """Content-Type or Content-Encoding the receiver does not speak."""


class BodyTooLarge(ExportRefused):
    """The body, compressed or decompressed, is over its limit."""


class BadRequest(ExportRefused):
    """The request cannot be understood (besides an undecodable OTLP payload)."""


class BodyTimeout(BadRequest):
    """The request body did not arrive within ``body_timeout_s`` (a slow or stalled sender)."""


class QueueFull(ExportRefused):
    """The writer's bounded queue has no room for this batch now; retry later."""


class Overloaded(ExportRefused):
    """All requests together hold ``max_inflight_bytes`` already; retry later."""


class WriterUnavailable(ExportRefused):
    """The writer failed to commit, did not commit in time, or is shutting down; retry later."""


class SpoolError(Exception):
    """The spool folder cannot be used (not writable, not ours)."""
