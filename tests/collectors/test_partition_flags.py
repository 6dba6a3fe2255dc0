"""``--partition`` / ``--max-request`` / ``--lateness``: a new store's partitioning, chosen when
the collector creates it; a store that holds spans keeps its own, and asking for another is a
one-line error, not a silent mix of partition widths."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from audit._errors import StoreError
from audit._store import Store
from collectors.otlp import Collector, CollectorConfig, ConfigError, StartError
from collectors.tuning_args import add_tuning_arguments, tuning_overrides

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "audit"))
from tiled_sample import tiled_sample  # noqa: E402


def _settings(path: Path) -> tuple[float, float, float]:
    store = Store(path)
    try:
        row = store._con.execute(
            "select partition_s, max_request_s, lateness_s from stg_partitioning").fetchall()[0]
        return float(row[0]), float(row[1]), float(row[2])
    finally:
        store.close()


def test_flags_reach_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_tuning_arguments(parser)
    found = tuning_overrides(parser.parse_args(["--partition", "1m", "--max-request", "90s",
                                                "--lateness", "10s"]))
    assert found == {"partition_s": 60.0, "max_request_s": 90.0, "lateness_s": 10.0}
    with pytest.raises(ConfigError, match="partition_s"):
        CollectorConfig(db_path=Path("x.duckdb"), partition_s=-60).validate()


def test_a_new_store_takes_the_partitioning_and_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "audit.duckdb"
    cfg = CollectorConfig(db_path=path, http_port=0, grpc_port=None, partition_s=60.0,
                          max_request_s=90.0, lateness_s=10.0)
    with Collector(cfg):
        pass
    assert _settings(path) == (60.0, 90.0, 10.0)
    # spans stored under that width: the same settings are accepted, other ones refused
    raw = tiled_sample(1)
    store = Store(path)
    store.append(spans=raw["raw_spans"], events=raw["raw_span_events"])
    store.close()
    with Collector(CollectorConfig(db_path=path, http_port=0, grpc_port=None, partition_s=60.0)):
        pass
    with pytest.raises(StartError, match=r"partition_s 60 \(asked 300\)") as caught:
        Collector(CollectorConfig(db_path=path, http_port=0, grpc_port=None,
                                  partition_s=300.0)).start()
    assert "\n" not in str(caught.value)
    assert _settings(path) == (60.0, 90.0, 10.0)


def _window(path: Path) -> int:
    store = Store(path)
    try:
        return int(store._con.execute("select window_partitions from stg_partitioning").fetchall()[0][0])
    finally:
        store.close()


def test_a_new_store_records_the_defaults_and_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "audit.duckdb"
    raw = tiled_sample(1)
    store = Store(path)
    store.append(spans=raw["raw_spans"], events=raw["raw_span_events"])
    store.close()
    assert _settings(path) == (60.0, 600.0, 30.0)
    assert _window(path) == 10  # 600 s of history
    with pytest.raises(StoreError, match=r"partition_s 60 \(asked 300\)"):
        Store(path, partitioning={"partition_s": 300.0})
    with pytest.raises(StoreError, match="unknown partitioning"):
        Store(path, partitioning={"partition_width": 60.0})
    assert _settings(path)[0] == 60.0


@pytest.mark.parametrize(("width", "window"), [(15.0, 40), (300.0, 2), (7.0, 86), (900.0, 1)])
def test_the_default_window_holds_600_s_of_traffic(tmp_path: Path, width: float, window: int) -> None:
    path = tmp_path / "audit.duckdb"
    Store(path, partitioning={"partition_s": width}).close()
    assert _window(path) == window
    Store(path, partitioning={"partition_s": 15.0, "window_partitions": 3}).close()
    assert _window(path) == 3  # a store without spans takes what it is given


def test_a_store_that_recorded_no_settings_keeps_the_fallbacks(tmp_path: Path) -> None:
    """A store whose routeaudit_meta holds no partitioning keys
    keeps stg_partitioning's fallbacks once it holds spans: 300 s, a window of 2."""
    path = tmp_path / "audit.duckdb"
    raw = tiled_sample(1)
    store = Store(path)
    store.append(spans=raw["raw_spans"], events=raw["raw_span_events"])
    store._con.execute("delete from routeaudit_meta where key in "
                       "('partition_s', 'window_partitions', 'lateness_s', 'max_request_s')")
    store._con.execute("delete from routeaudit_meta where key = 'relations_version'")
    store.close()
    assert _settings(path) == (300.0, 600.0, 30.0)
    assert _window(path) == 2
    with pytest.raises(StoreError, match=r"partition_s 300 \(asked 60\)"):
        Store(path, partitioning={"partition_s": 60.0})
