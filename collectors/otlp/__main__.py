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
from collectors.tuning_args import add_tuning_arguments, tuning_overrides


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m collectors.otlp", description=__doc__)
    p.add_argument("--db", required=True, help="store file (created if missing)")
    p.add_argument("--host", default=DEFAULT_HOST, help="bind address of both transports")
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="-1 disables gRPC")
    p.add_argument("--token", default=None, help="bearer token (default: $ROUTEAUDIT_TOKEN)")
    p.add_argument("--scrape", action="append", default=[], metavar="URL")
    p.add_argument("--scrape-interval", type=float, default=None, metavar="S")
    add_tuning_arguments(p)
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
    overrides.update(tuning_overrides(a))
    delay_s = a.commit_delay_ms / 1000.0
    try:
        return run_collector(default_config(**overrides),
                             before_commit=(lambda: time.sleep(delay_s)) if delay_s > 0 else None)
    except CollectorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
