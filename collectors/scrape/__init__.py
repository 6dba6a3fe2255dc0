"""Metrics sampler: replicas' Prometheus ``/metrics`` → ``raw_snapshots`` rows (Arrow tables).

``Scraper(targets, interval_s, sink, clock=time.time_ns, *, timeout_s=None)`` with
``start()``/``stop()``; ``parse_metrics(text, target, scraped_ns, scrape_ms=None)`` is the pure
parser. ``SCHEMA`` is the Arrow schema of ``raw_snapshots``.
"""

from ._parse import SCHEMA, parse_metrics, replica_of
from ._scraper import Scraper

__all__ = ["SCHEMA", "Scraper", "parse_metrics", "replica_of"]
