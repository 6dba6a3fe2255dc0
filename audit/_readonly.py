"""The read-only guard shared by ``routeaudit sql``, ``audit.open`` and the dashboard's SQL box.

Statements are classified with DuckDB's own parser, so a comment or odd spacing cannot smuggle
a write past a regular expression. Connections that run user queries also have
``enable_external_access`` off, which refuses file, network and extension functions even inside
an accepted ``SELECT``.
"""

from __future__ import annotations

import duckdb

from audit._errors import QueryError, ReadOnlyError

_ALLOWED = {
    duckdb.StatementType.SELECT,
    duckdb.StatementType.EXPLAIN,
}


def check_read_only(sql: str) -> None:
    """Raise :class:`ReadOnlyError` unless every statement in ``sql`` only reads."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(_first_line(str(exc))) from exc
    if not statements:
        raise QueryError("empty query")
    for st in statements:
        if st.type not in _ALLOWED:
            kind = st.type.name.lower()
            raise ReadOnlyError(
                f"refused: {kind} statements are not allowed; the store is read-only here "
                "(only SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE and EXPLAIN)"
            )


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message
