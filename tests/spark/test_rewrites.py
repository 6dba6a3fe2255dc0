"""Each named rewrite of audit.spark gives, on Spark, DuckDB's answer to the construct it
translates: one small query per construct, run by DuckDB as written and by Spark translated,
over inline rows chosen at the edges (ties of a rounding, empty and NULL lists, unmatched outer
joins)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import duckdb
import pytest

from tests.spark.test_spark_equivalence import _missing, _same

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The same xdist group as test_spark_equivalence (one worker, one JVM).
pytestmark = [pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
              pytest.mark.xdist_group("spark")]

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
        select k, timestamp '2026-01-01 00:00:00' + to_microseconds(k) as t_at
        from (values (0), (1), (1500001), (86400000001)) as t(k)
        order by k
    """,
    "md5_number": """
        select s, cast(md5_number(s) >> 3 as hugeint) as k
        from (values ('a'), ('abc|1|-'), (''), ('req-7|-|00ff')) as t(s)
        order by k
    """,
    "hugeint": """
        select k, sum(cast(a as hugeint) * b) as s, max(cast(a as hugeint)) as m
        from (values (1, 3000000000, 4000000000), (1, 5000000000, 6000000000), (2, 1, 2))
            as t(k, a, b)
        group by k
        order by k
    """,
    "folded_keys": """
        select l.replica, l.t_at, case when s.replica = l.replica then s.v end as v
        from (
            select *, (cast(hash(replica) >> 2 as hugeint) << 64) + t_at as k
            from (
                select replica, 1767225600000000 + cast(n as bigint) * 1000000000 as t_at
                from (values ('r1', 10), ('r1', 30), ('r2', 5), ('r3', 1), ('r4', 7), ('r2', 40),
                    ('r3', 25), ('r1', 3)) as t(replica, n)
            )
        ) as l
        asof left join (
            select *, (cast(hash(replica) >> 2 as hugeint) << 64) + t_at as k
            from (
                select replica, 1767225600000000 + cast(n as bigint) * 1000000000 as t_at, v
                from (values ('r1', 10, 'a'), ('r1', 20, 'b'), ('r2', 6, 'c'), ('r3', 0, 'd'),
                    ('r4', 35, 'e'), ('r2', 33, 'f'), ('r3', 24, 'g')) as t(replica, n, v)
            )
        ) as s
            on l.k >= s.k
        order by l.replica, l.t_at
    """,
    "asof_joins": """
        select l.g, l.t_at, s.v, s.t_at as s_at
        from (values ('x', 10), ('x', 20), ('x', 5), ('y', 3), (null, 9), ('x', null))
            as l(g, t_at)
        asof left join (values ('x', 10, 'p'), ('x', 15, 'q'), ('y', 4, 'r'), ('x', null, 'n'))
            as s(g, t_at, v)
            on l.g = s.g
            and l.t_at >= s.t_at
        order by l.g nulls last, l.t_at nulls last
    """,
    "union_by_name": """
        with a as (select 1 as x, 'p' as y), b as (select 'q' as y, 2 as x, 3.5 as z)
        select * from a
        union all by name
        select * from b
        order by x
    """,
    "row_keys": """
        select k, arg_min(x, (a, b)) as lo, arg_max(x, (a, b)) as hi
        from (values (1, 1, null, 1), (1, 2, 5, 1), (1, 3, 5, null), (2, 4, 1, 1)) as t(k, x, a, b)
        group by k
        order by k
    """,
    "json_objects": """
        with stored as (
            select *, json_keys(coalesce(a, '{}')) as ks
            from (values (1, '{"x": 1, "team.note": "kept"}', 'v', 2.5, [1, 2]),
                (2, null, 'v', null, null), (3, '{}', null, null, null),
                (4, '{"k.s": "stored", "n": null}', 'typed', 0.1, []),
                (5, '{"y": [1, {"z": true}]}', null, 1e-7, [3])) as t(id, a, s, d, l)
        )
        select id, json_merge_patch(coalesce(a, '{}'), json_merge_patch('{}', json_object(
            'k.s', if(list_contains(ks, 'k.s'), null, s),
            'k.d', if(list_contains(ks, 'k.d'), null, d),
            'k.l', if(list_contains(ks, 'k.l'), null, l)))) as o
        from stored
        order by id
    """,
    "any_value": """
        select k, any_value(v) as v, any_value(v) filter (where f) as w
        from (values (1, null, true), (1, 'a', true), (2, null, false), (2, 'b', true)) as t(k, v, f)
        group by k
        order by k
    """,
    "unnest_struct": """
        select k, unnest(arg_min({'a': x, 'b': y}, x))
        from (values (1, 2, 'p'), (1, 1, 'q'), (2, 5, 'r')) as t(k, x, y)
        group by k
        order by k
    """,
    "printf_floats": """
        select printf('%.1f ms' || ' over %d, %.0f s', a / 1000.0, n, a / 1000.0) as s
        from (values (1500, 2), (2250, 3), (2500, 4), (3500, 5), (1234, 6)) as t(a, n)
        order by a
    """,
    "hashes": """
        select block, n, min(block) over (partition by n, p1, p2) as class
        from (
            select block, count(*) as n, sum(cast(hash(r, t) as hugeint)) as p1,
                sum(cast(hash(t, r, 'row') as hugeint)) as p2
            from (
                select r, t, unnest(blocks) as block
                from (values ('r1', 1, ['a', 'b', 'c']), ('r1', 2, ['a', 'b']),
                    ('r2', 1, ['a', 'b', 'd']), ('r2', 5, ['e']), ('r3', 5, ['f', 'g']),
                    ('r2', 5, ['g', 'f'])) as x(r, t, blocks)
            ) as u
            group by block
        ) as b
        order by block
    """,
    "parallel_unnests": """
        select k, unnest(l) as v, unnest(range(1, len(l) + 1)) as i
        from (values (1, ['a', 'b', 'c']), (2, ['d'])) as t(k, l)
        order by k, i
    """,
}
"""A query per rewrite, each ordered so that rows compare by position."""


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from audit import spark as routeaudit_spark

    # the options apply to the first session of the process (one JVM), whichever module it is
    session = routeaudit_spark.session("local[1]", shuffle_partitions=1,
                                       java_options=routeaudit_spark.SHORT_RUN_JAVA_OPTIONS)
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
    if rewrite == "json_objects":  # the same objects, written with other spacing and order
        got = [tuple(json.loads(v) if isinstance(v, str) else v for v in row) for row in got]
        want = [tuple(json.loads(v) if isinstance(v, str) else v for v in row) for row in want]
    for have_row, want_row in zip(got, want, strict=True):
        have = tuple(have_row[i] for i in order)
        assert all(_same(w, h) for w, h in zip(want_row, have, strict=True)), (have, want_row)


RANGE_JOIN = """
    with spans as (
        select *, (cast(hash(replica) >> 2 as hugeint) << 64) + s as start_key,
            (cast(hash(replica) >> 2 as hugeint) << 64) + e as end_key
        from (values ('r1', 1, 10), ('r1', 5, 8), ('r2', 2, 20), ('r3', 30, 40)) as t(replica, s, e)
    ),
    instants as (
        select *, (cast(hash(replica) >> 2 as hugeint) << 64) + t as at_key
        from (values ('r1', 6), ('r2', 3), ('r3', 1), ('r1', 10)) as t(replica, t)
    )
    select i.replica, i.t, count(x.s) as n
    from instants as i
    left join spans as x
        on x.start_key <= i.at_key
        and x.end_key > i.at_key
    group by i.replica, i.t
    order by i.replica, i.t
"""


def test_folded_range_join_is_a_join_on_the_group(spark: SparkSession) -> None:
    """``folded_range_joins``: a range join bounded both ways over folded keys gives DuckDB's
    rows and is planned as a join on the group (an equi-join), not a comparison of every pair
    (a nested loop), which it is without the added equality."""
    from audit.spark import REWRITES, _translate, translate

    assert "folded_range_joins" in REWRITES
    con = duckdb.connect()
    try:
        want = con.execute(RANGE_JOIN).fetchall()
    finally:
        con.close()
    frame = spark.sql(translate(RANGE_JOIN).sql)
    assert [tuple(r) for r in frame.collect()] == want
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert "NestedLoopJoin" not in plan and "CartesianProduct" not in plan, plan
    saved = dict(REWRITES)
    try:
        _translate.REWRITES.pop("folded_range_joins")
        unkeyed = spark.sql(translate(RANGE_JOIN).sql)
        assert "NestedLoopJoin" in unkeyed._jdf.queryExecution().executedPlan().toString()
    finally:
        _translate.REWRITES.clear()
        _translate.REWRITES.update(saved)


SHARED_CTES = """
    with pairs as (
        select a, count(*) as n from (values (1), (1), (2), (3)) as t(a) group by a
    ),
    single as not materialized (
        select a, n * 10 as n from pairs where a > 1 group by a, n
    ),
    joined as (
        select l.a, l.n, r.n as m from pairs as l left join single as r on l.a = r.a
    )
    select x.a, x.n, x.m, y.n as again from joined as x inner join pairs as y on x.a = y.a
    union all
    select a, n, null, null from single
    order by a, again nulls last
"""


def test_shared_ctes_are_built_once(spark: SparkSession) -> None:
    """``shared_ctes``: a CTE read more than once is a step of its own, built once and read
    as a view wherever the query named it, and the query gives DuckDB's rows; a CTE read once,
    or written ``not materialized``, stays inline."""
    from audit.spark import translate
    from audit.spark._run import _evaluate
    from audit.spark._translate import Stage

    con = duckdb.connect()
    try:
        want = con.execute(SHARED_CTES).fetchall()
    finally:
        con.close()
    translation = translate(SHARED_CTES, "shared")
    assert [s.view for s in translation.steps if isinstance(s, Stage)] == ["__shared__pairs"]
    assert "__shared__pairs" in translation.sql and "single" in translation.sql
    got = [tuple(r) for r in _evaluate(spark, translation).collect()]
    assert got == want
    inline = translate(SHARED_CTES, "shared", stages=False)
    assert not inline.steps and "__shared__" not in inline.sql


BUCKETED_RANGE_JOIN = """
    with spans as (
        select *, (cast(hash(replica) >> 2 as hugeint) << 64) + epoch_us(s) as start_key,
            (cast(hash(replica) >> 2 as hugeint) << 64) + epoch_us(e) as end_key
        from (values ('r1', 1, 10), ('r1', 5, 8), ('r1', 0, 3), ('r2', 2, 20), ('r3', 30, 40),
                     ('r1', 6, 6), ('r2', 7, null))
            as t(replica, s_s, e_s),
            lateral (select to_timestamp(s_s) as s, to_timestamp(e_s) as e)
    ),
    instants as (
        select *, (cast(hash(replica) >> 2 as hugeint) << 64) + epoch_us(t) as at_key
        from (values ('r1', 6), ('r2', 3), ('r3', 1), ('r1', 10), ('r1', 3), ('r1', 0),
                     ('r2', 19), ('r4', 5)) as v(replica, t_s),
            lateral (select to_timestamp(t_s) as t)
    )
    select i.replica, i.t_s, count(x.s_s) as n, sum(x.s_s) as starts
    from instants as i
    left join spans as x
        on x.start_key <= i.at_key
        and x.end_key > i.at_key
    group by i.replica, i.t_s
    order by i.replica, i.t_s
"""


def test_folded_range_join_is_keyed_by_time_bucket(spark: SparkSession,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``folded_range_joins`` over microsecond keys: the interval side spread over the time
    buckets it overlaps and the join keyed by the point's bucket gives DuckDB's rows, each
    pair once, with intervals over several buckets and instants on a bucket's edge (buckets
    of 3 s here)."""
    from audit.spark import _translate, translate

    monkeypatch.setattr(_translate, "RANGE_BUCKET_US", 3_000_000)
    con = duckdb.connect()
    con.execute("set time zone 'UTC'")
    try:
        want = con.execute(BUCKETED_RANGE_JOIN).fetchall()
    finally:
        con.close()
    sql = translate(BUCKETED_RANGE_JOIN).sql
    assert "__range_bucket = i.at_key.lo DIV 3000000" in sql, sql
    frame = spark.sql(sql)
    assert [tuple(r) for r in frame.collect()] == want
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert "NestedLoopJoin" not in plan and "CartesianProduct" not in plan, plan


OVERLAP_JOIN = """
    with spans as (
        select *, (cast(hash(replica) >> 2 as hugeint) << 64) + epoch_us(s) as start_key,
            (cast(hash(replica) >> 2 as hugeint) << 64) + epoch_us(e) as end_key
        from (values ('r1', 1, 2, 20), ('r1', 2, 5, 7), ('r1', 3, 12, 14), ('r2', 4, 0, 9))
            as t(replica, id, s_s, e_s),
            lateral (select to_timestamp(s_s) as s, to_timestamp(e_s) as e)
    )
    select y.id, count(x.id) as n
    from spans as y
    left join spans as x
        on x.start_key < y.end_key
        and x.end_key > y.start_key
        and x.id <> y.id
    group by y.id
    order by y.id
"""


def test_overlapping_intervals_are_not_bucketed_by_a_point(spark: SparkSession,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Two intervals overlapping bound each other's ends: neither end is a point inside the
    other interval (one may lie wholly inside the other, away from the bucket of either end),
    so no time bucket keys the join, and Spark gives DuckDB's rows."""
    from audit.spark import _translate, translate

    monkeypatch.setattr(_translate, "RANGE_BUCKET_US", 3_000_000)
    con = duckdb.connect()
    con.execute("set time zone 'UTC'")
    try:
        want = con.execute(OVERLAP_JOIN).fetchall()
    finally:
        con.close()
    from audit.spark._run import _evaluate

    translation = translate(OVERLAP_JOIN)  # ``spans`` is read twice: a step of its own
    assert "__range_bucket" not in translation.sql, translation.sql
    assert [tuple(r) for r in _evaluate(spark, translation).collect()] == want


def test_a_fingerprint_hash_is_64_bits_on_spark() -> None:
    """Spark's ``hash`` is 32 bits: summed fingerprints of that width would put blocks with
    different histories in one class once there are tens of thousands of them."""
    from audit.spark import translate

    sql = translate("select sum(cast(hash(r, t) as hugeint)) as p from x").sql.lower()
    assert "xxhash64(r, t)" in sql and " hash(" not in sql
