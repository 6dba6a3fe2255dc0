"""The Spark path gives the DuckDB path's relations, over the sample data and a generated run.

One store holds both (``_data.py``): the sample data (800 requests in 2 runs, the data that has
attributions and slow requests) and a generated run of 5,000 requests (the testbed's
``baseline`` scenario, ``hot_prefix`` workload, 8 replicas, seed 0, through the OTel SDK and
the collector's decoder, a day after the sample data), where a plan that only works on a few
rows (a join that loses rows once partitions split, a window over several partitions) would
fail. DuckDB builds every relation over the store; its raw tables are exported to partitioned
Parquet, every relation is built by Spark SQL (local[2]) from the same ``.sql`` files translated
at run time, and each public relation is written to Parquet and read back with DuckDB. Every
relation compared is compared row by row with the store's, matched on its grain: floats agree
within a relative 1e-9 (absolute 1e-9 near zero: Spark and DuckDB add doubles in different
orders); every other value, timestamps included, exactly. One Spark build covers both data
sets: most of a build's time is fixed (the JVM, about 100 jobs, compiling their code).

The store is made in a child process while the other Spark tests run (conftest.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import math
import shutil
from collections.abc import Collection
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from audit import _relations, _store
from tests.spark._data import GENERATED_T0_NS, REQUESTS
from tests.spark.conftest import Generation

REL_TOL = 1e-9
ABS_TOL = 1e-9

BROADCAST_MAX_BYTES = 64 * 1024
"""Spark broadcasts a join's side below this estimated size (its default is 10 MB): the test's
data is small, so at the default nearly every join would be a broadcast, and the shuffled joins
a fleet's data gets would go untested."""

GRAIN: dict[str, tuple[str, ...]] = {
    "raw_span_attributes": ("trace_id", "span_id"),
    "requests": ("request_key",),
    "decisions": ("request_key", "attempt"),
    "candidates": ("decision_id", "event_index"),
    "executions": ("trace_id", "span_id"),
    "snapshots": ("target", "replica", "dp_rank", "scraped_ns"),
    "slo_targets": (),
    "slo_summary": ("run_id",),
    "attributions": ("request_key", "cause", "sub_kind"),
    "slow_requests": ("request_key",),
    "calibration": ("run_id", "router_id", "policy", "replica", "scope"),
    "herding_episodes": ("episode_id",),
}
"""Each public relation's grain (its ``.yml``): the key rows are matched on."""

PROVEN: tuple[str, ...] = ("raw_span_attributes", "slo_targets", "snapshots", "requests",
                           "decisions", "candidates", "executions", "slo_summary", "attributions",
                           "slow_requests", "calibration", "herding_episodes")
"""Public relations the Spark path is held to: every one."""

JSON_COLUMNS: dict[str, tuple[str, ...]] = {"raw_span_attributes": ("attributes",)}
"""Columns of JSON text, compared as the values they parse to: Spark writes the same objects
with other spacing, key order and number forms (docs/scale-out.md, ``json_objects``)."""

INTERNAL: dict[str, tuple[str, ...]] = {
    "stg_spans": ("trace_id", "span_id"),
    "stg_candidates": ("trace_id", "decision_span_id", "event_index"),
    "int_clock_offsets": ("part", "clock_domain"),
    "int_requests_linked": ("trace_id", "span_id"),
    "int_spans_clock_corrected": ("trace_id", "span_id"),
    "int_decisions_joined_to_executions": ("decision_id",),
    "int_attr_requests_judged": ("request_key",),
    "int_attr_decisions_resolved": ("request_key", "attempt", "decision_span_id"),
    "int_attr_candidates_resolved": ("request_key", "attempt", "decision_span_id", "replica"),
    "int_attr_candidates_state": ("request_key", "attempt", "decision_span_id", "replica"),
    "int_attr_requests_placed": ("request_key",),
}
"""Internal relations the proven ones read, held to the store's too (by their grain): the
steps a difference would start from (clock offsets, linking), already built for the public
ones."""


def _missing() -> str | None:
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("sqlglot") is None:
        return "pyspark and sqlglot are not installed (pip install -e '.[test]')"
    if shutil.which("java") is None:
        return "no Java runtime (make setup-test installs openjdk-17-jre-headless)"
    return None


# One xdist group (`make test` runs `-n 3 --dist loadgroup`): every Spark test in one worker,
# the module's build done once, and run as that worker's first work (xdist hands out the
# largest group first). A gateway forked by a worker that had already run the gRPC collector
# tests exited at start (JAVA_GATEWAY_EXITED, nothing on its stderr but gRPC's epoll error).
pytestmark = [pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
              pytest.mark.xdist_group("spark")]


def build_on_spark(store: Path, root: Path, public: Collection[str],
                   internal: Collection[str] = ()) -> Path:
    """Export ``store``'s raw tables under ``root``, build ``public`` and ``internal`` with the
    Spark path (local[2]) from them, and write them to ``root / "out"`` (returned)."""
    from audit import spark as routeaudit_spark

    con = duckdb.connect(str(store), read_only=True)
    try:
        raw = routeaudit_spark.export_raw(con, root / "raw")
    finally:
        con.close()
    spark = routeaudit_spark.session("local[2]", shuffle_partitions=2,
                                     java_options=routeaudit_spark.SHORT_RUN_JAVA_OPTIONS,
                                     conf={"spark.sql.autoBroadcastJoinThreshold":
                                           str(BROADCAST_MAX_BYTES)})
    try:
        routeaudit_spark.load_raw(spark, raw)
        built = routeaudit_spark.build(spark, only=(*public, *internal))
        assert not built.failed, built.failed
        routeaudit_spark.write_public(spark, root / "out", built)
        for name in internal:
            spark.table(name).write.parquet(str(root / "out" / name))
    finally:
        spark.stop()
    return root / "out"


@pytest.fixture(scope="module")
def store(compared_store: Generation) -> Path:
    """The DuckDB store of the sample data and the generated run, made in a process of its own
    started before the first Spark test (conftest.py)."""
    return compared_store.wait()


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory, store: Path) -> tuple[Path, Path]:
    """(the store, the Spark path's output folder), built once per module."""
    return store, build_on_spark(store, tmp_path_factory.mktemp("spark"), PROVEN, INTERNAL)


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DuckDB store of the sample data alone."""
    from routeaudit._demo import write_sample_store

    return write_sample_store(tmp_path_factory.mktemp("spark_sample") / "sample.duckdb")


def _norm(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return ("ts", round(value.timestamp() * 1e6))
    if isinstance(value, Decimal):
        # an integral decimal is a 128-bit integer on Spark (decision_key): exactly
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    a, b = _norm(a), _norm(b)
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        fa, fb = float(a), float(b)
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return math.isclose(fa, fb, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _rows(con: duckdb.DuckDBPyConnection, select: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    cur = con.execute(select)
    names = [d[0] for d in cur.description or []]
    return names, cur.fetchall()


def assert_relation_equal(store: Path, out: Path, name: str) -> None:
    """``name`` as Spark wrote it under ``out`` holds the rows of ``store``'s, matched on its
    grain, each value the same (floats within the tolerances above).

    Rows equal in every column as DuckDB compares them (``except all``, both ways) are set
    aside first; only the others are matched on the grain and compared value by value here
    (at 160,000 rows the comparison in Python took seconds per relation). Where DuckDB cannot
    set the two sides against each other (types it will not unify), every row is compared."""
    con = duckdb.connect(str(store), read_only=True)
    _store._tune(con)
    keys = GRAIN[name] if name in GRAIN else INTERNAL[name]
    try:
        with contextlib.suppress(duckdb.Error):  # a store's naive timestamps are UTC (as _norm reads them)
            con.execute("set timezone = 'UTC'")
        ref_cols, _ = _rows(con, f"select * from {name} limit 0")
        glob = str(out / name / "**" / "*.parquet").replace("'", "''")
        spark_rows = f"read_parquet('{glob}', hive_partitioning = true, union_by_name = true)"
        got_cols, _ = _rows(con, f"select * from {spark_rows} limit 0")
        assert sorted(got_cols) == sorted(ref_cols)
        n_ref, n_got = (con.execute(f"select count(*) from {t}").fetchall()[0][0]
                        for t in (name, spark_rows))
        assert n_got == n_ref, f"{name}: {n_got} rows from Spark, {n_ref} from DuckDB"
        if keys:
            grain = ", ".join(f'"{k}"' for k in keys)
            for t in (name, spark_rows):
                distinct = con.execute(f"select count(*) from (select distinct {grain} from {t})"
                                       ).fetchall()[0][0]
                assert distinct == n_ref, f"{name}: grain {keys} not unique"
        cols = ", ".join(f'"{c}"' for c in ref_cols)
        try:
            _, ref = _rows(con, f"select {cols} from {name} except all select {cols} from {spark_rows}")
            _, got = _rows(con, f"select {cols} from {spark_rows} except all select {cols} from {name}")
            got_cols = ref_cols
        except duckdb.Error:
            _, ref = _rows(con, f"select * from {name}")
            got_cols, got = _rows(con, f"select * from {spark_rows}")
    finally:
        con.close()
    assert len(got) == len(ref), f"{name}: {len(ref)} rows differ from Spark's, {len(got)} of Spark's"

    def by_grain(cols: list[str], rows: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        found = {}
        for row in rows:
            record = dict(zip(cols, row, strict=True))
            found[tuple(_norm(record[k]) for k in keys)] = record
        assert len(found) == len(rows), f"{name}: grain {keys} not unique"
        return found

    want, have = by_grain(ref_cols, ref), by_grain(got_cols, got)
    assert want.keys() == have.keys()
    for col in JSON_COLUMNS.get(name, ()):
        for record in (*want.values(), *have.values()):
            record[col] = None if record[col] is None else json.loads(record[col])
    differ = [(key, col, want[key][col], have[key][col])
              for key in want for col in ref_cols if not _same(want[key][col], have[key][col])]
    assert not differ, f"{name}: {len(differ)} values differ, first: {differ[:5]}"


@pytest.mark.parametrize("name", (*PROVEN, *INTERNAL))
def test_relation_equal(paths: tuple[Path, Path], name: str) -> None:
    assert_relation_equal(*paths, name)


def test_proven_relations_compare_rows(paths: tuple[Path, Path]) -> None:
    """At least one proven relation has rows in the store (an empty one compares only its
    columns)."""
    store, _ = paths
    con = duckdb.connect(str(store), read_only=True)
    try:
        counts = {n: con.execute(f"select count(*) from {n}").fetchall()[0][0] for n in PROVEN}
    finally:
        con.close()
    assert any(counts.values()), counts


def test_generated_run_is_full_size(store: Path) -> None:
    """The store holds the generated run's requests (those from its start on), each with its
    decision and candidates, beside the sample data's."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        requests, decisions, candidates, earlier = con.execute(
            "select (select count(*) from requests where anchor_ns >= $t0), "
            "(select count(*) from decisions where request_key in "
            "  (select request_key from requests where anchor_ns >= $t0)), "
            "(select count(*) from candidates where request_key in "
            "  (select request_key from requests where anchor_ns >= $t0)), "
            "(select count(*) from requests where anchor_ns < $t0)",
            {"t0": GENERATED_T0_NS}).fetchall()[0]
    finally:
        con.close()
    assert requests >= REQUESTS
    assert decisions >= REQUESTS and candidates >= REQUESTS
    assert earlier > 0


@pytest.mark.parametrize("name", (*PROVEN, *INTERNAL))
def test_sample_data_rows_as_alone(store: Path, sample_store: Path, name: str) -> None:
    """Each relation compared holds, in the store of both, every row a store of the sample data
    alone holds, equal in every column but ``verdict_final`` (the generated run, later, makes
    the sample data's verdicts final; floats within the tolerances above): the generated run
    changes none of the sample data's rows, so the comparison above holds Spark to them as they
    are alone."""
    keys = GRAIN[name] if name in GRAIN else INTERNAL[name]
    con = duckdb.connect(str(store), read_only=True)
    try:
        quoted = str(sample_store).replace("'", "''")
        con.execute(f"attach '{quoted}' as alone (read_only)")
        names = [c for c, *_ in con.execute(f"describe alone.{name}").fetchall()
                 if c != "verdict_final"]
        cols = ", ".join(f'"{c}"' for c in names)
        alone = con.execute(f"select count(*) from alone.{name}").fetchall()[0][0]
        # rows not found equal in every column, then their rows of the same grain in the store
        _, changed = _rows(con, f"select {cols} from alone.{name} except all select {cols} from {name}")
        grain = " and ".join(f'b."{k}" is not distinct from $k{i}' for i, k in enumerate(keys))
        differ = []
        for row in changed:
            record = dict(zip(names, row, strict=True))
            found = con.execute(f"select {cols} from {name} as b where {grain or 'false'}",
                                {f"k{i}": record[k] for i, k in enumerate(keys)}).fetchall()
            if len(found) != 1 or not all(_same(a, b) for a, b in zip(row, found[0], strict=True)):
                differ.append((row, found))
    finally:
        con.close()
    assert not differ, (f"{name}: {len(differ)} of the sample data's {alone} rows changed in the "
                        f"store of both, first: {differ[:2]}")


def test_every_public_relation_has_a_grain() -> None:
    assert sorted(GRAIN) == sorted(_relations.public_relations())


def test_every_public_relation_compared() -> None:
    assert sorted(PROVEN) == sorted(_relations.public_relations())
