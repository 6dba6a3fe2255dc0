"""Incremental refresh: recompute only the event time that received rows since the last refresh.

A full rebuild (``_relations.refresh``) reads every raw row; its cost follows the history. This
module recomputes the *slice* ``[t0, ∞)`` instead, where ``t0`` is the earliest anchor a new row
can change, and replaces the stored rows that slice owns (docs/architecture.md, "Always-on
analysis"). The relations are the same SQL files, run over temporary views of the raw tables
restricted to the slice's *region* ``[read_from, ∞)``: far enough back for every window a row
in the slice reads (the prefix-block and KV lookbacks, the windowed summaries of the
partitions before it, a trace's earlier spans), so the rows the slice owns equal a one-shot
build's.

Which rows of a relation a slice owns follows from the relation's keys: request-keyed rows by
their request's anchor, decision- and span-keyed rows through the request they belong to,
trace-keyed staging rows through their trace's request, per-partition summaries by partition,
scrapes by scrape time; a relation with none of these is replaced whole.

``t0`` is the start of the partition of the earliest of: the earliest start of a new span (less
:data:`SKEW_NS`, as a span's own clock may run ahead of the reference), the stored anchor of every
request a new span joins (by trace, or by request id), and the anchor of every stored request
whose prefill was still running then (a new prefill overlapping it moves the idle-prefill fit).
Whole partitions, because their per-partition summaries (clock offsets, fits, counts) read every
request of the partition: so every stored row equals a one-shot build's over the rows stored so
far, and a partition the watermark passes needs no recomputation, only its rows marked
``verdict_final`` (:func:`_finalise`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Final

import duckdb

from audit import _closed, _relations, _span_keys
from audit._errors import StoreError

DIRTY_TABLE: Final = "routeaudit_dirty"
DIRTY_DDL: Final = (
    f"create table if not exists {DIRTY_TABLE} ("
    "trace_id varchar, "  # null for a batch of scrapes
    "start_ns bigint not null)"  # earliest start (or scrape time) the batch brought
)
"""What each append brought since the last refresh: one row per (batch, trace)."""

RUNS_DUE_TABLE: Final = "routeaudit_runs_due"
RUNS_DUE_DDL: Final = f"create table if not exists {RUNS_DUE_TABLE} (run_id varchar)"
"""The runs whose per-run rows (the default-SLO tables of per-run views: ``slo_summary``,
``calibration``) a slice changed the inputs of, one row each (null: the traffic without a run
id). A slice marks them in its transaction; :func:`refresh_runs` recomputes their rows and
deletes the marks in its own, so the verdicts do not wait for a merge over a run's whole
history (a fleet without run ids is one run that never ends)."""

SKEW_NS: Final = 60 * 10**9
"""How far a host's clock may run ahead of or behind the reference at most: a request's anchor is
at most this before the raw start of any of its spans, or after it."""

SKEW_MARGIN_NS: Final = 2 * 10**9
"""A slice assumes the clocks of its time are off by at most the largest offset the store
measured around it plus this (never more than :data:`SKEW_NS`), and checks it against the
offsets it computes itself (:func:`refresh`)."""

LOOKBACK_NS: Final = 330 * 10**9
"""What a request's rows read before its anchor on its replicas: prefix blocks served up to 300 s
earlier, KV usage over the 30 s lookback (int_attr_thresholds.lookback_ms)."""


PART_CONTEXT: Final = ("int_clock_bounds_per_domain_pair", "int_clock_domain_spans",
                      "int_clock_offsets")
"""Per-partition relations a slice reads for the partitions before ``t0``'s as stored: the clock
summaries of the windows its own partitions read, and the offsets that correct its context's
spans. Their rows of those partitions equal a one-shot build's (no new row reaches them)."""

WINDOW_INPUTS: Final = {
    "int_attr_replica_fits": ("requests", "int_attr_executions_timed", "int_attr_idle_prefills"),
    "int_attr_client_gaps": ("requests",),
}
"""Windowed summaries and the request-keyed relations they read: a slice gives them the stored
rows of the requests of their window anchored before its recomputed region, so the region need
not reach back over whole partitions."""

LOOKBACK_TAKEN: Final = ("int_attr_executions_timed", "int_attr_decisions_resolved",
                         "int_attr_candidates_resolved")
"""The request-keyed relations through which rows read their replicas' recent past
(:data:`LOOKBACK_NS`: executions in flight or overlapping, prefix blocks served, the replicas a
run used, the decisions of those executions): once a slice has built one, its rows of the
requests anchored before the region surely holds them whole are replaced by the stored rows of
the requests anchored in that past, so the region need not reach back over the lookback. The
tables are replaced rather than read through common table expressions: the range join reading
them (int_attr_candidates_in_flight) is planned as an IEJoin only in a query without
materialised CTEs."""

TAKEN_NEW_ONLY: Final = {"int_attr_candidates_resolved": ("int_attr_decisions_resolved",)}
"""Per-decision relations of :data:`LOOKBACK_TAKEN` that read another one: a slice builds them
over that input's rows of its new requests only (``_context_new``). Their rows of every other
request are the stored ones taken afterwards, so computing them would be wasted, and worse: a
lookback decision the region holds no candidate of would look unrecorded and get reconstructed
candidates beside its stored recorded ones."""

LOOKBACK_INPUTS: Final = {"int_attr_candidates_state": ("decisions", "raw_spans")}
"""The same for inputs read by one relation: the decisions of the lookback's requests and the raw
decision spans carrying their prefix hashes (the blocks their replicas served)."""


@dataclass(frozen=True)
class Partitioning:
    """The store's settings (``stg_partitioning``), in ns."""

    partition_ns: int
    window_partitions: int
    lateness_ns: int
    max_request_ns: int

    @classmethod
    def read(cls, con: duckdb.DuckDBPyConnection, schema: str = "main") -> Partitioning:
        rows = con.execute(
            f"select partition_ns, window_partitions, cast(lateness_s * 1e9 as bigint), "
            f"cast(max_request_s * 1e9 as bigint) from {schema}.stg_partitioning").fetchall()
        if len(rows) != 1:
            raise StoreError("stg_partitioning must hold one row")
        p, k, late, longest = rows[0]
        return cls(int(p), int(k), int(late), int(longest))

    def start_of(self, ns: int) -> int:
        """The start of the partition ``ns`` falls in."""
        return (ns // self.partition_ns) * self.partition_ns


@dataclass(frozen=True)
class Plan:
    """What an incremental refresh recomputes: rows anchored at or after ``t0_ns``, from raw rows
    starting at or after ``recompute_from_ns`` (and the earlier spans of their traces), reading
    the stored rows of the windowed summaries' earlier partitions (:data:`PART_CONTEXT`,
    :data:`WINDOW_INPUTS`). ``read_from_ns`` is how far back the slice can reach at all: the
    windows' partitions before ``t0``'s, which a slice recomputes from raw rows when stored
    rows of them are missing (partitions it re-opened)."""

    t0_ns: int
    read_from_ns: int
    recompute_from_ns: int
    dirty_rows: int
    finalising: int | None
    """The oldest partition whose verdicts this refresh makes final, if any."""
    skew_ns: int = SKEW_NS
    """The clock offset the slice assumes at most (:data:`SKEW_MARGIN_NS`)."""

    def without_stored_windows(self) -> Plan:
        """The plan recomputing every window from raw rows, as a slice over re-opened partitions
        does (their intermediate rows were not kept)."""
        return replace(self, recompute_from_ns=self.read_from_ns)


def plan(con: duckdb.DuckDBPyConnection, parts: Partitioning,
         skew_ns: int = SKEW_NS) -> Plan | None:
    """The slice a refresh must recompute, or None when nothing arrived. ``con`` reads the
    store's stored relations (a transaction started by the caller). ``skew_ns``: the clock
    offset assumed at most (:data:`SKEW_NS`, or less as :func:`assumed_skew` measured)."""
    dirty_rows, dirty_min = con.execute(
        f"select count(*), min(start_ns) from {DIRTY_TABLE}").fetchall()[0]
    floor = _slice_floor(con, parts)
    t0: int | None = None
    if dirty_rows:
        # The whole partition of the earliest new span: new spans move its clock bounds, and so
        # may move the offsets correcting every span of it, not only the spans after them.
        t0 = parts.start_of(int(dirty_min) - skew_ns)
        far = t0 - parts.max_request_ns
        # The stored requests a new span joins: by trace (a late side of a request stored
        # earlier), or by request id (a second trace joined by the request-id fallback).
        joined = con.execute(f"""
            with dirty as (select distinct trace_id from {DIRTY_TABLE} where trace_id is not null),
            ids as (
                select distinct s.a_request_id as request_id
                from raw_spans as s semi join dirty using (trace_id)
                where s.start_ns >= {far} and s.a_request_id is not null
            ),
            keys as (
                select distinct t.request_key
                from int_request_spans as t semi join dirty using (trace_id)
                where t.start_ns >= {far}
            )
            select min(r.anchor_ns) from requests as r
            where r.anchor_ns >= {far - SKEW_NS}
              and (r.request_key in (select request_key from keys)
                   or r.request_id in (select request_id from ids))
        """).fetchall()[0][0]
        # The requests whose prefill was still running when the new spans start: a new
        # execution whose prefill overlaps theirs makes them no longer idle, which moves the
        # idle-prefill fit of their partition (int_attr_idle_prefills).
        overlapped = con.execute(f"""
            select min(r.anchor_ns) from int_attr_executions_timed as e
            join requests as r using (request_key)
            where coalesce(e.first_token_at, e.end_at_eff)
                  >= make_timestamp({(int(dirty_min) - skew_ns) // 1000})
              and r.anchor_ns >= {far - SKEW_NS}
        """).fetchall()[0][0]
        if overlapped is not None:
            t0 = min(t0, parts.start_of(int(overlapped)))
        if joined is not None:
            # the whole partition again: the late span moves its per-partition summaries (the
            # request's own fits and counts), which every request of the partition reads
            t0 = min(t0, parts.start_of(int(joined)))
        final_until = horizon(con)[0]
        if final_until is not None and t0 < final_until:
            # Later than the lateness allowed: the row lands in a partition already final. It
            # re-opens it (and the windows after it), and the requests whose executions it may
            # have overlapped, back to a partition boundary: the final verdicts there are
            # recomputed as a one-shot build would give them.
            t0 = parts.start_of(t0 - parts.max_request_ns)
    if t0 is None:
        return None
    finalising: int | None = None
    newest = con.execute("select max(start_ns) from raw_spans").fetchall()[0][0]
    if newest is not None:
        # The oldest partition the watermark (end + longest request) will likely pass with this
        # slice, for the record: its rows are marked final after the slice (:func:`_finalise`).
        row = con.execute(
            "select min(part) from requests where not verdict_final "
            "and (part + 1) * ? + ? <= ?",
            [parts.partition_ns, parts.max_request_ns,
             int(newest) - parts.lateness_ns]).fetchall()[0][0]
        finalising = None if row is None else int(row)
    if floor is not None and t0 < floor:
        # retention deleted the raw rows such a slice would read: rows anchored before the
        # floor keep the verdicts they have
        t0 = floor
    # The slice recomputes from raw rows the whole of t0's partition (its per-partition
    # summaries) and the requests anchored from t0 (whose spans may start SKEW_NS earlier on
    # their own clocks). What its rows read before that, their replicas' recent past
    # (LOOKBACK_NS) and the windowed summaries' window_partitions before t0's, comes as stored
    # rows (LOOKBACK_TAKEN, LOOKBACK_INPUTS, WINDOW_INPUTS, PART_CONTEXT), or, when those are
    # missing, is recomputed from raw rows back to read_from (a span of a request anchored at t0
    # may start SKEW_NS earlier, in the partition before, whose clock window reaches one
    # further back).
    window_from = parts.start_of(t0 - SKEW_NS) - parts.window_partitions * parts.partition_ns
    read_from = min(window_from, t0 - LOOKBACK_NS - SKEW_NS)
    recompute_from = min(parts.start_of(t0), t0 - skew_ns)
    return Plan(t0, read_from, recompute_from, int(dirty_rows), finalising, skew_ns)


def slice_reach_ns(parts: Partitioning) -> int:
    """How far before its ``t0`` a slice may read raw rows: the replica lookback with the skew,
    or the windows of ``t0``'s partition and of the one before (a span may start a skew early)."""
    return max(LOOKBACK_NS + SKEW_NS, (parts.window_partitions + 2) * parts.partition_ns)


def raw_retention_needed_ns(parts: Partitioning) -> int:
    """How long behind the newest span raw rows must be kept for every span that arrives within
    ``max_request_s`` of its request's anchor to be analysed (:func:`_slice_floor`)."""
    return slice_reach_ns(parts) + parts.max_request_ns


def _slice_floor(con: duckdb.DuckDBPyConnection, parts: Partitioning) -> int | None:
    """The oldest t0 whose slice still has every raw row it reads, after retention."""
    kept = raw_kept_from(con)
    if kept is None:
        return None
    return kept + slice_reach_ns(parts)


def _restrict_raw(cur: duckdb.DuckDBPyConnection, db: str, pl: Plan, parts: Partitioning) -> None:
    raw = f'"{db}".main'
    lo = int(pl.recompute_from_ns)
    far = lo - parts.max_request_ns - SKEW_NS
    # A trace that reaches into the region brings its earlier spans (a retry minutes after the
    # first attempt must not make a request of its own), and so does a span still running when
    # the region starts (an execution in flight: whether a replica was idle or queued then).
    cur.execute(f"""create or replace temp view raw_spans as
        select * from {raw}.raw_spans where start_ns >= {lo}
        union all
        select * from {raw}.raw_spans
        where start_ns >= {far} and start_ns < {lo}
          and (end_ns >= {lo}
               or trace_id in (select trace_id from {raw}.raw_spans where start_ns >= {lo}))""")
    cur.execute(f"create or replace temp view raw_span_events as select e.* "
                f"from {raw}.raw_span_events as e semi join temp.main.raw_spans as s "
                f"using (trace_id, span_id)")
    # scrapes are few: the last one before a decision is found however long ago it was
    cur.execute(f"create or replace temp view raw_snapshots as select * "
                f"from {raw}.raw_snapshots where scraped_ns >= {int(pl.read_from_ns)}")


def _take_stored_partitions(con: duckdb.DuckDBPyConnection, main: str, name: str, pl: Plan,
                            parts: Partitioning) -> None:
    """Replace the slice's rows of ``name`` (a :data:`PART_CONTEXT` relation) for the partitions
    before ``t0``'s, computed from a region that does not cover them, by the stored ones."""
    p0 = pl.t0_ns // parts.partition_ns
    # the windows of t0's partitions, and the spans of the context (a trace's earlier spans)
    lo = min(p0 - parts.window_partitions,
             (pl.recompute_from_ns - parts.max_request_ns - 2 * SKEW_NS) // parts.partition_ns)
    con.execute(f"delete from temp.main.{name} where part < {p0}")
    con.execute(f"insert into temp.main.{name} by name select * from {main}.{name} "
                f"where part >= {lo} and part < {p0}")


def _context_requests(con: duckdb.DuckDBPyConnection, main: str, pl: Plan,
                      parts: Partitioning) -> None:
    """The stored requests a slice reads as context (:func:`_with_context`,
    :func:`_take_stored_requests`), anchored before its region surely holds them whole
    (``recompute_from_ns`` + :data:`SKEW_NS`): ``_context_window``, the earlier requests of the
    windows of ``t0``'s partition, and ``_context_lookback``, those of the replica lookback
    (and those still in flight when it starts)."""
    whole_from = pl.recompute_from_ns + pl.skew_ns
    lo = pl.t0_ns // parts.partition_ns - parts.window_partitions
    since = whole_from - LOOKBACK_NS - parts.max_request_ns
    con.execute(f"create or replace temp table _context_window as select request_key "
                f"from {main}.requests where part >= {lo} and anchor_ns < {whole_from}")
    con.execute(f"create or replace temp table _context_lookback as select request_key "
                f"from {main}.requests where anchor_ns >= {since} and anchor_ns < {whole_from}")


def _new_requests(con: duckdb.DuckDBPyConnection, pl: Plan) -> None:
    """``_context_new``: the slice's requests its region surely holds whole (once ``requests``
    is built)."""
    con.execute(f"create or replace temp table _context_new as select request_key "
                f"from temp.main.requests where anchor_ns >= {pl.recompute_from_ns + pl.skew_ns}")


def _take_stored_requests(con: duckdb.DuckDBPyConnection, main: str, name: str, pl: Plan) -> None:
    """Replace the slice's rows of ``name`` (one of :data:`LOOKBACK_TAKEN`) of the requests its
    region may hold in part by the stored rows of the lookback's requests."""
    con.execute(f"delete from temp.main.{name} where request_key in (select request_key "
                f"from temp.main.requests where anchor_ns < {pl.recompute_from_ns + pl.skew_ns})")
    con.execute(f"insert into temp.main.{name} by name select * from {main}.{name} "
                f"where request_key in (select request_key from _context_lookback)")


def _with_context(db: str, body: str, inputs: tuple[str, ...], old_set: str, pl: Plan,
                  parts: Partitioning) -> str:
    """``body`` reading, for each of ``inputs``, the slice's rows of the requests of
    ``_context_new`` and the stored rows of the requests of ``old_set`` (see
    :func:`_context_requests`): common table expressions named after the inputs, which the
    relation's own references resolve to. ``raw_spans`` is the stored raw spans from the oldest
    start a request of the lookback may have (the relations read their decision spans)."""
    main = f'"{db}".main'
    new_keys = "request_key in (select request_key from _context_new)"
    old_keys = f"request_key in (select request_key from {old_set})"
    ctes = []
    for name in inputs:
        if name == "raw_spans":
            since = pl.recompute_from_ns - LOOKBACK_NS - 2 * parts.max_request_ns
            ctes.append(f"raw_spans as (select * from {main}.raw_spans where start_ns >= {since})")
            continue
        ctes.append(f"{name} as (select * from temp.main.{name} where {new_keys} "
                    f"union all by name select * from {main}.{name} where {old_keys})")
    return "with " + ",\n".join(ctes) + f"\nselect * from (\n{body}\n)"


def _new_only(body: str, inputs: tuple[str, ...]) -> str:
    """``body`` reading, for each of ``inputs``, the slice's rows of the requests of
    ``_context_new`` only (:data:`TAKEN_NEW_ONLY`)."""
    ctes = [f"{name} as (select * from temp.main.{name} "
            "where request_key in (select request_key from _context_new))" for name in inputs]
    return "with " + ",\n".join(ctes) + f"\nselect * from (\n{body}\n)"


def _ownership(columns: list[str]) -> str:
    """How a slice owns a relation's rows, from its columns (most specific key first)."""
    cols = set(columns)
    if "request_key" in cols:
        return "request"
    if "part" in cols:
        return "part"
    if "decision_key" in cols:
        return "decision"
    if "scraped_ns" in cols:
        return "scraped_ns"
    if "scraped_at" in cols:
        return "scraped_at"
    if "trace_id" in cols:
        return "trace"
    if "span_id" in cols:
        return "span"
    return "whole"


def _key_sets(con: duckdb.DuckDBPyConnection, side: str, schema: str, requests_where: str) -> None:
    """The keys of the requests of ``schema`` matching ``requests_where`` and of the rows that
    belong to them (decisions, traces, execution spans), as temporary tables ``_owned_<side>_*``
    that :func:`_owned` reads."""
    con.execute(f"create or replace temp table _owned_{side}_requests as "
                f"select request_key from {schema}.requests where {requests_where}")
    of_requests = f"request_key in (select request_key from _owned_{side}_requests)"
    for name, key, relation in (("decisions", "decision_key", "int_attr_decisions_resolved"),
                                ("traces", "distinct trace_id", "int_request_spans"),
                                ("spans", "span_id", "executions")):
        con.execute(f"create or replace temp table _owned_{side}_{name} as "
                    f"select {key} from {schema}.{relation} where {of_requests}")


GROWING_KEYS: Final = {"herding_episodes": "episode_id"}
"""Partition-owned relations whose row can move to a later partition as new rows join it (an
episode's partition is its latest member's): a slice that recomputes the row replaces the stored
row of the same key wherever it was."""

_KEYED: Final = {"request": ("request_key", "requests"), "decision": ("decision_key", "decisions"),
                  "trace": ("trace_id", "traces"), "span": ("span_id", "spans")}
"""Ownership kinds decided by a key set :func:`_key_sets` prepares: (key column, set name)."""


def _owned(kind: str, side: str, t0: int, parts: Partitioning) -> str:
    """The predicate selecting the owned rows of a relation on ``side`` (``old``: as stored,
    ``new``: as recomputed), over the key sets :func:`refresh` prepares."""
    if kind in _KEYED:
        column, keys = _KEYED[kind]
        return f"{column} in (select {column} from _owned_{side}_{keys})"
    if kind == "part":
        return f"part >= {t0 // parts.partition_ns}"
    if kind == "scraped_ns":
        return f"scraped_ns >= {t0}"
    if kind == "scraped_at":
        return f"epoch_ns(scraped_at) >= {t0}"
    return "true"


def refresh(con: duckdb.DuckDBPyConnection,
            before_commit: Callable[[duckdb.DuckDBPyConnection, int], None] | None = None,
            on_plan: Callable[[Plan], None] | None = None,
            on_built: Callable[[str, float], None] | None = None,
            store_path: str | os.PathLike[str] | None = None,
            reopened: _closed.Moved | None = None) -> int | None:
    """Recompute the slice new rows reach and replace the rows it owns, in one transaction.

    Returns the number of ``raw_spans`` rows in the transaction's snapshot (as
    ``_relations.refresh`` does), or None when there was nothing to do. Requires relations built
    by this version (a full rebuild first). ``con`` must be a cursor of its own: the slice's
    temporary relations live on it until it closes. ``on_built(step, seconds)`` is called after
    each relation is built over the slice and after each stored table is rewritten (benchmarks
    time them).

    ``store_path``: the store's file, whose closed partitions (audit._closed) a slice reaching
    them re-opens in this transaction; what it moved back is added to ``reopened`` (its folders
    are deleted here once the transaction has committed).

    The slice assumes the clocks of its time are off by at most what the store measured around
    it (:func:`assumed_skew`); when the offsets it computes exceed that, it is rolled back and
    run again assuming :data:`SKEW_NS`."""
    try:
        return _refresh(con, before_commit, on_plan, on_built, store_path, reopened, None)
    except _SkewExceeded:
        return _refresh(con, before_commit, on_plan, on_built, store_path, reopened, SKEW_NS)


class _SkewExceeded(Exception):
    """A slice found clock offsets larger than it assumed (it was rolled back)."""


def assumed_skew(con: duckdb.DuckDBPyConnection, parts: Partitioning) -> int:
    """The clock offset a slice assumes at most: the largest the store measured over the
    partitions around the new rows, plus :data:`SKEW_MARGIN_NS`, at most :data:`SKEW_NS`."""
    dirty_min = con.execute(f"select min(start_ns) from {DIRTY_TABLE}").fetchall()[0][0]
    if dirty_min is None:
        return SKEW_NS
    since = int(dirty_min) // parts.partition_ns - parts.window_partitions - 1
    seen = con.execute("select max(abs(offset_ns)) from int_clock_offsets where part >= ?",
                       [since]).fetchall()[0][0]
    return min(SKEW_NS, int(seen or 0) + SKEW_MARGIN_NS)


def _refresh(con: duckdb.DuckDBPyConnection,
             before_commit: Callable[[duckdb.DuckDBPyConnection, int], None] | None,
             on_plan: Callable[[Plan], None] | None,
             on_built: Callable[[str, float], None] | None,
             store_path: str | os.PathLike[str] | None,
             reopened: _closed.Moved | None,
             skew_ns: int | None) -> int | None:
    rels = _relations.load_relations()
    as_views = _relations.views(rels)
    db = con.execute("select current_database()").fetchall()[0][0]
    main = f'"{db}".main'
    moved = _closed.Moved()
    with _transaction(con):
        parts = Partitioning.read(con)
        pl = plan(con, parts, assumed_skew(con, parts) if skew_ns is None else skew_ns)
        if pl is None:
            return None
        if store_path is not None:
            pl = _reopen_reached(con, store_path, parts, pl, moved)
        kept = con.execute("select value from routeaudit_meta where key = ?",
                           [VERDICTS_KEPT_FROM]).fetchall()
        if moved.partitions or (kept and int(kept[0][0]) > pl.read_from_ns):
            # the stored rows of the windows are not all there: re-opened partitions keep no
            # intermediate rows, and retention may have deleted derived rows the windows read
            pl = pl.without_stored_windows()
        if on_plan is not None:
            on_plan(pl)
        spans = int(con.execute("select count(*) from raw_spans").fetchall()[0][0])
        _restrict_raw(con, db, pl, parts)
        # The requests anchored before t0 are context: other rows read them, none is stored.
        # The settings the slice's relations read say so (stg_partitioning.judge_from_ns), and
        # the costliest per-candidate work skips them. When the windowed summaries read the
        # stored rows of those requests, nothing reads their candidates' state either
        # (context_from_ns: their in-flight work is not looked up).
        stored_windows = pl.recompute_from_ns > pl.read_from_ns
        context = f"union all select 'context_from_ns', '{int(pl.t0_ns)}'" if stored_windows else ""
        con.execute(f"create or replace temp view routeaudit_meta as "
                    f"select * from {main}.routeaudit_meta "
                    f"where key not in ('judge_from_ns', 'context_from_ns') "
                    f"union all select 'judge_from_ns', '{int(pl.t0_ns)}' {context}")
        if stored_windows:
            _context_requests(con, main, pl, parts)
        once = _computed_once(con, rels)
        # a view no table of the slice reads is not created: the slice stores nothing from it
        # (binding a mart view binds every view under it, a tenth of a small slice's time)
        as_tables = {r.name for r in rels if r.name not in as_views or r.name in once}
        needed = _relations.upstream(rels, as_tables)
        for rel in rels:
            if rel.name not in needed:
                continue
            kind = "view" if rel.name in as_views and rel.name not in once else "table"
            body = rel.sql.strip().rstrip(";")
            started = time.perf_counter()
            if stored_windows and rel.name in WINDOW_INPUTS:
                body = _with_context(db, body, WINDOW_INPUTS[rel.name], "_context_window",
                                     pl, parts)
            elif stored_windows and rel.name in LOOKBACK_INPUTS:
                body = _with_context(db, body, LOOKBACK_INPUTS[rel.name], "_context_lookback",
                                     pl, parts)
            elif stored_windows and rel.name in TAKEN_NEW_ONLY:
                body = _new_only(body, TAKEN_NEW_ONLY[rel.name])
            try:
                con.execute(f"create or replace temp {kind} {rel.name} as\n{body}")
                if stored_windows and rel.name in PART_CONTEXT:
                    _take_stored_partitions(con, main, rel.name, pl, parts)
                if stored_windows and rel.name == "requests":
                    _new_requests(con, pl)
                if stored_windows and rel.name in LOOKBACK_TAKEN:
                    _take_stored_requests(con, main, rel.name, pl)
            except duckdb.Error as exc:
                raise StoreError(f"relation {rel.layer}/{rel.name}.sql does not build over a "
                                 f"slice: {_relations._first(exc)}") from exc
            if on_built is not None:
                on_built(f"build {rel.name}", time.perf_counter() - started)
        if pl.skew_ns < SKEW_NS:
            # the offsets correcting the spans of the requests the slice owns, as it computed
            # them: the region holds those requests whole only if none exceeds the assumption
            seen = con.execute("select max(abs(offset_ns)) from temp.main.int_clock_offsets "
                               "where part >= ?",
                               [pl.recompute_from_ns // parts.partition_ns]).fetchall()[0][0]
            if seen is not None and int(seen) > pl.skew_ns - SKEW_MARGIN_NS // 2:
                raise _SkewExceeded
        # the newest event time, as `requests` computes its watermark from it
        newest_ns = con.execute("select max(corrected_start_ns) "
                                "from temp.main.int_spans_clock_corrected").fetchall()[0][0]
        t0 = pl.t0_ns
        # The keys the slice owns, as stored before and as recomputed.
        _key_sets(con, "old", main, f"anchor_ns >= {t0}")
        _key_sets(con, "new", "temp.main", f"anchor_ns >= {t0}")
        per_run = False
        for relation, table, cols in _derived_tables(con):
            started = time.perf_counter()
            kind = _ownership(cols)
            names = ", ".join(f'"{c}"' for c in cols)
            if kind == "whole" and table != relation:
                if "run_id" not in cols:
                    raise StoreError(f"{table} has no key a slice can own its rows by")
                per_run = True
                continue
            grown = ""
            if kind == "part" and relation in GROWING_KEYS:
                key = GROWING_KEYS[relation]
                grown = (f" or {key} in (select {key} from temp.main.{relation} "
                         f"where {_owned(kind, 'new', t0, parts)})")
            con.execute(f"delete from {main}.{table} "
                        f"where {_owned(kind, 'old', t0, parts)} "
                        f"or {_owned(kind, 'new', t0, parts)}{grown}")
            order = " order by anchor_ns, request_key" if "anchor_ns" in cols else ""
            con.execute(f"insert into {main}.{table} ({names}) "
                        f"select {names} from temp.main.{relation} "
                        f"where {_owned(kind, 'new', t0, parts)}{order}")
            if on_built is not None:
                on_built(f"replace {table}", time.perf_counter() - started)
        # A default-SLO table with no rows of its own time (per run over the store: slo_summary,
        # calibration) is recomputed for the runs the slice touched by refresh_runs, after this
        # transaction: the slice only marks them. Traffic without a run id is one run.
        if per_run:
            con.execute(f"insert into {main}.{RUNS_DUE_TABLE} select distinct run_id from ("
                        "select run_id, request_key from main.requests union all "
                        "select run_id, request_key from temp.main.requests) as r "
                        "where request_key in (select request_key from _owned_old_requests "
                        "union all select request_key from _owned_new_requests) "
                        f"and not exists (select 1 from {main}.{RUNS_DUE_TABLE} as d "
                        "where d.run_id is not distinct from r.run_id)")
        # the slice's temporary relations shadow stored tables the rest writes
        _drop_temp(con)
        if newest_ns is not None:
            _finalise(con, main, parts, int(newest_ns) - parts.lateness_ns)
        con.execute(f"delete from {main}.{DIRTY_TABLE}")
        if before_commit is not None:
            before_commit(con, spans)
    if store_path is not None and moved.partitions:
        _closed.forget(store_path, moved, _closed.closed_until(con), parts.partition_ns)
        if reopened is not None:
            reopened.spans += moved.spans
            reopened.partitions += moved.partitions
    return spans


def refresh_runs(con: duckdb.DuckDBPyConnection,
                 store_path: str | os.PathLike[str] | None = None,
                 on_built: Callable[[str, float], None] | None = None) -> int:
    """Recompute the per-run rows of the runs slices marked (:data:`RUNS_DUE_TABLE`) from the
    live views over the stored tables, closed partitions included (``store_path``), and delete
    the marks, in one transaction. Returns the runs recomputed (0: none was marked). ``con``: a
    cursor of its own."""
    db = con.execute("select current_database()").fetchall()[0][0]
    main = f'"{db}".main'
    with _transaction(con):
        runs = [r[0] for r in con.execute(f"select distinct run_id from {main}.{RUNS_DUE_TABLE}")
                .fetchall()]
        if not runs:
            return 0
        named = [r for r in runs if r is not None]
        touched = " or ".join((["run_id in (select unnest(?::varchar[]))"] if named else [])
                              + (["run_id is null"] if None in runs else []))
        params = [named] if named else []
        if store_path is not None:
            # per-run rows are over every partition, closed ones included
            _closed.install_views(con, store_path)
        for relation, table, cols in _derived_tables(con):
            if table == relation or _ownership(cols) != "whole":
                continue
            started = time.perf_counter()
            names = ", ".join(f'"{c}"' for c in cols)
            con.execute(f"delete from {main}.{table} where {touched}", params)
            con.execute(f"insert into {main}.{table} ({names}) select {names} "
                        f"from {main}.{relation}{_relations.LIVE_SUFFIX} where {touched}", params)
            if on_built is not None:
                on_built(f"replace {table}", time.perf_counter() - started)
        con.execute(f"delete from {main}.{RUNS_DUE_TABLE}")
    return len(runs)


@contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """A transaction on ``con`` committed when the block ends, rolled back if it raises; the
    temporary objects made in it are dropped either way."""
    con.execute("begin transaction")
    try:
        yield
        con.execute("commit")
    except BaseException:
        con.execute("rollback")
        raise
    finally:
        _drop_temp(con)


def _finalise(con: duckdb.DuckDBPyConnection, main: str, parts: Partitioning,
              watermark_ns: int) -> None:
    """Mark final the stored rows of the requests the watermark has now passed (their partition's
    end + ``max_request_s``), as ``requests`` computes ``verdict_final``.

    Nothing else in them changes: every slice that a span of partition ``p`` reaches recomputes
    the whole of ``p`` and everything after it, so the rows of ``p`` stored after its last span
    arrived already read its complete summaries and windows; only the flag waits for the
    watermark."""
    con.execute(f"create or replace temp table _finalised as select request_key "
                f"from {main}.requests where not verdict_final "
                f"and (part::hugeint + 1) * {parts.partition_ns} + {parts.max_request_ns} "
                f"<= {watermark_ns}")
    if not con.execute("select count(*) from _finalised").fetchall()[0][0]:
        return
    for _relation, table, columns in _derived_tables(con):
        cols = set(columns)
        if "verdict_final" not in cols:
            continue
        if "request_key" not in cols:
            raise StoreError(f"{table} carries verdict_final without request_key")
        con.execute(f"update {main}.{table} set verdict_final = true where not verdict_final "
                    f"and request_key in (select request_key from _finalised)")


def far_ns(pl: Plan, parts: Partitioning) -> int:
    """The oldest raw start a slice reads: its region, and the earlier spans of the traces
    reaching into it (:func:`_restrict_raw`)."""
    return pl.read_from_ns - parts.max_request_ns - SKEW_NS


def _reopen_reached(con: duckdb.DuckDBPyConnection, store_path: str | os.PathLike[str],
                    parts: Partitioning, pl: Plan, moved: _closed.Moved) -> Plan:
    """Re-open the closed partitions the slice reaches, and plan again over the rows they
    bring back (a request they hold may pull ``t0`` further back), until it reaches none."""
    while True:
        until = _closed.closed_until(con)
        if until is None or far_ns(pl, parts) >= until * parts.partition_ns:
            return pl
        back = _closed.reopen(con, store_path, far_ns(pl, parts) // parts.partition_ns)
        moved.spans += back.spans
        moved.partitions += back.partitions
        moved.stale += back.stale
        again = plan(con, parts, pl.skew_ns)
        assert again is not None  # the marks that planned the slice are still there
        pl = again


def horizon(con: duckdb.DuckDBPyConnection) -> tuple[int | None, int | None]:
    """(end of the newest final partition, newest request anchor) in the stored relations."""
    row = con.execute(
        "select max(case when r.verdict_final then (r.part + 1) * p.partition_ns end), "
        "max(r.anchor_ns) from requests as r cross join stg_partitioning as p").fetchall()[0]
    return (None if row[0] is None else int(row[0]), None if row[1] is None else int(row[1]))


def _drop_temp(con: duckdb.DuckDBPyConnection) -> None:
    """The slice's temporary objects go with it (a cursor may be reused): views first, as they
    read the tables."""
    try:
        rows = con.execute("select table_name, table_type from information_schema.tables "
                           "where table_catalog = 'temp' order by table_type = 'VIEW' desc").fetchall()
        for name, kind in rows:
            con.execute(f"drop {'view' if kind == 'VIEW' else 'table'} if exists temp.main.\"{name}\"")
    except duckdb.Error:
        pass


@dataclass(frozen=True)
class Retained:
    """What :func:`drop_before` removed, and from when the store now holds rows (Unix ns)."""

    raw_from_ns: int | None
    verdicts_from_ns: int | None
    spans_deleted: int
    requests_deleted: int


RAW_KEPT_FROM: Final = "raw_kept_from_ns"
"""routeaudit_meta key: raw rows older than this were deleted by retention; slices never reach
back before it (their windows would read rows that are gone)."""

VERDICTS_KEPT_FROM: Final = "verdicts_kept_from_ns"
"""routeaudit_meta key: derived rows anchored before this were deleted by retention; a slice
whose windows reach before it recomputes them from raw rows instead of reading stored ones."""


def _computed_once(con: duckdb.DuckDBPyConnection,
                   rels: list[_relations.Relation]) -> set[str]:
    """The parametrised relations a slice computes as temporary tables instead of views: those
    its default-SLO tables are replaced from (but the per-run ones :func:`refresh_runs`
    recomputes) and what they read. Several of those tables read one relation (three read
    ``int_attr_requests_placed``): as a view it was computed again for each. A slice runs with
    no session variable set, so each table holds the view's rows at the defaults."""
    replaced = {name for (name, table, cols) in _derived_tables(con)
                if table != name and _ownership(cols) != "whole"}
    # the relations they read that are not parametrised are stored tables already
    return _relations.upstream(rels, replaced) & _relations.parametrised(rels)


def _derived_tables(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, list[str]]]:
    """(relation, stored table, the table's columns) for every stored table of derived rows, in
    build order: the relations stored as tables, and the default-SLO tables of the cached views.
    The columns come from one catalog query (a ``describe`` per table cost a slice of a small
    store 0.1 s)."""
    rels = _relations.load_relations()
    as_views = _relations.views(rels)
    cached = set(_relations.cached(rels))
    stored: dict[str, list[str]] = {}
    for table, column in con.execute(
            "select c.table_name, c.column_name from duckdb_columns() as c "
            "inner join duckdb_tables() as t using (database_name, schema_name, table_name) "
            "where c.database_name = current_database() and c.schema_name = 'main' "
            "order by c.table_name, c.column_index").fetchall():
        stored.setdefault(str(table), []).append(str(column))
    out: list[tuple[str, str, list[str]]] = []
    for rel in rels:
        if rel.name not in as_views and rel.name in stored:
            out.append((rel.name, rel.name, stored[rel.name]))
        table = rel.name + _relations.CACHE_SUFFIX
        if rel.name in cached and table in stored:
            out.append((rel.name, table, stored[table]))
    return out


def drop_before(con: duckdb.DuckDBPyConnection, *, raw_keep_ns: int | None,
                verdicts_keep_ns: int | None) -> Retained:
    """Delete whole partitions older than the newest event time minus ``raw_keep_ns`` (raw rows)
    and minus ``verdicts_keep_ns`` (derived rows), in one transaction; None keeps everything.

    Time is the store's own (its newest span start), not the wall clock, so a replay of old
    traffic is not emptied. Raw rows go by their own start (a trace straddling the cut loses
    its older spans); derived rows by the anchor of their request (or their partition, or
    scrape time), the same ownership a slice uses."""
    with _transaction(con):
        parts = Partitioning.read(con)
        newest = con.execute("select max(start_ns) from raw_spans").fetchall()[0][0]
        raw_cut = verdict_cut = None
        spans_deleted = requests_deleted = 0
        if newest is not None and raw_keep_ns is not None:
            raw_cut = parts.start_of(int(newest) - raw_keep_ns)
            con.execute("delete from raw_span_events where (trace_id, span_id) in "
                        "(select trace_id, span_id from raw_spans where start_ns < ?)", [raw_cut])
            spans_deleted = int(con.execute(
                "delete from raw_spans where start_ns < ?", [raw_cut]).fetchall()[0][0])
            _span_keys.delete_keys(con, f"start_ns < {int(raw_cut)}")
            con.execute("delete from raw_snapshots where scraped_ns < ?", [raw_cut])
            # the relations had read the deleted spans: their count of spans read follows
            con.execute("update routeaudit_meta set value = cast(greatest(0, try_cast(value as "
                        "bigint) - ?) as varchar) where key = 'relations_spans'", [spans_deleted])
            con.execute(f"delete from {DIRTY_TABLE} where start_ns < ?", [raw_cut])
            kept = con.execute("select value from routeaudit_meta where key = ?",
                               [RAW_KEPT_FROM]).fetchall()
            if not kept or int(kept[0][0]) < raw_cut:
                con.execute("insert or replace into routeaudit_meta values (?, ?)",
                            [RAW_KEPT_FROM, str(raw_cut)])
        if newest is not None and verdicts_keep_ns is not None:
            verdict_cut = parts.start_of(int(newest) - verdicts_keep_ns)
            kept = con.execute("select value from routeaudit_meta where key = ?",
                               [VERDICTS_KEPT_FROM]).fetchall()
            if not kept or int(kept[0][0]) < verdict_cut:
                con.execute("insert or replace into routeaudit_meta values (?, ?)",
                            [VERDICTS_KEPT_FROM, str(verdict_cut)])
            _key_sets(con, "old", "main", f"anchor_ns < {verdict_cut}")
            requests_deleted = int(con.execute(
                "select count(*) from _owned_old_requests").fetchall()[0][0])
            for _, table, cols in _derived_tables(con):
                kind = _ownership(cols)
                if kind == "whole":
                    continue
                if kind == "part":
                    where = f"part < {verdict_cut // parts.partition_ns}"
                elif kind == "scraped_ns":
                    where = f"scraped_ns < {verdict_cut}"
                elif kind == "scraped_at":
                    where = f"epoch_ns(scraped_at) < {verdict_cut}"
                else:
                    where = _owned(kind, "old", 0, parts)
                con.execute(f"delete from main.{table} where {where}")
    return Retained(raw_cut, verdict_cut, spans_deleted, requests_deleted)


def raw_kept_from(con: duckdb.DuckDBPyConnection) -> int | None:
    """Where retention cut the raw rows (None: nothing deleted)."""
    rows = con.execute("select value from routeaudit_meta where key = ?", [RAW_KEPT_FROM]).fetchall()
    return int(rows[0][0]) if rows else None
