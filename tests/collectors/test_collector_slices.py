"""A collector refreshing by slices (``--refresh-mode slices``) keeps its relations current as
rows arrive in batches, and ends with the relations a one-shot build gives."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa

from audit._store import MIN_REFRESH_GAP_S, Store
from collectors.otlp import Collector, CollectorConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "audit"))
from tiled_sample import SETTINGS, tiled_sample  # noqa: E402

QUERY = ("select request_key, status, chosen_replica, served_by, ttft_ms, verdict_final "
         "from requests order by request_key")


def _health(c: Collector) -> dict[str, object]:
    return httpx.get(c.http_url + "/health", timeout=10).json()


def test_a_collector_refreshes_by_slices_as_batches_arrive(tmp_path: Path) -> None:
    raw = tiled_sample()
    spans: pa.Table = raw["raw_spans"].sort_by("end_ns")
    path = tmp_path / "audit.duckdb"
    seeded = Store(path)
    seeded._con.execute("insert or replace into routeaudit_meta select * from (values "
                        + ", ".join(f"('{k}', '{v}')" for k, v in SETTINGS.items()) + ")")
    seeded.close()
    cfg = CollectorConfig(db_path=path, http_port=0, grpc_port=None, refresh_interval_s=0.1,
                          refresh_max_share=1.0, refresh_mode="slices")
    newest_seen: list[int] = []
    with Collector(cfg) as c:
        assert c._writer is not None
        step = -(-spans.num_rows // 3)
        for i in range(0, spans.num_rows, step):
            batch = spans.slice(i, step)
            c._writer.submit(spans=batch).result(timeout=30)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                h = _health(c)
                if h["relations_lag_spans"] == 0 and h["newest_request_ns"] is not None:
                    break
                time.sleep(0.1)
            assert h["relations_lag_spans"] == 0, h
            newest = h["newest_request_ns"]
            assert isinstance(newest, int)
            newest_seen.append(newest)
        # each batch caught up by a refresh of its own (background, or one a query waited for),
        # by slices after the first
        counters = _health(c)["counters"]
        assert isinstance(counters, dict) and counters["background_refreshes"] >= 1
        assert c._store is not None and c._store.last_refresh_kind in ("slice", "none")
        live = c._store.query_arrow(QUERY) if c._store is not None else None
    assert newest_seen == sorted(newest_seen) and len(set(newest_seen)) == 3
    one = Store(tmp_path / "one.duckdb", incremental=False)
    try:
        one._con.execute("insert or replace into routeaudit_meta select * from (values "
                         + ", ".join(f"('{k}', '{v}')" for k, v in SETTINGS.items()) + ")")
        one.append(spans=spans)
        one.refresh()
        assert live is not None and live.equals(one.query_arrow(QUERY))
    finally:
        one.close()


def test_background_refreshes_are_paced_only_while_the_writer_is_behind(tmp_path: Path) -> None:
    spans: pa.Table = tiled_sample()["raw_spans"].slice(0, 400)
    gate = threading.Event()
    cfg = CollectorConfig(db_path=tmp_path / "audit.duckdb", http_port=0, grpc_port=None,
                          refresh_interval_s=0.5, refresh_max_share=0.25, queue_max_spans=1000)
    with Collector(cfg, before_commit=lambda: gate.wait(30)) as c:
        assert c._writer is not None and c._store is not None
        c._store.last_refresh_s = 8.0  # as if the last refresh had been slow
        # the writer's queue is empty: nothing to leave the cores to, so the next refresh
        # follows the slow one after the shortest pause
        assert _health(c)["refresh_gap_ms"] == MIN_REFRESH_GAP_S * 1000
        # commits held back: 400 spans queued (at least 5 % of the queue) is ingest behind,
        # and the pause after a slow refresh is 8 s × 3 again
        pending = c._writer.submit(spans=spans)
        deadline = time.monotonic() + 10
        while c._writer.depth < 400 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _health(c)["refresh_gap_ms"] == 24000.0
        gate.set()
        pending.result(timeout=30)
        # unpaced again: at most the interval (a refresh of the new rows may have run)
        assert MIN_REFRESH_GAP_S * 1000 <= _health(c)["refresh_gap_ms"] <= 500.0
