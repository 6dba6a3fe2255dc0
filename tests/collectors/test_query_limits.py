"""Queries through a live collector are bounded and stoppable: the time limit, a client that
goes away, and a stop of the collector each end a runaway query instead of letting it run on."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

import audit
from audit import QueryCancelled, QueryError
from collectors.otlp import Collector, CollectorConfig

RUNAWAY = "select count(*) from range(4000000000) a, range(4000000000) b"


def _config(tmp_path: Path, **changes: object) -> CollectorConfig:
    return CollectorConfig(db_path=tmp_path / "audit.duckdb", http_port=0, grpc_port=None, **changes)


def _wait_for(predicate: object, deadline_s: float = 60.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_query_time_limit_of_the_collector(tmp_path: Path) -> None:
    with Collector(_config(tmp_path, query_timeout_s=0.5)) as c:
        with pytest.raises(QueryError, match="longer than 0.5 s"):
            audit.open(c.config.db_path).query(RUNAWAY)
        # and the collector still answers
        assert audit.open(c.config.db_path).query("select 1 as x")["x"].to_list() == [1]


def test_query_row_limit_of_the_collector(tmp_path: Path) -> None:
    with Collector(_config(tmp_path, query_max_rows=100)) as c:
        with pytest.raises(QueryError, match="more than 100 rows"):
            audit.open(c.config.db_path).query("select * from range(1000)")


def test_a_query_whose_client_went_away_is_stopped(tmp_path: Path) -> None:
    with Collector(_config(tmp_path)) as c:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(c.query_url, json={"sql": RUNAWAY},
                       headers={"x-routeaudit-query": "1"}, timeout=httpx.Timeout(5.0, read=1.0))
        assert _wait_for(lambda: c.metrics.value("queries_cancelled") >= 1)
        assert _wait_for(lambda: not c._store._active)  # type: ignore[union-attr]


def test_stopping_the_collector_stops_a_running_query(tmp_path: Path) -> None:
    c = Collector(_config(tmp_path)).start()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            audit.open(c.config.db_path).query(RUNAWAY)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert _wait_for(lambda: bool(c._store and c._store._active))
    c.stop()
    worker.join(60)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], QueryError)


def test_query_limit_flags_are_checked(tmp_path: Path) -> None:
    from collectors.otlp import ConfigError

    for bad in ({"query_timeout_s": 0}, {"query_max_rows": 0}, {"query_max_bytes": -1}):
        with pytest.raises(ConfigError):
            _config(tmp_path, **bad).validate()
    assert QueryCancelled is not None
