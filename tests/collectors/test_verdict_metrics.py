"""The live verdict metrics (``routeaudit_verdicts_*``) computed from a real store of the
committed sample data: each number equals what SQL on the marts says, the window is event time
ending at the newest request, and a failing update never raises."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from audit._store import Store
from collectors.otlp._verdict_metrics import CAUSES, VerdictMetrics, read_snapshot

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store(tmp_path_factory.mktemp("verdicts") / "audit.duckdb")
    s.append(spans=pq.read_table(SAMPLE / "raw_spans.parquet"),
             events=pq.read_table(SAMPLE / "raw_span_events.parquet"))
    s.refresh()
    yield s
    s.close()


def _rows(store: Store, sql: str, params: list[object] | None = None) -> list[tuple[Any, ...]]:
    t = store.query_arrow(sql, params)
    return list(zip(*(c.to_pylist() for c in t.columns), strict=True))


def _pairs(store: Store, sql: str, params: list[object]) -> dict[Any, Any]:
    return {k: v for k, v in _rows(store, sql, params)}


def test_whole_store_window_equals_the_slo_summary(store: Store) -> None:
    snap = read_snapshot(store, window_s=86_400)
    assert snap is not None
    [(requests, good, ok, slow)] = _rows(
        store, "select sum(requests), sum(goodput), sum(ok), sum(slow) from slo_summary")
    assert sum(snap.requests.values()) == requests == 800
    assert snap.good_requests == good
    assert snap.requests["ok"] == ok
    assert sum(snap.slow_by_cause.values()) == _rows(store, "select count(*) from slow_requests")[0][0]
    assert snap.slow_by_cause["misrouting"] > 0 and 0 < good < requests
    assert ok - good == slow


def test_a_short_window_counts_only_its_requests(store: Store) -> None:
    snap = read_snapshot(store, window_s=60)
    assert snap is not None and store.newest_request_ns is not None
    since = store.newest_request_ns - 60 * 10**9
    assert snap.window_start_ns == since
    by_status = _pairs(store, "select status, count(*) from requests where anchor_ns > ? "
                                  "group by status", [since])
    assert {k: v for k, v in snap.requests.items() if v} == by_status
    assert 0 < sum(snap.requests.values()) < 800
    by_cause = _pairs(store, "select s.cause, count(*) from slow_requests as s join requests "
                                 "as r using (request_key) where r.anchor_ns > ? group by all",
                          [since])
    assert {k: v for k, v in snap.slow_by_cause.items() if v} == by_cause
    assert set(snap.slow_by_cause) == set(CAUSES)
    kinds = _pairs(store, "select s.cause || '/' || coalesce(s.sub_kind, ''), count(*) "
                              "from slow_requests as s join requests as r using (request_key) "
                              "where r.anchor_ns > ? group by all", [since])
    assert {f"{c}/{k}": n for (c, k), n in snap.slow_by_kind.items()} == kinds
    [(p50, p99)] = _rows(store, "select quantile_cont(ttft_ms, 0.5), quantile_cont(ttft_ms, 0.99) "
                                "from requests where anchor_ns > ? and status = 'ok'", [since])
    assert snap.ttft_p50_ms == pytest.approx(p50) and snap.ttft_p99_ms == pytest.approx(p99)


def test_exposition_names_help_and_values(store: Store) -> None:
    vm = VerdictMetrics()
    vm.update(store)
    reg = CollectorRegistry()
    reg.register(vm)
    text = generate_latest(reg).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("routeaudit_verdicts_requests", "routeaudit_verdicts_slow_requests",
                 "routeaudit_verdicts_goodput_ratio", "routeaudit_verdicts_ttft_seconds",
                 "routeaudit_verdicts_relations_lag_seconds", "routeaudit_verdicts_provisional_seconds",
                 "routeaudit_verdicts_updates"):
        assert name in families and families[name].documentation, name
        assert f"# TYPE {name}" in text
    snap = vm.snapshot
    assert snap is not None
    goodput = families["routeaudit_verdicts_goodput_ratio"].samples[0].value
    assert goodput == pytest.approx(snap.good_requests / 800)
    # the sample's spans are all in the relations, and no partition is final yet
    assert families["routeaudit_verdicts_relations_lag_seconds"].samples[0].value == 0
    assert math.isnan(families["routeaudit_verdicts_provisional_seconds"].samples[0].value)
    assert {s.labels["cause"] for s in families["routeaudit_verdicts_slow_requests"].samples} == set(CAUSES)


def test_an_empty_store_then_a_failing_update(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = Store(tmp_path / "audit.duckdb")
    vm = VerdictMetrics()
    reg = CollectorRegistry()
    reg.register(vm)
    vm.update_after_refresh(s, refreshed=True)
    assert vm.snapshot is None and vm.failures == 0
    text = generate_latest(reg).decode()
    assert "routeaudit_verdicts_updates_total 1.0" in text
    assert "routeaudit_verdicts_requests" not in text
    # relations that name a newest request give a window, here an empty one
    s.newest_request_ns = 1_767_225_600 * 10**9
    vm.update(s)
    before = vm.snapshot
    assert before is not None and sum(before.requests.values()) == 0
    assert "routeaudit_verdicts_goodput_ratio NaN" in generate_latest(reg).decode()
    s.close()  # every query now fails
    with caplog.at_level(logging.WARNING, logger="routeaudit.collector"):
        vm.update(s)
        vm.update(s)
        vm.update_after_refresh(s, refreshed=False)  # updated before and nothing new: no query
    assert vm.failures == 2
    assert len([r for r in caplog.records if "verdict metrics" in r.getMessage()]) == 1
    assert vm.snapshot is before
    text = generate_latest(reg).decode()
    assert "routeaudit_verdicts_update_failures_total 2.0" in text
    assert 'routeaudit_verdicts_requests{status="ok"} 0.0' in text


def test_updates_are_paced_and_a_refresh_seen_meanwhile_is_read_after(store: Store) -> None:
    vm = VerdictMetrics()
    vm.update_after_refresh(store, refreshed=False)  # relations already built: read at once
    assert vm.snapshot is not None
    first = vm.snapshot
    vm._last_duration_s = 3600.0  # as if the last update took an hour: the next waits 3 hours
    vm.update_after_refresh(store, refreshed=True)
    assert vm.snapshot is first
    vm._last_duration_s = 0.0  # the pause is over: the refresh seen during it is read now
    vm.update_after_refresh(store, refreshed=False)
    assert vm.snapshot is not first and vm.snapshot == first
    again = vm.snapshot
    vm.update_after_refresh(store, refreshed=False)  # nothing new since
    assert vm.snapshot is again
