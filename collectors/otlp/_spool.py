"""The spool: an fsynced append-only log of accepted exports, so an export can be acknowledged
before its DuckDB commit (``CollectorConfig.spool``).

Why: DuckDB's cost per statement dominates small commits (an insert of 4,096 spans runs at a
fraction of the rate of one of 65,536), and when every export waits for its own commit, a group
can only be as large as the number of senders waiting. With the spool an export waits for an
``fdatasync`` of its record instead; the writer then commits whatever has piled up in one large
transaction. This is the OpenTelemetry Collector's persistent queue, kept to what we need:

* One record per export: a header (magic, payload length, CRC-32) then the spans and their events
  as two Arrow IPC streams, exactly the tables the writer will insert.
* Records go to numbered segment files in ``<store>.spool/``. One thread (``routeaudit-spool``)
  syncs whatever was written since its last sync and resolves the waiting exports' futures: one
  ``fdatasync`` covers every export that arrived meanwhile (group sync).
* A segment is deleted once it is closed (full) and every record in it has been committed to the
  store. At start, records still in the folder are replayed into the store before anything
  listens. Replay is idempotent: the store ignores spans it already holds.
* A record cut short by a crash (torn write) fails its length or CRC check; it cannot have been
  acknowledged (acknowledgement waits for the sync after the whole record), so replay stops
  reading that segment there, and says so in the log.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from collectors.otlp._errors import SpoolError, WriterUnavailable

log = logging.getLogger("routeaudit.collector")

SPOOL_SUFFIX = ".spool"
"""The spool of ``<store>`` is the folder ``<store>.spool``."""

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
"""A segment is closed (and becomes deletable) once it holds this much."""

_MAGIC = b"RAS1"
_HEADER = struct.Struct("<4sII")  # magic, payload length, crc32(payload)
_LEN = struct.Struct("<I")
_SEGMENT = re.compile(r"^(\d{12})\.seg$")


def spool_path(db_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(db_path)}{SPOOL_SUFFIX}")


@dataclass
class _Segment:
    number: int
    path: Path
    fd: int
    pending: int = 0
    """Records written here and not yet committed to the store."""
    closed: bool = False


def encode_record(spans: pa.Table, events: pa.Table | None) -> list[Any]:
    """One record as the buffers to write in order: header, then the payload (the spans' IPC
    stream length, the spans and the events as Arrow IPC streams), never copied into one."""
    s = _ipc(spans)
    e = _ipc(events) if events is not None and events.num_rows else b""
    lead = _LEN.pack(s.size)
    crc = zlib.crc32(e, zlib.crc32(s, zlib.crc32(lead)))
    return [_HEADER.pack(_MAGIC, len(lead) + s.size + len(e), crc), lead, s, e]


def read_segment(path: Path) -> tuple[list[tuple[pa.Table, pa.Table | None]], int]:
    """The intact records of a segment and the number of trailing bytes that are not one."""
    data = path.read_bytes()
    out: list[tuple[pa.Table, pa.Table | None]] = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        magic, length, crc = _HEADER.unpack_from(data, pos)
        start, end = pos + _HEADER.size, pos + _HEADER.size + length
        if magic != _MAGIC or end > len(data) or zlib.crc32(data[start:end]) != crc:
            break
        payload = memoryview(data)[start:end]
        (n_spans,) = _LEN.unpack_from(payload, 0)
        spans = pa.ipc.open_stream(payload[_LEN.size:_LEN.size + n_spans]).read_all()
        rest = payload[_LEN.size + n_spans:]
        events = pa.ipc.open_stream(rest).read_all() if len(rest) else None
        out.append((spans, events))
        pos = end
    return out, len(data) - pos


class Spool:
    """Segment files plus the sync thread. ``append`` may be called from any thread."""

    def __init__(self, directory: Path, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"cannot create spool folder {self.directory}: {exc.strerror}") from exc
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise SpoolError(f"spool folder {self.directory} is not writable")
        self._segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._segments: dict[int, _Segment] = {}
        self._current: _Segment | None = None
        self._current_size = 0
        self._written = 0
        """Bytes written since start, all segments: the position a waiter needs synced."""
        self._synced = 0
        self._waiting: list[tuple[int, Future[None]]] = []
        self._retired: list[int] = []
        """File descriptors of closed segments, still to be synced and closed by the sync thread."""
        self._closing = False
        self._thread: threading.Thread | None = None
        self.bytes_on_disk = 0

    # -- start: replay --------------------------------------------------------------------------
    def leftover_segments(self) -> list[Path]:
        """Segment files found in the folder, oldest first (before :meth:`start`: a previous run's)."""
        found = [(int(m.group(1)), p) for p in self.directory.iterdir()
                 if (m := _SEGMENT.match(p.name))]
        return [p for _, p in sorted(found)]

    def replay(self, append: Callable[[pa.Table, pa.Table | None], int], *,
               max_group_spans: int) -> tuple[int, int]:
        """Commit every leftover record through ``append`` in groups, delete the segments.

        Returns (records, spans) replayed. A segment is deleted only after all its records were
        committed, so a crash during replay replays it again (harmlessly: duplicates are ignored).
        """
        records = spans_total = 0
        segments = self.leftover_segments()
        for k, path in enumerate(segments, 1):
            recs, torn = read_segment(path)
            if torn:
                log.warning("spool %s: %d trailing bytes are not a whole record (a write cut short "
                            "by a crash; never acknowledged), ignored", path.name, torn)
            group: list[tuple[pa.Table, pa.Table | None]] = []
            size = 0
            for spans, events in recs:
                group.append((spans, events))
                size += spans.num_rows
                if size >= max_group_spans:
                    append(*_concat_group(group))
                    group, size = [], 0
            if group:
                append(*_concat_group(group))
            records += len(recs)
            spans_total += sum(s.num_rows for s, _ in recs)
            path.unlink()
            if len(segments) > 1:  # a long replay shows its progress
                log.info("spool: segment %d/%d replayed (%d span(s) so far)", k, len(segments),
                         spans_total)
        if records:
            log.info("spool: replayed %d export(s), %d span(s) into the store", records, spans_total)
        return records, spans_total

    def start(self) -> None:
        self._next_number = max((int(_SEGMENT.match(p.name).group(1))  # type: ignore[union-attr]
                                 for p in self.leftover_segments()), default=0) + 1
        self._thread = threading.Thread(target=self._run, name="routeaudit-spool", daemon=True)
        self._thread.start()

    # -- runtime --------------------------------------------------------------------------------
    def append_record(self, record: list[Any], durable: Future[None]) -> int:
        """Write one record (:func:`encode_record`); ``durable`` resolves once it is synced.
        Returns its segment number: hand it to :meth:`release` once the record is committed."""
        with self._lock:
            if self._closing:
                raise SpoolError("spool is closing")
            seg = self._current
            if seg is None or self._current_size >= self._segment_bytes:
                seg = self._open_segment()
            size = _write_all(seg.fd, record)
            self._current_size += size
            self.bytes_on_disk += size
            self._written += size
            seg.pending += 1
            self._waiting.append((self._written, durable))
            self._wake.notify()
            return seg.number

    def release(self, segments: list[int]) -> None:
        """The records of these segments (one entry per record) are committed to the store."""
        dead: list[_Segment] = []
        with self._lock:
            for number in segments:
                seg = self._segments.get(number)
                if seg is None:  # closed meanwhile: the file stays, a replay will find it stored
                    continue
                seg.pending -= 1
                if seg.pending == 0 and seg.closed:
                    dead.append(self._segments.pop(number))
        for seg in dead:
            self._delete(seg)

    def close(self) -> None:
        """Sync and resolve every waiter, stop the thread, close the files. Segments whose
        records were all committed are deleted; the others stay for the next start's replay."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            segments = list(self._segments.values())
            self._segments.clear()
            self._current = None
        for seg in segments:
            if not seg.closed:
                os.close(seg.fd)
            if seg.pending == 0:
                self._delete(seg)
            else:
                log.warning("spool %s keeps %d export(s) not yet in the store; they are replayed "
                            "at the next start", seg.path.name, seg.pending)

    def _open_segment(self) -> _Segment:
        """Called with the lock held: retire the current segment, open the next one."""
        old = self._current
        if old is not None:
            old.closed = True
            self._retired.append(old.fd)
            if old.pending == 0:
                self._segments.pop(old.number, None)
                self._delete(old)
        number = self._next_number
        self._next_number += 1
        path = self.directory / f"{number:012d}.seg"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        seg = _Segment(number, path, fd)
        self._segments[number] = seg
        self._current = seg
        self._current_size = 0
        return seg

    def _delete(self, seg: _Segment) -> None:
        try:
            size = seg.path.stat().st_size
            seg.path.unlink()
            self.bytes_on_disk -= size
        except FileNotFoundError:
            pass

    def _run(self) -> None:
        """Group sync: one fdatasync for everything written since the last one."""
        while True:
            with self._lock:
                while self._synced == self._written and not self._retired and not self._closing:
                    self._wake.wait()
                target = self._written
                retired, self._retired = self._retired, []
                current = self._current.fd if self._current is not None else None
                waiting, self._waiting = self._waiting, []
                done = self._closing and target == self._synced and not retired
            error: OSError | None = None
            try:
                for fd in retired:
                    os.fdatasync(fd)
                if current is not None and target > self._synced:
                    os.fdatasync(current)
            except OSError as exc:  # a failed sync must not acknowledge anything
                error = exc
            finally:
                for fd in retired:
                    os.close(fd)
            with self._lock:
                # Either way these bytes are settled: synced, or their exports are told the sync
                # failed (503, the sender retries). Settling them also keeps a failing disk from
                # turning this loop into a busy one. (Every waiter taken above was written by
                # then: writes and waiters are added under the same lock.)
                self._synced = target
            if error is not None:
                log.error("spool sync failed: %s", error)
            for _, fut in waiting:
                if not fut.done():
                    if error is None:
                        fut.set_result(None)
                    else:
                        # answered like a failed commit: 503 / UNAVAILABLE, the sender retries
                        fut.set_exception(WriterUnavailable(f"spool sync failed: {error.strerror}"))
            if done:
                return


def _ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _write_all(fd: int, parts: list[Any]) -> int:
    """``writev`` until every byte is out (a short write resumes where it stopped)."""
    views = [memoryview(p).cast("B") for p in parts if len(memoryview(p))]
    total = sum(len(v) for v in views)
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]
    return total


def _concat_group(group: list[tuple[pa.Table, pa.Table | None]]) -> tuple[pa.Table, pa.Table | None]:
    spans = pa.concat_tables([s for s, _ in group], promote_options="default")
    events = [e for _, e in group if e is not None and e.num_rows]
    return spans, (pa.concat_tables(events, promote_options="default") if events else None)
