"""Metrics sampler: engines' and routers' Prometheus ``/metrics`` → ``raw_snapshots`` rows (Arrow
tables).

``Scraper(targets, interval_s, sink, clock=time.time_ns, *, timeout_s=None)`` with
``start()``/``stop()`` (it remembers the targets that answered as routers: no row about such a
target itself afterwards); ``parse_metrics(text, target, scraped_ns, scrape_ms=None, *,
router=False)`` is the pure parser. ``SCHEMA`` is the Arrow schema of ``raw_snapshots``.
``ROUTER_METRICS`` names the router series read as a router's view of each worker (rows with
``source = 'router'``).
"""

from ._parse import ROUTER_METRICS, SCHEMA, parse_metrics, replica_of
from ._scraper import Scraper

__all__ = ["ROUTER_METRICS", "SCHEMA", "Scraper", "parse_metrics", "replica_of"]
