"""Read-only queries: the guard shared by ``routeaudit sql``, ``audit.open``, the collector's query
endpoint and the dashboard's SQL box, and the bounded way such a query runs.

Two walls, so that a statement that slips past the first still cannot change the store:

1. :func:`check_read_only` accepts a statement only if it cannot write, whatever wraps it.
   Statements are classified with DuckDB's own parser (a comment or odd spacing cannot smuggle a
   write past a regular expression). ``EXPLAIN [ANALYZE]`` executes the statement it wraps, so
   the wrapped statement is checked in turn. Inside an accepted ``SELECT``, the parse tree
   (``json_serialize_sql``) is walked: only table functions known to read are allowed (no
   ``checkpoint()``, no ``query('...')`` whose text the walk cannot see), and scalar functions
   that change state (``nextval``, ``setval``, ``setseed``) are refused.
2. :func:`run_read_only` runs the query inside a transaction that is always rolled back (on the
   collector's read-write database), or on a connection opened read-only (a reader of a file):
   a write could not commit. It also bounds the query: a time limit, a row limit and a byte limit
   interrupt it (DuckDB's ``interrupt``), and a :class:`QueryCancel` lets its caller stop it (a
   client that went away, a collector shutting down).

Every connection that runs user queries also has ``enable_external_access`` off (file, network
and extension functions are refused) and its configuration locked.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import duckdb
import pyarrow as pa

from audit._errors import QueryCancelled, QueryError, QueryTimeout, ReadOnlyError

_ALLOWED: Final = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})

READ_TABLE_FUNCTIONS: Final = frozenset({
    # generators and unnesting
    "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree",
    "query_table",  # reads the tables it is given by name, nothing else
    "summary", "test_all_types", "test_vector_types",
    # catalog and settings, read only
    "duckdb_columns", "duckdb_constraints", "duckdb_databases", "duckdb_dependencies",
    "duckdb_functions", "duckdb_indexes", "duckdb_keywords", "duckdb_schemas",
    "duckdb_sequences", "duckdb_settings", "duckdb_tables", "duckdb_types", "duckdb_variables",
    "duckdb_views", "duckdb_memory", "duckdb_optimizers", "duckdb_extensions",
    "duckdb_temporary_files", "pragma_table_info", "pragma_show", "pragma_version",
    "pragma_database_size", "pragma_storage_info", "pragma_metadata_info", "pragma_collations",
    "pragma_platform", "pragma_user_agent", "icu_calendar_names", "pg_timezone_names",
    # what DESCRIBE / SHOW / SUMMARIZE become
    "show", "show_tables", "show_tables_expanded", "show_databases",
})
"""Table functions a read query may call: they only read. Any other (``checkpoint``,
``force_checkpoint``, ``query``, ``enable_logging``, ``read_csv`` ...) is refused, so a new
DuckDB release's side-effecting table function is refused until it is added here."""

WRITING_SCALAR_FUNCTIONS: Final = frozenset({"nextval", "setval", "setseed", "currval"})
"""Scalar functions that change state outside the query (sequences, the random seed)."""


@dataclass(frozen=True)
class QueryLimits:
    """Bounds on one read query. ``None`` turns a bound off.

    The defaults let every dashboard page and report through on a store of millions of
    requests, and stop a runaway ad-hoc query (a cross join, ``select *`` of the raw tables)
    before it holds a core or the collector's memory for long.
    """

    timeout_s: float | None = 300.0
    """Wall-clock limit; the query is interrupted when it passes."""
    max_rows: int | None = 5_000_000
    """Rows a result may hold."""
    max_bytes: int | None = 1 << 30
    """Arrow bytes a result may hold."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "max_rows", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or value <= 0):
                raise QueryError(f"query limit {name} must be a positive number or None, got {value!r}")


DEFAULT_LIMITS: Final = QueryLimits()


class QueryCancel:
    """A handle that stops a running read query from another thread.

    Pass one to a query, call :meth:`cancel` from anywhere (a request handler whose client went
    away, a shutdown); the query then raises :class:`QueryCancelled`. Cancelling before the query
    starts stops it as soon as it does.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._unbound = threading.Event()
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            first = self.reason is None
            if first:
                self.reason = reason
            running = self._con is not None
        # Not running yet: the query sees the reason when it binds (under the same lock) and stops.
        if first and running:
            # An interrupt that lands between two statements of the query (or just before it
            # starts) is lost, so keep interrupting until the query has let go of the connection.
            threading.Thread(target=self._interrupt_until_unbound, daemon=True,
                             name="routeaudit-query-cancel").start()

    def _interrupt_until_unbound(self) -> None:
        while True:
            con = self._con
            if con is not None:
                con.interrupt()
            if self._unbound.wait(0.05):
                return

    def _bind(self, con: duckdb.DuckDBPyConnection) -> None:
        with self._lock:
            self._con = con
            self._unbound.clear()
        if self.reason is not None:
            raise QueryCancelled(f"the query was stopped ({self.reason})")

    def _unbind(self) -> None:
        with self._lock:
            self._con = None
            self._unbound.set()


def check_read_only(sql: str) -> None:
    """Raise :class:`ReadOnlyError` unless every statement in ``sql`` only reads."""
    statements = _statements(sql)
    for st in statements:
        _check_statement(st.type, st.query, depth=0)


def _statements(sql: str) -> list[Any]:
    try:
        statements = duckdb.extract_statements(sql)
    except (duckdb.Error, ValueError) as exc:
        # ValueError: a statement type this Python binding cannot name (DuckDB's parser knows it)
        raise QueryError(_first_line(str(exc))) from exc
    if not statements:
        raise QueryError("empty query")
    return statements


def _check_statement(kind: Any, text: str, *, depth: int) -> None:
    if kind not in _ALLOWED:
        name = getattr(kind, "name", str(kind)).lower()
        hint = (" (a PIVOT without an IN list creates types first: list the values, "
                "`pivot t on c in ('a', 'b') using ...`)" if name == "multi" else "")
        raise ReadOnlyError(
            f"refused: {name} statements are not allowed; the store is read-only here "
            f"(only SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE, PIVOT and EXPLAIN of those){hint}"
        )
    if kind == duckdb.StatementType.EXPLAIN:
        if depth > 0:
            raise ReadOnlyError("refused: nested EXPLAIN")
        inner = _explained(text)
        inner_statements = _statements(inner)
        if len(inner_statements) != 1:
            raise ReadOnlyError("refused: EXPLAIN wraps exactly one statement")
        _check_statement(inner_statements[0].type, inner_statements[0].query, depth=depth + 1)
        return
    _check_select(text)


def _explained(text: str) -> str:
    """The statement an ``EXPLAIN [ANALYZE] [(options)]`` wraps, found with DuckDB's tokenizer."""
    tokens = [(pos, kind) for pos, kind in duckdb.tokenize(text) if kind != duckdb.token_type.comment]
    if not tokens or text[tokens[0][0]:tokens[0][0] + 7].lower() != "explain":
        raise ReadOnlyError("refused: cannot find the statement EXPLAIN wraps")
    i = 1
    if i < len(tokens) and text[tokens[i][0]:tokens[i][0] + 7].lower() == "analyze":
        i += 1
    if i < len(tokens) and text[tokens[i][0]] == "(":
        depth = 0
        while i < len(tokens):
            ch = text[tokens[i][0]]
            if tokens[i][1] == duckdb.token_type.operator and ch in "()":
                depth += 1 if ch == "(" else -1
                if depth == 0:
                    i += 1
                    break
            i += 1
    if i >= len(tokens):
        raise ReadOnlyError("refused: EXPLAIN wraps no statement")
    return text[tokens[i][0]:]


_PARSER_LOCK = threading.Lock()
_PARSER: list[duckdb.DuckDBPyConnection] = []


def _parser() -> duckdb.DuckDBPyConnection:
    """An in-memory database that only parses (holds no data), made once."""
    if not _PARSER:
        _PARSER.append(duckdb.connect(config={"enable_external_access": False}))
    return _PARSER[0]


def _check_select(text: str) -> None:
    """Walk a SELECT's parse tree for functions that do more than read."""
    with _PARSER_LOCK:
        raw = _parser().execute("select json_serialize_sql(?)", [text]).fetchone()
    tree = json.loads(raw[0]) if raw else {"error": True}
    if tree.get("error"):
        message = str(tree.get("error_message") or "cannot be parsed")
        raise ReadOnlyError(f"refused: the statement cannot be checked as read-only: {_first_line(message)}")
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "TABLE_FUNCTION":
                fn = node.get("function")
                name = fn.get("function_name") if isinstance(fn, dict) else None
                if not isinstance(name, str) or name.lower() not in READ_TABLE_FUNCTIONS:
                    raise ReadOnlyError(f"refused: table function {name!r} is not allowed in a read query")
            name = node.get("function_name")
            if node.get("class") == "FUNCTION" and isinstance(name, str) and name.lower() in WRITING_SCALAR_FUNCTIONS:
                raise ReadOnlyError(f"refused: function {name!r} changes state; not allowed in a read query")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def run_read_only(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None,
                  variables: Mapping[str, float | str] | None = None, *,
                  limits: QueryLimits = DEFAULT_LIMITS, cancel: QueryCancel | None = None,
                  rollback: bool = True, checked: bool = False) -> pa.Table:
    """Run one checked read query on ``con`` (a cursor of its own) within ``limits``.

    ``rollback``: run inside a transaction that is rolled back whatever happens (a connection
    that could write); a connection opened read-only needs none. DuckDB errors become one-line
    :class:`QueryError`; an interrupt becomes :class:`QueryTimeout` or :class:`QueryCancelled`.
    ``checked``: the caller has already passed ``sql`` through :func:`check_read_only` (it
    refuses before doing any work of its own), so it is not parsed twice.
    """
    if not checked:
        check_read_only(sql)
    cancel = cancel or QueryCancel()
    timer: threading.Timer | None = None
    if limits.timeout_s is not None:
        timer = threading.Timer(limits.timeout_s, cancel.cancel, args=("timeout",))
        timer.daemon = True
    began = False
    try:
        cancel._bind(con)
        if timer is not None:
            timer.start()
        if rollback:
            con.execute("begin transaction")
            began = True
        _set_variables(con, variables)
        rel = con.sql(sql, params=list(params) if params else None)
        if rel is None:
            return pa.table({})
        reader = rel.fetch_record_batch(64 * 1024)
        batches: list[pa.RecordBatch] = []
        rows = nbytes = 0
        for batch in reader:
            rows += batch.num_rows
            nbytes += batch.nbytes
            if limits.max_rows is not None and rows > limits.max_rows:
                cancel.cancel("rows")
                raise QueryError(f"the result has more than {limits.max_rows:,} rows: narrow it "
                                 "(where, limit, an aggregate)")
            if limits.max_bytes is not None and nbytes > limits.max_bytes:
                cancel.cancel("bytes")
                raise QueryError(f"the result is larger than {limits.max_bytes / 2**20:,.0f} MiB: "
                                 "narrow it (fewer columns or rows)")
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.InterruptException as exc:
        if cancel.reason == "timeout":
            raise QueryTimeout(f"the query ran longer than {limits.timeout_s:g} s and was stopped") from exc
        raise QueryCancelled(f"the query was stopped ({cancel.reason or 'interrupted'})") from exc
    except duckdb.Error as exc:
        raise QueryError(_first_line(str(exc))) from exc
    finally:
        if timer is not None:
            timer.cancel()
        cancel._unbind()
        if began:
            try:
                con.execute("rollback")
            except duckdb.Error:
                pass  # the transaction already ended with the error that is being raised


def _set_variables(con: duckdb.DuckDBPyConnection, variables: Mapping[str, float | str] | None) -> None:
    for name, value in (variables or {}).items():
        if not name.isidentifier():
            raise QueryError(f"bad variable name {name!r}")
        con.execute(f"set variable {name} = ?", [value])


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message
