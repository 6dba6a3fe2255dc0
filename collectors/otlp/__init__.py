"""OTLP receiver: OTLP/HTTP (:4318) and OTLP/gRPC (:4317) → one ``export()`` → bounded queue →
one writer thread (group commit) → the store. A span is acknowledged only once committed.

    with Collector(default_config(db_path="audit.duckdb")) as c:
        ...                     # c.traces_url, c.grpc_target, c.query_url, c.health()

``run_collector(config)`` blocks until SIGINT/SIGTERM (what ``routeaudit collect`` calls).
"""

from collectors.otlp._collector import Collector, run_collector
from collectors.otlp._errors import (
    BadRequest,
    BodyTimeout,
    BodyTooLarge,
    CollectorError,
    ConfigError,
    ExportRefused,
    Forbidden,
    Overloaded,
    QueueFull,
    SpoolError,
    StartError,
    Unauthenticated,
    UnsupportedMediaType,
    WriterUnavailable,
)
from collectors.otlp.config import CollectorConfig, default_config

__all__ = [
    "Collector",
    "CollectorConfig",
    "default_config",
    "run_collector",
    "BadRequest",
    "BodyTimeout",
    "BodyTooLarge",
    "CollectorError",
    "ConfigError",
    "ExportRefused",
    "Forbidden",
    "Overloaded",
    "QueueFull",
    "SpoolError",
    "StartError",
    "Unauthenticated",
    "UnsupportedMediaType",
    "WriterUnavailable",
]
