"""Configuration of the OTLP receiver: one frozen dataclass with documented defaults.

Precedence (applied by the caller, e.g. the command line): argument, then ``ROUTEAUDIT_*``
environment variable, then the ``DEFAULT_*`` constant. :func:`default_config` applies the
environment variables this module names; :meth:`CollectorConfig.validate` fails fast, before
anything listens, with a one-line :class:`ConfigError`.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from collectors.otlp._errors import ConfigError

ENV_TOKEN: Final = "ROUTEAUDIT_TOKEN"
"""Environment variable holding the bearer token clients must send (none: no auth on loopback)."""

DEFAULT_DB_PATH: Final = "audit.duckdb"
DEFAULT_HOST: Final = "127.0.0.1"
"""Both transports bind loopback unless told otherwise; a non-loopback bind needs a token."""
DEFAULT_HTTP_PORT: Final = 4318
"""OTLP/HTTP's registered port; also serves /health, /metrics and /routeaudit/query."""
DEFAULT_GRPC_PORT: Final = 4317
"""OTLP/gRPC's registered port."""
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
"""Largest request body accepted as sent on the wire (HTTP) or as a gRPC message; more → 413."""
DEFAULT_MAX_DECOMPRESSED_BYTES: Final = 64 * 1024 * 1024
"""Largest body after gzip decompression; a gzip bomb stops here (→ 413), never exhausts memory."""
DEFAULT_QUEUE_MAX_SPANS: Final = 100_000
"""Spans waiting for the writer; when full, exports are refused with 429 / RESOURCE_EXHAUSTED."""
DEFAULT_MAX_GROUP_BATCHES: Final = 256
"""Most queued exports merged into one commit (group commit)."""
DEFAULT_MAX_GROUP_SPANS: Final = 131_072
"""A group stops growing once it holds this many spans (bounds one transaction's size). From
122,880 rows DuckDB writes a commit straight to the file instead of the WAL: with a queue that
lets groups grow that large (``queue_max_spans`` 200,000), ingest +14 % against 50,000
(docs/performance.md); with the default queue the groups stay smaller."""
DEFAULT_RETRY_AFTER_S: Final = 1
"""Delay suggested to refused clients (``Retry-After`` / ``RetryInfo``), whole seconds."""
DEFAULT_EXPORT_TIMEOUT_S: Final = 30.0
"""How long an export waits for its commit before answering 503 / UNAVAILABLE (retryable)."""
DEFAULT_GRPC_MAX_WORKERS: Final = 16
"""gRPC handler threads; each blocks while its export waits for the commit."""
DEFAULT_SCRAPE_INTERVAL_S: Final = 1.0
"""Interval between two scrapes of each ``/metrics`` target."""
DEFAULT_REFRESH_INTERVAL_S: Final = 2.0
"""How often the relations (requests, attributions, …) are rebuilt while new rows arrive; raw
tables are always current. Queries therefore see relations at most about this old."""
DEFAULT_REFRESH_MAX_SHARE: Final = 0.25
"""At most this share of the time goes to rebuilding the relations while rows arrive: a refresh
of a large store (minutes at a million requests) is followed by a pause three times as long
instead of the next refresh, so ingest keeps most of the machine (docs/operations.md)."""
DEFAULT_STORE_THREADS: Final = max(1, os.cpu_count() or 1)
"""DuckDB worker threads of the store: every core. A collector left on a fleet spends its cores on
the refreshes that set the verdicts' lag (2 threads instead of 1 on 2 cores: 17.5 s at p99
instead of 22.7 s at 100 requests/s), far below ingest's limits; half the cores leave the
receiver more while a rebuild runs, which only bulk ingest needs (+13-27 % spans/s with one
thread on 2 cores, docs/performance.md). DuckDB's configuration is locked once the store is
open, so the count cannot follow the load."""
DEFAULT_BODY_TIMEOUT_S: Final = 10.0
"""Longest an OTLP/HTTP request body may take to arrive once its headers are in; a slower
sender (slow-loris) is answered 408 and disconnected, so it cannot hold the collector."""
DEFAULT_KEEP_PROMPTS: Final = False
"""Privacy default: attribute values of known prompt/completion keys (``gen_ai.prompt*``,
``gen_ai.input.messages``, ``llm.input_messages*``, ``input.value``, ...) are dropped by the
decoder (and counted) unless the collector is started with ``keep_prompts=True``."""
DEFAULT_STORE_MEMORY_LIMIT: Final = "25%"
"""DuckDB's memory limit in the collector, a share of the machine's memory (DuckDB's own default
is 80 %). A fixed 1 GB could not rebuild the relations of a million-request store (out of memory
in a recursive CTE, which does not spill; 4 GB did, in 239 s: docs/performance.md)."""
DEFAULT_SPOOL: Final = False
"""Acknowledge an export once it is synced to the spool (``<db>.spool/``) instead of once it is
committed to DuckDB: much larger commits, hence several times the ingest rate, at the cost of
disk writes and spans that become visible to queries a commit later (see docs/operations.md)."""
DEFAULT_MAX_QUERY_BYTES: Final = 1024 * 1024
"""Largest ``POST /routeaudit/query`` body."""
DEFAULT_MAX_INFLIGHT_BYTES: Final = 256 * 1024 * 1024
"""Bytes all requests together may hold while their bodies are read, decompressed and decoded
(both transports). A request that would go over is refused at once with 429 /
``RESOURCE_EXHAUSTED`` and a retry delay, so concurrent gzip bombs cannot multiply the per-request
cap into gigabytes. Must fit one request of the largest size (see ``validate``)."""
DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
"""Longest a connection may take to send a request's headers (from its first byte, or from the
connection's opening), and an OTLP/gRPC connection its HTTP/2 handshake; slower → closed."""
DEFAULT_IDLE_TIMEOUT_S: Final = 30.0
"""An HTTP keep-alive connection with no request for this long is closed; a gRPC connection
without calls for this long is sent GOAWAY."""
DEFAULT_MAX_CONNECTIONS: Final = 512
"""Open connections per transport; beyond, a new HTTP connection is answered 503 with
``Retry-After`` and closed, a new gRPC connection is closed. Keeps the process below its file
limit (``LimitNOFILE``), where accepting would fail for everyone."""
DEFAULT_GRPC_MAX_CONCURRENT_RPCS: Final = 64
"""Export RPCs running or queued for a handler thread; beyond → ``RESOURCE_EXHAUSTED``."""
DEFAULT_SHUTDOWN_GRACE_S: Final = 5.0
"""On stop (SIGTERM), how long each transport lets in-flight requests finish before closing."""
DEFAULT_QUERY_TIMEOUT_S: Final = 300.0
"""A query through ``POST /routeaudit/query`` is interrupted after this long (a runaway ad-hoc
query must not hold a core of the collector)."""
DEFAULT_QUERY_MAX_ROWS: Final = 5_000_000
"""Rows one query's answer may hold; beyond, the query is stopped with a one-line error."""
DEFAULT_QUERY_MAX_BYTES: Final = 1 << 30
"""Arrow bytes one query's answer may hold (1 GiB)."""
DEFAULT_LOG_REPEAT_INTERVAL_S: Final = 10.0
"""The same warning (same logger and message) is logged at most once per this many seconds;
the next line says how many were left out."""


@dataclass(frozen=True)
class CollectorConfig:
    """Everything the receiver needs. Defaults bind loopback and suit one machine.

    A port of ``0`` picks a free port (the chosen one is on :attr:`Collector.http_port` /
    :attr:`Collector.grpc_port`); ``grpc_port=None`` disables the gRPC transport.
    """

    db_path: Path = Path(DEFAULT_DB_PATH)
    """The store file; the collector is its only writer."""
    http_host: str = DEFAULT_HOST
    http_port: int = DEFAULT_HTTP_PORT
    grpc_host: str = DEFAULT_HOST
    grpc_port: int | None = DEFAULT_GRPC_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    queue_max_spans: int = DEFAULT_QUEUE_MAX_SPANS
    max_group_batches: int = DEFAULT_MAX_GROUP_BATCHES
    max_group_spans: int = DEFAULT_MAX_GROUP_SPANS
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_S
    grpc_max_workers: int = DEFAULT_GRPC_MAX_WORKERS
    token: str | None = field(default=None, repr=False)
    """Bearer token required on every endpoint but ``/health``; never logged or printed."""
    scrape_targets: tuple[str, ...] = ()
    """Prometheus ``/metrics`` URLs sampled into ``raw_snapshots``."""
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S
    """Seconds between rebuilds of the relations while new rows arrive (at least)."""
    refresh_max_share: float = DEFAULT_REFRESH_MAX_SHARE
    """Longest share of the time spent rebuilding relations: the pause after a refresh is at
    least its duration × (1 − share) / share (``DEFAULT_REFRESH_MAX_SHARE``)."""
    store_threads: int = DEFAULT_STORE_THREADS
    """DuckDB worker threads of the store (``DEFAULT_STORE_THREADS``)."""
    store_memory_limit: str = DEFAULT_STORE_MEMORY_LIMIT
    """DuckDB memory limit of the store, e.g. ``"4GB"`` or ``"25%"`` (of the machine's memory);
    spills to disk beyond it where DuckDB can."""
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    """Seconds an OTLP/HTTP body may take to arrive (after the headers); slower → 408."""
    keep_prompts: bool = DEFAULT_KEEP_PROMPTS
    """Store prompt/completion attribute values (default: drop them; the keys are
    ``collectors.otlp._decode.PROMPT_PATTERNS``)."""
    drop_attributes: tuple[str, ...] = ()
    """More attribute keys to drop (and count), as in ``PROMPT_PATTERNS``: a whole key, or a prefix
    ending in ``*``; ASCII letters in any case; at any nesting; applied with ``keep_prompts`` too."""
    spool: bool = DEFAULT_SPOOL
    """Acknowledge exports at the spool sync rather than the store commit (``DEFAULT_SPOOL``)."""
    allowed_hosts: tuple[str, ...] = ()
    """Names besides the bound address a request's ``Host`` header may carry (e.g. the DNS name
    senders use); ``"*"`` accepts any. See ``collectors.otlp._http.HostCheck``."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins (``scheme://host[:port]``) allowed to call ``POST /routeaudit/query``; a
    request carrying any other ``Origin`` is refused (403)."""
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    """Global budget of request bytes being read, decompressed and decoded (``DEFAULT_MAX_INFLIGHT_BYTES``)."""
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """Seconds to send a request's headers (HTTP) or finish the HTTP/2 handshake (gRPC)."""
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    """Seconds an idle keep-alive connection stays open."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Open connections per transport (``DEFAULT_MAX_CONNECTIONS``)."""
    grpc_max_concurrent_rpcs: int = DEFAULT_GRPC_MAX_CONCURRENT_RPCS
    """Export RPCs running or waiting for a handler thread (``DEFAULT_GRPC_MAX_CONCURRENT_RPCS``)."""
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    """Seconds each transport lets in-flight requests finish on stop."""
    log_repeat_interval_s: float = DEFAULT_LOG_REPEAT_INTERVAL_S
    """At most one line per this many seconds for the same warning (``DEFAULT_LOG_REPEAT_INTERVAL_S``)."""
    query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S
    """Seconds a read query may run before it is interrupted (``DEFAULT_QUERY_TIMEOUT_S``)."""
    query_max_rows: int = DEFAULT_QUERY_MAX_ROWS
    """Rows a read query's answer may hold (``DEFAULT_QUERY_MAX_ROWS``)."""
    query_max_bytes: int = DEFAULT_QUERY_MAX_BYTES
    """Arrow bytes a read query's answer may hold (``DEFAULT_QUERY_MAX_BYTES``)."""
    refresh_mode: str = "auto"
    """How relations are refreshed: ``slices`` (only the event time that received rows,
    docs/architecture.md), ``full`` (every relation from every raw row), or ``auto`` (slices from
    20,000 spans on)."""
    retain_raw_s: float | None = None
    """Keep raw rows (spans, events, scrapes) this many seconds behind the newest span; older
    whole partitions are deleted while running (None: keep everything)."""
    retain_verdicts_s: float | None = None
    """Keep derived rows (requests, decisions, attributions...) this many seconds behind the
    newest span (None: keep everything). May exceed ``retain_raw_s``."""
    partition_s: float | None = None
    """Width of a new store's time partitions, seconds (None: the store's own, 60 for a new
    one); a store holding spans keeps the width it was created with (docs/architecture.md)."""
    max_request_s: float | None = None
    """A new store's ``max_request_s`` (None: the store's own, 600 for a new one)."""
    lateness_s: float | None = None
    """A new store's allowed lateness, seconds (None: the store's own, 30 for a new one)."""
    host: str | None = None
    """Shorthand for the command line: when given, sets both ``http_host`` and ``grpc_host``
    at construction (and reads back as None afterwards)."""

    def __post_init__(self) -> None:
        # Normalise what a command line naturally passes (str path, list of targets).
        object.__setattr__(self, "db_path", Path(self.db_path))
        object.__setattr__(self, "scrape_targets", tuple(self.scrape_targets))
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        object.__setattr__(self, "allowed_origins", tuple(self.allowed_origins))
        if self.host is not None:
            object.__setattr__(self, "http_host", self.host)
            object.__setattr__(self, "grpc_host", self.host)
            object.__setattr__(self, "host", None)

    def with_changes(self, **changes: Any) -> CollectorConfig:
        """A copy with some fields replaced (the dataclass is frozen)."""
        return replace(self, **changes)

    def validate(self) -> CollectorConfig:
        """Raise :class:`ConfigError` (one line) if this cannot work; return ``self`` otherwise."""
        _check_port("http_port", self.http_port)
        if self.grpc_port is not None:
            _check_port("grpc_port", self.grpc_port)
            if (self.grpc_port == self.http_port and self.http_port != 0
                    and _same_bind(self.http_host, self.grpc_host)):
                raise ConfigError(f"http_port and grpc_port are both {self.http_port}")
        hosts = [self.http_host] + ([self.grpc_host] if self.grpc_port is not None else [])
        for host in hosts:
            if not host or any(c.isspace() for c in host):
                raise ConfigError(f"bad bind host {host!r}")
        if self.token is not None and (
                not self.token.strip() or any(c.isspace() or ord(c) < 33 for c in self.token)):
            raise ConfigError("token must be non-empty printable text without spaces")
        if not self.token and not all(_is_loopback(h) for h in hosts):
            exposed = next(h for h in hosts if not _is_loopback(h))
            raise ConfigError(
                f"refusing to listen on non-loopback address {exposed} without a token "
                f"(set {ENV_TOKEN} or --token)"
            )
        for name in ("max_body_bytes", "max_decompressed_bytes", "queue_max_spans",
                     "max_group_batches", "max_group_spans", "grpc_max_workers", "store_threads",
                     "max_inflight_bytes", "max_connections", "grpc_max_concurrent_rpcs",
                     "query_max_rows", "query_max_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.max_decompressed_bytes < self.max_body_bytes:
            raise ConfigError("max_decompressed_bytes must be at least max_body_bytes")
        needed = self.max_body_bytes + 2 * self.max_decompressed_bytes
        if self.max_inflight_bytes < needed:
            raise ConfigError(
                f"max_inflight_bytes must be at least max_body_bytes + 2 x max_decompressed_bytes "
                f"({needed}), so that one request of the largest size fits; got {self.max_inflight_bytes}")
        if not isinstance(self.retry_after_s, int) or self.retry_after_s < 0:
            raise ConfigError(f"retry_after_s must be a whole number of seconds >= 0, got {self.retry_after_s!r}")
        if not self.export_timeout_s > 0:
            raise ConfigError(f"export_timeout_s must be > 0, got {self.export_timeout_s!r}")
        if not self.refresh_interval_s > 0:
            raise ConfigError(f"refresh_interval_s must be > 0, got {self.refresh_interval_s!r}")
        if not (isinstance(self.refresh_max_share, (int, float))
                and not isinstance(self.refresh_max_share, bool)
                and 0 < self.refresh_max_share <= 1):
            raise ConfigError(f"refresh_max_share must be in (0, 1], got {self.refresh_max_share!r}")
        for name in ("body_timeout_s", "header_timeout_s", "idle_timeout_s", "shutdown_grace_s",
                     "log_repeat_interval_s", "query_timeout_s"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not 0 < value < float("inf")):
                raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.refresh_mode not in ("auto", "slices", "full"):
            raise ConfigError(f"refresh_mode must be auto, slices or full, got {self.refresh_mode!r}")
        for name in ("retain_raw_s", "retain_verdicts_s", "partition_s", "max_request_s",
                     "lateness_s"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                      or not 0 < value < float("inf")):
                raise ConfigError(f"{name} must be a duration > 0, got {value!r}")
        for name in ("allowed_hosts", "allowed_origins"):
            for item in getattr(self, name):
                if not isinstance(item, str) or not item.strip() or any(c.isspace() for c in item):
                    raise ConfigError(f"bad entry in {name}: {item!r}")
        for origin in self.allowed_origins:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
                raise ConfigError(f"allowed origin {origin!r} is not scheme://host[:port]")
        for pattern in self.drop_attributes:  # a key, or a key prefix ending in '*'
            if (not isinstance(pattern, str) or not pattern.strip(" *") or not pattern.isprintable()
                    or "*" in pattern[:-1]):
                raise ConfigError(f"bad entry in drop_attributes: {pattern!r} (a key, or a prefix and '*')")
        for name in ("keep_prompts", "spool"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not self.scrape_interval_s > 0:
            raise ConfigError(f"scrape_interval_s must be > 0, got {self.scrape_interval_s!r}")
        for target in self.scrape_targets:
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError(f"scrape target {target!r} is not an http(s) URL")
        db = Path(self.db_path)
        if db.is_dir():
            raise ConfigError(f"db_path {db} is a folder, not a file")
        parent = db.parent if str(db.parent) else Path(".")
        if not parent.is_dir():
            raise ConfigError(f"folder {parent} of db_path does not exist")
        return self


def default_config(**overrides: Any) -> CollectorConfig:
    """Defaults, then environment (``ROUTEAUDIT_TOKEN``), then ``overrides`` (not validated)."""
    base: dict[str, Any] = {}
    env_token = os.environ.get(ENV_TOKEN)
    if env_token:
        base["token"] = env_token
    base.update(overrides)
    return CollectorConfig(**base)


def _check_port(name: str, port: Any) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"{name} must be an integer in 0..65535 (0 = pick a free port), got {port!r}")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _same_bind(a: str, b: str) -> bool:
    wildcard = ("0.0.0.0", "::", "[::]", "")
    return a == b or a in wildcard or b in wildcard
