"""routeaudit's store, relations and judgement.

``audit.semconv`` (the attribute convention) imports nothing heavy, so that instrumented routers
can use it without pulling in DuckDB; everything else is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["open", "Store", "Reader", "AuditError", "SLO", "load_slo"]

if TYPE_CHECKING:  # pragma: no cover
    from audit._errors import AuditError
    from audit._slo import SLO, load_slo
    from audit._store import Reader, Store, open


def __getattr__(name: str) -> Any:
    if name in ("SLO", "load_slo"):
        from audit import _slo

        return getattr(_slo, name)
    if name in ("open", "Store", "Reader"):
        from audit import _store

        return getattr(_store, name)
    if name == "AuditError":
        from audit._errors import AuditError

        return AuditError
    raise AttributeError(f"module 'audit' has no attribute {name!r}")
