"""Merge the raw rows of several stores into one: ingest fan-out.

Several collectors behind a load balancer keyed by trace id each write their own store; a
request whose trace a router broke (client and router in different traces, linked by request
id) can then have its sides in different stores. :func:`merge` copies every source's raw rows
(``raw_spans`` with their ``raw_span_events``, ``raw_snapshots``) into one target store through
:meth:`audit.Store.append`, which marks what it brought, and refreshes the target: the
relations link and judge the requests over every source's spans.

Sources are read as any reader reads them (:func:`audit.open`): through the query endpoint of
the collector that is running on one, else read-only. Their closed partitions (Parquet beside
the store) are read with the rest. Queries of raw tables never wait for a collector's rebuild.
Spans are read in pages ordered by (``received_ns``, ``trace_id``, ``span_id``), each page's
events by a second query over the same keys (a span's events commit with it, so they are all
there when the span is).

What is new since the last merge is found per source from a fingerprint of each minute of
receipt time (``received_ns`` for spans, ``scraped_ns`` for scrapes: row count and XOR of the
start times), kept in the target's ``routeaudit_merge_marks``: only minutes whose fingerprint
changed are read again. Rows committed late to a source (a spool replayed after a restart keeps
the receipt time of the original export) change their minute's fingerprint, so they are read
by the next merge; rows committed while a merge reads are either read by it or change a
fingerprint it recorded before reading. Rows the target holds already (closed partitions
included) are skipped: a span and its events are copied once, a scrape once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import duckdb
import pyarrow as pa

from audit import _closed
from audit._errors import AuditError, StoreError
from audit._readonly import QueryLimits
from audit._store import Reader, Store, _live_collector

__all__ = ["MergeReport", "SourceMerged", "merge", "BUCKET_S", "MARKS_TABLE"]

BUCKET_S: Final = 60
"""Seconds of receipt time per fingerprint: the unit a merge re-reads when anything in it
changed."""

PAGE_ROWS: Final = 20_000
"""Spans (or scrapes) read from a source per query: bounded answers from a live collector."""

MARKS_TABLE: Final = "routeaudit_merge_marks"
"""The target's record of each source's fingerprints as last merged."""

_MARKS_DDL: Final = (
    f"create table if not exists {MARKS_TABLE} (source varchar not null, kind varchar not null, "
    "bucket bigint not null, n bigint not null, x bigint, primary key (source, kind, bucket))")

SETTINGS: Final = ("partition_s", "window_partitions", "lateness_s", "max_request_s")
"""Store settings (``routeaudit_meta``) the target must share with its sources: they decide
how requests fall into partitions."""

_LIMITS: Final = QueryLimits(timeout_s=600.0, max_rows=None, max_bytes=None)


@dataclass
class SourceMerged:
    """What one source brought: rows read from it and rows new to the target."""

    source: str
    buckets_read: int = 0
    spans_read: int = 0
    spans_new: int = 0
    events_new: int = 0
    snapshots_read: int = 0
    snapshots_new: int = 0


@dataclass
class MergeReport:
    """The result of :func:`merge`."""

    target: str
    sources: list[SourceMerged] = field(default_factory=list)
    refresh_s: float = 0.0
    refresh_kind: str = "none"

    @property
    def spans_new(self) -> int:
        return sum(s.spans_new for s in self.sources)

    @property
    def snapshots_new(self) -> int:
        return sum(s.snapshots_new for s in self.sources)


def merge(target: str | os.PathLike[str], sources: Sequence[str | os.PathLike[str]], *,
          refresh: bool = True, page_rows: int = PAGE_ROWS,
          progress: Callable[[str], None] | None = None) -> MergeReport:
    """Copy what is new in each of ``sources`` (stores, possibly collecting right now) into the
    store ``target`` (created if missing; no collector may hold it), then refresh its relations
    unless ``refresh`` is False. Returns what was copied; raises :class:`audit.StoreError` for a
    missing or invalid source, a target among the sources, or settings that differ."""
    if not sources:
        raise StoreError("merge needs at least one source store")
    if page_rows < 1:
        raise StoreError(f"page_rows must be >= 1, got {page_rows!r}")
    target_path = Path(target)
    keys: list[tuple[str, Path]] = []
    for src in sources:
        path = Path(src)
        key = _source_key(path)
        if target_path.exists() and path.exists() and os.path.samefile(path, target_path):
            raise StoreError(f"{path} is the merge target; a store cannot be its own source")
        if key not in {k for k, _ in keys}:
            keys.append((key, path))
    if _live_collector(target_path) is not None:
        raise StoreError(f"a collector is running on {target_path}: merge into a store no "
                         "collector writes (and collect into the sources)")
    readers = [(key, _open_source(path)) for key, path in keys]
    settings = _common_settings(readers)
    fresh = not target_path.exists()
    # A new target's first merge is a backfill: one full rebuild over everything it copied.
    store = Store(target_path, incremental=False if fresh else None)
    report = MergeReport(target=str(target_path))
    try:
        _apply_settings(store, settings)
        cur = store._con.cursor()
        try:
            cur.execute(_MARKS_DDL)
            for key, reader in readers:
                done = _merge_source(store, cur, key, reader, page_rows)
                report.sources.append(done)
                if progress is not None:
                    progress(f"{key}: {done.spans_new} new span(s) of {done.spans_read} read, "
                             f"{done.snapshots_new} new scrape(s)")
        finally:
            cur.close()
        if refresh and store.dirty:
            report.refresh_s = store.refresh()
            report.refresh_kind = store.last_refresh_kind
    finally:
        # close() would refresh what is pending: not when asked not to, nor after an error
        store.stop_work()
        store.close()
    return report


def _source_key(path: Path) -> str:
    return str(path.resolve())


def _open_source(path: Path) -> Reader:
    """A reader of the source at ``path``, after checking it is a routeaudit store (a file
    opened read-only when no collector runs on it: ``audit.open`` would otherwise try to
    rebuild relations into whatever DuckDB file it is given)."""
    if not path.exists():
        raise StoreError(f"merge source {path} does not exist")
    if path.is_dir():
        raise StoreError(f"merge source {path} is a folder, not a store file")
    if _live_collector(path) is None:
        try:
            con = duckdb.connect(os.fspath(path), read_only=True)
        except duckdb.Error as exc:
            raise StoreError(f"merge source {path} is not a DuckDB store (or is held by a "
                             f"process that announced no collector): {_line(exc)}") from exc
        try:
            have = {r[0] for r in con.execute(
                "select table_name from information_schema.tables "
                "where table_schema = 'main'").fetchall()}
        finally:
            con.close()
        missing = {"raw_spans", "raw_span_events", "raw_snapshots"} - have
        if missing:
            raise StoreError(f"merge source {path} is not a routeaudit store "
                             f"(no {', '.join(sorted(missing))})")
    return Reader(path, limits=_LIMITS)


def _common_settings(readers: Sequence[tuple[str, Reader]]) -> dict[str, str]:
    """The partitioning settings every source shares (absent: the defaults)."""
    seen: dict[str, dict[str, str]] = {}
    for key, reader in readers:
        rows = _query(reader, key, "select key, value from routeaudit_meta where key in "
                      f"({', '.join(repr(s) for s in SETTINGS)})").to_pylist()
        seen[key] = {str(r["key"]): str(r["value"]) for r in rows}
    first = next(iter(seen.values()))
    for key, got in seen.items():
        if got != first:
            raise StoreError(f"sources partition differently ({key}: {got or 'defaults'}; "
                             f"{readers[0][0]}: {first or 'defaults'}): merge stores that share "
                             f"{', '.join(SETTINGS)}")
    return first


def _apply_settings(store: Store, settings: dict[str, str]) -> None:
    """Give a target without spans the sources' settings; refuse a target that differs."""
    cur = store._con.cursor()
    try:
        have = {str(k): str(v) for k, v in cur.execute(
            "select key, value from routeaudit_meta where key in "
            f"({', '.join(repr(s) for s in SETTINGS)})").fetchall()}
        if have == settings:
            return
        spans = int(cur.execute("select count(*) from raw_spans").fetchall()[0][0])
        if spans:
            raise StoreError(f"{store.path} partitions differently from its sources "
                             f"({have or 'defaults'} vs {settings or 'defaults'})")
        cur.execute("begin transaction")
        cur.execute("delete from routeaudit_meta where key in "
                    f"({', '.join(repr(s) for s in SETTINGS)})")
        for k, v in settings.items():
            cur.execute("insert into routeaudit_meta values (?, ?)", [k, v])
        # relations built over no rows under the target's own settings: rebuilt under these
        cur.execute("delete from routeaudit_meta where key = 'relations_version'")
        cur.execute("commit")
        store._full_rebuild_due = True
    finally:
        cur.close()


def _query(reader: Reader, key: str, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
    try:
        return reader.query_arrow(sql, params)
    except AuditError as exc:
        raise type(exc)(f"merge source {key}: {_line(exc)}") from exc


_FINGERPRINT: Final = (
    f"select 'spans' as kind, received_ns // {BUCKET_S * 1_000_000_000} as bucket, "
    "count(*) as n, bit_xor(start_ns) as x from raw_spans group by all "
    f"union all select 'snapshots', scraped_ns // {BUCKET_S * 1_000_000_000}, count(*), "
    "bit_xor(scraped_ns) from raw_snapshots group by all")

_PAGE_KEYS: Final = ("received_ns >= ? and received_ns < ? "
                     "and (received_ns, trace_id, span_id) > (?, ?, ?)")

_SPANS_PAGE: Final = (
    f"select * from raw_spans where {_PAGE_KEYS} order by received_ns, trace_id, span_id limit ?")

_EVENTS_PAGE: Final = (
    "select e.* from raw_span_events as e semi join (select trace_id, span_id from raw_spans "
    f"where {_PAGE_KEYS} and (received_ns, trace_id, span_id) <= (?, ?, ?)) as p "
    "using (trace_id, span_id)")
"""The events of a page of spans: those of every span from the page's first key to its last
(a span's events commit with it, so every event of the page's spans is there)."""

_SNAPSHOTS_PAGE: Final = (
    "select * from raw_snapshots where scraped_ns >= ? and scraped_ns < ? order by scraped_ns")


def _merge_source(store: Store, cur: duckdb.DuckDBPyConnection, key: str, reader: Reader,
                  page_rows: int) -> SourceMerged:
    done = SourceMerged(source=key)
    seen = {(str(r["kind"]), int(r["bucket"])): (int(r["n"]), r["x"])
            for r in _query(reader, key, _FINGERPRINT).to_pylist()}
    marked = {(str(k), int(b)): (int(n), x) for k, b, n, x in cur.execute(
        f"select kind, bucket, n, x from {MARKS_TABLE} where source = ?", [key]).fetchall()}
    bucket_ns = BUCKET_S * 1_000_000_000
    _closed.install_views(cur, store.path)
    for lo, hi in _ranges(seen, marked, "spans", page_rows):
        done.buckets_read += (hi - lo)
        after: tuple[int, str, str] = (lo * bucket_ns - 1, "", "")
        while True:
            page = _query(reader, key, _SPANS_PAGE,
                          [lo * bucket_ns, hi * bucket_ns, *after, page_rows])
            if not page.num_rows:
                break
            done.spans_read += page.num_rows
            last = page.slice(page.num_rows - 1).select(["received_ns", "trace_id", "span_id"])
            upto = tuple(last.to_pylist()[0].values())
            events = _query(reader, key, _EVENTS_PAGE,
                            [lo * bucket_ns, hi * bucket_ns, *after, *upto])
            spans, new_events = _new_spans(cur, page, events)
            if spans.num_rows:
                done.spans_new += store.append(spans=spans, events=new_events)
                done.events_new += new_events.num_rows if new_events is not None else 0
            after = (int(upto[0]), str(upto[1]), str(upto[2]))
            if page.num_rows < page_rows:
                break
    for lo, hi in _ranges(seen, marked, "snapshots", page_rows):
        done.buckets_read += (hi - lo)
        page = _query(reader, key, _SNAPSHOTS_PAGE, [lo * bucket_ns, hi * bucket_ns])
        done.snapshots_read += page.num_rows
        snaps = _new_snapshots(cur, page)
        if snaps.num_rows:
            store.append(snapshots=snaps)
            done.snapshots_new += snaps.num_rows
    # The fingerprints as seen before reading: anything committed since differs next time.
    _record_marks(cur, key, seen, marked)
    return done


def _ranges(seen: dict[tuple[str, int], tuple[int, Any]],
            marked: dict[tuple[str, int], tuple[int, Any]], kind: str,
            page_rows: int) -> Iterable[tuple[int, int]]:
    """Bucket ranges ``[lo, hi)`` to read: runs of buckets whose fingerprint changed, with no
    unchanged bucket inside, cut where they would hold more than ``page_rows`` rows (one bucket
    may hold more: spans are then read in pages)."""
    lo: int | None = None
    hi = 0
    rows = 0
    for (k, bucket) in sorted(b for b in seen if b[0] == kind):
        changed = seen[(k, bucket)] != marked.get((k, bucket))
        n = seen[(k, bucket)][0]
        if lo is not None and (not changed or rows + n > page_rows):
            yield lo, hi
            lo = None
        if changed:
            if lo is None:
                lo, rows = bucket, 0
            hi, rows = bucket + 1, rows + n
    if lo is not None:
        yield lo, hi


def _new_spans(cur: duckdb.DuckDBPyConnection, page: pa.Table,
               events: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """The spans of ``page`` the target lacks (its closed partitions included), and their
    events among ``events``."""
    cur.register("_rm_page", page)
    cur.register("_rm_events", events)
    try:
        spans = cur.sql(
            "select p.* from _rm_page as p where not exists (select 1 from raw_spans as s "
            "where s.trace_id = p.trace_id and s.span_id = p.span_id "
            "and s.start_ns between (select min(start_ns) from _rm_page) "
            "and (select max(start_ns) from _rm_page))").to_arrow_table()
        if not spans.num_rows or not events.num_rows:
            return spans, None
        cur.register("_rm_new", spans)
        try:
            new_events = cur.sql("select e.* from _rm_events as e semi join _rm_new "
                                 "using (trace_id, span_id)").to_arrow_table()
        finally:
            cur.unregister("_rm_new")
    finally:
        cur.unregister("_rm_page")
        cur.unregister("_rm_events")
    return spans, new_events if new_events.num_rows else None


def _new_snapshots(cur: duckdb.DuckDBPyConnection, page: pa.Table) -> pa.Table:
    """The scrapes of ``page`` the target lacks."""
    if not page.num_rows:
        return page
    cur.register("_rm_snaps", page)
    try:
        return cur.sql(
            "select p.* from _rm_snaps as p where not exists (select 1 from raw_snapshots as s "
            "where s.scraped_ns = p.scraped_ns and s.target = p.target "
            "and s.replica = p.replica and s.dp_rank is not distinct from p.dp_rank "
            "and s.source is not distinct from p.source)").to_arrow_table()
    finally:
        cur.unregister("_rm_snaps")


def _record_marks(cur: duckdb.DuckDBPyConnection, key: str,
                  seen: dict[tuple[str, int], tuple[int, Any]],
                  marked: dict[tuple[str, int], tuple[int, Any]]) -> None:
    changed = [(key, k, b, n, x) for (k, b), (n, x) in seen.items() if marked.get((k, b)) != (n, x)]
    gone = [(key, k, b) for (k, b) in marked if (k, b) not in seen]
    if not changed and not gone:
        return
    cur.execute("begin transaction")
    try:
        if gone:
            cur.executemany(f"delete from {MARKS_TABLE} where source = ? and kind = ? and bucket = ?",
                            gone)
        if changed:
            rows = pa.table({"source": [r[0] for r in changed], "kind": [r[1] for r in changed],
                             "bucket": pa.array([r[2] for r in changed], pa.int64()),
                             "n": pa.array([r[3] for r in changed], pa.int64()),
                             "x": pa.array([r[4] for r in changed], pa.int64())})
            cur.register("_rm_marks", rows)
            cur.execute(f"insert or replace into {MARKS_TABLE} select * from _rm_marks")
            cur.unregister("_rm_marks")
        cur.execute("commit")
    except BaseException:
        cur.execute("rollback")
        raise


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

