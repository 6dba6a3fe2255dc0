"""``routeaudit spark`` as the README gives it: export a store's raw tables, build every
relation with Spark, write the public ones where DuckDB reads them; and its refusals."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from routeaudit.cli import main
from tests.spark.test_spark_equivalence import _missing

pytestmark = [pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
              pytest.mark.xdist_group("spark")]


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


def test_a_raw_folder_without_its_tables_is_refused(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["spark", "--raw", str(tmp_path), "--out", str(tmp_path / "out")])
    assert rc != 0
    assert "no raw_spans/ folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
