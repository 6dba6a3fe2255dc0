"""Closed partitions: old time partitions moved out of the DuckDB file into zstd Parquet beside it.

A partition is *closed* once no refresh can reach it: its verdicts are final and every slice
that starts at or after the final horizon reads raw rows only from later partitions
(:func:`reach_ns`). Its rows then leave the DuckDB tables for ``<store>.parquet/<table>/part=<p>/``
(a Hive layout that DuckDB, polars and Spark read without routeaudit); the DuckDB file keeps only
the open partitions, so what a refresh deletes and rewrites, and what the file holds, follows the
recent traffic rather than the history (docs/architecture.md, "Closed partitions").

Readers see each table as one: :func:`install_views` creates, on a connection, a temporary view
of every table's name over its DuckDB rows and its Parquet files of partitions below
``closed_until`` (the store's record, ``routeaudit_meta``). Files of later partitions are never
read: a close that did not commit leaves them behind, and the next close overwrites them.

A row that arrives later than that re-opens the partitions its slice reaches
(:func:`reopen`): their rows move back into the DuckDB tables in the refresh's own transaction,
and they close again once the horizon has passed them.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from audit import _incremental, _relations, _span_keys
from audit.schema import RAW_TABLES

FOLDER_SUFFIX: Final = ".parquet"
"""Closed partitions of ``store.duckdb`` live in ``store.duckdb.parquet/``."""

CLOSED_UNTIL: Final = "closed_until_part"
"""routeaudit_meta key: partitions below this one are in Parquet (absent: none is)."""

MARKER: Final = "_closed.json"
"""Written in the folder after each change, for engines that read the folder directly: the
partitions below ``closed_until_part`` are the closed ones."""

COMPRESSION: Final = "zstd"

COMPRESSION_LEVEL: Final = 6
"""zstd's level for closed partitions: against the default 3, 2.3 % fewer bytes for 12 % more
time writing them (a soak store's closed partitions, every table; docs/performance.md)."""

WINDOW_FROM_VARIABLE: Final = "routeaudit_window_from_ns"
"""Session variable a reader of a time window sets to the window's start (Unix ns): the views
over closed partitions then neither list nor read the partitions that no row of the window's
requests can come from (:func:`install_views`). Unset (and :data:`WINDOW_TO_VARIABLE` unset),
every closed partition is read."""

WINDOW_TO_VARIABLE: Final = "routeaudit_window_to_ns"
"""Like :data:`WINDOW_FROM_VARIABLE`, the window's end (Unix ns): the partitions after those
its requests' rows can lie in are skipped too."""

SUMMARY_TABLE: Final = "routeaudit_closed_requests"
"""Stored table with one row per closed partition: its ``requests`` rows, and the oldest and
newest start among them (``first_at`` / ``last_at``). Written in the same transaction as the
partition's move, so the store's range (:data:`RANGE_VIEW`) never reads the Parquet files."""

RANGE_VIEW: Final = "routeaudit_requests_range"
"""Temporary view :func:`install_views` makes beside the others, in one row: ``requests``,
``first_at``, ``last_at`` over every request the ``requests`` view reads (the DuckDB rows and
the closed partitions' :data:`SUMMARY_TABLE` rows), without opening a closed partition."""

RANGE_COLUMN: Final = "first_seen_at"
"""The start of a request the range reports (the dashboard's ``REQUEST_AT``)."""

GENERATION: Final = "closed_generation"
"""routeaudit_meta key bumped by every close and re-open, in its transaction: a reader that
listed the partition folders under the same generation (and ``closed_until``) lists the same
folders, so it keeps the listing instead of walking thousands of folders per query."""

KEY_TABLES: Final = ("requests", "int_attr_decisions_resolved", "int_request_spans", "executions")
"""Read by a slice's plan and key sets (audit._incremental), so kept for closed partitions:
when one re-opens, the rows it brings back are found and replaced."""


def folder(store_path: str | os.PathLike[str]) -> Path:
    """The folder of a store's closed partitions."""
    return Path(f"{os.fspath(store_path)}{FOLDER_SUFFIX}").absolute()


def reach_ns(parts: _incremental.Partitioning) -> int:
    """How far before the final horizon a later refresh may read or write rows: a slice's
    ``t0`` is at most :data:`~audit._incremental.SKEW_NS` before a new span's start, its region
    reaches back over the window partitions (and the partition of ``t0 − SKEW``) or the replica
    lookback, and a trace reaching into the region brings spans up to ``max_request`` earlier."""
    skew = _incremental.SKEW_NS
    window = (parts.window_partitions + 1) * parts.partition_ns + skew
    return max(window, _incremental.LOOKBACK_NS + skew) + parts.max_request_ns + 2 * skew


def kept_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The stored tables whose rows of closed partitions are kept: raw rows, the relations a
    reader queries (public ones and the default-SLO tables), the tables the live views read,
    and :data:`KEY_TABLES`. The steps in between are dropped: a re-opened partition is
    recomputed from its raw rows."""
    rels = _relations.load_relations()
    by_name = {r.name: r for r in rels}
    as_views = _relations.views(rels)
    kept = set(RAW_TABLES) | set(KEY_TABLES) | set(_relations.public_relations())
    kept |= {name + _relations.CACHE_SUFFIX for name in _relations.cached(rels)}
    stack = [n for n in as_views]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        for dep in _relations.reads(by_name[name].sql):
            if dep in by_name and dep not in seen:
                seen.add(dep)
                if dep in as_views:
                    stack.append(dep)
                else:
                    kept.add(dep)
    stored = {r[0] for r in con.execute(
        "select table_name from information_schema.tables where table_catalog = "
        "current_database() and table_schema = 'main' and table_type = 'BASE TABLE'").fetchall()}
    return kept & stored


def closed_until(con: duckdb.DuckDBPyConnection) -> int | None:
    """The first partition not closed (None: none is)."""
    try:
        rows = con.execute("select value from routeaudit_meta where key = ?",
                           [CLOSED_UNTIL]).fetchall()
    except duckdb.CatalogException:
        return None  # not a store (yet)
    return int(rows[0][0]) if rows else None


def closed_until_ns(con: duckdb.DuckDBPyConnection) -> int | None:
    """Where the closed partitions end, in event time (None: none is closed)."""
    until = closed_until(con)
    return None if until is None else until * _incremental.Partitioning.read(con).partition_ns


def allow(con: duckdb.DuckDBPyConnection, store_path: str | os.PathLike[str]) -> None:
    """Let ``con`` read (and the writer write) the store's Parquet folder once external access
    is switched off: call before ``set enable_external_access = false``."""
    con.execute("set allowed_directories = ?", [[f"{folder(store_path)}/"]])


def _table_dirs(root: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_dir())
    except FileNotFoundError:
        return []


def _has_files(table_dir: Path, below: int) -> bool:
    try:
        for e in os.scandir(table_dir):
            p = _part_of(e.name)
            if e.is_dir() and p is not None and p < below:
                if any(f.name.endswith(".parquet") for f in os.scandir(e.path)):
                    return True
    except FileNotFoundError:
        return False
    return False


def _glob(root: Path, table: str) -> str:
    return f"{root / table}/part=*/*.parquet".replace("'", "''")


def _parts_below(table_dir: Path, below: int) -> list[tuple[int, int]]:
    """The partitions below ``below`` that have a folder in ``table_dir``, as runs
    ``[first, end)`` of consecutive ones (one run for a table with rows in every partition)."""
    parts = sorted(p for p in map(_part_of, _table_dirs(table_dir)) if p is not None and p < below)
    runs: list[tuple[int, int]] = []
    for p in parts:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


def _files(root: Path, table: str, runs: list[tuple[int, int]], lo: str, hi: str) -> str:
    """The files argument of ``read_parquet`` for ``table``'s closed partitions: with a window
    bound (``lo`` / ``hi``, partitions, constants once the window's variables are bound), one
    folder per partition of ``runs`` in ``[lo, hi)``, so DuckDB lists only those; without one,
    the glob of every folder. ``runs`` lists only folders that exist (a pattern matching no
    file is an error): when none is in the window, the newest stands in, and the view's filter
    on ``part`` drops its rows."""
    prefix = f"{root / table}/part=".replace("'", "''")
    listed = ", ".join(f"[{a}, {b}]" for a, b in runs)
    wanted = (f"flatten(list_transform([{listed}], "
              f"lambda r: range(greatest(r[1], {lo}), least(r[2], {hi}))))")
    some = f"case when len({wanted}) = 0 then [{runs[-1][1] - 1}] else {wanted} end"
    return (f"case when getvariable('{WINDOW_FROM_VARIABLE}') is null "
            f"and getvariable('{WINDOW_TO_VARIABLE}') is null then ['{_glob(root, table)}'] "
            f"else list_transform({some}, lambda p: '{prefix}' || p || '/*.parquet') end")


def _columns(con: duckdb.DuckDBPyConnection, qualified: str) -> list[tuple[str, str]]:
    return [(str(r[0]), str(r[1])) for r in con.execute(f"describe {qualified}").fetchall()]


def _closed_select(root: Path, table: str, cols: list[tuple[str, str]], where: str,
                   files: str | None = None) -> str:
    """The Parquet rows of ``table`` in the stored table's columns and types (``part`` comes
    from the folder name: a table with a column of that name has it written there), read from
    ``files`` (an expression, :func:`_files`; None: every folder's)."""
    # Cast where Parquet does not give the stored type back (a union with the DuckDB rows must
    # not widen a column), and only there: a cast column's filters no longer reach the scan.
    names = ", ".join(f'"{name}"' if _round_trips(typ) and name != "part"
                      else f'cast("{name}" as {typ}) as "{name}"' for name, typ in cols)
    files = f"'{_glob(root, table)}'" if files is None else files
    return (f"select {names} from read_parquet({files}, hive_partitioning = true)"
            f" where {where}")


_ROUND_TRIP: Final = frozenset({
    "VARCHAR", "BIGINT", "INTEGER", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT", "BOOLEAN",
    "DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "BLOB"})
"""Types a Parquet file written by DuckDB reads back as (others, like DECIMAL and HUGEINT,
may come back wider or as DOUBLE)."""


def _round_trips(typ: str) -> bool:
    while typ.endswith("[]"):
        typ = typ[:-2]
    return typ in _ROUND_TRIP


def window_bounds(parts: _incremental.Partitioning, until: int) -> tuple[str, str]:
    """SQL of the first partition a reader of the window its variables name needs and of the
    first after them (partitions), at most ``until`` (:func:`install_views`)."""
    w, reach = parts.partition_ns, reach_ns(parts)
    lo = f"coalesce((getvariable('{WINDOW_FROM_VARIABLE}') - {reach}) // {w}, {-(2**63)})"
    hi = (f"least({until}, coalesce((getvariable('{WINDOW_TO_VARIABLE}') + {reach}) // {w} + 1, "
          f"{until}))")
    return lo, hi


def _meta(con: duckdb.DuckDBPyConnection, keys: list[str]) -> dict[str, str]:
    try:
        rows = con.execute("select key, value from routeaudit_meta where key in "
                           "(select unnest(?::varchar[]))", [keys]).fetchall()
    except duckdb.CatalogException:
        return {}  # not a store (yet)
    return {str(k): str(v) for k, v in rows}


_LISTED: dict[Path, tuple[tuple[int, str], dict[str, list[tuple[int, int]]]]] = {}
_LISTED_LOCK = threading.Lock()


def _listed_runs(root: Path, until: int, generation: str | None) -> dict[str, list[tuple[int, int]]]:
    """Each table's folders of partitions below ``until`` as runs (:func:`_parts_below`), for
    the tables with files there. Listed once per generation of the closed partitions: the
    folders change only with a close or re-open (which bump it) or a retention drop (whose cut
    :func:`_clip` applies); a store written without the generation key is listed every time."""
    key = (until, generation or "")
    if generation is not None:
        with _LISTED_LOCK:
            hit = _LISTED.get(root)
        if hit is not None and hit[0] == key:
            return hit[1]
    runs = {t: r for t in _table_dirs(root)
            if _has_files(root / t, until) and (r := _parts_below(root / t, until))}
    if generation is not None:
        with _LISTED_LOCK:
            _LISTED[root] = (key, runs)
    return runs


def _clip(runs: list[tuple[int, int]], cut: int | None) -> list[tuple[int, int]]:
    """``runs`` without the partitions below ``cut`` (retention's: their folders are going)."""
    if cut is None:
        return runs
    return [(max(a, cut), b) for a, b in runs if b > cut]


def _cuts(meta: dict[str, str], w: int) -> tuple[int | None, int | None]:
    """(raw, derived) partitions below which retention dropped the closed partitions."""
    raw, derived = (meta.get(k) for k in (_incremental.RAW_KEPT_FROM,
                                          _incremental.VERDICTS_KEPT_FROM))
    return (None if raw is None else int(raw) // w, None if derived is None else int(derived) // w)


def install_views(con: duckdb.DuckDBPyConnection, store_path: str | os.PathLike[str]) -> int:
    """On ``con``, a temporary view of each stored table that has closed partitions, under the
    table's own name: its DuckDB rows and its Parquet rows as one. Views that read the table
    by name (the parametrised relations) then read both. Also :data:`RANGE_VIEW` when the store
    keeps :data:`SUMMARY_TABLE`. Returns how many views of tables it made.

    Every query through the collector runs on a cursor of its own, so this runs per query: the
    folders are listed once per generation of the closed partitions, the columns of every table
    come from one catalog query and the views from one statement."""
    meta = _meta(con, [CLOSED_UNTIL, GENERATION, _incremental.RAW_KEPT_FROM,
                       _incremental.VERDICTS_KEPT_FROM])
    if CLOSED_UNTIL not in meta:
        return 0
    until = int(meta[CLOSED_UNTIL])
    root = folder(store_path)
    parts = _incremental.Partitioning.read(con)
    raw_cut, derived_cut = _cuts(meta, parts.partition_ns)
    runs = {t: clipped for t, r in _listed_runs(root, until, meta.get(GENERATION)).items()
            if (clipped := _clip(r, raw_cut if t in RAW_TABLES else derived_cut))}
    tables = list(runs)
    if not tables:
        return 0
    db = con.execute("select current_database()").fetchall()[0][0]
    cols: dict[str, list[tuple[str, str]]] = {}
    for table, name, typ in con.execute(
            "select table_name, column_name, data_type from duckdb_columns() "
            "where database_name = ? and schema_name = 'main' and table_name in "
            "(select unnest(?::varchar[])) order by table_name, column_index",
            [db, tables + [SUMMARY_TABLE]]).fetchall():
        cols.setdefault(str(table), []).append((str(name), str(typ)))
    summary = cols.pop(SUMMARY_TABLE, None)
    # A window's requests are anchored at or after its start; what their rows read (windowed
    # fits, lookbacks, executions still running) lies at most reach_ns before it, and every
    # closed row sits in the partition of its request's anchor (or its own time). Symmetrically
    # a request started by the window's end has its rows (a span starts at most max_request
    # after it, on a clock at most the skew off) within reach_ns after it. The bounds are
    # constants once the variables are bound, so DuckDB lists the folders of those partitions
    # only: listing every folder costs a query tens of ms per table at thousands of partitions.
    lo, hi = window_bounds(parts, until)
    where = f"part >= {lo} and part < {hi}"
    statements = []
    for table, columns in cols.items():
        qualified = f'"{db}".main."{table}"'
        names = ", ".join(f'"{name}"' for name, _ in columns)
        files = _files(root, table, runs[table], lo, hi)
        statements.append(
            f'create or replace temp view "{table}" as select {names} from {qualified} '
            f"union all {_closed_select(root, table, columns, where, files)}")
    if summary is not None and "requests" in cols:
        # the rows the requests view reads: every DuckDB row, and the closed partitions below
        # closed_until that retention kept
        kept = "true" if derived_cut is None else f"part >= {derived_cut}"
        statements.append(
            f"create or replace temp view {RANGE_VIEW} as select "
            "cast(coalesce(sum(requests), 0) as bigint) as requests, min(first_at) as first_at, "
            "max(last_at) as last_at from ("
            f"select count(*) as requests, min({RANGE_COLUMN}) as first_at, "
            f'max({RANGE_COLUMN}) as last_at from "{db}".main.requests union all '
            f'select requests, first_at, last_at from "{db}".main.{SUMMARY_TABLE} '
            f"where part < {until} and {kept})")
    if statements:
        # Creating a view binds its query, and without a window that lists every folder of
        # every table: seconds at thousands of partitions, paid per query where a reader
        # opens the file per query. Bound to a window after every partition instead, each
        # view's query lists the one stand-in folder (_files); a query binds it again under its
        # own variables, which are put back as they were.
        bound = {name: con.execute("select getvariable(?)", [name]).fetchall()[0][0]
                 for name in (WINDOW_FROM_VARIABLE, WINDOW_TO_VARIABLE)}
        con.execute(f"set variable {WINDOW_FROM_VARIABLE} = ?", [2**62])
        con.execute(f"reset variable {WINDOW_TO_VARIABLE}")
        try:
            con.execute(";\n".join(statements))
        finally:
            for name, value in bound.items():
                if value is None:
                    con.execute(f"reset variable {name}")
                else:
                    con.execute(f"set variable {name} = ?", [value])
    return len(cols)


def _has_summary(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("select count(*) from information_schema.tables where table_catalog = "
                            "current_database() and table_schema = 'main' and table_name = ?",
                            [SUMMARY_TABLE]).fetchall()[0][0])


def _summarise(con: duckdb.DuckDBPyConnection, root: Path, until: int | None) -> bool:
    """Make :data:`SUMMARY_TABLE` if the store lacks it (closed by an earlier version, or never
    closed): from the closed partitions' Parquet files, once. In the caller's transaction;
    True when it made it."""
    if _has_summary(con):
        return False
    con.execute(f"create table main.{SUMMARY_TABLE} (part bigint primary key, requests bigint, "
                "first_at timestamp with time zone, last_at timestamp with time zone)")
    # a store closed by an earlier version has no generation yet: from here its readers keep
    # their listing of the folders
    _bump_generation(con)
    if until is None or not _has_files(root / "requests", until):
        return True
    con.execute(f"insert into main.{SUMMARY_TABLE} select part, count(*), "
                f"min({RANGE_COLUMN}), max({RANGE_COLUMN}) from read_parquet("
                f"'{_glob(root, 'requests')}', hive_partitioning = true) "
                f"where part < {until} group by part")
    return True


def _bump_generation(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("insert or replace into routeaudit_meta select ?, cast(coalesce(max(try_cast("
                "value as bigint)), 0) + 1 as varchar) from routeaudit_meta where key = ?",
                [GENERATION, GENERATION])


@dataclass
class Moved:
    """What a close or a re-open moved (spans count as ``raw_spans`` rows)."""

    spans: int = 0
    partitions: list[int] = field(default_factory=list)
    stale: list[Path] = field(default_factory=list)
    """Folders of re-opened partitions, deleted once the transaction has committed."""


def _owned_parts(con: duckdb.DuckDBPyConnection, lo: int, hi: int) -> None:
    """Temporary key -> partition maps of the requests anchored in partitions [lo, hi), and of
    the decisions, traces and execution spans that belong to them."""
    con.execute("create or replace temp table _close_requests as select request_key, part "
                f"from main.requests where part >= {lo} and part < {hi}")
    for name, key, relation in (("decisions", "decision_key", "int_attr_decisions_resolved"),
                                ("traces", "trace_id", "int_request_spans"),
                                ("spans", "span_id", "executions")):
        con.execute(f"create or replace temp table _close_{name} as "
                    f"select t.{key}, min(r.part) as part from main.{relation} as t "
                    f"join _close_requests as r using (request_key) group by t.{key}")


def _part_expr(kind: str, w: int) -> tuple[str, str]:
    """(join clause, partition expression) of a derived table's rows, by ownership kind."""
    if kind in _incremental._KEYED:
        column, keys = _incremental._KEYED[kind]
        return f" join _close_{keys} as k using ({column})", "k.part"
    if kind == "part":
        return "", "t.part"
    if kind == "scraped_ns":
        return "", f"t.scraped_ns // {w}"
    if kind == "scraped_at":
        return "", f"epoch_ns(t.scraped_at) // {w}"
    raise ValueError(kind)


def _written(name: str, typ: str) -> str:
    """Column ``name`` of a derived table's row ``t`` as written to Parquet. A ``HUGEINT``
    (``decision_key``: 125 bits) goes as ``DECIMAL(38, 0)``, which holds it exactly; DuckDB
    would write it as a ``DOUBLE`` and lose its low bits. Readers cast it back
    (:func:`_closed_select`)."""
    if typ == "HUGEINT":
        return f'cast(t."{name}" as decimal(38, 0)) as "{name}"'
    return f't."{name}"'


def _copy(con: duckdb.DuckDBPyConnection, select: str, root: Path, table: str) -> None:
    target = str(root / table).replace("'", "''")
    con.execute(f"copy ({select}) to '{target}' (format parquet, compression {COMPRESSION}, "
                f"compression_level {COMPRESSION_LEVEL}, partition_by (part), "
                "overwrite_or_ignore, filename_pattern 'data_{i}')")


def close(con: duckdb.DuckDBPyConnection, store_path: str | os.PathLike[str],
          final_until_ns: int | None) -> Moved:
    """Move every partition no later refresh can reach into Parquet, in one transaction.

    ``con``: a cursor of its own (temporary tables live on it). Rows arriving meanwhile are not
    touched (they are not in the transaction's snapshot); a late raw row older than the closed
    partitions stays in DuckDB until its refresh re-opens them."""
    moved = Moved()
    if final_until_ns is None:
        return moved
    root = folder(store_path)
    con.execute("begin transaction")
    try:
        parts = _incremental.Partitioning.read(con)
        w = parts.partition_ns
        hi = (final_until_ns - reach_ns(parts)) // w
        lo_row = con.execute("select min(part) from main.requests").fetchall()[0][0]
        raw_lo = con.execute("select min(start_ns) from main.raw_spans").fetchall()[0][0]
        old = closed_until(con)
        candidates = [v for v in (lo_row, None if raw_lo is None else int(raw_lo) // w)
                      if v is not None]
        lo = old if old is not None else (min(candidates) if candidates else hi)
        made = _summarise(con, root, old)
        if hi <= lo:
            con.execute("commit" if made else "rollback")
            return moved
        root.mkdir(parents=True, exist_ok=True)
        # what a close that did not commit left behind (never read: not below closed_until)
        for table in _table_dirs(root):
            for entry in _table_dirs(root / table):
                p = _part_of(entry)
                if p is not None and p >= lo:
                    shutil.rmtree(root / table / entry)
        kept = kept_tables(con)
        # before the rows leave: the range of the partitions' requests, as the view reads them
        con.execute(f"insert or replace into main.{SUMMARY_TABLE} select part, count(*), "
                    f"min({RANGE_COLUMN}), max({RANGE_COLUMN}) from main.requests "
                    f"where part >= {lo} and part < {hi} group by part")
        _owned_parts(con, lo, hi)
        for _, table, _cols in _incremental._derived_tables(con):
            typed = _columns(con, f"main.{table}")
            cols = [c for c, _ in typed]
            kind = _incremental._ownership(cols)
            if kind == "whole":
                continue
            join, part = _part_expr(kind, w)
            where = f"{part} >= {lo} and {part} < {hi}"
            if table in kept:
                own = ", ".join(_written(c, typ) for c, typ in typed if c != "part")
                _copy(con, f"select {own}, {part} as part from main.{table} as t{join} "
                      f"where {where}", root, table)
            if join:
                column = _incremental._KEYED[kind][0]
                con.execute(f"delete from main.{table} where {column} in "
                            f"(select {column} from _close_{_incremental._KEYED[kind][1]})")
            else:
                con.execute(f"delete from main.{table} as t where {where}")
        lo_ns, hi_ns = lo * w, hi * w
        in_range = f"start_ns >= {lo_ns} and start_ns < {hi_ns}"
        con.execute(f"create or replace temp table _close_raw as select trace_id, span_id, "
                    f"start_ns // {w} as part from main.raw_spans where {in_range}")
        _copy(con, "select e.*, s.part from main.raw_span_events as e "
              "join _close_raw as s using (trace_id, span_id)", root, "raw_span_events")
        _copy(con, f"select *, start_ns // {w} as part from main.raw_spans where {in_range}",
              root, "raw_spans")
        _copy(con, f"select *, scraped_ns // {w} as part from main.raw_snapshots "
              f"where scraped_ns >= {lo_ns} and scraped_ns < {hi_ns}", root, "raw_snapshots")
        con.execute("delete from main.raw_span_events where (trace_id, span_id) in "
                    "(select trace_id, span_id from _close_raw)")
        moved.spans = int(con.execute(f"delete from main.raw_spans where {in_range}")
                          .fetchall()[0][0])
        _span_keys.delete_keys(con, in_range)
        con.execute(f"delete from main.raw_snapshots where scraped_ns >= {lo_ns} "
                    f"and scraped_ns < {hi_ns}")
        # the relations had read the moved spans: the count of spans they read follows
        con.execute("update routeaudit_meta set value = cast(greatest(0, try_cast(value as "
                    "bigint) - ?) as varchar) where key = 'relations_spans'", [moved.spans])
        con.execute("insert or replace into routeaudit_meta values (?, ?)", [CLOSED_UNTIL, str(hi)])
        _bump_generation(con)
        con.execute("commit")
    except BaseException:
        con.execute("rollback")
        raise
    finally:
        _drop_close_tables(con)
    moved.partitions = list(range(lo, hi))
    _write_marker(root, hi, w)
    return moved


def reopen(con: duckdb.DuckDBPyConnection, store_path: str | os.PathLike[str],
           from_part: int | None) -> Moved:
    """Move the closed partitions from ``from_part`` on (None: all) back into the DuckDB
    tables, in the caller's transaction. Their folders are listed in :attr:`Moved.stale`: the
    caller deletes them (:func:`forget`) once the transaction has committed."""
    moved = Moved()
    until = closed_until(con)
    if until is None or (from_part is not None and from_part >= until):
        return moved
    root = folder(store_path)
    lo = from_part
    where = f"part < {until}" + ("" if lo is None else f" and part >= {lo}")
    for table in _table_dirs(root):
        if not _has_files(root / table, until):
            continue
        try:
            cols = _columns(con, f"main.{table}")
        except duckdb.Error:
            continue
        names = ", ".join(f'"{c}"' for c, _ in cols)
        rows = _closed_select(root, table, cols, where)
        if table == "raw_spans":
            # a span resent after its partition closed is stored again: one copy stays
            moved.spans = _span_keys.insert_new_spans(con, f"({rows})", columns=names)
            # back in the DuckDB tables the relations had read (a close took them off the count)
            con.execute("update routeaudit_meta set value = cast(try_cast(value as bigint) + ? "
                        "as varchar) where key = 'relations_spans'", [moved.spans])
        elif table == "raw_span_events":
            con.execute(f"insert into main.{table} ({names}) select c.* from ({rows}) as c "
                        f"anti join main.{table} as h using (trace_id, span_id, event_index)")
        else:
            con.execute(f"insert into main.{table} ({names}) {rows}")
        for entry in _table_dirs(root / table):
            p = _part_of(entry)
            if p is not None and p < until and (lo is None or p >= lo):
                moved.stale.append(root / table / entry)
    if lo is None:
        con.execute("delete from routeaudit_meta where key = ?", [CLOSED_UNTIL])
    else:
        con.execute("insert or replace into routeaudit_meta values (?, ?)", [CLOSED_UNTIL, str(lo)])
    if _has_summary(con):  # else closed by an earlier version: the next close makes it
        con.execute(f"delete from main.{SUMMARY_TABLE}" + ("" if lo is None else f" where part >= {lo}"))
    _bump_generation(con)
    moved.partitions = sorted({int(p.name[5:]) for p in moved.stale})
    return moved


def reopen_all(con: duckdb.DuckDBPyConnection, store_path: str | os.PathLike[str]) -> Moved:
    """Move every closed partition back into the DuckDB tables, in a transaction of its own
    (before a full rebuild, which reads every partition)."""
    con.execute("begin transaction")
    try:
        moved = reopen(con, store_path, None)
        w = _incremental.Partitioning.read(con).partition_ns if moved.partitions else 0
        con.execute("commit")
    except BaseException:
        con.execute("rollback")
        raise
    if moved.partitions:
        forget(store_path, moved, None, w)
    return moved


def forget(store_path: str | os.PathLike[str], moved: Moved, until: int | None,
           partition_ns: int) -> None:
    """After a re-open has committed: delete the folders it moved back, and rewrite the marker."""
    for path in moved.stale:
        shutil.rmtree(path, ignore_errors=True)
    _write_marker(folder(store_path), until, partition_ns)


@dataclass
class Dropped:
    """What retention deleted of the closed partitions: folders, and the rows of ``raw_spans``
    and ``requests`` in them (from the Parquet footers)."""

    folders: int = 0
    spans: int = 0
    requests: int = 0


def _rows(path: Path) -> int:
    """Rows of the Parquet files of one partition's folder, from their footers."""
    total = 0
    for name in os.listdir(path):
        if name.endswith(".parquet"):
            total += pq.ParquetFile(path / name).metadata.num_rows
    return total


def drop_before(store_path: str | os.PathLike[str], *, raw_before_part: int | None,
                derived_before_part: int | None) -> Dropped:
    """Retention over closed partitions: delete the folders of raw tables below
    ``raw_before_part`` and of derived tables below ``derived_before_part``. Their rows had
    already left the DuckDB tables' counts when they closed; the raw spans and requests they
    held are counted for the retention's figures."""
    root = folder(store_path)
    dropped = Dropped()
    for table in _table_dirs(root):
        cut = raw_before_part if table in RAW_TABLES else derived_before_part
        if cut is None:
            continue
        for entry in _table_dirs(root / table):
            p = _part_of(entry)
            if p is not None and p < cut:
                # out of the Hive names first, in one step: readers list a partition's folder
                # by name (install_views) and must not find it without its files
                doomed = root / table / f".{entry}.deleting"
                try:
                    os.rename(root / table / entry, doomed)
                except OSError:
                    continue
                try:
                    if table == "raw_spans":
                        dropped.spans += _rows(doomed)
                    elif table == "requests":
                        dropped.requests += _rows(doomed)
                except (OSError, pa.ArrowException):  # a count is a figure: the delete goes on
                    pass
                shutil.rmtree(doomed, ignore_errors=True)
                dropped.folders += 1
    return dropped


def _part_of(entry: str) -> int | None:
    """The partition of a Hive folder name ``part=<p>`` (None: not one)."""
    if not entry.startswith("part="):
        return None
    try:
        return int(entry[5:])
    except ValueError:
        return None


def _write_marker(root: Path, until: int | None, partition_ns: int) -> None:
    if not root.exists():
        return
    tmp = root / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"closed_until_part": until, "partition_s": partition_ns / 1e9,
                               "partition_column": "part"}) + "\n", "utf-8")
    os.replace(tmp, root / MARKER)


def _drop_close_tables(con: duckdb.DuckDBPyConnection) -> None:
    for name in ("requests", "decisions", "traces", "spans", "raw"):
        try:
            con.execute(f"drop table if exists temp.main._close_{name}")
        except duckdb.Error:
            pass
