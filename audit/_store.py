"""The DuckDB store: one writer (the collector), many readers.

See ``docs/architecture.md`` ("Writing and reading one DuckDB file") for why readers go through a
running collector when there is one, and open the file read-only for one query otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import duckdb
import polars as pl
import pyarrow as pa

import semconv
from audit import _closed, _empty_store, _incremental, _relations, _span_keys
from audit._errors import AuditError, CollectorUnavailable, QueryError, StoreError
from audit._readonly import DEFAULT_LIMITS, QueryCancel, QueryLimits, check_read_only, run_read_only
from audit._slo import SLO, load_slo
from audit.schema import (
    RAW_SNAPSHOTS_SCHEMA,
    RAW_SPAN_EVENTS_SCHEMA,
    RAW_SPANS_SCHEMA,
    RAW_TABLES,
    has_primary_key,
    raw_ddl,
)

SIDECAR_SUFFIX = ".collector.json"
"""A running collector announces itself in ``<store>.collector.json`` (query URL, token)."""


SYNC_REFRESH_BUDGET_S = 2.0
"""A query refreshes stale relations first when the last refresh took at most this long."""

QUERY_REFRESH_BUDGET_S = 10.0
"""With a background refresher, a query waits for a due refresh only when the last one took at
most this long; a larger store's rebuild (minutes at a million requests) is left to it."""

MAX_FAILED_REFRESH_GAP_S = 300.0
"""Longest pause before retrying after refreshes that failed (they back off, doubling)."""

MIN_REFRESH_GAP_S = 0.25
"""While ingest is not behind, refreshes start ``refresh_interval_s`` apart, and one that ran
longer than that is followed after this pause only: the rows that arrived during it wait for one
refresh, not for a refresh and an interval (the lag of always-on verdicts)."""


PARTITIONING_KEYS: Final = ("partition_s", "max_request_s", "lateness_s", "window_partitions")
"""The store settings a new store may be given (``stg_partitioning``, docs/architecture.md)."""

DEFAULT_PARTITIONING: Final[Mapping[str, float]] = {
    "partition_s": 60.0, "lateness_s": 30.0, "max_request_s": 600.0}
"""The settings a new store records for the keys it is not given. A slice recomputes whole
partitions from the one holding its earliest new span, so the width sets how much traffic each
refresh reads and how far the verdicts lag (docs/performance.md, "Always-on soak"). A store
that recorded no settings keeps ``stg_partitioning``'s fallbacks (300 s, a window of 2)."""

WINDOW_HISTORY_S: Final = 600.0
"""How much traffic a new store's windowed summaries (clock offsets, fits, fleet medians) learn
from at least, when ``window_partitions`` is not given: that many partitions' worth (10 of
60 s)."""


def _set_partitioning(con: duckdb.DuckDBPyConnection, wanted: dict[str, float], path: Path) -> None:
    """Write ``wanted`` into ``routeaudit_meta`` of a store without spans; on a store with spans,
    check it against the settings the store's relations were built with (stg_partitioning,
    whose defaults apply to unset keys)."""
    unknown = sorted(set(wanted) - set(PARTITIONING_KEYS))
    if unknown:
        raise StoreError(f"unknown partitioning setting(s) {', '.join(unknown)} "
                         f"(known: {', '.join(PARTITIONING_KEYS)})")
    for key, value in wanted.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise StoreError(f"{key} must be a number > 0, got {value!r}")
    windows = wanted.get("window_partitions")
    if windows is not None and windows != int(windows):
        raise StoreError(f"window_partitions must be a whole number, got {windows!r}")
    spans = int(con.execute("select count(*) from raw_spans").fetchall()[0][0])
    if spans == 0 and not _closed.folder(path).exists():
        recorded = {str(k): float(v) for k, v in con.execute(
            "select key, value from routeaudit_meta where key in "
            f"({', '.join(repr(k) for k in PARTITIONING_KEYS)})").fetchall()}
        # what an empty store recorded before stays, unless asked otherwise; the rest defaults
        fill = {k: v for k, v in DEFAULT_PARTITIONING.items() if k not in recorded}
        if "window_partitions" not in recorded:
            width = wanted.get("partition_s", recorded.get("partition_s",
                                                           DEFAULT_PARTITIONING["partition_s"]))
            fill["window_partitions"] = max(1, math.ceil(WINDOW_HISTORY_S / width - 1e-9))
        wanted = {**fill, **wanted}
        if not wanted:
            return
        con.executemany("insert or replace into routeaudit_meta values (?, ?)",
                        [[k, str(int(v) if k == "window_partitions" else float(v))]
                         for k, v in wanted.items()])
        # relations built over no rows under other settings: rebuilt under these
        con.execute("delete from routeaudit_meta where key = 'relations_version'")
        return
    built = con.execute(
        "select count(*) from information_schema.tables "
        "where table_catalog = current_database() and table_name = 'stg_partitioning'").fetchall()[0][0]
    current: dict[str, float] = {}
    if built:  # the settings in force, defaults included
        row = con.execute(f"select {', '.join(PARTITIONING_KEYS)} from stg_partitioning").fetchall()
        current = {k: float(v) for k, v in zip(PARTITIONING_KEYS, row[0], strict=True)} if row else {}
    if not current:  # relations not built yet: what the store was given
        stored = dict(con.execute("select key, value from routeaudit_meta").fetchall())
        current = {k: float(stored[k]) for k in PARTITIONING_KEYS if k in stored}
    differ = [f"{k} {current[k]:g} (asked {float(v):g})" for k, v in wanted.items()
              if k in current and float(v) != current[k]]
    if differ:
        raise StoreError(f"{path} holds spans partitioned with {', '.join(differ)}: a store keeps "
                         "the partitioning it was created with (start a new store to change it)")


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(path)}{SIDECAR_SUFFIX}")


class Store:
    """Read-write handle on a store file. Only one process may hold it (the collector).

    Writes come from one thread at a time (the collector's writer); :meth:`query_arrow` may be
    called from any thread: each call runs on its own cursor and sees committed data.

    The relations are materialised (see :mod:`audit._relations`): :meth:`refresh` rebuilds them.
    A query refreshes first when rows were appended since the last refresh and the last refresh
    is older than ``refresh_interval_s`` (0: always up to date; the collector uses a few seconds
    and also refreshes in the background). :meth:`close` refreshes what is pending.

    ``refresh_max_share`` paces refreshes that are not quick: after one that took ``d`` seconds,
    the next is due no sooner than ``d * (1 - share) / share`` seconds later (see
    :attr:`refresh_gap_s`), so rebuilding a large store takes at most that share of the time
    from ingest. 1 (the default) means no pacing. ``ingest_pressed``, when set, says whether
    ingest needs that time now (the collector: its writer's queue is not near empty); while it
    says no, refreshes start ``refresh_interval_s`` apart (or :data:`MIN_REFRESH_GAP_S` after
    one that took longer): pacing a refresh that takes nothing from a waiting append only makes
    the verdicts older.

    ``background_refresh``: another thread calls :meth:`refresh_if_due` (the collector does), so
    a query refreshes first only when the last refresh took at most
    :data:`QUERY_REFRESH_BUDGET_S`, and then ``refresh_interval_s`` after it (unpaced: a reader
    is waiting); it never waits minutes for a large store's rebuild, it reads the relations as
    last built and the paced background thread rebuilds them.

    ``query_limits``: the time, row and byte bounds of :meth:`query_arrow` (a caller may pass
    its own per query).

    ``threads``: DuckDB's worker threads for this store (None: DuckDB's default, one per core).
    A rebuild with every core takes them from the appends beside it; with fewer it runs longer
    but ingest keeps the rest (the collector's ``store_threads``, every core by default).

    ``partitioning``: settings of a new store's partitions (:data:`PARTITIONING_KEYS`:
    ``partition_s``, ``max_request_s``, ``lateness_s``, ``window_partitions``), written to
    ``routeaudit_meta`` while the store holds no spans, with :data:`DEFAULT_PARTITIONING` (and a
    window of :data:`WINDOW_HISTORY_S`) for the keys it recorded no value of and is not given; a
    store that holds spans keeps the settings it was created with, and asking for others is a
    :class:`StoreError`.

    ``clock``: monotonic seconds, when refreshes ended and are due (default
    :func:`time.monotonic`); tests pass one they step. A refresh's own duration is always
    measured on the real clock.
    """

    def __init__(self, path: str | os.PathLike[str], *, refresh_interval_s: float = 0.0,
                 refresh_max_share: float = 1.0, background_refresh: bool = False,
                 memory_limit: str | None = None, threads: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 query_limits: QueryLimits = DEFAULT_LIMITS,
                 incremental: bool | None = None,
                 partitioning: Mapping[str, float] | None = None) -> None:
        if not 0 < refresh_max_share <= 1:
            raise StoreError(f"refresh_max_share must be in (0, 1], got {refresh_max_share!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise StoreError(f"threads must be a whole number >= 1, got {threads!r}")
        self.path = Path(path)
        self._closes = os.fspath(path) not in ("", ":memory:")
        """Whether old partitions move to Parquet beside the file (a file store that refreshes
        by slices; audit._closed)."""
        if self.path.parent and not self.path.parent.exists():
            raise StoreError(f"folder {self.path.parent} does not exist")
        # a new file store starts as a copy of the empty store this process built for the same
        # code and settings (never written over a file that exists)
        copied = (self._closes and not _empty_store.building() and not self.path.exists()
                  and not Path(f"{os.fspath(self.path)}.wal").exists()
                  and _empty_store.copy_to(self.path, _empty_store.key(partitioning),
                                           lambda at: Store(at, partitioning=partitioning).close()))
        try:
            self._con = duckdb.connect(os.fspath(self.path))
        except duckdb.IOException as exc:
            raise StoreError(_lock_message(self.path, exc)) from exc
        except duckdb.Error as exc:
            raise StoreError(f"{self.path} is not a DuckDB store: {_one_line(exc)}") from exc
        self.refresh_interval_s = refresh_interval_s
        self.refresh_max_share = refresh_max_share
        self.background_refresh = background_refresh
        self.last_refresh_error: str | None = None
        """Why the last refresh failed (one line); None once one succeeds."""
        self.closed_until_ns: int | None = None
        """Rows before this (event time, Unix ns) are in closed partitions, in Parquet beside
        the file (after the last refresh; None: none is)."""
        self.last_close_error: str | None = None
        """Why the last move of partitions to Parquet failed (one line); None once one works."""
        self.last_close_s: float | None = None
        """Seconds the last move of partitions to Parquet took, part of its refresh's
        :attr:`last_refresh_s` (None: none has moved any yet)."""
        self.last_checkpoint_s: float | None = None
        """Seconds the last checkpoint after a slice took (:data:`SLICED_CHECKPOINT_BYTES`), part
        of its refresh's :attr:`last_refresh_s` (None: none has run yet)."""
        self.last_runs_s: float | None = None
        """Seconds the last recompute of per-run rows took (None: none has run yet)."""
        self.last_runs_error: str | None = None
        """Why the last recompute of per-run rows failed (one line); None once one works."""
        self._runs_ended = -math.inf
        self._refresh_failures = 0
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._closed = False
        self._stopping = False
        self._refresh_stop = QueryCancel()
        self.query_limits = query_limits
        self.incremental = incremental
        """Refresh by slices of event time (True), by full rebuilds (False), or by slices from
        :data:`INCREMENTAL_MIN_SPANS` spans on (None)."""
        self._full_rebuild_due = False
        self.last_refresh_kind = "none"
        """How the last refresh ran: ``full``, ``slice``, ``none`` (nothing new)."""
        self.final_until_ns: int | None = None
        """Verdicts of requests anchored before this are final (after the last refresh)."""
        self.newest_request_ns: int | None = None
        """The newest request's anchor in the relations (after the last refresh)."""
        self._pool: list[tuple[int, duckdb.DuckDBPyConnection]] = []
        self._pool_lock = threading.Lock()
        self._closed_generation = 0
        self._active: set[QueryCancel] = set()
        self._active_cond = threading.Condition()
        self._dirty = False
        self._clock = clock
        self._last_refresh = 0.0
        self.last_refresh_s = 0.0
        self.ingest_pressed: Callable[[], bool] | None = None
        """Whether ingest is behind now (see the class docstring); None: always paced."""
        _tune(self._con)
        if threads is not None:
            self._con.execute(f"set threads = {int(threads)}")
        if memory_limit is not None:
            # DuckDB's own default is 80 % of the machine; a collector sharing a host needs less.
            try:
                self._con.execute("set memory_limit = ?", [memory_limit])
            except duckdb.Error as exc:
                self._con.close()
                raise StoreError(f"bad memory limit {memory_limit!r}: {_one_line(exc)}") from exc
        for table in RAW_TABLES:
            self._con.execute(raw_ddl(table))
        _add_missing_raw_columns(self._con, self.path if self._closes else None)
        _span_keys.ensure(self._con)
        self._events_keyed = has_primary_key(self._con, "raw_span_events")
        self._con.execute(
            "create table if not exists routeaudit_meta (key varchar primary key, value varchar)"
        )
        marks_kept = bool(self._con.execute(
            "select count(*) from information_schema.tables where table_catalog = current_database() "
            "and table_name = ?", [_incremental.DIRTY_TABLE]).fetchall()[0][0])
        self._con.execute(_incremental.DIRTY_DDL)
        self._con.execute(_incremental.RUNS_DUE_DDL)
        self.runs_pending = int(self._con.execute(
            f"select count(*) from {_incremental.RUNS_DUE_TABLE}").fetchall()[0][0])
        """Runs whose per-run rows (``slo_summary``, ``calibration``) wait for a recompute."""
        self._spans_stored = int(self._con.execute("select count(*) from raw_spans").fetchall()[0][0])
        counted = self._con.execute(
            "select try_cast(value as bigint) from routeaudit_meta where key = 'relations_spans'"
        ).fetchall()
        self._spans_in_relations: int | None = counted[0][0] if counted else None
        if self._spans_in_relations is not None and self._spans_in_relations > self._spans_stored:
            # Spans were deleted since the relations were built (retention, docs/operations.md):
            # they still show them, and the counts no longer say how far behind they are.
            self._spans_in_relations = None
            self._dirty = True
        elif self._spans_in_relations is None or self._spans_in_relations < self._spans_stored:
            # A writer stopped before its relations caught up (a prompt stop): this one rebuilds,
            # by slices when the stopped writer kept marks of what it appended.
            self._dirty = True
            self._full_rebuild_due = not marks_kept
        if copied:
            _record_refresh(self._con, 0)  # the copy's relations are this store's from now
        else:  # a store without spans records its settings (given, else the defaults)
            try:
                _set_partitioning(self._con, dict(partitioning or {}), self.path)
            except StoreError:
                self._con.close()  # the file's lock goes with the refusal
                raise
        if self._closes:
            _closed.allow(self._con, self.path)
        if not _views_current(self._con):
            # Relations are rebuilt when the SQL changed since this store was last refreshed:
            # all of them, as a slice would read stored rows of the old relations' columns.
            self._full_rebuild_due = True
            self.refresh()
            self._con.execute("checkpoint")
        try:
            self.final_until_ns, self.newest_request_ns = _incremental.horizon(self._con)
            self.closed_until_ns = _closed.closed_until_ns(self._con)
        except duckdb.Error:  # relations of an older version, rebuilt at the next refresh
            pass
        # From here on no query on this database may read or write files other than the store
        # and its closed partitions (allowed above).
        self._con.execute("set enable_external_access = false")
        self._con.execute("set lock_configuration = true")

    @property
    def relations_lag_spans(self) -> int | None:
        """Spans stored that the relations do not hold yet (stored since the rebuild that built
        them began); None when the store cannot tell: relations built by a version that did
        not count, or spans deleted since (retention) until the next rebuild."""
        if self._spans_in_relations is None:
            return None
        # a rebuild may read a commit a moment before append() counts it
        return max(0, self._spans_stored - self._spans_in_relations)

    @property
    def dirty(self) -> bool:
        """Whether rows were appended since the relations were last rebuilt."""
        return self._dirty

    def refresh(self, *, paced: bool = False) -> float:
        """Rebuild the materialised relations from the raw tables; return seconds taken.
        ``paced``: the per-run rows wait while :data:`RUNS_MAX_SHARE` says so."""
        with self._refresh_lock:
            started = time.perf_counter()
            self._dirty = False
            cur = self._con.cursor()
            stop = self._refresh_stop = QueryCancel()
            try:
                if self._stopping:
                    raise StoreError("the store is stopping: refresh skipped")
                stop._bind(cur)
                spans: int | None
                closes = self._closes and self._slices_apply()
                if self._slices_apply():
                    back = _closed.Moved()
                    spans = _incremental.refresh(
                        cur, before_commit=_record_refresh,
                        store_path=self.path if self._closes else None, reopened=back)
                    self._count_moved(back.spans)
                    if back.partitions:
                        self._partitions_moved()
                    self.last_refresh_kind = "none" if spans is None else "slice"
                    if spans is not None:
                        self._cache_once_large()
                else:
                    if self._closes:
                        # a full rebuild reads every partition: the closed ones come back first
                        self._count_moved(_closed.reopen_all(cur, self.path).spans)
                    self._partitions_moved()  # every table rebuilt: columns may have changed
                    spans = _relations.refresh(cur, before_commit=_record_refresh)
                    self.last_refresh_kind = "full"
                    self._full_rebuild_due = False
                    # every run's rows were rebuilt
                    cur.execute(f"delete from {_incremental.RUNS_DUE_TABLE}")
                self.runs_pending = int(cur.execute(
                    f"select count(*) from {_incremental.RUNS_DUE_TABLE}").fetchall()[0][0])
                # the horizon first: a reader that sees the relations caught up (the spans
                # count) sees their newest request too
                self.final_until_ns, self.newest_request_ns = _incremental.horizon(cur)
                if spans is not None:
                    self._spans_in_relations = spans
                if closes:
                    try:
                        close_started = time.perf_counter()
                        moved = _closed.close(cur, self.path, self.final_until_ns)
                        self._count_moved(-moved.spans)
                        if moved.partitions:
                            self.last_close_s = time.perf_counter() - close_started
                            self._partitions_moved()
                        self.last_close_error = None
                    except (duckdb.Error, OSError) as exc:
                        # the refresh stands; the partitions stay open and close next time
                        self.last_close_error = _one_line(exc) or type(exc).__name__
                if self._closes:
                    # a full rebuild or a late row may have re-opened partitions
                    self.closed_until_ns = _closed.closed_until_ns(cur)
                if self._runs_due(paced):
                    self._refresh_runs(cur)
                if self.last_refresh_kind == "slice":
                    self._checkpoint_if_large(cur)
            except BaseException as exc:
                self._dirty = True
                if self.last_refresh_kind != "full":
                    # whatever broke the slice, a full rebuild is the path every test holds
                    self._full_rebuild_due = True
                # The next attempt waits longer (see refresh_gap_s): under load a refresh can run
                # out of memory, and retrying at once would take that memory from the commits
                # again and again.
                self._refresh_failures += 1
                self.last_refresh_error = _one_line(exc) or type(exc).__name__
                raise
            else:
                self._refresh_failures = 0
                self.last_refresh_error = None
            finally:
                stop._unbind()
                cur.close()
                # a failed attempt's cost counts for pacing as a refresh's does
                self._last_refresh = self._clock()
                self.last_refresh_s = time.perf_counter() - started
            return self.last_refresh_s

    def _runs_due(self, paced: bool) -> bool:
        if not self.runs_pending:
            return False
        if not paced or self.last_runs_s is None or self.last_runs_s <= SYNC_REFRESH_BUDGET_S:
            return True
        share = RUNS_MAX_SHARE
        return self._clock() - self._runs_ended >= self.last_runs_s * (1 - share) / share

    def _refresh_runs(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Recompute the marked runs' rows; a failure leaves the marks for the next refresh
        (the verdicts committed before stand)."""
        started = time.perf_counter()
        try:
            _incremental.refresh_runs(cur, store_path=self.path if self._closes else None)
        except duckdb.Error as exc:
            self.last_runs_error = _one_line(exc) or type(exc).__name__
        else:
            self.last_runs_error = None
            self.runs_pending = 0
        finally:
            self.last_runs_s = time.perf_counter() - started
            self._runs_ended = self._clock()

    def _refresh_runs_now(self) -> None:
        """:meth:`_refresh_runs` outside a refresh (no new rows to slice)."""
        with self._refresh_lock:
            cur = self._con.cursor()
            try:
                self._refresh_runs(cur)
            finally:
                cur.close()

    def _checkpoint_if_large(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Checkpoint once the WAL holds :data:`SLICED_CHECKPOINT_BYTES`, between slices."""
        try:
            wal = os.stat(f"{self.path}.wal").st_size
        except OSError:  # no WAL: nothing committed since the last checkpoint
            return
        if wal < SLICED_CHECKPOINT_BYTES:
            return
        started = time.perf_counter()
        try:
            cur.execute("checkpoint")
        except duckdb.Error:
            # the slice stands; DuckDB still checkpoints at CHECKPOINT_THRESHOLD
            return
        self.last_checkpoint_s = time.perf_counter() - started

    def _cache_once_large(self) -> None:
        """Materialise the relations at the defaults (``_relations.add_cached``) once a store
        refreshed by slices reaches :data:`SLICED_CACHE_MIN_SPANS`: it was small at its last
        full rebuild, and slices only maintain the tables that exist, so the dashboard would
        otherwise compute every verdict live, over the whole history for per-run figures."""
        if self._spans_stored < SLICED_CACHE_MIN_SPANS and self.closed_until_ns is None:
            return
        cur = self._con.cursor()
        try:
            if _relations.has_cached(cur):
                return
            if self._closes:
                _closed.install_views(cur, self.path)  # the closed partitions' rows too
            _relations.add_cached(cur)
        finally:
            cur.close()

    def _count_moved(self, spans: int) -> None:
        """Spans moved into (positive) or out of (negative) the DuckDB tables by a re-open or a
        close of partitions: both counts of :attr:`relations_lag_spans` follow, as the
        relations had read them."""
        if not spans:
            return
        with self._lock:
            self._spans_stored += spans
        if self._spans_in_relations is not None and spans < 0:
            self._spans_in_relations = max(0, self._spans_in_relations + spans)

    def raw_retention_needed_s(self) -> float:
        """How long raw rows must be kept behind the newest span for every span of a request to
        be analysed (:func:`audit._incremental.raw_retention_needed_ns`, from this store's
        partitioning): :meth:`retain` with a shorter ``raw_s`` leaves the late spans of older
        requests stored but not analysed."""
        cur = self._con.cursor()
        try:
            return _incremental.raw_retention_needed_ns(_incremental.Partitioning.read(cur)) / 1e9
        finally:
            cur.close()

    def retain(self, *, raw_s: float | None = None, verdicts_s: float | None = None) -> _incremental.Retained:
        """Delete whole partitions of raw rows older than ``raw_s`` seconds and of derived rows
        older than ``verdicts_s`` seconds before the newest span (None keeps them), online: see
        :func:`audit._incremental.drop_before`. A refresh never recomputes time whose raw rows
        are gone; derived rows kept longer than raw ones stay as they were last computed.
        Returns the cuts and what went: raw spans and requests, in the DuckDB file and in the
        closed partitions' folders alike."""
        for name, value in (("raw_s", raw_s), ("verdicts_s", verdicts_s)):
            if value is not None and not value > 0:
                raise StoreError(f"{name} must be a number of seconds > 0, got {value!r}")
        with self._refresh_lock:
            cur = self._con.cursor()
            # the closed rows had left the DuckDB counts at their close: only the figures
            # returned (the collector's retention counters) take them in
            closed_spans = closed_requests = 0
            try:
                done = _incremental.drop_before(
                    cur, raw_keep_ns=None if raw_s is None else int(raw_s * 1e9),
                    verdicts_keep_ns=None if verdicts_s is None else int(verdicts_s * 1e9))
                if self._closes:
                    w = _incremental.Partitioning.read(cur).partition_ns
                    dropped = _closed.drop_before(
                        self.path,
                        raw_before_part=None if done.raw_from_ns is None else done.raw_from_ns // w,
                        derived_before_part=None if done.verdicts_from_ns is None
                        else done.verdicts_from_ns // w)
                    if dropped.folders:
                        self._partitions_moved()
                    closed_spans, closed_requests = dropped.spans, dropped.requests
            finally:
                cur.close()
            if done.spans_deleted:
                with self._lock:
                    self._spans_stored -= done.spans_deleted
                if self._spans_in_relations is not None:
                    # the deleted spans had been read by the relations (the store's count too)
                    self._spans_in_relations = max(0, self._spans_in_relations - done.spans_deleted)
            return dataclasses.replace(done, spans_deleted=done.spans_deleted + closed_spans,
                                       requests_deleted=done.requests_deleted + closed_requests)

    def _slices_apply(self) -> bool:
        """Whether this refresh can recompute slices: relations of this version already built
        from this process's view of the store, and slices chosen (or the store large enough)."""
        if self._full_rebuild_due or self._spans_in_relations is None:
            return False
        if self.incremental is None:
            # Closed partitions are no longer counted in the DuckDB tables, yet the store is as
            # large as before: a full rebuild would re-open every one of them.
            return self._spans_stored >= INCREMENTAL_MIN_SPANS or self.closed_until_ns is not None
        return self.incremental

    @property
    def rebuild_is_slow(self) -> bool:
        """Whether the last rebuild took longer than a query waits for one
        (:data:`QUERY_REFRESH_BUDGET_S`): a large store, whose readers read the relations as
        last built."""
        return self.last_refresh_s > QUERY_REFRESH_BUDGET_S

    @property
    def refresh_gap_s(self) -> float:
        """Seconds from the end of the last refresh until the next is due: ``refresh_interval_s``,
        or longer after a slow refresh so that refreshing stays within ``refresh_max_share``.
        While :attr:`ingest_pressed` (when set) says ingest is not behind, nothing is paced:
        refreshes start ``refresh_interval_s`` apart, or :data:`MIN_REFRESH_GAP_S` after one
        that took longer."""
        pressed = self.ingest_pressed
        if pressed is not None and not pressed():
            gap = max(self.refresh_interval_s - self.last_refresh_s, MIN_REFRESH_GAP_S)
        else:
            share = self.refresh_max_share
            gap = max(self.refresh_interval_s, self.last_refresh_s * (1 - share) / share)
        if self._refresh_failures:  # back off: 2, 4, 8… × the interval (at least 1 s)
            backoff = max(self.refresh_interval_s, 1.0) * 2 ** min(self._refresh_failures, 16)
            gap = max(gap, min(backoff, MAX_FAILED_REFRESH_GAP_S))
        return gap

    def refresh_if_due(self, *, for_query: bool = False) -> bool:
        """Refresh when rows arrived since the last refresh, and either the last refresh ended
        :attr:`refresh_gap_s` ago or it was quick (under :data:`SYNC_REFRESH_BUDGET_S`): small
        stores are always current, large ones at most about one gap plus one refresh behind.
        After a failed refresh only the gap counts (:attr:`last_refresh_error` says why).
        ``for_query`` with :attr:`background_refresh`: the rule in the class docstring."""
        if not self._dirty:
            if self.runs_pending and not self._stopping and self._runs_due(True):
                self._refresh_runs_now()
            return False
        elapsed = self._clock() - self._last_refresh
        quick = self.last_refresh_s <= SYNC_REFRESH_BUDGET_S and not self._refresh_failures
        if for_query and self.background_refresh:
            due = quick or (not self._refresh_failures and elapsed >= self.refresh_interval_s
                            and self.last_refresh_s <= QUERY_REFRESH_BUDGET_S)
        else:
            due = quick or elapsed >= self.refresh_gap_s
        if due:
            self.refresh(paced=True)
            return True
        return False

    def append(self, spans: pa.Table | None = None, events: pa.Table | None = None,
               snapshots: pa.Table | None = None) -> int:
        """Insert in one transaction and commit; return the number of new spans.

        Spans already stored (same trace_id, span_id) and their events are ignored, so a retried
        export is stored once. Events are deduplicated with their spans (``raw_span_events`` has
        no key): pass a span's events in the call that passes the span, as the decoders give
        them; events passed without their span are stored where the table lacks them, and again
        if the span later arrives with them (a call whose spans are all new inserts their events
        unchecked). When this returns, the rows survive a crash (WAL synced on commit).
        """
        spans, events, snapshots = (as_inserted(t) for t in (spans, events, snapshots))
        with self._lock:
            con = self._con
            con.execute("begin transaction")
            try:
                new = 0
                if spans is not None and spans.num_rows:
                    con.register("_ra_spans", spans)
                    new = _span_keys.insert_new_spans(con, "_ra_spans", rows=spans.num_rows)
                    if new:
                        # what the next incremental refresh must reach back to
                        con.execute(f"insert into {_incremental.DIRTY_TABLE} "
                                    "select trace_id, min(start_ns) from _ra_spans group by trace_id")
                    con.unregister("_ra_spans")
                if events is not None and events.num_rows:
                    con.register("_ra_events", events)
                    con.execute(self._events_insert(spans, new))
                    con.unregister("_ra_events")
                if snapshots is not None and snapshots.num_rows:
                    con.register("_ra_snaps", snapshots)
                    con.execute("insert into raw_snapshots by name select * from _ra_snaps")
                    con.execute(f"insert into {_incremental.DIRTY_TABLE} "
                                "select null, min(scraped_ns) from _ra_snaps")
                    con.unregister("_ra_snaps")
                con.execute("commit")
            except BaseException:
                con.execute("rollback")
                raise
            self._spans_stored += int(new)
            if new or (events is not None and events.num_rows) or (
                    snapshots is not None and snapshots.num_rows):
                self._dirty = True
            return int(new)

    def _events_insert(self, spans: pa.Table | None, new: int) -> str:
        """The statement storing ``_ra_events``. When every span of the call was new, so are
        their events (the usual case: a plain insert; an exact check cost ingest 7-10 %, A/B);
        otherwise (a retried export, a spool replay, events alone) only the events the table
        lacks are inserted, once each."""
        if self._events_keyed:  # a store created with the events' primary key keeps it
            return "insert or ignore into raw_span_events by name select * from _ra_events"
        if spans is not None and spans.num_rows and new == spans.num_rows:
            return "insert into raw_span_events by name select * from _ra_events"
        return ("insert into raw_span_events by name "
                "select distinct on (e.trace_id, e.span_id, e.event_index) e.* "
                "from _ra_events as e anti join raw_span_events as s "
                "using (trace_id, span_id, event_index)")

    def query_arrow(self, sql: str, params: Sequence[Any] | None = None,
                    variables: Mapping[str, float | str] | None = None, *,
                    limits: QueryLimits | None = None, cancel: QueryCancel | None = None) -> pa.Table:
        """Run a read-only query on a fresh cursor (thread-safe).

        ``variables`` are DuckDB session variables the relations read (the SLO targets).
        The query runs in a transaction that is always rolled back, within ``limits`` (default
        :attr:`query_limits`); ``cancel`` stops it from another thread, and :meth:`close` stops
        every query still running.
        """
        check_read_only(sql)
        cancel = cancel or QueryCancel()
        with self._active_cond:
            if self._closed:
                raise StoreError("the store is closed")
            self._active.add(cancel)
        try:
            cur, generation = self._reader()
            done = False
            try:
                if self._dirty and _reads_relations(cur, sql):
                    self.refresh_if_due(for_query=True)
                    if generation != self._closed_generation:
                        cur.close()
                        cur, generation = self._reader()
                out = run_read_only(cur, sql, params, variables, limits=limits or self.query_limits,
                                    cancel=cancel, rollback=True, checked=True)
                done = True
                return out
            finally:
                self._give_back(cur, generation, reuse=done)
        finally:
            with self._active_cond:
                self._active.discard(cancel)
                self._active_cond.notify_all()

    def _reader(self) -> tuple[duckdb.DuckDBPyConnection, int]:
        """A cursor for one read query, with the views over the closed partitions: one left by
        an earlier query if the closed partitions have not changed since (making the views
        takes a few milliseconds per table), else a new one."""
        with self._pool_lock:
            while self._pool:
                generation, cur = self._pool.pop()
                if generation == self._closed_generation:
                    return cur, generation
                cur.close()
            generation = self._closed_generation
        cur = self._con.cursor()
        if self._closes:
            _closed.install_views(cur, self.path)
        return cur, generation

    def _give_back(self, cur: duckdb.DuckDBPyConnection, generation: int, *, reuse: bool) -> None:
        """Keep a cursor whose query ended well for the next query, without the session
        variables it set (the SLO a later query does not choose must not carry over)."""
        if reuse and generation == self._closed_generation:
            try:
                for (name,) in cur.execute("select name from duckdb_variables()").fetchall():
                    cur.execute(f'reset variable "{name}"')
            except duckdb.Error:
                reuse = False
            else:
                with self._pool_lock:
                    if len(self._pool) < READER_POOL and not self._closed:
                        self._pool.append((generation, cur))
                        return
        cur.close()

    def _partitions_moved(self) -> None:
        """Closed partitions changed (closed, re-opened, deleted): the views of the pooled
        cursors no longer match them."""
        with self._pool_lock:
            self._closed_generation += 1
            pool, self._pool = self._pool, []
        for _, cur in pool:
            cur.close()

    def stop_work(self) -> None:
        """Stop what would hold a prompt shutdown: interrupt a running rebuild of the relations
        (it rolls back; the relations stay as last built, and the counts say how far behind they
        are) and every running read query. Appends are not touched. Later refreshes are skipped."""
        self._stopping = True
        self._refresh_stop.cancel("the store is stopping")
        self.cancel_queries("the collector is stopping")

    def cancel_queries(self, reason: str = "the store is closing", wait_s: float = 10.0) -> int:
        """Stop every read query running on this store and wait (at most ``wait_s``) until they
        have ended; returns how many were stopped."""
        with self._active_cond:
            running = list(self._active)
        for c in running:
            c.cancel(reason)
        with self._active_cond:
            self._active_cond.wait_for(lambda: not self._active, timeout=wait_s)
        return len(running)

    def checkpoint(self) -> None:
        with self._lock:
            self._con.execute("checkpoint")

    def close(self) -> None:
        """Refresh what is pending, checkpoint and close; safe to call twice. A failing refresh
        still closes the store (its error is raised afterwards)."""
        if self._closed:
            return
        # A running ad-hoc query would hold the close (and its checkpoint) for as long as it runs.
        self.cancel_queries()
        try:
            if self._dirty and not self._stopping:
                self.refresh()
            elif self.runs_pending and not self._stopping:
                self._refresh_runs_now()
        finally:
            with self._lock:
                if not self._closed:
                    self._closed = True
                    try:
                        self._con.execute("checkpoint")
                    finally:
                        self._con.close()


def without_null_columns(table: pa.Table | None) -> pa.Table | None:
    """``table`` without the columns that hold only nulls.

    The inserts go ``by name``, so a column left out is stored as null all the same, and DuckDB
    then need not convert and append a null Arrow array per column: a fleet fills the typed
    columns of the names its own router and engine emit and leaves the others null (28 of 90 in
    the testbed's batches), and leaving them out made ``Store.append`` about 11 % cheaper per
    span (docs/performance.md, "Why ingest costs what it does").
    """
    if table is None or not table.num_rows:
        return table
    n = table.num_rows
    keep = [i for i, col in enumerate(table.columns) if col.null_count < n]
    return table if len(keep) in (0, table.num_columns) else table.select(keep)


def as_inserted(table: pa.Table | None) -> pa.Table | None:
    """``table`` in the shape :meth:`Store.append` inserts: without its all-null columns, in one
    chunk. DuckDB scans an Arrow table chunk by chunk in parallel, and for an insert that
    parallelism bought no time on two cores but cost 11 % more CPU per span (coordinating the
    threads' row groups), CPU the decoders needed (docs/performance.md)."""
    narrow = without_null_columns(table)
    return None if narrow is None else narrow.combine_chunks()


def _add_missing_raw_columns(con: duckdb.DuckDBPyConnection,
                             store_path: str | os.PathLike[str] | None = None) -> None:
    """Bring a store written by an older version up to the raw DDL: add the typed columns it
    lacks and fill them from the verbatim attribute JSON, so old rows read like new ones.
    Closed partitions (``store_path``'s Parquet) move back into DuckDB first, as their files
    lack the new columns; they close again after the next refresh."""
    sources = {
        "raw_spans": [("attributes", semconv.TYPED_SPAN_ATTRIBUTES),
                      ("resource_attributes", semconv.TYPED_RESOURCE_ATTRIBUTES)],
        "raw_span_events": [("attributes", semconv.TYPED_EVENT_ATTRIBUTES)],
    }
    schemas = {"raw_spans": RAW_SPANS_SCHEMA, "raw_span_events": RAW_SPAN_EVENTS_SCHEMA,
               "raw_snapshots": RAW_SNAPSHOTS_SCHEMA}
    for table in RAW_TABLES:
        have = {row[0] for row in con.execute(
            "select column_name from information_schema.columns "
            "where table_schema = 'main' and table_name = ?", [table]).fetchall()}
        con.register("_ra_ddl", schemas[table].empty_table())
        try:
            wanted = con.execute("describe select * from _ra_ddl").fetchall()
        finally:
            con.unregister("_ra_ddl")
        missing = {name: typ for name, typ, *_ in wanted if name not in have}
        if not missing:
            continue
        if store_path is not None and _closed.closed_until(con) is not None:
            _closed.reopen_all(con, store_path)
        fills, params = [], []
        for json_col, registry in sources.get(table, []):
            for key, (col, typ) in registry.items():
                if col in missing:
                    extract = "json_extract" if typ.endswith("[]") else "json_extract_string"
                    fills.append(f'"{col}" = try_cast({extract}({json_col}, ?) as {typ})')
                    params.append('$."' + key.replace('"', '\\"') + '"')
        con.execute("begin transaction")
        try:
            for name, typ in missing.items():
                con.execute(f'alter table {table} add column "{name}" {typ}')
            if fills:
                con.execute(f"update {table} set {', '.join(fills)}", params)
            con.execute("commit")
        except BaseException:
            con.execute("rollback")
            raise


READER_POOL: Final = 4
"""Cursors kept between read queries (with their views over the closed partitions)."""

INCREMENTAL_MIN_SPANS: Final = 20_000
"""Stores with at least this many spans refresh by slices of event time (audit/_incremental.py)
unless the store says otherwise; below it (about 4,000 requests) a full rebuild takes about a
second, and from it on a slice costs less than a full rebuild."""

SLICED_CACHE_MIN_SPANS: Final = 20_000
"""A store refreshed by slices gets the relations at the defaults as tables from this many spans
on (a full rebuild only from :data:`~audit._relations.CACHE_MIN_SPANS`). Slices keep them at a
cost per slice that does not depend on when they were made, while making them costs what the
store holds: about 3 s at 100,000 spans (the soak's store), a pause in the middle of the traffic
that a collector's verdicts lag by, and a fifth of that at the switch to slices."""

CHECKPOINT_THRESHOLD: Final = "1GB"
"""WAL size that makes DuckDB checkpoint (its default is 16 MB). A checkpoint rewrites the
table's last, partly filled row group and compresses what it folds in, so the fewer checkpoints
the less ingest pays: 16 MB → 256 MB gave ``Store.append`` ×2.2, 256 MB → 1 GB ingest end to end +19 %
(docs/performance.md). Commits stay durable: the WAL is synced on every commit and replayed on
open (1.0 s for a 339 MB WAL, measured)."""

SLICED_CHECKPOINT_BYTES: Final = 256 * 2**20
"""WAL size from which a refresh by slices ends with a checkpoint. Each slice rewrites the rows of
the time it recomputes (30-70 MB of WAL per slice of a 60 s partition at 50 requests/s), so a
collector refreshing by slices reached :data:`CHECKPOINT_THRESHOLD` every one to three minutes,
and the commit that crossed it ran a checkpoint of 4-6 s: verdicts lagged by that much more
each time. At this size a checkpoint takes about a second and comes every few slices; bulk
ingest without slices keeps the larger threshold."""

RUNS_MAX_SHARE: Final = 0.1
"""A refresh the collector paces (:meth:`Store.refresh_if_due`) recomputes the per-run rows the
slices marked (audit._incremental.refresh_runs) only when the last such recompute took at most
:data:`SYNC_REFRESH_BUDGET_S` or at most this share of the time since it ended: a run without
end (a fleet without run ids) merges its whole history, which must not hold every slice's
verdicts back as the history grows. An explicit :meth:`Store.refresh` always recomputes them."""


def _record_refresh(con: duckdb.DuckDBPyConnection, spans: int) -> None:
    """The store's record of a rebuild, in its transaction: the SQL version it built (so a newer
    routeaudit rebuilds), when, and the spans it read (audit.queries.relations_freshness)."""
    con.execute(
        "insert or replace into routeaudit_meta values ('relations_version', ?), "
        "('refreshed_ns', ?), ('relations_spans', ?)",
        [_relations.relations_version(), str(time.time_ns()), str(spans)],
    )
    # a rebuild read every row the marks point at (those of later commits stay)
    con.execute(f"delete from {_incremental.DIRTY_TABLE}")


def _tune(con: duckdb.DuckDBPyConnection) -> None:
    # A database-wide setting (cursors inherit it): the parametrised relations are views over the
    # materialised tables, and this optimizer pass alone took seconds to plan them (DuckDB 2.0).
    con.execute("set global disabled_optimizers = 'projection_pullup'")
    # DuckDB runs an ASOF join whose left side it estimates at <= 64 rows as a nested loop join
    # plus an aggregate. It estimates the prefix-block lookup of int_attr_candidates_state that
    # small whatever its size, and the loop then compares every pair: 82 s instead of 0.35 s for
    # a 12,000-request `mixed` replay (same rows), quadratic beyond. Always sort-merge.
    con.execute("set global asof_loop_join_threshold = 0")
    con.execute(f"set checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")


class Reader:
    """Read-only access for notebooks, ``routeaudit sql`` and the dashboard.

    Each query goes to the collector that owns the store if one is running (its sidecar file
    says where), else opens the file read-only for that query alone, so a collector can still
    start later. Results are polars DataFrames.
    """

    def __init__(self, path: str | os.PathLike[str], *, slo: SLO | None = None,
                 limits: QueryLimits = DEFAULT_LIMITS) -> None:
        self.path = Path(path)
        self.slo = slo or load_slo()
        self.limits = limits
        """Bounds of a query this reader runs itself; a collector applies its own."""
        self._rebuild_tried = False
        if not self.path.exists():
            raise StoreError(f"no store at {self.path} (start `routeaudit collect --db {self.path}` "
                             "or run `routeaudit demo`)")

    def query(self, sql: str, params: Sequence[Any] | None = None, *,
              slo: SLO | None = None,
              variables: Mapping[str, float | str] | None = None) -> pl.DataFrame:
        """Run one read-only query and return its rows; ``slo`` overrides :attr:`slo`;
        ``variables`` adds session variables (e.g. ``routeaudit_scope_run``, docs/attribution.md)."""
        table = self.query_arrow(sql, params, slo=slo, variables=variables)
        return pl.from_arrow(table)  # type: ignore[return-value]

    def query_arrow(self, sql: str, params: Sequence[Any] | None = None, *,
                    slo: SLO | None = None,
                    variables: Mapping[str, float | str] | None = None) -> pa.Table:
        check_read_only(sql)
        variables = {**(slo or self.slo).variables(), **(variables or {})}
        remote = _live_collector(self.path)
        if remote is not None:
            return _query_collector(remote, sql, params, variables, self.limits)
        return self._query_file(sql, params, variables)

    def table(self, name: str, limit: int | None = None) -> pl.DataFrame:
        """A whole relation (or its first ``limit`` rows) by name."""
        known = self.relations()
        if name not in known:
            raise QueryError(f"unknown relation {name!r}; known: {', '.join(known)}")
        sql = f"select * from {name}" + (f" limit {int(limit)}" if limit is not None else "")
        return self.query(sql)

    def relations(self) -> list[str]:
        """Public relations (marts) users may read, plus the raw tables."""
        return _relations.public_relations() + list(RAW_TABLES)

    def version(self) -> str:
        """Changes whenever the store's content changes: cache key for dashboards."""
        remote = _live_collector(self.path)
        st = self.path.stat()
        wal = Path(f"{self.path}.wal")
        wal_m = wal.stat().st_mtime_ns if wal.exists() else 0
        return f"{'live' if remote else 'file'}:{st.st_mtime_ns}:{st.st_size}:{wal_m}"

    def _query_file(self, sql: str, params: Sequence[Any] | None,
                    variables: Mapping[str, float | str]) -> pa.Table:
        # DuckDB shares one database, and its configuration, per file in a process: a read
        # that opened it while another had locked that configuration could not restrict its
        # own connection (a dashboard runs its pages' reads in threads)
        with _file_reads_lock(self.path):
            return self._query_file_alone(sql, params, variables)

    def _query_file_alone(self, sql: str, params: Sequence[Any] | None,
                          variables: Mapping[str, float | str]) -> pa.Table:
        con = self._connect_read_only()
        try:
            _tune(con)
            if not _views_current(con):
                con.close()
                if self._rebuild():
                    return self._query_file_alone(sql, params, variables)
                con = self._connect_read_only()
                _tune(con)
                # Written by another version and cannot be rebuilt now: this connection builds
                # its own (a refresh's work, for every query).
                _relations.install(con, temporary=True)
            _closed.install_views(con, self.path)
            con.execute("set lock_configuration = true")
            # Opened read-only, so a write could not commit: no transaction to roll back.
            return run_read_only(con, sql, params, variables, limits=self.limits, rollback=False,
                                 checked=True)
        finally:
            con.close()

    def _connect_read_only(self) -> duckdb.DuckDBPyConnection:
        try:
            con = duckdb.connect(os.fspath(self.path), read_only=True)
            # no file but the store and its closed partitions, before any query runs
            _closed.allow(con, self.path)
            con.execute("set enable_external_access = false")
            return con
        except duckdb.IOException as exc:
            raise StoreError(_lock_message(self.path, exc)) from exc
        except duckdb.Error as exc:
            raise StoreError(f"{self.path} is not a DuckDB store: {_one_line(exc)}") from exc

    def _rebuild(self) -> bool:
        """Rebuild the relations of a store written by another version of the SQL, when no
        other process holds the file; False when it cannot (then each read builds temporary
        relations of its own)."""
        if self._rebuild_tried:
            return False
        self._rebuild_tried = True
        try:
            Store(self.path).close()
        except (AuditError, duckdb.Error, OSError):
            return False
        return True


def _reads_relations(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Whether ``sql`` reads a relation (not only raw tables): only then can a refresh matter."""
    names: set[str] | None
    try:
        names = set(con.get_table_names(sql))
    except duckdb.Error:
        # get_table_names refuses a query with parameters (`?`, `$1`); the parse tree names
        # its tables all the same, so a lookup by request id need not wait for a rebuild.
        names = _parsed_table_names(con, sql)
    if names is None:
        return True  # cannot tell: refresh, to be safe
    return bool(names - set(RAW_TABLES) - {"routeaudit_meta"})


def _parsed_table_names(con: duckdb.DuckDBPyConnection, sql: str) -> set[str] | None:
    """The base tables ``sql``'s parse tree names, less the names of its CTEs (as
    ``get_table_names`` leaves them out); None when DuckDB cannot serialise the statements."""
    try:
        tree = json.loads(con.execute("select json_serialize_sql(?)", [sql]).fetchall()[0][0])
    except (duckdb.Error, ValueError, TypeError):
        return None
    if tree.get("error"):
        return None
    tables: set[str] = set()
    ctes: set[str] = set()
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "TABLE_FUNCTION":
                return None  # query_table(?) and the like name their tables at run time
            if node.get("type") == "BASE_TABLE" and isinstance(node.get("table_name"), str):
                tables.add(node["table_name"])
            cte_map = node.get("cte_map")
            if isinstance(cte_map, dict):
                ctes.update(e["key"] for e in cte_map.get("map", []) if isinstance(e, dict) and "key" in e)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return tables - ctes


def _views_current(con: duckdb.DuckDBPyConnection) -> bool:
    return _relations.built_version(con) == _relations.relations_version()


def _live_collector(path: Path) -> dict[str, Any] | None:
    side = sidecar_path(path)
    try:
        info = json.loads(side.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):  # not a collector's sidecar (it writes an object): none live
        return None
    pid = info.get("pid")
    if not isinstance(pid, int) or not _pid_alive(pid):
        return None
    return info


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _query_collector(info: dict[str, Any], sql: str, params: Sequence[Any] | None,
                     variables: Mapping[str, float | str], limits: QueryLimits) -> pa.Table:
    import httpx

    url = info.get("query_url")
    headers = {"content-type": "application/json", "x-routeaudit-query": "1"}
    token = info.get("token") or os.environ.get("ROUTEAUDIT_TOKEN")
    if token:
        headers["authorization"] = f"Bearer {token}"
    try:
        resp = httpx.post(str(url), json={"sql": sql, "params": list(params or []), "variables": dict(variables)},
                          headers=headers, timeout=_collector_timeout(limits))
    except httpx.HTTPError as exc:
        raise CollectorUnavailable(f"the collector at {url} owns this store but did not answer: {exc}") from exc
    if resp.status_code != 200:
        try:
            message = resp.json().get("error", resp.text)
        except ValueError:
            message = resp.text
        raise QueryError(str(message).strip().splitlines()[0] if message else f"HTTP {resp.status_code}")
    with pa.ipc.open_stream(resp.content) as reader:
        return reader.read_all()


def _collector_timeout(limits: QueryLimits) -> Any:
    """Wait for the answer as long as a query may run (the collector bounds it), and a bit more."""
    import httpx

    read = None if limits.timeout_s is None else limits.timeout_s + 30.0
    return httpx.Timeout(10.0, read=read)


_FILE_READS: dict[str, threading.RLock] = {}
_FILE_READS_GUARD = threading.Lock()


def _file_reads_lock(path: Path) -> threading.RLock:
    """The lock serialising this process's read-only opens of one store file."""
    key = os.path.realpath(path)
    with _FILE_READS_GUARD:
        return _FILE_READS.setdefault(key, threading.RLock())


def _lock_message(path: Path, exc: Exception) -> str:
    text = _one_line(exc)
    if "lock" in text.lower():
        return (f"{path} is held by another process and no running collector announced itself "
                f"({sidecar_path(path).name} missing): {text}")
    return f"cannot open {path}: {text}"


def _one_line(exc: BaseException | str) -> str:
    s = str(exc).strip()
    return s.splitlines()[0] if s else type(exc).__name__


def open(path: str | os.PathLike[str], *, slo: SLO | None = None,  # noqa: A001
         limits: QueryLimits = DEFAULT_LIMITS) -> Reader:
    """Open a store for reading: ``audit.open("audit.duckdb").query("select ...")``.

    ``slo`` sets the TTFT/TPOT targets the attribution relations judge by (default:
    :func:`audit.load_slo`, i.e. config file, environment, then defaults). ``limits`` bounds
    each query's time, rows and bytes (a running collector applies its own).
    """
    return Reader(path, slo=slo, limits=limits)
