"""Plan shapes that keep the refresh linear (timings belong in benchmarks/, plans do not vary)."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from audit import _relations
from audit._store import Store
from routeaudit._demo import write_sample_store


def _joins(con: duckdb.DuckDBPyConnection, relation: str) -> set[str]:
    sql = {r.name: r for r in _relations.load_relations()}[relation].sql
    text = "\n".join(row[1] for row in con.sql(f"explain {sql}").fetchall())
    return {m.strip().lower() for m in re.findall(r"[A-Za-z ]*Join", text)}


def test_the_prefix_block_lookup_is_a_sort_merge_asof_join(tmp_path: Path) -> None:
    """int_attr_candidates_state finds the last time the chosen replica served each prefix
    block with an ASOF join. DuckDB turns an ASOF join whose left side it estimates small into a
    nested loop over every pair, and it estimates this one small at any size (a 12,000-request
    `mixed` replay: 82 s instead of 0.35 s): the store's connections forbid that."""
    path = write_sample_store(tmp_path / "sample.duckdb")
    plain = duckdb.connect(str(path), read_only=True)
    assert "nested loop join" in _joins(plain, "int_attr_candidates_state")  # DuckDB's default
    plain.close()
    store = Store(path)
    try:
        joins = _joins(store._con, "int_attr_candidates_state")
    finally:
        store.close()
    assert "asof join" in joins and "nested loop join" not in joins
