"""The policies page: runs of the same trace under different policies, side by side; or, where
requests carry no run id (a production fleet), the router's policies over the time window."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import polars as pl

from audit._reads import Reads
from audit._slo import SLO
from audit.queries._common import JUDGED, OUTCOMES, REQUEST_AT, TimeWindow, in_window, query_at, window_variables

Group = Literal["run_id", "policy"]
"""What the page compares: runs (a replay per policy) or the router's policies themselves."""

_GROUPS: Final[frozenset[str]] = frozenset({"run_id", "policy"})


def _group(by: str) -> str:
    if by not in _GROUPS:  # the column name goes into the SQL text
        raise ValueError(f"compare by run_id or policy, not {by!r}")
    return by


def run_list(reader: Reads, *, window: TimeWindow | None = None,
             by: Group = "run_id") -> pl.DataFrame:
    """Runs (``by="policy"``: router policies) with requests in ``window`` (None: the whole
    store). Columns: the group's column (run_id or policy), policies (comma-separated), requests,
    first_at, last_at (of its requests in the window)."""
    key = _group(by)
    where, params = in_window(window)
    return reader.query(
        f"""
        select {key}, string_agg(distinct policy, ', ' order by policy) as policies,
            count(*) as requests, min({REQUEST_AT}) as first_at, max({REQUEST_AT}) as last_at
        from requests where {key} is not null and {where}
        group by {key} order by first_at, {key}
        """,
        params, variables=window_variables(window),
    )


def run_summaries(reader: Reads, run_ids: Sequence[str], slo: SLO | None = None, *,
                  window: TimeWindow | None = None, by: Group = "run_id") -> pl.DataFrame:
    """One row per run of ``run_ids`` (``by="policy"``: per router policy) that has requests in
    ``window``, in that order: the group's column and the columns of :func:`overview_totals`
    over its requests in the window. Two runs tested against each other:
    :func:`audit.attribution.compare_runs`."""
    key = _group(by)
    where, params = in_window(window)
    return query_at(
        reader,
        f"""
        select {key}, {OUTCOMES}
        from {JUDGED}
        where list_contains(?, {key}) and {where}
        group by {key}
        order by list_position(?, {key})
        """,
        [list(run_ids), *params, list(run_ids)],
        slo, window=window,
    )


def run_failures(reader: Reads, run_ids: Sequence[str], *,
                 window: TimeWindow | None = None, by: Group = "run_id") -> pl.DataFrame:
    """Failed requests in ``window`` per run (``by="policy"``: per router policy) and kind.
    Columns: the group's column, kind, requests."""
    key = _group(by)
    where, params = in_window(window)
    return reader.query(
        f"""
        select {key}, status || coalesce(' ' || http_status::varchar, '') as kind,
            count(*) as requests
        from {JUDGED} where list_contains(?, {key}) and not is_ok and {where}
        group by all order by {key}, requests desc
        """,
        [list(run_ids), *params], variables=window_variables(window),
    )
