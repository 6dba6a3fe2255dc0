"""The Spark path gives the DuckDB path's relations.

The sample data's store is built with DuckDB, its raw tables exported to partitioned Parquet,
every relation built by Spark SQL (local[2]) from the same ``.sql`` files translated at run
time, and each public relation written to Parquet and read back with DuckDB; every relation is
compared row by row with the store's, matched on its grain. Floats agree within a relative
1e-9 (absolute 1e-9 near zero: Spark and DuckDB add doubles in different orders); every other
value, timestamps included, exactly.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import math
import shutil
from collections.abc import Collection, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from audit import _relations, _store

REL_TOL = 1e-9
ABS_TOL = 1e-9

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

PROVEN: tuple[str, ...] = ("slo_targets", "snapshots", "requests", "decisions", "candidates",
                           "executions", "slo_summary", "attributions", "slow_requests",
                           "calibration", "herding_episodes")
"""Public relations the Spark path is held to (docs/scale-out.md lists the others and why)."""

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


# One xdist group (`make test` runs `-n 2 --dist loadgroup`): every Spark test in one worker,
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
                                     java_options=routeaudit_spark.SHORT_RUN_JAVA_OPTIONS)
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
def paths(tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[tuple[Path, Path]]:
    """(the DuckDB sample store, the Spark path's output folder), built once per module. The
    generated run of ``test_spark_generated.py``, when it is to run too, is started first and
    made while this builds (conftest.py)."""
    from routeaudit._demo import write_sample_store
    from tests.spark.conftest import start_generated_run_if_wanted

    start_generated_run_if_wanted(request)
    root = tmp_path_factory.mktemp("spark")
    store = write_sample_store(root / "sample.duckdb")
    yield store, build_on_spark(store, root, PROVEN, INTERNAL)


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
    differ = [(key, col, want[key][col], have[key][col])
              for key in want for col in ref_cols if not _same(want[key][col], have[key][col])]
    assert not differ, f"{name}: {len(differ)} values differ, first: {differ[:5]}"


@pytest.mark.parametrize("name", (*PROVEN, *INTERNAL))
def test_relation_equal(paths: tuple[Path, Path], name: str) -> None:
    assert_relation_equal(*paths, name)


def test_proven_relations_compare_rows(paths: tuple[Path, Path]) -> None:
    """At least one proven relation has rows in the sample data (an empty one compares only
    its columns)."""
    store, _ = paths
    con = duckdb.connect(str(store), read_only=True)
    try:
        counts = {n: con.execute(f"select count(*) from {n}").fetchall()[0][0] for n in PROVEN}
    finally:
        con.close()
    assert any(counts.values()), counts


def test_every_public_relation_has_a_grain() -> None:
    assert sorted(GRAIN) == sorted(_relations.public_relations())
