"""The collector: store + writer + both transports + sidecar (+ scraper), started and stopped
in the right order.

Start: validate the config, bind both ports (a port in use is a one-line :class:`StartError`),
open the store (the only read-write handle), start the writer, serve, announce ourselves in
``<db>.collector.json`` (mode 0600), start the scraper. Stop (idempotent): stop the scraper,
remove the sidecar, stop accepting on both transports while in-flight exports finish, drain the
writer's queue (every queued batch is committed), close the store (checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa

from audit import QueryLimits, Retained, Store, StoreError, sidecar_path
from collectors.otlp._errors import QueueFull, StartError, WriterUnavailable
from collectors.otlp._export import Exporter
from collectors.otlp._grpc import GrpcLimits, GrpcReceiver, GrpcServer
from collectors.otlp._http import ConnectionPolicy, HttpReceiver, HttpServer, bind_socket
from collectors.otlp._limits import ByteBudget, RepeatFilterInstalled
from collectors.otlp._metrics import Metrics
from collectors.otlp._spool import Spool, spool_path
from collectors.otlp._status import one_line
from collectors.otlp._verdict_metrics import VerdictMetrics
from collectors.otlp._writer import Writer
from collectors.otlp.config import CollectorConfig

log = logging.getLogger("routeaudit.collector")

INGEST_PRESSED_SHARE = 0.05
"""Background refreshes are paced (``refresh_max_share``) only while the writer's queue holds at
least this share of ``queue_max_spans``: ingest is behind, and a refresh would take cores it
needs. With the queue near empty refreshes start ``refresh_interval_s`` apart, or right after one
that took longer (``Store.refresh_gap_s``)."""

RETENTION_INTERVAL_S = 60.0
"""How often the retention flags are applied (whole partitions go, so more often gains little)."""

_OPEN_LOCK = threading.Lock()
_OPEN_STORES: set[str] = set()
"""Store files held by a collector of this process."""

_FILES_RESERVED = 256
"""File descriptors kept for the store, the spool, the scraper and the process itself."""


class Collector:
    """The OTLP receiver and single writer of one store. ``with Collector(cfg) as c: ...``.

    ``before_commit`` is a test hook run on the writer thread before every group commit (it may
    sleep to slow the writer down, or raise to simulate a failing store).
    """

    def __init__(self, config: CollectorConfig, *,
                 before_commit: Callable[[], None] | None = None) -> None:
        self.config = config
        self._before_commit = before_commit
        self._lock = threading.Lock()
        self._state = "new"
        self.metrics = Metrics()
        self.verdicts = VerdictMetrics()
        """``routeaudit_verdicts_*`` on ``/metrics``, read after each background refresh."""
        self.metrics.registry.register(self.verdicts)
        self._store: Store | None = None
        self._writer: Writer | None = None
        self._spool: Spool | None = None
        self._http: HttpServer | None = None
        self._grpc: GrpcServer | None = None
        self._scraper: Any = None
        self._refresher: threading.Thread | None = None
        self._refresh_stop = threading.Event()
        self._last_retention = float("-inf")
        self._retained: Retained | None = None
        self._sidecar: Path | None = None
        self._started_ns = 0
        self._store_key: str | None = None
        self._log_filter: RepeatFilterInstalled | None = None
        self.budget = ByteBudget(config.max_inflight_bytes)
        """The in-flight byte budget both transports share."""

    # -- addresses ------------------------------------------------------------------------------
    @property
    def http_port(self) -> int:
        """The bound OTLP/HTTP port (useful when configured as 0)."""
        if self._http is None:
            raise RuntimeError("collector not started")
        return self._http.port

    @property
    def grpc_port(self) -> int | None:
        """The bound OTLP/gRPC port, None when gRPC is disabled."""
        return self._grpc.port if self._grpc is not None else None

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP port, e.g. ``http://127.0.0.1:4318``."""
        return f"http://{_connect_host(self.config.http_host)}:{self.http_port}"

    @property
    def traces_url(self) -> str:
        return f"{self.http_url}/v1/traces"

    @property
    def query_url(self) -> str:
        return f"{self.http_url}/routeaudit/query"

    @property
    def grpc_target(self) -> str | None:
        """``host:port`` for a gRPC channel, None when gRPC is disabled."""
        if self.grpc_port is None:
            return None
        return f"{_connect_host(self.config.grpc_host)}:{self.grpc_port}"

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Collector:
        """Validate, bind, open the store, serve. Raises ConfigError / StartError (one line)."""
        with self._lock:
            if self._state != "new":
                raise StartError(f"collector already {self._state}; create a new one")
            self._state = "starting"
        cfg = self.config.validate()
        try:
            self._start(cfg)
        except BaseException:
            self._shutdown()
            with self._lock:
                self._state = "stopped"
            raise
        with self._lock:
            self._state = "running"
        grpc_txt = f", OTLP/gRPC {self.grpc_target}" if self._grpc else ""
        log.info("routeaudit collector listening: OTLP/HTTP %s (and %s/)%s; store %s%s",
                 self.traces_url, self.http_url, grpc_txt, cfg.db_path,
                 "; token required" if cfg.token else "")
        return self

    def _start(self, cfg: CollectorConfig) -> None:
        self.budget = ByteBudget(cfg.max_inflight_bytes)
        self._log_filter = RepeatFilterInstalled(
            cfg.log_repeat_interval_s, on_suppress=lambda: self.metrics.inc("log_lines_suppressed"))
        _check_file_limit(cfg)
        sock = bind_socket(cfg.http_host, cfg.http_port)
        key = os.path.realpath(cfg.db_path)
        try:
            with _OPEN_LOCK:
                # DuckDB shares one database instance per file inside a process, so a second
                # open here would not hit the file lock: refuse it ourselves.
                if key in _OPEN_STORES:
                    raise StartError(f"{cfg.db_path} is already owned by a collector in this process")
                _OPEN_STORES.add(key)
            self._store_key = key
            store = Store(cfg.db_path, refresh_interval_s=cfg.refresh_interval_s,
                          refresh_max_share=cfg.refresh_max_share, background_refresh=True,
                          threads=cfg.store_threads,
                          memory_limit=cfg.store_memory_limit,
                          incremental={"auto": None, "slices": True, "full": False}[cfg.refresh_mode],
                          partitioning={k: v for k in ("partition_s", "max_request_s", "lateness_s")
                                        if (v := getattr(cfg, k)) is not None},
                          query_limits=QueryLimits(timeout_s=cfg.query_timeout_s,
                                                   max_rows=cfg.query_max_rows,
                                                   max_bytes=cfg.query_max_bytes))
        except BaseException as exc:
            sock.close()
            if isinstance(exc, StoreError):
                raise StartError(str(exc)) from exc
            if isinstance(exc, Exception) and not isinstance(exc, StartError):
                raise StartError(f"cannot open store {cfg.db_path}: {one_line(exc)}") from exc
            raise
        self._store = store
        _check_raw_retention(cfg, store)
        self.metrics.bind_relations_lag(
            lambda: float("nan") if (lag := store.relations_lag_spans) is None else lag)
        self._spool = self._open_spool(cfg, store)
        self._writer = Writer(store, self.metrics, queue_max_spans=cfg.queue_max_spans,
                              max_group_batches=cfg.max_group_batches,
                              max_group_spans=cfg.max_group_spans,
                              before_commit=self._before_commit, spool=self._spool)
        self._writer.start()
        writer = self._writer
        pressed_at = max(1, int(cfg.queue_max_spans * INGEST_PRESSED_SHARE))
        store.ingest_pressed = lambda: writer.depth >= pressed_at
        exporter = Exporter(self._writer, self.metrics, cfg.export_timeout_s)
        receiver = HttpReceiver(exporter, store, self.metrics, cfg, self.health, self.budget)
        policy = ConnectionPolicy(max_connections=cfg.max_connections,
                                  header_timeout_s=cfg.header_timeout_s,
                                  idle_timeout_s=cfg.idle_timeout_s,
                                  retry_after_s=cfg.retry_after_s, metrics=self.metrics)
        budget = self.budget
        self.metrics.bind_limits(lambda: budget.used, lambda: policy.open)
        self._http = HttpServer(receiver.app, sock, cfg.shutdown_grace_s, policy)
        if cfg.grpc_port is not None:
            self._grpc = GrpcServer(
                GrpcReceiver(exporter, self.metrics, cfg.token, cfg.retry_after_s,
                             keep_prompts=cfg.keep_prompts, drop_attributes=cfg.drop_attributes,
                             budget=self.budget),
                cfg.grpc_host, cfg.grpc_port, GrpcLimits(
                    max_workers=cfg.grpc_max_workers,
                    max_message_bytes=cfg.max_decompressed_bytes,
                    max_concurrent_rpcs=cfg.grpc_max_concurrent_rpcs,
                    max_connections=cfg.max_connections,
                    handshake_timeout_s=cfg.header_timeout_s,
                    idle_timeout_s=cfg.idle_timeout_s,
                    # a call cut by the connection's age may still be waiting for its commit
                    connection_age_grace_s=cfg.export_timeout_s + cfg.body_timeout_s),
            )
            self._grpc.start()
        self._http.start()
        self._refresher = threading.Thread(target=self._refresh_loop, args=(store,),
                                           name="routeaudit-refresh", daemon=True)
        self._refresher.start()
        self._started_ns = time.time_ns()
        self._write_sidecar(cfg)
        if cfg.scrape_targets:
            from collectors.scrape import Scraper  # lazily: only when asked to scrape

            self._scraper = Scraper(list(cfg.scrape_targets), cfg.scrape_interval_s, self._sink_snapshots)
            self._scraper.start()

    def _open_spool(self, cfg: CollectorConfig, store: Store) -> Spool | None:
        """Replay what a previous run left in the spool (even when this run does not spool:
        those exports were acknowledged), then start the spool if configured."""
        folder = spool_path(cfg.db_path)
        if not cfg.spool and not folder.is_dir():
            return None
        try:
            spool = Spool(folder)
            leftovers = spool.leftover_segments()
            if leftovers:
                log.info("spool: replaying %d segment(s) from %s before listening", len(leftovers), folder)
            _, spans = spool.replay(lambda s, e: store.append(spans=s, events=e),
                                    max_group_spans=cfg.max_group_spans)
        except Exception as exc:  # folder, record or store: the collector must not start half-way
            raise StartError(f"cannot use spool {folder}: {one_line(exc)}") from exc
        self.metrics.inc("spool_replayed_spans", spans)
        if not cfg.spool:
            _quietly(folder.rmdir)
            return None
        spool.start()
        return spool

    def stop(self) -> None:
        """Stop accepting, commit everything queued, close the store, remove the sidecar.

        Safe to call twice and from any thread (not from inside a request handler).
        """
        with self._lock:
            if self._state in ("stopping", "stopped"):
                return
            if self._state == "new":
                self._state = "stopped"
                return
            self._state = "stopping"
        try:
            self._shutdown()
        finally:
            with self._lock:
                self._state = "stopped"
            log.info("routeaudit collector stopped; store %s closed", self.config.db_path)

    def _refresh_loop(self, store: Store) -> None:
        """Rebuild the relations while rows arrive, paced by ``store.refresh_gap_s`` (own thread)."""
        while True:
            gap = store.refresh_gap_s
            if self._refresh_stop.wait(gap):
                return
            self.metrics.inc("background_refresh_pause_seconds", gap)
            refreshed = False
            try:
                if store.refresh_if_due():
                    refreshed = True
                    self.metrics.last_refresh_s = store.last_refresh_s
                    self.metrics.inc("background_refreshes")
                    self.metrics.inc("background_refresh_seconds", store.last_refresh_s)
            except Exception as exc:  # a broken relation must not stop ingest
                self.metrics.inc("background_refresh_failures")
                log.warning("refreshing the relations failed (next attempt in %.0f s): %s",
                            store.refresh_gap_s, one_line(exc))
            # live verdict metrics: never raises (failures are counted and logged once)
            self.verdicts.update_after_refresh(store, refreshed=refreshed)
            self._retain(store)

    def _retain(self, store: Store) -> None:
        """Apply the retention flags, at most once per :data:`RETENTION_INTERVAL_S`."""
        cfg = self.config
        if cfg.retain_raw_s is None and cfg.retain_verdicts_s is None:
            return
        now = time.monotonic()
        if now - self._last_retention < RETENTION_INTERVAL_S:
            return
        self._last_retention = now
        try:
            done = store.retain(raw_s=cfg.retain_raw_s, verdicts_s=cfg.retain_verdicts_s)
        except Exception as exc:  # retention must not stop ingest either
            self.metrics.inc("retention_failures")
            log.warning("retention failed (next attempt in %.0f s): %s",
                        RETENTION_INTERVAL_S, one_line(exc))
            return
        self.metrics.inc("retention_runs")
        self.metrics.inc("retention_spans_deleted", done.spans_deleted)
        self.metrics.inc("retention_requests_deleted", done.requests_deleted)
        self._retained = done

    def _shutdown(self) -> None:
        self._refresh_stop.set()
        store = self._store
        if store is not None:
            # Running ad-hoc queries would hold the stop for as long as they run. A store whose
            # rebuild is slow (a large one) stops without waiting for it: the rebuild rolls back,
            # the relations stay as last built, and the next writer catches up. A quick one still
            # refreshes at close, so a finished run's store is current.
            if store.rebuild_is_slow:
                _quietly(store.stop_work)
            else:
                _quietly(lambda: store.cancel_queries("the collector is stopping"))
        if self._refresher is not None:
            _quietly(lambda: self._refresher.join(120) if self._refresher else None)
            self._refresher = None
        if self._scraper is not None:
            _quietly(self._scraper.stop)
            self._scraper = None
        self._remove_sidecar()
        # Transports first, while the writer still runs, so in-flight exports get their commit.
        # Both at once, so a stop takes one grace period, not two.
        grace = self.config.shutdown_grace_s
        grpc_stopped: list[threading.Event] = []
        if self._grpc is not None:
            _quietly(lambda: grpc_stopped.append(self._grpc.begin_stop(grace)) if self._grpc else None)
        if self._http is not None:
            _quietly(lambda: self._http.stop(grace + 5) if self._http else None)
        for event in grpc_stopped:
            event.wait(grace + 1)
        if self._writer is not None:
            _quietly(lambda: self._writer.close(self.config.export_timeout_s + 30) if self._writer else None)
        if self._spool is not None:
            _quietly(self._spool.close)
            self._spool = None
        if self._store is not None:
            _quietly(self._store.close)
        if self._store_key is not None:
            with _OPEN_LOCK:
                _OPEN_STORES.discard(self._store_key)
            self._store_key = None
        if self._log_filter is not None:
            self._log_filter.remove()
            self._log_filter = None

    def __enter__(self) -> Collector:  # noqa: PYI034 - start() returns self
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- status -------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """What ``GET /health`` answers."""
        writer = self._writer
        state = self._state
        status = "ok" if state == "running" else state
        if state == "running" and writer is not None and writer.last_error:
            status = "degraded"
        last = self.metrics.last_write_s
        return {
            "status": status,
            "store": str(self.config.db_path),
            "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self.metrics.started_monotonic, 3),
            "queue_spans": writer.depth if writer else 0,
            "queue_limit_spans": self.config.queue_max_spans,
            "spool_bytes": self._spool.bytes_on_disk if self._spool is not None else None,
            "last_write_ms": round(last * 1000, 3) if last is not None else None,
            "last_commit_ns": self.metrics.last_commit_ns,
            "last_error": writer.last_error if writer else None,
            "last_refresh_ms": (round(self.metrics.last_refresh_s * 1000, 1)
                                if self.metrics.last_refresh_s is not None else None),
            # pause before the next refresh: how stale the relations may get under load
            "refresh_gap_ms": (round(self._store.refresh_gap_s * 1000, 1)
                               if self._store is not None else None),
            "refresh_error": self._store.last_refresh_error if self._store is not None else None,
            # spans stored but not yet in the relations (null: the store cannot tell)
            "relations_lag_spans": (self._store.relations_lag_spans
                                    if self._store is not None else None),
            # verdicts of requests anchored before final_until_ns are final, later ones
            # provisional, up to the newest request in the relations (Unix ns, reference clock)
            "final_until_ns": self._store.final_until_ns if self._store is not None else None,
            "newest_request_ns": self._store.newest_request_ns if self._store is not None else None,
            # where retention last cut raw and derived rows (Unix ns; null: nothing cut yet)
            "raw_kept_from_ns": self._retained.raw_from_ns if self._retained else None,
            "verdicts_kept_from_ns": self._retained.verdicts_from_ns if self._retained else None,
            # rows anchored before this are in closed partitions, Parquet beside the store
            "closed_until_ns": self._store.closed_until_ns if self._store is not None else None,
            "close_error": self._store.last_close_error if self._store is not None else None,
            # how long the last move to Parquet took (its refresh's last_refresh_ms includes it)
            "last_close_ms": (round(self._store.last_close_s * 1000, 1)
                              if self._store is not None and self._store.last_close_s is not None
                              else None),
            # how long the last checkpoint between slices took (in its refresh's too)
            "last_checkpoint_ms": (round(self._store.last_checkpoint_s * 1000, 1)
                                   if self._store is not None
                                   and self._store.last_checkpoint_s is not None else None),
            # runs whose per-run rows (slo_summary, calibration) wait for a recompute, and how
            # long the last one took (in its refresh's too when it ran in one)
            "runs_pending": self._store.runs_pending if self._store is not None else None,
            "last_runs_ms": (round(self._store.last_runs_s * 1000, 1)
                             if self._store is not None and self._store.last_runs_s is not None
                             else None),
            "runs_error": self._store.last_runs_error if self._store is not None else None,
            "counters": self.metrics.snapshot(),
        }

    # -- helpers --------------------------------------------------------------------------------
    def _sink_snapshots(self, table: pa.Table) -> None:
        """Scraper sink (scraper thread): queue the rows, do not wait for the commit."""
        writer = self._writer
        if writer is None or not table.num_rows:
            return
        try:
            writer.submit(snapshots=table)
        except (QueueFull, WriterUnavailable) as exc:
            self.metrics.inc("snapshots_dropped", table.num_rows)
            log.warning("scrape round dropped: %s", exc)

    def _write_sidecar(self, cfg: CollectorConfig) -> None:
        """``<db>.collector.json``, mode 0600 (it may hold the token), written atomically."""
        path = sidecar_path(cfg.db_path)
        info: dict[str, Any] = {"pid": os.getpid(), "query_url": self.query_url,
                                "started_ns": self._started_ns}
        if cfg.token:
            info["token"] = cfg.token
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, json.dumps(info).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._sidecar = path

    def _remove_sidecar(self) -> None:
        path, self._sidecar = self._sidecar, None
        if path is None:
            return
        try:
            info = json.loads(path.read_text("utf-8"))
            if info.get("pid") == os.getpid() and info.get("started_ns") == self._started_ns:
                path.unlink()
        except (OSError, ValueError):
            pass


def run_collector(config: CollectorConfig, *,
                  before_commit: Callable[[], None] | None = None) -> int:
    """Start a collector and block until SIGINT or SIGTERM; stop cleanly; return 0.

    Raises ConfigError / StartError (one line each) when it cannot start. Signal handlers are
    installed only when called from the main thread (elsewhere, KeyboardInterrupt still works).
    """
    if not logging.getLogger().handlers and not log.handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # One line per scrape request would drown what matters; failed scrapes are recorded as rows.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _raise_file_limit()
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    collector = Collector(config, before_commit=before_commit)
    try:
        collector.start()
        while not stop.wait(0.5):
            pass
        log.info("signal received, stopping")
    except KeyboardInterrupt:
        pass
    finally:
        collector.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _raise_file_limit() -> None:
    """Soft file limit up to the hard one, as Go programs do: the default soft limit (often
    1,024) is below what ``max_connections`` on two transports needs."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _check_raw_retention(cfg: CollectorConfig, store: Store) -> None:
    """Warn when raw rows are kept for less than the store's slices read back: late spans of the
    older requests would be stored but never analysed."""
    if cfg.retain_raw_s is None:
        return
    needed = store.raw_retention_needed_s()
    if cfg.retain_raw_s < needed:
        log.warning("--retain-raw %.0fs is shorter than %.0fs, what this store's refreshes read "
                    "back plus its max_request_s: late spans of the older requests will be stored "
                    "but not analysed (docs/operations.md, \"Retention\")", cfg.retain_raw_s,
                    needed)


def _check_file_limit(cfg: CollectorConfig) -> None:
    """Warn when the connection limits do not fit the file limit: accept() would fail first."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return
    transports = 2 if cfg.grpc_port is not None else 1
    needed = transports * cfg.max_connections + _FILES_RESERVED
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning("the file limit (%d) is below what max_connections=%d needs (%d); raise "
                    "LimitNOFILE / ulimit -n, or lower --max-connections", soft,
                    cfg.max_connections, needed)


def _connect_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:
        log.exception("error during shutdown")
