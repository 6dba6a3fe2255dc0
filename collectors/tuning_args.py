"""The collector's tuning and limit flags (queue, commits, rebuild pacing, the store's threads and
memory, request sizes, timeouts, connections, allowed hosts and origins, query limits), defined once for
``routeaudit collect`` and ``python -m collectors.otlp`` so the two cannot drift apart
(docs/operations.md names them). Imports nothing of the receiver, so ``routeaudit --help``
stays quick; each flag left out keeps ``CollectorConfig``'s default.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``12h`` or ``7d`` (a command-line type)."""
    t = text.strip().lower()
    scale = _UNITS.get(t[-1:], None)
    number = t[:-1] if scale is not None else t
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad duration {text!r} (a number with s, m, h or d, e.g. 7d)") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"a duration must be > 0, got {text!r}")
    return value


_FLAGS: Final[tuple[tuple[str, str, Any, str, str], ...]] = (
    # flag, CollectorConfig field, type, metavar, help
    ("--queue-max-spans", "queue_max_spans", int, "N",
     "spans waiting for the writer; beyond, exports are refused with 429 (default 100,000)"),
    ("--max-group-spans", "max_group_spans", int, "N",
     "most spans one commit merges (default 131,072)"),
    ("--refresh-interval", "refresh_interval_s", float, "S",
     "seconds between background rebuilds of the relations while rows arrive (default 2)"),
    ("--refresh-max-share", "refresh_max_share", float, "F",
     "longest share of the time spent rebuilding the relations (default 0.25: a slow "
     "rebuild is followed by a pause 3x as long)"),
    ("--store-threads", "store_threads", int, "N",
     "DuckDB worker threads of the store (default every core: the refreshes set the "
     "verdicts' lag; half the cores leave more to bulk ingest while a rebuild runs)"),
    ("--store-memory-limit", "store_memory_limit", str, "SIZE",
     "DuckDB memory limit of the store, e.g. 4GB (default 25%% of the machine's memory)"),
    ("--max-body-bytes", "max_body_bytes", int, "N",
     "largest request body as sent; larger → 413 (default 16 MiB)"),
    ("--max-decompressed-bytes", "max_decompressed_bytes", int, "N",
     "largest body after decompression, and largest gRPC message (default 64 MiB)"),
    ("--max-inflight-bytes", "max_inflight_bytes", int, "N",
     "bytes all requests together may hold while read, decompressed and decoded; beyond → "
     "429 / RESOURCE_EXHAUSTED with a retry delay (default 256 MiB)"),
    ("--header-timeout", "header_timeout_s", float, "S",
     "seconds to send request headers (HTTP) or finish the HTTP/2 handshake (gRPC) (default 10)"),
    ("--body-timeout", "body_timeout_s", float, "S",
     "seconds for an HTTP body to arrive after its headers; slower → 408 (default 10)"),
    ("--idle-timeout", "idle_timeout_s", float, "S",
     "seconds an idle keep-alive connection stays open (default 30)"),
    ("--max-connections", "max_connections", int, "N",
     "open connections per transport; beyond, new ones are refused (default 512)"),
    ("--grpc-workers", "grpc_max_workers", int, "N",
     "gRPC handler threads (default 16)"),
    ("--grpc-max-concurrent-rpcs", "grpc_max_concurrent_rpcs", int, "N",
     "gRPC exports running or waiting for a thread; beyond → RESOURCE_EXHAUSTED (default 64)"),
    ("--export-timeout", "export_timeout_s", float, "S",
     "seconds an export waits for its commit before 503 / UNAVAILABLE (default 30)"),
    ("--retry-after", "retry_after_s", int, "S",
     "retry delay suggested with 429/503 and RESOURCE_EXHAUSTED/UNAVAILABLE (default 1)"),
    ("--shutdown-grace", "shutdown_grace_s", float, "S",
     "on SIGTERM, seconds each transport lets in-flight requests finish (default 5)"),
    ("--query-timeout", "query_timeout_s", float, "S",
     "seconds a query through the collector may run before it is stopped (default 300)"),
    ("--query-max-rows", "query_max_rows", int, "N",
     "rows a query's answer may hold; beyond, it is stopped (default 5,000,000)"),
    ("--query-max-bytes", "query_max_bytes", int, "N",
     "bytes a query's answer may hold; beyond, it is stopped (default 1 GiB)"),
    ("--refresh-mode", "refresh_mode", str, "MODE",
     "auto (default): refresh only the event time that received rows from 20,000 spans on; "
     "slices: always; full: rebuild every relation from every raw row"),
    ("--retain-raw", "retain_raw_s", duration, "DURATION",
     "keep raw spans, events and scrapes this long behind the newest span, e.g. 7d; older whole "
     "partitions are deleted while running (default: keep everything)"),
    ("--retain-verdicts", "retain_verdicts_s", duration, "DURATION",
     "keep requests, decisions, attributions and the other derived rows this long behind the "
     "newest span, e.g. 90d (default: keep everything)"),
    ("--partition", "partition_s", duration, "DURATION",
     "width of a time partition of a new store, e.g. 60s: a refresh by slices recomputes whole "
     "partitions, so narrower ones keep verdicts fresher (default 60s; a store keeps the "
     "width it was created with)"),
    ("--max-request", "max_request_s", duration, "DURATION",
     "longest a request's spans may arrive after its start, for a new store: a partition's "
     "verdicts are final once the watermark is this far past its end (default 10m)"),
    ("--lateness", "lateness_s", duration, "DURATION",
     "allowed lateness of spans, for a new store: the watermark is the newest span's start "
     "minus this (default 30s)"),
    ("--log-repeat-interval", "log_repeat_interval_s", float, "S",
     "the same warning is logged at most once per this many seconds, with a count (default 10)"),
)

_LIST_FLAGS: Final[tuple[tuple[str, str, str, str], ...]] = (
    # flag, CollectorConfig field, metavar, help (repeatable)
    ("--allow-host", "allowed_hosts", "NAME",
     "a Host header name accepted besides the bound address (repeatable; * accepts any)"),
    ("--allow-origin", "allowed_origins", "ORIGIN",
     "a browser origin (scheme://host[:port]) allowed to call /routeaudit/query (repeatable)"),
    ("--drop-attribute", "drop_attributes", "PATTERN",
     "also drop attributes whose key is PATTERN, or starts with it when it ends in * (any case, "
     "any nesting; repeatable; applies with --keep-prompts too)"),
)


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the tuning flags to ``parser``."""
    for flag, _, kind, metavar, text in _FLAGS:
        parser.add_argument(flag, type=kind, default=None, metavar=metavar, help=text)
    for flag, _, metavar, text in _LIST_FLAGS:
        parser.add_argument(flag, action="append", default=None, metavar=metavar, help=text)


def tuning_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``CollectorConfig`` fields the parsed flags set (those given)."""
    found: dict[str, Any] = {}
    for flag, name, *_ in _FLAGS + _LIST_FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            found[name] = tuple(value) if isinstance(value, list) else value
    return found
