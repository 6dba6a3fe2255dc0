"""routeaudit's exception tree. Every error a user can act on is one of these, with a one-line
message; the command line prints the message and exits non-zero, never a traceback.

    AuditError
    ├── StoreError            the store file is missing, locked, or not a routeaudit store
    ├── QueryError            a query failed (syntax, unknown relation or column)
    │   ├── ReadOnlyError     a query tried to write, attach, copy, install or touch files
    │   ├── QueryTimeout      a query ran past its time limit and was stopped
    │   └── QueryCancelled    a query was stopped by its caller (client gone, shutdown)
    └── CollectorUnavailable  the sidecar names a collector that does not answer
"""

from __future__ import annotations


class AuditError(Exception):
    """Base of every error routeaudit reports to a user."""


class StoreError(AuditError):
    """The store cannot be opened as asked."""


class QueryError(AuditError):
    """A read query failed."""


class ReadOnlyError(QueryError):
    """A query would modify the store or reach outside it."""


class QueryTimeout(QueryError):
    """A read query ran past its time limit and was interrupted."""


class QueryCancelled(QueryError):
    """A read query was interrupted by its caller."""


class CollectorUnavailable(AuditError):
    """A running collector owns the store but did not answer the query."""
