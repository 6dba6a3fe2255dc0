"""Scraper: samples replicas' Prometheus ``/metrics`` on a daemon thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import httpx
import pyarrow as pa

from ._parse import failed_row, parse_scrape, to_table

DEFAULT_TIMEOUT_S: Final = 2.0
"""Per-scrape HTTP timeout ceiling, seconds (also capped at the interval)."""

_LOG = logging.getLogger("collectors.scrape")


def _normalise(target: str) -> str:
    url = target if "://" in target else "http://" + target
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url += "/metrics"
    return url


class Scraper:
    """Scrape every target each ``interval_s`` and hand one Arrow table per round to ``sink``.

    Targets are scraped concurrently; a target that fails or times out yields a row with
    ``ok = false``. A target that once answered as a router is remembered as one: an answer
    without its router families later (a router not yet, or no longer, registering them) gives
    no row about the target itself. ``sink`` is called from the scraper thread and must not block for long;
    its exceptions are logged and counted (:attr:`sink_errors`), never fatal. ``clock`` gives
    ``scraped_ns`` (Unix ns). ``start()`` and ``stop()`` are idempotent.
    """

    def __init__(
        self,
        targets: list[str],
        interval_s: float,
        sink: Callable[[pa.Table], None],
        clock: Callable[[], int] = time.time_ns,
        *,
        timeout_s: float | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        if not targets:
            raise ValueError("at least one target")
        self.targets = [t.strip() for t in targets]
        self.interval_s = float(interval_s)
        self.sink = sink
        self.clock = clock
        self.timeout_s = min(timeout_s or DEFAULT_TIMEOUT_S, self.interval_s)
        self.rounds = 0
        self.sink_errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._routers: set[str] = set()  # targets whose answer was a router's
        self._routers_lock = threading.Lock()

    def scrape_once(self, http: httpx.Client | None = None) -> pa.Table:
        """Scrape all targets now and return the table (no sink call)."""
        own = http is None
        client = http or httpx.Client(timeout=self.timeout_s)
        try:
            if len(self.targets) == 1:
                rows = self._scrape(client, self.targets[0])
            else:
                with ThreadPoolExecutor(max_workers=min(16, len(self.targets))) as pool:
                    rows = [r for rs in pool.map(lambda t: self._scrape(client, t), self.targets)
                            for r in rs]
            return to_table(rows)
        finally:
            if own:
                client.close()

    def _scrape(self, client: httpx.Client, target: str) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        try:
            resp = client.get(_normalise(target), timeout=self.timeout_s)
            ms = (time.perf_counter() - t0) * 1e3
            now = self.clock()
            if resp.status_code != 200:
                return [failed_row(target, now, f"HTTP {resp.status_code}", ms)]
            known = target in self._routers
            rows, router = parse_scrape(resp.text, target, now, ms, router=known)
            if router and not known:
                with self._routers_lock:
                    self._routers.add(target)
            return rows
        except Exception as exc:
            ms = (time.perf_counter() - t0) * 1e3
            return [failed_row(target, self.clock(), f"{type(exc).__name__}: {exc}", ms)]

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            next_at = time.monotonic()
            while not self._stop.is_set():
                table = self.scrape_once(client)
                self.rounds += 1
                try:
                    self.sink(table)
                except Exception:
                    self.sink_errors += 1
                    _LOG.warning("scrape sink failed (round dropped)", exc_info=True)
                next_at += self.interval_s
                delay = next_at - time.monotonic()
                if delay < 0:  # fell behind: skip missed rounds rather than bursting
                    next_at = time.monotonic()
                    delay = 0.0
                self._stop.wait(delay)

    def start(self) -> None:
        """Start the daemon thread (no-op when running)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="routeaudit-scraper",
                                            daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop and join the thread (waits for an in-flight round); safe to call twice."""
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout if timeout is not None else self.timeout_s + 5.0)

    def __enter__(self) -> Scraper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def scrape_targets(targets: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> pa.Table:
    """One scrape of ``targets`` (convenience for scripts and tests)."""
    return Scraper(list(targets), max(timeout_s, 0.001), lambda t: None,
                   timeout_s=timeout_s).scrape_once()
