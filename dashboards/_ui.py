"""What every page shares: the reader, cached queries, SLO targets, error display, charts.

The Reader is a ``st.cache_resource`` (one per store path; it opens the file read-only per
query, or asks the running collector). Query results are ``st.cache_data`` entries keyed on the
store's ``version()`` plus the query's arguments, so a new commit invalidates them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Final

import altair as alt
import polars as pl
import streamlit as st

import audit
from audit import AuditError, queries

_log = logging.getLogger(__name__)

ENV_DB: Final = "ROUTEAUDIT_DB"
"""Path of the store to show; ``routeaudit dashboard --db PATH`` sets it."""

ENV_TOKEN: Final = "ROUTEAUDIT_DASHBOARD_TOKEN"
"""When set, the dashboard asks for this token before showing anything."""

DEFAULT_DB: Final = "sample_data/demo.duckdb"
"""Store used when ``ROUTEAUDIT_DB`` is unset (built by ``routeaudit demo``)."""

CACHE_TTL_S: Final = 30
CACHE_MAX_ENTRIES: Final = 256
BUCKETS: Final = 60
TABLE_ROWS: Final = queries.TABLE_LIMIT
"""Rows a table on a page shows at most (the largest or worst first)."""

NO_REQUESTS: Final = (
    "No requests in this store yet: is traffic flowing through an instrumented client, router "
    "or replica, and is `routeaudit collect` receiving it?"
)
NO_DECISIONS: Final = "No decision records yet: is the router instrumented?"
NO_ATTRIBUTION: Final = (
    "The attribution relations (`attributions`) are not in this store yet: causes show as "
    "'unattributed'. Run `routeaudit attribute` or upgrade the store."
)


def store_path() -> Path:
    return Path(os.environ.get(ENV_DB) or DEFAULT_DB)


@st.cache_resource(show_spinner=False)
def _open(path: str) -> audit.Reader:
    return audit.open(path)


def reader() -> audit.Reader:
    """The store's reader; shows an explanation and stops the page if there is no store."""
    path = store_path()
    if not path.exists():
        st.error(
            f"No store at `{path}`. Start `routeaudit collect --db {path}`, run "
            "`routeaudit demo`, or pass `routeaudit dashboard --db PATH`."
        )
        st.stop()
    try:
        return _open(str(path))
    except Exception as exc:  # noqa: BLE001
        _show(exc)
        st.stop()


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def _cached(path: str, version: str, name: str, args: tuple[Any, ...],
            kwargs: tuple[tuple[str, Any], ...]) -> Any:
    # ``version`` is only part of the cache key: a new commit to the store changes it.
    del version
    return getattr(queries, name)(_open(path), *args, **dict(kwargs))


def query(name: str, *args: Any, **kwargs: Any) -> Any:
    """``audit.queries.<name>(reader, *args, **kwargs)``, cached; None (and an error shown on
    the page) when the store answers with an error. Never raises AuditError."""
    r = reader()
    try:
        return _cached(str(r.path), r.version(), name, args, tuple(sorted(kwargs.items())))
    except Exception as exc:  # noqa: BLE001 - a page shows a message, never a traceback
        _show(exc)
        return None


def query_or_stop(name: str, *args: Any, **kwargs: Any) -> Any:
    """:func:`query` for what the rest of a page needs: on an error (shown) the page stops."""
    result = query(name, *args, **kwargs)
    if result is None:
        st.stop()
    return result


def uncached(name: str, *args: Any, **kwargs: Any) -> Any:
    """Like :func:`query` without caching (user SQL); AuditError is shown, not raised."""
    try:
        return getattr(queries, name)(reader(), *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a page shows a message, never a traceback
        _show(exc)
        return None


def _show(exc: Exception) -> None:
    """One line for the person looking at the page; the traceback goes to the server log for
    anything that is not a documented :class:`AuditError`."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, AuditError):
        st.error(text)
    else:
        _log.warning("dashboard query failed", exc_info=exc)
        st.error(f"The store could not answer ({type(exc).__name__}): {text}")


def has(relation: str, *columns: str) -> bool:
    rels = query("relation_columns")
    return bool(rels) and queries.has_relation(reader(), relation, *columns, known=rels)


def slo() -> audit.SLO:
    """The SLO targets chosen in the sidebar (app.py owns the widgets), else the defaults."""
    default = audit.SLO()
    return audit.SLO(ttft_ms=float(st.session_state.get("slo_ttft_ms", default.ttft_ms)),
                     tpot_ms=float(st.session_state.get("slo_tpot_ms", default.tpot_ms)))


def empty(df: pl.DataFrame | None) -> bool:
    return df is None or df.height == 0


def freshness_note() -> str | None:
    """A line for the sidebar when the relations lag the raw tables: spans stored since their
    last rebuild, and how long ago that was (docs/architecture.md, "Freshness"). None when they
    are current or the store cannot say; never an error on the page (the sidebar is on every
    page, and a store too old to count is not the person's problem)."""
    path = store_path()
    if not path.exists():
        return None  # the page explains
    try:
        r = _open(str(path))
        row = _cached(str(r.path), r.version(), "relations_freshness", (), ())
    except Exception:  # noqa: BLE001
        _log.debug("relations_freshness failed", exc_info=True)
        return None
    lag = None if row is None else queries.describe_lag(row)
    if lag is None:
        return None
    return f"{lag} These pages read the relations; the raw tables, on the SQL page, have every span."


def fmt_ms(v: float | None) -> str:
    """Milliseconds for a metric tile, three significant digits from 100 ms on: ``"59.0 ms"``,
    ``"395 ms"``, ``"3.95 s"``, ``"19.3 s"``, ``"1,234 s"``; "1,670 ms" did not fit a tile of the
    overview's row of six."""
    if v is None:
        return "–"
    v = float(v)
    if abs(v) >= 100_000:
        return f"{v / 1000:,.0f} s"
    if abs(v) >= 10_000:
        return f"{v / 1000:.1f} s"
    if abs(v) >= 1_000:
        return f"{v / 1000:.2f} s"
    return f"{v:,.0f} ms" if abs(v) >= 100 else f"{v:,.1f} ms"


def fmt_pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f} %"


def chart(c: alt.Chart) -> None:
    st.altair_chart(c, width="stretch")


def time_axis(field: str = "bucket", title: str = "time (UTC)") -> alt.X:
    # a UTC scale: Vega-Lite otherwise draws times in the browser's zone under a "UTC" title
    return alt.X(f"{field}:T", title=title, scale=alt.Scale(type="utc"))


def time_tooltip(field: str = "bucket") -> alt.Tooltip:
    """A tooltip line for a time field, in UTC like :func:`time_axis` (not the browser's zone)."""
    return alt.Tooltip(f"{field}:T", title=f"{field} (UTC)", format="%Y-%m-%d %H:%M:%S.%L",
                       formatType="utc")


def y_ms(field: str, title: str) -> alt.Y:
    return alt.Y(f"{field}:Q", title=f"{title} (ms)")
