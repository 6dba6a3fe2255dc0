"""Online retention: whole partitions of raw and of derived rows go, separately, while the store
keeps refreshing by slices; nothing else is touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tiled_sample import assert_span_keys_match, new_store, tiled_sample

from audit import _incremental
from audit._errors import StoreError
from audit._store import Store

S = 10**9


def _later(raw: dict[str, pa.Table], shift_ns: int) -> pa.Table:
    """The first copy's spans again, shifted past the end with fresh ids (new traffic)."""
    import duckdb

    con = duckdb.connect()
    try:
        con.register("s", raw["raw_spans"])
        return con.sql(f"""select * replace (md5(trace_id || '-late') as trace_id,
                                          start_ns + {shift_ns} as start_ns,
                                          end_ns + {shift_ns} as end_ns,
                                          a_run_id || '-late' as a_run_id,
                                          r_run_id || '-late' as r_run_id,
                                          a_request_id || '-late' as a_request_id)
                           from s where a_run_id like '%-c0' or r_run_id like '%-c0'""").to_arrow_table()
    finally:
        con.close()


def test_retention_drops_old_partitions_and_slices_go_on(tmp_path: Path) -> None:
    raw = tiled_sample()
    store = new_store(tmp_path / "r.duckdb", incremental=True)
    try:
        store.append(spans=raw["raw_spans"], events=raw["raw_span_events"])
        store.refresh()
        def con_rows(sql: str) -> list[tuple[Any, ...]]:
            # through the store: closed partitions are read with the DuckDB rows
            return [tuple(r.values()) for r in store.query_arrow(sql).to_pylist()]

        newest, oldest = con_rows("select max(start_ns), min(start_ns) from raw_spans")[0]
        span_s = (newest - oldest) / S
        assert span_s > 400, "the tiled sample spans several partitions"
        before = {r[0]: r[1:] for r in con_rows(
            "select request_key, status, chosen_replica, anchor_ns from requests")}
        attributed = con_rows("select count(*) from attributions")[0][0]

        done = store.retain(raw_s=240, verdicts_s=420)
        assert done.raw_from_ns == (newest - 240 * S) // (60 * S) * (60 * S)
        assert done.verdicts_from_ns == (newest - 420 * S) // (60 * S) * (60 * S)
        assert done.spans_deleted > 0 and done.requests_deleted > 0
        assert con_rows("select min(start_ns) from raw_spans")[0][0] >= done.raw_from_ns
        assert_span_keys_match(store)  # the deleted spans' keys went with them
        assert con_rows("select count(*) from raw_span_events e anti join raw_spans s "
                           "using (trace_id, span_id)")[0][0] == 0
        kept = {r[0]: r[1:] for r in con_rows(
            "select request_key, status, chosen_replica, anchor_ns from requests")}
        # derived rows: exactly the requests anchored at or after the verdict cut, unchanged
        assert kept == {k: v for k, v in before.items() if v[2] >= done.verdicts_from_ns}
        assert 0 < len(kept) < len(before)
        for rel in ("decisions", "executions", "candidates", "attributions"):
            orphans = con_rows(f"select count(*) from {rel} where request_key not in "
                                  "(select request_key from requests)")[0][0]
            assert orphans == 0, rel
        assert 0 < con_rows("select count(*) from attributions")[0][0] < attributed
        # rows between the two cuts outlive their raw rows
        assert any(v[2] < done.raw_from_ns for v in kept.values())
        assert store.relations_lag_spans == 0

        # new traffic: refreshed by a slice that never reaches back into the deleted time
        later = _later(raw, int(newest - oldest) + 30 * S)
        store.append(spans=later)
        store.refresh()
        assert store.last_refresh_kind == "slice"
        after = {r[0]: r[1:] for r in con_rows(
            "select request_key, status, chosen_replica, anchor_ns from requests")}
        assert {k: v for k, v in after.items() if k in kept} == kept
        assert len(after) > len(kept)
    finally:
        store.close()
    # the store's own records agree with its rows: reopening does not rebuild
    again = Store(tmp_path / "r.duckdb")
    try:
        assert not again.dirty
        assert _incremental.raw_kept_from(again._con) == done.raw_from_ns
    finally:
        again.close()


def test_retention_refuses_nonsense(tmp_path: Path) -> None:
    store = Store(tmp_path / "x.duckdb")
    try:
        with pytest.raises(StoreError, match="raw_s"):
            store.retain(raw_s=0)
        with pytest.raises(StoreError, match="verdicts_s"):
            store.retain(verdicts_s=-1)
        assert store.retain(raw_s=60).spans_deleted == 0  # empty store: nothing to do
    finally:
        store.close()
