"""Slices of event time: every relation, unchanged, computed over the raw rows near a time range.

A slice ``[start_ns, end_ns)`` installs, on one connection, temporary views of the raw tables
restricted to ``[start_ns - before_ns, end_ns + after_ns)`` and every relation over them
(temporary, so they shadow the store's own on that connection only). The rows a slice *owns* are
those whose anchor lies in ``[start_ns, end_ns)``: a request's ``first_seen_at``, and for the
request-keyed relations the anchor of their request; a scrape's ``scraped_ns``.

The **slice property**: for a relation whose inputs all lie within the margins, the rows a slice
owns equal the rows of a one-shot build with the same anchors. It is what lets a refresh
recompute only the time that received rows (docs/architecture.md, "Always-on analysis"); the
tests hold each relation to it, and name the ones that do not hold it yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import duckdb
import pyarrow as pa

from audit import _relations
from audit._errors import QueryError

DEFAULT_BEFORE_NS: Final = 600 * 10**9
"""What a decision looks back at: the prefix-block lookback (300 s), the last scrape before it,
executions still in flight on its replica."""

DEFAULT_AFTER_NS: Final = 600 * 10**9
"""What a request reaches forward to: its own later spans (its longest expected duration)."""

REQUEST_ANCHOR: Final = "epoch_ns(first_seen_at)"
"""A request's event time: the earliest start of any of its sides, on the reference clock."""

_OWNED_BY_TIME: Final = {
    "requests": REQUEST_ANCHOR,
    "snapshots": "scraped_ns",
}


@dataclass(frozen=True)
class Slice:
    """A range of event time and the margins of raw rows read around it (all Unix ns)."""

    start_ns: int
    end_ns: int
    before_ns: int = DEFAULT_BEFORE_NS
    after_ns: int = DEFAULT_AFTER_NS

    def __post_init__(self) -> None:
        if self.end_ns <= self.start_ns:
            raise QueryError(f"a slice must end after it starts ({self.start_ns} .. {self.end_ns})")
        if self.before_ns < 0 or self.after_ns < 0:
            raise QueryError("slice margins must not be negative")

    @property
    def read_from_ns(self) -> int:
        return self.start_ns - self.before_ns

    @property
    def read_until_ns(self) -> int:
        return self.end_ns + self.after_ns


def partition_of(ns: int, partition_s: float) -> int:
    """The partition a Unix-ns event time falls in, for partitions ``partition_s`` wide."""
    width = int(partition_s * 1e9)
    if width <= 0:
        raise QueryError(f"partition width must be positive, got {partition_s!r}")
    return ns // width


def install_slice(con: duckdb.DuckDBPyConnection, sl: Slice) -> None:
    """Restrict the raw tables to the slice's reach and build every relation over them, as
    temporary objects of ``con`` (a connection or cursor of its own: they shadow the store's
    relations there until it closes)."""
    db = con.execute("select current_database()").fetchall()[0][0]
    raw = f'"{db}".main'
    lo, hi = int(sl.read_from_ns), int(sl.read_until_ns)
    con.execute(f"create or replace temp view raw_spans as select * from {raw}.raw_spans "
                f"where start_ns >= {lo} and start_ns < {hi}")
    # An event belongs with its span: kept exactly when its span is.
    con.execute(f"create or replace temp view raw_span_events as select e.* from {raw}.raw_span_events as e "
                f"semi join temp.main.raw_spans as s using (trace_id, span_id)")
    con.execute(f"create or replace temp view raw_snapshots as select * from {raw}.raw_snapshots "
                f"where scraped_ns >= {lo} and scraped_ns < {hi}")
    _relations.install(con, temporary=True)


def owned_rows_sql(relation: str, sl: Slice, columns: list[str]) -> str:
    """The query selecting the rows of ``relation`` that ``sl`` owns (run it on a connection
    where the slice is installed, or on the store for the one-shot rows to compare)."""
    lo, hi = int(sl.start_ns), int(sl.end_ns)
    if relation in _OWNED_BY_TIME:
        anchor = _OWNED_BY_TIME[relation]
        return f"select * from {relation} where {anchor} >= {lo} and {anchor} < {hi}"
    if "request_key" in columns:
        return (f"select * from {relation} where request_key in (select request_key from requests "
                f"where {REQUEST_ANCHOR} >= {lo} and {REQUEST_ANCHOR} < {hi})")
    raise QueryError(f"relation {relation!r} has no anchor: it is not owned by a slice of time")


def slice_rows(con: duckdb.DuckDBPyConnection, relation: str, sl: Slice) -> pa.Table:
    """The rows of ``relation`` that ``sl`` owns, computed from the slice's raw rows alone."""
    cur = con.cursor()
    try:
        install_slice(cur, sl)
        columns = [r[0] for r in cur.execute(f"describe {relation}").fetchall()]
        return cur.sql(owned_rows_sql(relation, sl, columns)).to_arrow_table()
    finally:
        cur.close()
