"""Which spans the store holds: one integer key per stored span, so that a span sent twice is
stored once.

``raw_spans`` has no primary key of its own. One on its two varchar id columns would make every
delete of raw spans (closing partitions, retention) slow at commit: DuckDB takes each deleted
row's entry out of such an index one by one, about 55 µs per span, against under 2 µs on one
125-bit integer (docs/performance.md). The key lives instead in :data:`SPAN_KEYS_TABLE`, one
row per span held in the DuckDB file: 125 bits of an MD5 of the span's ids, beside the span's
start, so that keys leave with their spans by the same time range. Every writer of raw spans
inserts them through :func:`insert_new_spans`; every delete of raw spans deletes the keys of
the same range (:func:`delete_keys`).
"""

from __future__ import annotations

from typing import Final

import duckdb

from audit.schema import has_primary_key, raw_ddl

SPAN_KEYS_TABLE: Final = "routeaudit_span_keys"
SPAN_KEYS_DDL: Final = (
    f"create table if not exists {SPAN_KEYS_TABLE} ("
    "span_key hugeint primary key, "  # span_key(): 125 bits of an MD5
    "start_ns bigint not null)"  # the span's start: keys leave with their spans by time
)
"""One row per span in ``raw_spans``."""


def span_key() -> str:
    """The key of a span, over its ``trace_id`` and ``span_id``: 125 bits of the MD5 of its ids,
    the trace id's length first so that no two pairs of ids give one string. A hugeint that
    small is exactly the 38-digit decimal Arrow carries it in (:func:`insert_new_spans` reads
    the new keys back)."""
    return "cast(md5_number(length(trace_id) || ':' || trace_id || span_id) >> 3 as hugeint)"


def insert_new_spans(con: duckdb.DuckDBPyConnection, source: str, columns: str | None = None,
                     rows: int | None = None) -> int:
    """Insert the spans of ``source`` (a relation or a parenthesised query with ``raw_spans``'s
    columns, or ``columns`` of them) that the store's ``raw_spans`` does not hold, once each,
    with their keys; return how many. ``rows``: how many rows ``source`` holds, when the caller
    knows (else counted). Run in the caller's transaction."""
    # a relation: DuckDB runs the statement once, and its rows come back without a DB-API copy
    new = con.sql(f"insert or ignore into main.{SPAN_KEYS_TABLE} "
                  f"select {span_key()}, start_ns from {source} returning span_key").to_arrow_table()
    n = int(new.num_rows)
    if not n:
        return 0
    into = f"main.raw_spans ({columns})" if columns else "main.raw_spans by name"
    cols = columns or "*"
    total = rows if rows is not None else int(
        con.execute(f"select count(*) from {source}").fetchall()[0][0])
    if n == total:  # every span new, none twice: the usual export
        con.execute(f"insert into {into} select {cols} from {source}")
        return n
    con.register("_ra_new_span_keys", new)
    try:
        con.execute(f"insert into {into} select {cols} from {source} "
                    f"where {span_key()} in (select span_key from _ra_new_span_keys) "
                    "qualify row_number() over (partition by trace_id, span_id) = 1")
    finally:
        con.unregister("_ra_new_span_keys")
    return n


def delete_keys(con: duckdb.DuckDBPyConnection, where: str) -> None:
    """Delete the keys of the spans ``where`` (a condition on ``start_ns`` alone) selects, with
    them, in the caller's transaction."""
    con.execute(f"delete from main.{SPAN_KEYS_TABLE} where {where}")


def fill(con: duckdb.DuckDBPyConnection, database: str | None = None) -> None:
    """Add the keys of the spans of ``raw_spans`` that have none (spans written straight into
    the table rather than through :func:`insert_new_spans`: a migration, a benchmark's copies).
    ``database``: an attached store's name instead of the connection's own."""
    at = f"{database}.main" if database else "main"
    con.execute(f"insert or ignore into {at}.{SPAN_KEYS_TABLE} "
                f"select {span_key()}, start_ns from {at}.raw_spans")


def ensure(con: duckdb.DuckDBPyConnection) -> None:
    """Create the key table; a store whose ``raw_spans`` still carries the primary key on its
    ids (written by an earlier version) gets ``raw_spans`` rewritten without it and its keys
    filled, in one transaction (a copy of the spans held in the DuckDB file)."""
    con.execute(SPAN_KEYS_DDL)
    if not has_primary_key(con, "raw_spans"):
        return
    ddl = raw_ddl("raw_spans")
    create = "create table if not exists raw_spans ("
    if create not in ddl:
        raise RuntimeError("raw_spans.sql no longer starts its table as expected")
    con.execute("begin transaction")
    try:
        con.execute(ddl.replace(create, "create table raw_spans__keyless (", 1))
        names = ", ".join(f'"{r[0]}"' for r in con.execute(
            "select column_name from duckdb_columns() where database_name = current_database() "
            "and schema_name = 'main' and table_name = 'raw_spans__keyless' "
            "order by column_index").fetchall())
        con.execute(f"insert into raw_spans__keyless ({names}) select {names} from raw_spans")
        con.execute("drop table raw_spans")
        con.execute("alter table raw_spans__keyless rename to raw_spans")
        fill(con)
        con.execute("commit")
    except BaseException:
        con.execute("rollback")
        raise
