"""The policies page: runs of the same trace under different policies, side by side."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from audit._reads import Reads
from audit._slo import SLO
from audit.queries._common import JUDGED, OUTCOMES, REQUEST_AT, query_at


def run_list(reader: Reads) -> pl.DataFrame:
    """Runs seen in ``requests``. Columns: run_id, policies (comma-separated), requests,
    first_at, last_at."""
    return reader.query(
        f"""
        select run_id, string_agg(distinct policy, ', ' order by policy) as policies,
            count(*) as requests, min({REQUEST_AT}) as first_at, max({REQUEST_AT}) as last_at
        from requests where run_id is not null
        group by run_id order by first_at, run_id
        """
    )


def run_summaries(reader: Reads, run_ids: Sequence[str], slo: SLO | None = None) -> pl.DataFrame:
    """One row per run of ``run_ids`` that has requests, in that order: run_id and the columns
    of :func:`overview_totals` over the run's requests. Two runs tested against each other:
    :func:`audit.attribution.compare_runs`."""
    return query_at(
        reader,
        f"""
        select run_id, {OUTCOMES}
        from {JUDGED}
        where list_contains(?, run_id)
        group by run_id
        order by list_position(?, run_id)
        """,
        [list(run_ids), list(run_ids)],
        slo,
    )


def run_failures(reader: Reads, run_ids: Sequence[str]) -> pl.DataFrame:
    """Failed requests per run and kind. Columns: run_id, kind, requests."""
    return reader.query(
        f"""
        select run_id, status || coalesce(' ' || http_status::varchar, '') as kind,
            count(*) as requests
        from {JUDGED} where list_contains(?, run_id) and not is_ok
        group by all order by run_id, requests desc
        """,
        [list(run_ids)],
    )
