"""routeaudit's store, relations and judgement. Loaded on first use of a name; the attribute
convention instrumentation needs is the ``semconv`` package, which does not import this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["open", "Store", "Reader", "AuditError", "SLO", "load_slo", "QueryLimits", "QueryCancel"]

if TYPE_CHECKING:  # pragma: no cover
    from audit._errors import AuditError
    from audit._readonly import QueryCancel, QueryLimits
    from audit._slo import SLO, load_slo
    from audit._store import Reader, Store, open


def __getattr__(name: str) -> Any:
    if name in ("SLO", "load_slo"):
        from audit import _slo

        return getattr(_slo, name)
    if name in ("open", "Store", "Reader"):
        from audit import _store

        return getattr(_store, name)
    if name in ("QueryLimits", "QueryCancel"):
        from audit import _readonly

        return getattr(_readonly, name)
    if name == "AuditError":
        from audit._errors import AuditError

        return AuditError
    raise AttributeError(f"module 'audit' has no attribute {name!r}")
