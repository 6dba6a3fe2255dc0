"""routeaudit's store, relations and judgement.

``audit.open(path)`` reads a store (:class:`Reader`); the collector writes one (:class:`Store`).
The questions the dashboard asks are :mod:`audit.queries`, the CLI's run comparison and capacity
:mod:`audit.attribution`. Every error a user can act on is an :class:`AuditError`. The attribute
convention instrumentation needs is the ``semconv`` package, which does not import this one.
"""

from audit._errors import (
    AuditError,
    CollectorUnavailable,
    QueryCancelled,
    QueryError,
    QueryTimeout,
    ReadOnlyError,
    StoreError,
)
from audit._incremental import Retained
from audit._readonly import QueryCancel, QueryLimits
from audit._reads import Reads
from audit._slo import SLO, load_slo
from audit._store import Reader, Store, open, sidecar_path, without_null_columns

__all__ = [
    "open",
    "Reader",
    "Reads",
    "Store",
    "Retained",
    "SLO",
    "load_slo",
    "sidecar_path",
    "without_null_columns",
    "AuditError",
    "StoreError",
    "QueryError",
    "ReadOnlyError",
    "QueryTimeout",
    "QueryCancelled",
    "QueryLimits",
    "QueryCancel",
    "CollectorUnavailable",
]
