"""``python -m collectors.otlp --db F``: run a collector without the ``routeaudit`` CLI (tests,
debugging). The flags mirror ``routeaudit collect``."""

from __future__ import annotations

import argparse
import sys
import time

from collectors.otlp._collector import run_collector
from collectors.otlp._errors import CollectorError
from collectors.otlp.config import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    default_config,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m collectors.otlp", description=__doc__)
    p.add_argument("--db", required=True, help="store file (created if missing)")
    p.add_argument("--host", default=DEFAULT_HOST, help="bind address of both transports")
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="-1 disables gRPC")
    p.add_argument("--token", default=None, help="bearer token (default: $ROUTEAUDIT_TOKEN)")
    p.add_argument("--scrape", action="append", default=[], metavar="URL")
    p.add_argument("--scrape-interval", type=float, default=None, metavar="S")
    p.add_argument("--queue-max-spans", type=int, default=None)
    p.add_argument("--max-group-spans", type=int, default=None)
    p.add_argument("--refresh-interval", type=float, default=None, metavar="S",
                   help="seconds between background rebuilds of the relations")
    p.add_argument("--refresh-max-share", type=float, default=None, metavar="F",
                   help="longest share of the time spent rebuilding the relations (default "
                        "0.25: a slow refresh is followed by a pause 3x as long)")
    p.add_argument("--store-threads", type=int, default=None, metavar="N",
                   help="DuckDB worker threads of the store (default half the cores, so a "
                        "rebuild of the relations leaves the rest to ingest)")
    p.add_argument("--store-memory-limit", default=None, metavar="SIZE",
                   help="DuckDB memory limit of the store, e.g. 4GB (default 25%% of the "
                        "machine's memory)")
    p.add_argument("--commit-delay-ms", type=float, default=0.0,
                   help="testing only: sleep before every commit, to make a slow store and "
                        "exercise backpressure (benchmarks/backpressure_soak.py)")
    p.add_argument("--keep-prompts", action="store_true",
                   help="store prompt/completion attribute values (default: dropped and counted)")
    p.add_argument("--spool", action="store_true",
                   help="acknowledge exports once synced to <db>.spool/ (larger commits, faster)")
    a = p.parse_args(argv)
    overrides: dict[str, object] = {
        "db_path": a.db, "http_host": a.host, "grpc_host": a.host, "http_port": a.http_port,
        "grpc_port": None if a.grpc_port < 0 else a.grpc_port, "scrape_targets": a.scrape,
    }
    if a.token:
        overrides["token"] = a.token
    if a.scrape_interval is not None:
        overrides["scrape_interval_s"] = a.scrape_interval
    if a.keep_prompts:
        overrides["keep_prompts"] = True
    if a.spool:
        overrides["spool"] = True
    if a.queue_max_spans is not None:
        overrides["queue_max_spans"] = a.queue_max_spans
    if a.max_group_spans is not None:
        overrides["max_group_spans"] = a.max_group_spans
    if a.refresh_interval is not None:
        overrides["refresh_interval_s"] = a.refresh_interval
    if a.refresh_max_share is not None:
        overrides["refresh_max_share"] = a.refresh_max_share
    if a.store_threads is not None:
        overrides["store_threads"] = a.store_threads
    if a.store_memory_limit is not None:
        overrides["store_memory_limit"] = a.store_memory_limit
    delay_s = a.commit_delay_ms / 1000.0
    try:
        return run_collector(default_config(**overrides),
                             before_commit=(lambda: time.sleep(delay_s)) if delay_s > 0 else None)
    except CollectorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
