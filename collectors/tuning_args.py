"""The collector's tuning flags (queue, commits, rebuild pacing, the store's threads and memory),
defined once for ``routeaudit collect`` and ``python -m collectors.otlp`` so the two cannot drift
apart (docs/operations.md names them). Imports nothing of the receiver, so ``routeaudit --help``
stays quick; each flag left out keeps ``CollectorConfig``'s default.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

_FLAGS: Final[tuple[tuple[str, str, type, str, str], ...]] = (
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
     "DuckDB worker threads of the store (default half the cores, so a rebuild of the "
     "relations leaves the rest to ingest)"),
    ("--store-memory-limit", "store_memory_limit", str, "SIZE",
     "DuckDB memory limit of the store, e.g. 4GB (default 25%% of the machine's memory)"),
)


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the tuning flags to ``parser``."""
    for flag, _, kind, metavar, text in _FLAGS:
        parser.add_argument(flag, type=kind, default=None, metavar=metavar, help=text)


def tuning_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``CollectorConfig`` fields the parsed flags set (those given)."""
    found: dict[str, Any] = {}
    for flag, name, *_ in _FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            found[name] = value
    return found
