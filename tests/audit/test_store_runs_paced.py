"""Per-run rows (the default-SLO tables of ``slo_summary`` and ``calibration``, merged over a
run's whole history) are recomputed after a slice's verdicts commit: an explicit refresh brings
them up to date, a refresh the collector paces lets them wait while their last recompute was
slow, and marks left waiting are recomputed when the store closes."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiled_sample import batches, new_store, tiled_sample

from audit import _incremental, _relations, _store
from audit._store import Store


def _runs(store: Store, relation: str) -> list[tuple[object, ...]]:
    """Each run's requests in ``relation`` (the stored rows at the defaults, or ``__live``)."""
    table = store.query_arrow(f"select run_id, requests from {relation} order by run_id nulls first")
    return list(zip(*(table.column(c).to_pylist() for c in ("run_id", "requests")), strict=True))


def _pending(store: Store) -> int:
    """The marks as stored (what a collector started on the file would find)."""
    sql = f"select count(*) as n from {_incremental.RUNS_DUE_TABLE}"
    return int(store.query_arrow(sql).column("n")[0].as_py())


def test_a_paced_refresh_commits_the_verdicts_and_lets_slow_run_rows_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_relations, "CACHE_MIN_SPANS", 0)
    monkeypatch.setattr(_store, "SLICED_CACHE_MIN_SPANS", 0)
    parts = batches(tiled_sample(2), seed=7, batches=4)
    now = [1000.0]
    path = tmp_path / "s.duckdb"
    store = new_store(path, incremental=True, clock=lambda: now[0])
    try:
        for batch in parts[:2]:
            store.append(spans=batch["spans"], events=batch["events"], snapshots=batch["snapshots"])
            store.refresh()
            assert store.last_refresh_kind in ("slice", "none")
            # explicit: the runs the slice touched are recomputed after it
            assert store.runs_pending == 0 and store.last_runs_s is not None
            assert _runs(store, "slo_summary__cached") == _runs(store, "slo_summary__live")
        before = _runs(store, "slo_summary__cached")
        requests_before = store.query_arrow("select count(*) as n from requests").column("n")[0].as_py()

        # the last recompute took long (a run with a long history): a paced refresh leaves it
        store.last_runs_s = 10 * _store.SYNC_REFRESH_BUDGET_S
        store._runs_ended = now[0]
        batch = parts[2]
        store.append(spans=batch["spans"], events=batch["events"], snapshots=batch["snapshots"])
        assert store.refresh_if_due()
        assert store.last_refresh_kind == "slice"
        requests_after = store.query_arrow("select count(*) as n from requests").column("n")[0].as_py()
        assert requests_after > requests_before, "the verdicts of the new rows committed"
        assert store.runs_pending > 0 and _pending(store) == store.runs_pending
        assert _runs(store, "slo_summary__cached") == before, "the per-run rows waited"
        assert _runs(store, "slo_summary__live") != before

        # within the share of time they may take: still waiting, also without new rows
        now[0] += store.last_runs_s * (1 - _store.RUNS_MAX_SHARE) / _store.RUNS_MAX_SHARE - 1
        assert not store.refresh_if_due()
        assert store.runs_pending > 0
        # past it: recomputed without new rows to slice
        now[0] += 2
        assert not store.refresh_if_due()
        assert store.runs_pending == 0 and _pending(store) == 0
        assert _runs(store, "slo_summary__cached") == _runs(store, "slo_summary__live")
        calibration = "select count(*) as n from (select * from calibration__cached except all " \
                      "select * from calibration__live)"
        assert store.query_arrow(calibration).column("n")[0].as_py() == 0

        # marks left waiting when the store closes are recomputed by the close
        store.last_runs_s = 10 * _store.SYNC_REFRESH_BUDGET_S
        store._runs_ended = now[0]
        batch = parts[3]
        store.append(spans=batch["spans"], events=batch["events"], snapshots=batch["snapshots"])
        assert store.refresh_if_due() and store.runs_pending > 0
    finally:
        store.close()
    again = Store(path)
    try:
        assert again.runs_pending == 0 and _pending(again) == 0
        assert _runs(again, "slo_summary__cached") == _runs(again, "slo_summary__live")
    finally:
        again.close()
