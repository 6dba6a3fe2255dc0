"""What every page shares: the reader, cached queries, SLO targets, the time window, error
display, charts.

The Reader is a ``st.cache_resource`` (one per store path; it opens the file read-only per
query, or asks the running collector). Query results are ``st.cache_data`` entries keyed on the
store's ``version()`` plus the query's arguments, so a new commit invalidates them.

The time window is one state for every page: the sidebar's widgets (app.py draws them with
:func:`window_sidebar`) are bound to the URL's query parameters, so a link keeps the window,
and :func:`time_window` turns them into the :class:`audit.queries.TimeWindow` each page passes
to its queries.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, NamedTuple

import altair as alt
import polars as pl
import streamlit as st
from streamlit.errors import StreamlitAPIException

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


WINDOW_KEY: Final = "window"
"""Session-state key and URL query parameter of the window picker."""
WINDOW_FROM_KEY: Final = "window_from"
WINDOW_TO_KEY: Final = "window_to"
"""Keys (and URL query parameters) of the custom range's two ends, UTC to the minute."""

WINDOW_ALL: Final = "all"
WINDOW_CUSTOM: Final = "custom range"
WINDOW_SPANS: Final[dict[str, timedelta | None]] = {
    "last 15 min": timedelta(minutes=15),
    "last 1 h": timedelta(hours=1),
    "last 6 h": timedelta(hours=6),
    "last 24 h": timedelta(hours=24),
    WINDOW_ALL: None,
    WINDOW_CUSTOM: None,
}
"""The picker's choices (shown as they are, and written so in the URL: ``?window=all``) and
how far each reaches back from the newest request stored."""
_SHOWN_KEY: Final = "window_shown"
"""Session state: the window the last run showed (a custom range starts from it)."""
DEFAULT_WINDOW: Final = "last 1 h"
"""The window every page opens with: the hour ending at the newest request in the store (not
the wall clock: a store may be days old)."""


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


def _quiet(name: str, *args: Any) -> Any:
    """A cached query for the sidebar: None (logged, not shown) when the store cannot answer,
    so the page below shows the one explanation."""
    path = store_path()
    if not path.exists():
        return None  # the page explains
    try:
        r = _open(str(path))
        return _cached(str(r.path), r.version(), name, args, ())
    except Exception:  # noqa: BLE001
        _log.debug("%s failed", name, exc_info=True)
        return None


class StoreSpan(NamedTuple):
    """Which requests the store holds: how many, the oldest and newest start."""

    requests: int
    first_at: datetime | None
    last_at: datetime | None


def store_span() -> StoreSpan:
    """The store's range (:func:`audit.queries.store_range`); no requests when it cannot say."""
    df = _quiet("store_range")
    if df is None or df.height != 1:
        return StoreSpan(0, None, None)
    row = df.row(0, named=True)
    return StoreSpan(int(row["requests"] or 0), row["first_at"], row["last_at"])


def _utc(value: datetime | None) -> datetime | None:
    """A custom range's end as UTC (the picker's datetimes are naive, in UTC)."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _custom_range() -> tuple[datetime | None, datetime | None]:
    return (_utc(st.session_state.get(WINDOW_FROM_KEY)), _utc(st.session_state.get(WINDOW_TO_KEY)))


def time_window() -> queries.TimeWindow:
    """The window the sidebar's picker chose: the last 15 min / 1 h / 6 h / 24 h up to the
    newest request, everything, or a custom range (either end may be left open). A custom range
    that ends before it starts falls back to the default (the sidebar says so); so does an
    unknown choice. An empty store: everything (the pages say the store is empty)."""
    choice = st.session_state.get(WINDOW_KEY, DEFAULT_WINDOW)
    if choice == WINDOW_ALL:
        return queries.TimeWindow()
    if choice == WINDOW_CUSTOM:
        start, end = _custom_range()
        if start is None or end is None or start <= end:
            return queries.TimeWindow(start, end)
        choice = DEFAULT_WINDOW
    last = store_span().last_at
    span = WINDOW_SPANS.get(choice) or WINDOW_SPANS[DEFAULT_WINDOW]
    if last is None or span is None:
        return queries.TimeWindow()
    return queries.TimeWindow.ending_at(last, span)


def fmt_time(at: datetime | None, open_end: str = "–") -> str:
    """A time on the reference clock as ``2026-01-01 00:00:00`` UTC; ``open_end`` for None."""
    if at is None:
        return open_end
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def describe_window(window: queries.TimeWindow) -> str:
    """``between 2026-01-01 00:00:00 and 2026-01-01 01:00:00 UTC`` (open ends named)."""
    if window.is_all:
        return "over the whole store"
    return (f"between {fmt_time(window.start, 'the oldest request')} and "
            f"{fmt_time(window.end, 'the newest request')} UTC")


def _prefill_custom() -> None:
    """On choosing "custom range": start from the window shown until now, to the minute, so
    the range is a refinement, not a blank."""
    if st.session_state.get(WINDOW_KEY) != WINDOW_CUSTOM:
        return
    shown = st.session_state.get(_SHOWN_KEY) or queries.TimeWindow()
    span = store_span()
    start = shown.start or span.first_at
    end = shown.end or span.last_at
    if st.session_state.get(WINDOW_FROM_KEY) is None and start is not None:
        st.session_state[WINDOW_FROM_KEY] = start.astimezone(UTC).replace(
            tzinfo=None, second=0, microsecond=0)
    if st.session_state.get(WINDOW_TO_KEY) is None and end is not None:
        st.session_state[WINDOW_TO_KEY] = (end.astimezone(UTC).replace(
            tzinfo=None, second=0, microsecond=0) + timedelta(minutes=1))


def _keep_window_in_url() -> None:
    """Put the window back into the URL after a page switch, before its widgets are drawn.

    Streamlit drops a bound query parameter when the page changes (it ties the binding to the
    page that drew the widget, here the one shown when the sidebar first ran), though the
    widget keeps its value: without this, a link copied after a page switch would open on the
    default window."""
    for key in (WINDOW_KEY, WINDOW_FROM_KEY, WINDOW_TO_KEY):
        value = st.session_state.get(key)
        if value is None or key in st.query_params or (key == WINDOW_KEY and value == DEFAULT_WINDOW):
            continue
        if key != WINDOW_KEY and st.session_state.get(WINDOW_KEY) != WINDOW_CUSTOM:
            continue
        try:
            st.query_params[key] = (value.strftime("%Y-%m-%dT%H:%M") if isinstance(value, datetime)
                                    else str(value))
        except StreamlitAPIException:  # still bound: Streamlit keeps it in the URL itself
            _log.debug("query parameter %s is bound", key, exc_info=True)


def window_sidebar(*, applies: bool = True) -> None:
    """The window picker and what it covers, for the sidebar (app.py calls it inside
    ``st.sidebar`` on every page, so the state survives a page switch). ``applies``: False on
    a page that reads the whole store (SQL), which says so."""
    st.subheader("Time window")
    _keep_window_in_url()
    choices = list(WINDOW_SPANS)
    # no format_func: a bound selectbox writes the label shown into the URL
    st.selectbox("Requests started in", choices, index=choices.index(DEFAULT_WINDOW),
                 key=WINDOW_KEY, bind="query-params",
                 on_change=_prefill_custom,
                 help="Up to the newest request in the store, not the wall clock.")
    if st.session_state.get(WINDOW_KEY) == WINDOW_CUSTOM:
        st.datetime_input("From (UTC)", value=None, key=WINDOW_FROM_KEY, bind="query-params",
                          format="YYYY-MM-DD", step=60)
        st.datetime_input("To (UTC)", value=None, key=WINDOW_TO_KEY, bind="query-params",
                          format="YYYY-MM-DD", step=60)
        start, end = _custom_range()
        if start is not None and end is not None and start > end:
            st.warning("The range ends before it starts: showing the last hour.")
    window = time_window()
    st.session_state[_SHOWN_KEY] = window
    if not applies:
        st.caption("The SQL page reads the whole store; the window applies to the other pages.")
    else:
        st.caption(f"Showing requests {describe_window(window)}.")
    span = store_span()
    if span.requests:
        st.caption(f"The store covers {fmt_time(span.first_at)} to {fmt_time(span.last_at)} UTC "
                   f"({span.requests:,} requests).")
    if applies and (split := finality_note(window)) is not None:
        st.caption(split)


def finality_note(window: queries.TimeWindow) -> str | None:
    """How many requests of ``window`` have a final verdict and how many a provisional one,
    when the store says (None otherwise)."""
    counts = _quiet("window_counts", window)
    if counts is None or counts.height != 1:
        return None
    row = counts.row(0, named=True)
    if row["final"] is None or not row["requests"]:
        return None
    return (f"In the window: {row['final']:,} final, {row['provisional']:,} provisional. "
            "A provisional verdict may still change as late spans arrive; a final one no "
            "longer does.")


def stop_if_window_empty(window: queries.TimeWindow) -> None:
    """When the store has requests but ``window`` none: say so on the page and stop it (an
    empty store is left to the page's own explanation)."""
    span = store_span()
    if not span.requests or window.is_all:
        return
    counts = _quiet("window_counts", window)
    if counts is None or counts.height != 1 or counts["requests"][0]:
        return
    st.info(f"No requests {describe_window(window)}; the store covers "
            f"{fmt_time(span.first_at)} to {fmt_time(span.last_at)} UTC. Pick a wider window "
            "in the sidebar.")
    st.stop()


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
