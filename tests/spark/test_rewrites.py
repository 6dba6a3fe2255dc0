"""Each named rewrite of audit.spark gives, on Spark, DuckDB's answer to the construct it
translates: one small query per construct, run by DuckDB as written and by Spark translated,
over inline rows chosen at the edges (ties of a rounding, empty and NULL lists, unmatched outer
joins)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import duckdb
import pytest

from tests.spark.test_spark_equivalence import _missing, _same

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")

QUERIES: dict[str, str] = {
    "rounding_casts": """
        select a, b, cast((a + b) / 2.0 as bigint) as mid, cast(a * 0.5e0 as bigint) as half,
            cast(case when a > 0 then (a + b) / 2.0 else b end as int) as branch
        from (values (1, 2), (3, 4), (-1, -2), (2, 3), (-3, -4), (5, null)) as t(a, b)
        order by a
    """,
    "list_quantile": """
        select id, list_aggregate(l, 'quantile_cont', 0.5) as p50,
            list_aggregate(l, 'quantile_cont', 0.9) as p90,
            list_aggregate(l, 'quantile_cont', 0.99) as p99
        from (values (1, [4.0, 1.0, 3.0, 2.0]), (2, []::double[]), (3, null::double[]),
            (4, [7.5]), (5, [1.0, null, 10.0]), (6, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
            0.9, 1.0, 1.1])) as t(id, l)
        order by id
    """,
    "qualify_with_star": """
        with ranked as (
            select * from (values (1, 'a', 10), (1, 'b', 5), (2, 'c', 7)) as t(k, v, n)
            qualify row_number() over (partition by t.k order by n desc) = 1
        )
        select * from ranked order by k
    """,
    "row_as_struct": """
        select l.k, r from (values (1), (2)) as l(k)
        left join (values (1, 'x', 3.5)) as r(k, v, w) on r.k = l.k
        order by l.k
    """,
    "star_replace": """
        select r.* replace (coalesce(r.v, 'none') as v, r.n * 2 as n)
        from (values (1, 'a', 10), (2, null, 5)) as r(k, v, n)
        order by k
    """,
    "interval_functions": """
        select k, timestamp '2026-01-01 00:00:00' + to_microseconds(k) as at
        from (values (0), (1), (1500001), (86400000001)) as t(k)
        order by k
    """,
}
"""A query per rewrite, each ordered so that rows compare by position."""


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from audit import spark as routeaudit_spark

    session = routeaudit_spark.session("local[1]", shuffle_partitions=1)
    try:
        yield session
    finally:
        session.stop()


def _plain(value: Any) -> Any:
    """A Spark value as DuckDB's Python client gives it (a struct as a dict)."""
    from pyspark.sql import Row

    if isinstance(value, Row):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("rewrite", sorted(QUERIES))
def test_rewrite_gives_duckdbs_answer(spark: SparkSession, rewrite: str) -> None:
    from audit.spark import REWRITES, translate

    assert rewrite in REWRITES
    sql = QUERIES[rewrite]
    con = duckdb.connect()
    con.execute("set time zone 'UTC'")
    try:
        cur = con.execute(sql)
        want_cols = [d[0] for d in cur.description or []]
        want = cur.fetchall()
    finally:
        con.close()
    frame = spark.sql(translate(sql).sql)
    got = [tuple(_plain(v) for v in row) for row in frame.collect()]
    assert frame.columns == want_cols or sorted(frame.columns) == sorted(want_cols)
    assert len(got) == len(want), (got, want)
    order = [frame.columns.index(c) for c in want_cols]
    for have_row, want_row in zip(got, want, strict=True):
        have = tuple(have_row[i] for i in order)
        assert all(_same(w, h) for w, h in zip(want_row, have, strict=True)), (have, want_row)
