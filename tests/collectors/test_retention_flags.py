"""``--retain-raw`` / ``--retain-verdicts``: a running collector deletes whole old partitions of
raw and derived rows, says where it cut in ``/health``, and keeps ingesting."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import duckdb
import httpx
import pytest

import audit
from audit._store import Store
from collectors.otlp import Collector, CollectorConfig, ConfigError
from collectors.tuning_args import add_tuning_arguments, duration, tuning_overrides

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "audit"))
from tiled_sample import new_store, tiled_sample  # noqa: E402

S = 10**9


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800),
                                                ("12h", 43200), ("7d", 604800), ("1.5h", 5400)])
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "7w", "-1d", "0", "inf", "seven days"])
def test_bad_durations_are_one_line_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


def test_flags_reach_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_tuning_arguments(parser)
    found = tuning_overrides(parser.parse_args(["--retain-raw", "7d", "--retain-verdicts", "90d"]))
    assert found == {"retain_raw_s": 7 * 86400.0, "retain_verdicts_s": 90 * 86400.0}
    with pytest.raises(ConfigError, match="retain_raw_s"):
        CollectorConfig(db_path=Path("x.duckdb"), retain_raw_s=0).validate()


def test_a_running_collector_cuts_old_partitions(tmp_path: Path) -> None:
    path = tmp_path / "audit.duckdb"
    raw = tiled_sample()
    store = new_store(path, incremental=True)
    store.append(spans=raw["raw_spans"], events=raw["raw_span_events"])
    store.close()
    con = duckdb.connect(str(path), read_only=True)
    newest, spans_before, requests_before = con.execute(
        "select (select max(start_ns) from raw_spans), (select count(*) from raw_spans), "
        "(select count(*) from requests)").fetchall()[0]
    con.close()
    cfg = CollectorConfig(db_path=path, http_port=0, grpc_port=None, refresh_interval_s=0.2,
                          retain_raw_s=240, retain_verdicts_s=420)
    with Collector(cfg) as c:
        deadline = time.monotonic() + 60
        health: dict[str, object] = {}
        while time.monotonic() < deadline:
            health = httpx.get(c.http_url + "/health", timeout=10).json()
            if health.get("verdicts_kept_from_ns") is not None:
                break
            time.sleep(0.2)
        assert health["raw_kept_from_ns"] == (newest - 240 * S) // (60 * S) * (60 * S), health
        assert health["verdicts_kept_from_ns"] == (newest - 420 * S) // (60 * S) * (60 * S)
        # partitions the watermark passed are final; the newer ones provisional
        final, newest_request = health["final_until_ns"], health["newest_request_ns"]
        assert isinstance(final, int) and isinstance(newest_request, int), health
        assert health["verdicts_kept_from_ns"] < final <= newest_request, health
        # partitions far enough behind the final horizon moved to Parquet beside the store
        closed = health["closed_until_ns"]
        assert health["close_error"] is None and isinstance(closed, int) and closed < final, health
        counters = health["counters"]
        assert isinstance(counters, dict) and counters["retention_spans_deleted"] > 0
    # read as a user would, the closed partitions with the rest
    spans, oldest, requests, oldest_anchor = audit.open(path).query(
        "select (select count(*) from raw_spans), (select min(start_ns) from raw_spans), "
        "(select count(*) from requests), (select min(anchor_ns) from requests)").row(0)
    assert 0 < spans < spans_before and oldest >= health["raw_kept_from_ns"]
    assert 0 < requests < requests_before and oldest_anchor >= health["verdicts_kept_from_ns"]
    again = Store(path)
    try:
        assert not again.dirty  # its records agree with its rows: no rebuild on the next start
    finally:
        again.close()


@pytest.mark.parametrize(("partitioning", "needed_s"), [
    ({}, 12 * 60 + 600),  # a new store's: 12 partitions of 60 s, then max_request_s
    ({"partition_s": 15.0, "max_request_s": 60.0, "window_partitions": 2},
     390 + 60),  # the replica lookback and skew reach further than the window
    ({"partition_s": 300.0, "window_partitions": 2}, 4 * 300 + 600)])
def test_raw_retention_shorter_than_a_slice_reads_is_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, partitioning: dict[str, float],
        needed_s: float) -> None:
    """Raw rows kept for less than a slice reads back plus max_request_s: late spans of older
    requests would be stored and never analysed, so the collector says so when it starts."""
    path = tmp_path / "audit.duckdb"
    Store(path, partitioning=partitioning).close()
    store = Store(path)
    try:
        assert store.raw_retention_needed_s() == needed_s
    finally:
        store.close()
    for keep, warned in ((needed_s - 1, True), (needed_s, False), (7 * 86400, False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="routeaudit.collector"), \
                Collector(CollectorConfig(db_path=path, http_port=0, grpc_port=None,
                                          retain_raw_s=keep)):
            pass
        assert ("--retain-raw" in caplog.text) is warned, (keep, caplog.text)
        if warned:
            assert f"shorter than {needed_s:.0f}s" in caplog.text
