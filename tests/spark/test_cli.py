"""``routeaudit spark`` as the README gives it: export a store's raw tables, build every
relation with Spark, write the public ones where DuckDB reads them; and its refusals.

The whole command over the sample data takes minutes of Spark's fixed costs (planning and
compiling every relation), which the equivalence test already pays for the same build and
write: it is marked ``slow`` (``pytest -m slow tests/spark/test_cli.py``). In CI the command's
own part runs for real up to the build: the store exported, the arguments handed on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from routeaudit.cli import main
from tests.spark.test_spark_equivalence import _missing

pytestmark = [pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
              pytest.mark.xdist_group("spark")]


@pytest.mark.slow
def test_the_command_writes_the_relations_duckdb_reads(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from routeaudit._demo import write_sample_store

    store = write_sample_store(tmp_path / "sample.duckdb")
    out = tmp_path / "out"
    rc = main(["spark", "--db", str(store), "--raw", str(tmp_path / "raw"), "--out", str(out),
               "--master", "local[1]", "--driver-memory", "1g"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert str(out / "requests") in printed.out.splitlines()
    con = duckdb.connect(str(store), read_only=True)
    try:
        want = sorted(con.execute("select request_key, status, served_by from requests").fetchall())
    finally:
        con.close()
    got = sorted(duckdb.sql(
        f"select request_key, status, served_by from read_parquet('{out}/requests/**/*.parquet', "
        "hive_partitioning = true)").fetchall())
    assert got == want and len(want) > 100


def test_the_command_exports_the_store_and_hands_on_its_options(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to the build, for real: the store's raw tables exported to ``--raw``; the build
    itself (covered by the equivalence test) receives the folders, master, heap and settings."""
    from audit.spark import _run
    from routeaudit._demo import write_sample_store

    store = write_sample_store(tmp_path / "sample.duckdb")
    seen: dict[str, Any] = {}

    def build(raw: str, out: str, **options: Any) -> _run.Built:
        seen.update(raw=raw, out=out, **options)
        return _run.Built(written=["requests"], skipped={"x": "reads y"})

    monkeypatch.setattr(_run, "run", build)
    raw, out = tmp_path / "raw", tmp_path / "out"
    rc = main(["spark", "--db", str(store), "--raw", str(raw), "--out", str(out),
               "--master", "spark://h:7077", "--driver-memory", "6g",
               "--conf", "spark.hadoop.fs.s3a.endpoint=http://h:9000"])
    printed = capsys.readouterr()
    assert rc == 0
    assert seen == {"raw": str(raw), "out": str(out), "master": "spark://h:7077",
                    "driver_memory": "6g",
                    "conf": {"spark.hadoop.fs.s3a.endpoint": "http://h:9000"}}
    assert printed.out.splitlines() == [str(out / "requests")]
    assert "not built: x: reads y" in printed.err
    con = duckdb.connect(str(store), read_only=True)
    try:
        spans = con.execute("select count(*) from raw_spans").fetchall()[0][0]
    finally:
        con.close()
    exported = duckdb.sql(f"select count(*) from read_parquet('{raw}/raw_spans/**/*.parquet', "
                          "hive_partitioning = true)").fetchall()[0][0]
    assert exported == spans > 0


def test_a_raw_folder_without_its_tables_is_refused(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["spark", "--raw", str(tmp_path), "--out", str(tmp_path / "out")])
    assert rc != 0
    assert "no raw_spans/ folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_uri_folders_go_through_hadoops_file_system_with_the_settings_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--raw`` and ``--out`` as URIs (here ``file://``, as an object store's ``s3a://`` would
    be): read and written by Spark through Hadoop's file system, never as local paths; each
    ``--conf`` reaches the session. The build is cut to two relations (the whole build is
    the equivalence test's)."""
    from audit import spark as routeaudit_spark
    from audit.spark import _run
    from routeaudit._demo import write_sample_store

    store = write_sample_store(tmp_path / "sample.duckdb")
    con = duckdb.connect(str(store), read_only=True)
    try:
        routeaudit_spark.export_raw(con, tmp_path / "raw")
        want = con.execute("select count(*) from raw_span_attributes").fetchall()[0][0]
    finally:
        con.close()
    real_build = _run.build
    seen: dict[str, Any] = {}

    def small_build(spark: Any, **options: Any) -> _run.Built:
        seen["setting"] = spark.conf.get("spark.routeaudit.check")
        return real_build(spark, only=["raw_span_attributes", "slo_targets"], **options)

    monkeypatch.setattr(_run, "build", small_build)
    raw, out = f"file://{tmp_path}/raw", f"file://{tmp_path}/out/"
    rc = main(["spark", "--raw", raw, "--out", out, "--master", "local[1]",
               "--driver-memory", "1g", "--conf", "spark.routeaudit.check=a=b",
               "--conf", "spark.sql.shuffle.partitions=1"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert seen == {"setting": "a=b"}
    assert sorted(printed.out.splitlines()) == [f"file://{tmp_path}/out/raw_span_attributes",
                                                f"file://{tmp_path}/out/slo_targets"]
    got = duckdb.sql(f"select count(*) from read_parquet('{tmp_path}/out/raw_span_attributes/**/*.parquet', "
                     "hive_partitioning = true)").fetchall()[0][0]
    assert got == want > 0
    assert not (Path.cwd() / "file:").exists()
    # a URI without the raw tables: refused once Hadoop's file system says so
    rc = main(["spark", "--raw", f"file://{tmp_path}/out", "--out", f"file://{tmp_path}/o2",
               "--master", "local[1]", "--driver-memory", "1g"])
    err = capsys.readouterr().err
    assert rc != 0
    assert f"file://{tmp_path}/out/raw_spans: no such table folder" in err


def test_bad_settings_and_an_export_to_a_uri_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["spark", "--raw", str(tmp_path), "--out", str(tmp_path / "out"),
               "--conf", "spark.sql.shuffle.partitions"])
    assert rc != 0
    assert "expected KEY=VALUE" in capsys.readouterr().err
    rc = main(["spark", "--db", str(tmp_path / "a.duckdb"), "--raw", "s3a://bucket/raw",
               "--out", "s3a://bucket/out"])
    assert rc != 0
    assert "--db exports to a local folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
