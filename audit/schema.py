"""Arrow schemas of the raw tables, derived from their DDL in ``audit/sql/raw/``.

The ``.sql`` files are the single definition; the decoder and the scraper build Arrow tables with
exactly these schemas so that inserts are columnar and by name.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

import duckdb
import pyarrow as pa

RAW_TABLES: Final = ("raw_spans", "raw_span_events", "raw_snapshots")
"""Tables the collector writes, in creation order."""


def raw_ddl(table: str) -> str:
    """The ``create table`` statement of one raw table."""
    return resources.files("audit").joinpath(f"sql/raw/{table}.sql").read_text("utf-8")


def _arrow_schema(table: str) -> pa.Schema:
    con = duckdb.connect()
    try:
        con.execute(raw_ddl(table))
        schema = con.sql(f"select * from {table} limit 0").to_arrow_table().schema
    finally:
        con.close()
    return schema


def has_primary_key(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether ``table`` of the connection's database has a primary key (raw tables of stores
    written by earlier versions do)."""
    return bool(con.execute(
        "select count(*) from duckdb_constraints() where database_name = current_database() "
        "and schema_name = 'main' and table_name = ? and constraint_type = 'PRIMARY KEY'",
        [table]).fetchall()[0][0])


RAW_SPANS_SCHEMA: Final = _arrow_schema("raw_spans")
RAW_SPAN_EVENTS_SCHEMA: Final = _arrow_schema("raw_span_events")
RAW_SNAPSHOTS_SCHEMA: Final = _arrow_schema("raw_snapshots")
