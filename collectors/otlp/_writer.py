"""The writer: one thread owns :class:`audit._store.Store` and commits queued batches in groups.

Exports are put on a queue bounded in spans (snapshot rows count as spans); each carries a
:class:`~concurrent.futures.Future`. The writer thread takes the first waiting batch, then every
batch already waiting (up to ``max_group_batches`` / ``max_group_spans``), concatenates them and
calls ``Store.append`` once: one transaction, one WAL sync for the group.

Without a spool, an export's future resolves only when that call has returned (the rows are
durable); if it raises, the group is retried batch by batch so that one poisonous batch cannot
fail the others, and each batch that still fails has its future failed with
:class:`WriterUnavailable` (answered 503 / ``UNAVAILABLE``).

With a spool (:mod:`collectors.otlp._spool`), an export's future resolves once its record is
synced to the spool, before the commit. A failed commit can then no longer be answered: the
batches that failed go back to the head of the queue and are retried with a growing pause (the
queue fills meanwhile and new exports are refused with 429), and whatever is still uncommitted at
stop stays in the spool for the next start.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa

from audit import Store, without_null_columns
from collectors.otlp._errors import QueueFull, SpoolError, WriterUnavailable
from collectors.otlp._metrics import Metrics
from collectors.otlp._spool import Spool, encode_record
from collectors.otlp._status import one_line

log = logging.getLogger("routeaudit.collector")


@dataclass(eq=False)  # identity: items are compared with `in`
class _Item:
    spans: pa.Table | None
    events: pa.Table | None
    snapshots: pa.Table | None
    weight: int
    future: Future[None]
    segment: int | None = None
    """Spool segment holding this batch's record (its future resolves at the spool sync)."""


_RETRY_PAUSE_S = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Pauses between retries of spooled batches whose commit failed (the last one repeats)."""


class Writer:
    """Single writer thread with a bounded queue and group commit.

    :meth:`submit` may be called from any thread and never blocks. ``before_commit`` (a test
    hook) runs on the writer thread before each group's transaction; it may sleep or raise (a
    raise fails that group like a store error would).
    """

    def __init__(self, store: Store, metrics: Metrics, *, queue_max_spans: int,
                 max_group_batches: int, max_group_spans: int,
                 before_commit: Callable[[], None] | None = None,
                 spool: Spool | None = None) -> None:
        self._store = store
        self._metrics = metrics
        self._limit = queue_max_spans
        self._max_batches = max_group_batches
        self._max_spans = max_group_spans
        self._before_commit = before_commit
        self._spool = spool
        self._queue: collections.deque[_Item] = collections.deque()
        self._depth = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        """One line: why the last group failed, None once a group commits again."""
        metrics.bind_queue_depth(lambda: self.depth)

    @property
    def depth(self) -> int:
        """Spans (and snapshot rows) queued and not yet committed."""
        return self._depth

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="routeaudit-writer", daemon=True)
        self._thread.start()

    def submit(self, spans: pa.Table | None = None, events: pa.Table | None = None,
               snapshots: pa.Table | None = None) -> Future[None]:
        """Queue rows for the next group commit; the future resolves once they are durable
        (committed, or with a spool: synced to the spool).

        Raises :class:`QueueFull` when the queue has no room (a batch larger than the whole
        queue is still taken when the queue is empty, so it is never refused forever) and
        :class:`WriterUnavailable` once the writer is closing or the spool cannot be written.
        """
        # Before the spool: a null column costs its record bytes as it costs the insert.
        spans, events, snapshots = (without_null_columns(t) for t in (spans, events, snapshots))
        weight = (spans.num_rows if spans is not None else 0) + (
            snapshots.num_rows if snapshots is not None else 0)
        fut: Future[None] = Future()
        # Only exports are spooled: snapshot rows are the collector's own and nobody waits for them.
        spool = self._spool if spans is not None and spans.num_rows > 0 else None
        spooled = spool is not None
        with self._cond:
            if self._closing:
                raise WriterUnavailable("collector is shutting down")
            if self._depth and self._depth + weight > self._limit:
                raise QueueFull(
                    f"write queue full ({self._depth} spans waiting, limit {self._limit}); retry later"
                )
            self._depth += weight  # reserved: the spool write below happens outside the lock
        item = _Item(spans, events, snapshots, weight, fut)
        if spool is not None:
            try:
                record = encode_record(spans, events)
                item.segment = spool.append_record(record, fut)
            except (OSError, SpoolError, pa.ArrowException) as exc:
                with self._cond:
                    self._depth -= weight
                raise WriterUnavailable(f"spool write failed: {one_line(exc)}") from exc
        with self._cond:
            if self._closing and not spooled:  # close() began meanwhile: nobody would commit it
                self._depth -= weight
                raise WriterUnavailable("collector is shutting down")
            # (a spooled batch is safe either way: committed, or replayed at the next start)
            self._queue.append(item)
            self._cond.notify()
        return fut

    def close(self, timeout: float | None = None) -> None:
        """Refuse new batches, commit everything queued, stop the thread. Safe to call twice."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("writer did not finish draining within %.0f s", timeout or 0)
        # Nothing may wait forever on a future the thread will never resolve.
        with self._cond:
            left = list(self._queue)
            self._queue.clear()
            self._depth = 0
        for item in left:
            if not item.future.done():
                item.future.set_exception(WriterUnavailable("collector stopped before commit"))
        spooled = sum(item.weight for item in left if item.segment is not None)
        if spooled:
            log.error("%d acknowledged span(s) could not be committed before stop; they stay in "
                      "the spool and are replayed at the next start", spooled)

    def _take_group(self) -> list[_Item] | None:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None  # closing and drained
            group = [self._queue.popleft()]
            spans = group[0].weight
            while (self._queue and len(group) < self._max_batches
                   and spans + self._queue[0].weight <= self._max_spans):
                item = self._queue.popleft()
                group.append(item)
                spans += item.weight
            return group

    def _run(self) -> None:
        failures = 0
        while True:
            group = self._take_group()
            if group is None:
                return
            left = self._commit(group)
            with self._cond:
                self._depth -= sum(item.weight for item in group if item not in left)
                if not left:
                    failures = 0
                    continue
                # Spooled batches were acknowledged: keep them, first in line, and pause.
                self._queue.extendleft(reversed(left))
                if self._cond.wait_for(lambda: self._closing,
                                       _RETRY_PAUSE_S[min(failures, len(_RETRY_PAUSE_S) - 1)]):
                    return
                failures += 1

    def _commit(self, group: list[_Item]) -> list[_Item]:
        """Commit the group; return the spooled items that could not be committed."""
        try:
            self._append(group)
        except Exception as exc:  # noqa: BLE001 - every failure is answered, none kills the thread
            self._metrics.inc("commit_failures")
            self.last_error = one_line(exc)
            if len(group) == 1:
                log.error("commit failed: %s", self.last_error)
                if group[0].segment is not None:
                    return group
                group[0].future.set_exception(WriterUnavailable(f"store write failed: {self.last_error}"))
                return []
            log.warning("group commit of %d batches failed (%s); retrying one by one",
                        len(group), self.last_error)
            return [left for item in group for left in self._commit([item])]
        self.last_error = None
        spooled = [item.segment for item in group if item.segment is not None]
        if spooled:
            self._spool.release(spooled)  # type: ignore[union-attr]
        for item in group:
            if item.segment is None:
                item.future.set_result(None)
        return []

    def _append(self, group: list[_Item]) -> None:
        if self._before_commit is not None:
            self._before_commit()
        spans = _concat([i.spans for i in group])
        events = _concat([i.events for i in group])
        snaps = _concat([i.snapshots for i in group])
        t0 = time.perf_counter()
        new = self._store.append(spans=spans, events=events, snapshots=snaps)
        seconds = time.perf_counter() - t0
        n_spans = spans.num_rows if spans is not None else 0
        self._metrics.commit(seconds, len(group))
        self._metrics.inc("commits")
        self._metrics.inc("spans_committed", n_spans)
        self._metrics.inc("spans_new", new)
        self._metrics.inc("spans_duplicate", n_spans - new)
        self._metrics.inc("snapshots_written", snaps.num_rows if snaps is not None else 0)


def _concat(tables: list[pa.Table | None]) -> pa.Table | None:
    present = [t for t in tables if t is not None and t.num_rows]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    return pa.concat_tables(present, promote_options="default")
