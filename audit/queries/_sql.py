"""The SQL page: a person's own read-only queries, and examples to start from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import polars as pl

from audit._reads import Reads

EXAMPLE_QUERIES: Final[Mapping[str, str]] = {
    "Every attribute of the slowest request's spans": (
        "select s.name, s.kind, v.attributes\nfrom raw_spans s\n"
        "join raw_span_attributes v using (trace_id, span_id)\n"
        "where s.a_request_id = (select request_id from requests\n"
        "    where ttft_ms is not null order by ttft_ms desc limit 1)\n"
        "order by s.start_ns"
    ),
    "Slowest requests by TTFT": (
        "select request_id, policy, chosen_replica, ttft_ms, tpot_ms, status\n"
        "from requests\nwhere ttft_ms is not null\norder by ttft_ms desc\nlimit 20"
    ),
    "TTFT percentiles per policy": (
        "select policy, count(*) as requests,\n"
        "    quantile_cont(ttft_ms::double, [0.5, 0.9, 0.99]) as ttft_p50_p90_p99_ms\n"
        "from requests\ngroup by policy\norder by policy"
    ),
    "Decisions per replica and reason": (
        "select chosen_replica, reason, count(*) as decisions\n"
        "from decisions\ngroup by all\norder by decisions desc"
    ),
    "Stale telemetry at decision time": (
        "select d.router_id, c.replica, c.telemetry_age_ms\nfrom candidates c\n"
        "join decisions d using (request_key, attempt)\n"
        "order by c.telemetry_age_ms desc nulls last\nlimit 50"
    ),
    "Relations and columns": (
        "select table_name, count(*) as columns\nfrom information_schema.columns\n"
        "group by table_name\norder by table_name"
    ),
}
"""Read-only example queries offered by the dashboard's SQL page."""


def run_sql(reader: Reads, sql: str, max_rows: int = 10_000) -> tuple[pl.DataFrame, bool]:
    """Run a user's read-only query; return (at most ``max_rows`` rows, whether truncated).

    The reader's read-only guard refuses writes, ATTACH, COPY, INSTALL and file access with
    :class:`audit.ReadOnlyError` / :class:`audit.QueryError`.
    """
    df = reader.query(sql)
    return df.head(max_rows), df.height > max_rows
