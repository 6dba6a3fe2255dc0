"""The policies page: runs of the same trace under different policies, side by side."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from audit._reads import Reads
from audit._slo import SLO
from audit.queries._common import JUDGED, OUTCOMES, REQUEST_AT, TimeWindow, in_window, query_at


def run_list(reader: Reads, *, window: TimeWindow | None = None) -> pl.DataFrame:
    """Runs with requests in ``window`` (None: the whole store). Columns: run_id, policies
    (comma-separated), requests, first_at, last_at (of the run's requests in the window)."""
    where, params = in_window(window)
    return reader.query(
        f"""
        select run_id, string_agg(distinct policy, ', ' order by policy) as policies,
            count(*) as requests, min({REQUEST_AT}) as first_at, max({REQUEST_AT}) as last_at
        from requests where run_id is not null and {where}
        group by run_id order by first_at, run_id
        """,
        params,
    )


def run_summaries(reader: Reads, run_ids: Sequence[str], slo: SLO | None = None, *,
                  window: TimeWindow | None = None) -> pl.DataFrame:
    """One row per run of ``run_ids`` that has requests in ``window``, in that order: run_id
    and the columns of :func:`overview_totals` over the run's requests in the window. Two runs
    tested against each other: :func:`audit.attribution.compare_runs`."""
    where, params = in_window(window)
    return query_at(
        reader,
        f"""
        select run_id, {OUTCOMES}
        from {JUDGED}
        where list_contains(?, run_id) and {where}
        group by run_id
        order by list_position(?, run_id)
        """,
        [list(run_ids), *params, list(run_ids)],
        slo,
    )


def run_failures(reader: Reads, run_ids: Sequence[str], *,
                 window: TimeWindow | None = None) -> pl.DataFrame:
    """Failed requests in ``window`` per run and kind. Columns: run_id, kind, requests."""
    where, params = in_window(window)
    return reader.query(
        f"""
        select run_id, status || coalesce(' ' || http_status::varchar, '') as kind,
            count(*) as requests
        from {JUDGED} where list_contains(?, run_id) and not is_ok and {where}
        group by all order by run_id, requests desc
        """,
        [list(run_ids), *params],
    )
