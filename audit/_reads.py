"""What the query layer (:mod:`audit.queries`, :mod:`audit.attribution`) needs from a reader."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

    from audit._slo import SLO


class Reads(Protocol):
    """A read-only query runner: :class:`audit.Reader` is one; a notebook or a test may bring
    its own (over one DuckDB connection, say)."""

    def query(self, sql: str, params: Sequence[Any] | None = None, *, slo: SLO | None = None,
              variables: Mapping[str, float | str] | None = None) -> pl.DataFrame:
        """The rows of one read-only query, ``params`` bound to its ``?`` in order.

        ``slo``: the targets the relations judge by this once (set as the session variables
        :meth:`SLO.variables` names); None: the reader's own. ``variables``: further session
        variables (``routeaudit_scope_run`` / ``routeaudit_scope_request``, which only narrow
        a live computation; docs/attribution.md)."""
        ...
