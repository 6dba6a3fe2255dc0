"""A new store copies the empty relations this process built before (audit._empty_store): the
same database a build writes, for the same code and settings only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from audit import _relations
from audit._store import Store


def _objects(path: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], dict[str, str]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        tables = con.execute(
            "select table_name, table_type from information_schema.tables "
            "where table_catalog = current_database() order by table_name").fetchall()
        columns = con.execute(
            "select table_name, column_name, data_type, ordinal_position "
            "from information_schema.columns where table_catalog = current_database() "
            "order by table_name, ordinal_position").fetchall()
        meta = dict(con.execute("select key, value from routeaudit_meta").fetchall())
        return tables, columns, meta
    finally:
        con.close()


def _counting_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    builds: list[int] = []
    original = _relations.refresh

    def counting(con: duckdb.DuckDBPyConnection, *args: Any, **kwargs: Any) -> int:
        builds.append(1)
        return original(con, *args, **kwargs)

    monkeypatch.setattr(_relations, "refresh", counting)
    return builds


def _new(path: Path, **options: Any) -> Path:
    Store(path, **options).close()
    return path


def test_a_second_new_store_is_the_first_ones_copy_with_its_own_build_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _counting_builds(monkeypatch)
    # settings no other test uses: this process has no template of them yet
    settings = {"partition_s": 97.0}
    first = _new(tmp_path / "first.duckdb", partitioning=settings)
    assert len(builds) == 1
    second = _new(tmp_path / "second.duckdb", partitioning=settings)
    assert len(builds) == 1, "the second store was built, not copied"
    t1, c1, m1 = _objects(first)
    t2, c2, m2 = _objects(second)
    assert (t2, c2) == (t1, c1) and len(t1) > 40
    assert m2["relations_version"] == m1["relations_version"] == _relations.relations_version()
    assert m2["partition_s"] == "97.0" and int(m2["refreshed_ns"]) > int(m1["refreshed_ns"])
    # reopened, the copy is a store of its own settings (not rebuilt: its relations are current)
    store = Store(second)
    try:
        assert len(builds) == 1
        got = store.query_arrow("select partition_ns from stg_partitioning").to_pylist()
        assert got == [{"partition_ns": 97 * 10**9}]
    finally:
        store.close()


def test_other_settings_or_storage_get_a_build_of_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _counting_builds(monkeypatch)
    _new(tmp_path / "a.duckdb", partitioning={"partition_s": 89.0})
    other = _new(tmp_path / "b.duckdb", partitioning={"partition_s": 83.0})
    assert len(builds) == 2
    con = duckdb.connect(str(other), read_only=True)
    try:
        assert con.execute("select partition_ns from stg_partitioning").fetchall() == [(83 * 10**9,)]
    finally:
        con.close()
    # the default-SLO tables of an empty store (built when caching starts at 0 spans)
    monkeypatch.setattr(_relations, "CACHE_MIN_SPANS", 0)
    cached = _new(tmp_path / "c.duckdb", partitioning={"partition_s": 89.0})
    assert len(builds) == 3
    tables = {t for t, _ in _objects(cached)[0]}
    assert "attributions" + _relations.CACHE_SUFFIX in tables


def test_an_existing_file_is_never_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {"partition_s": 79.0}
    _new(tmp_path / "template.duckdb", partitioning=settings)
    path = tmp_path / "kept.duckdb"
    con = duckdb.connect(str(path))
    con.execute("create table mine as select 42 as answer")
    con.close()
    Store(path, partitioning=settings).close()
    con = duckdb.connect(str(path), read_only=True)
    try:
        assert con.execute("select answer from mine").fetchall() == [(42,)]
    finally:
        con.close()


def test_a_new_store_keeps_its_file_locked_against_other_processes(tmp_path: Path) -> None:
    """Copying the template must not touch the open store's file: reading it from the process
    that holds it would drop DuckDB's lock (POSIX locks go with any descriptor closed)."""
    import subprocess
    import sys

    for name in ("first.duckdb", "second.duckdb"):  # built (or copied), then copied
        path = tmp_path / name
        store = Store(path, partitioning={"partition_s": 71.0})
        try:
            probe = subprocess.run(
                [sys.executable, "-c", "import duckdb, sys; duckdb.connect(sys.argv[1])", str(path)],
                capture_output=True, text=True, timeout=60)
            assert probe.returncode != 0 and "lock" in probe.stderr.lower(), probe.stderr
        finally:
            store.close()


def test_a_file_created_meanwhile_is_not_written_over(tmp_path: Path) -> None:
    """Another process may create the file between the store's check and the copy."""
    from audit import _empty_store

    settings = {"partition_s": 73.0}
    _new(tmp_path / "template.duckdb", partitioning=settings)
    theirs = tmp_path / "theirs.duckdb"
    theirs.write_bytes(b"another process's file")
    copied = _empty_store.copy_to(theirs, _empty_store.key(settings),
                                  lambda at: pytest.fail("the template exists: no build"))
    assert copied is False and theirs.read_bytes() == b"another process's file"
