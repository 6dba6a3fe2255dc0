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


def test_a_store_with_spans_and_no_settings_keeps_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "audit.duckdb"
    raw = tiled_sample(1)
    store = Store(path)
    store.append(spans=raw["raw_spans"], events=raw["raw_span_events"])
    store.close()
    with pytest.raises(StoreError, match=r"partition_s 300 \(asked 60\)"):
        Store(path, partitioning={"partition_s": 60.0})
    with pytest.raises(StoreError, match="unknown partitioning"):
        Store(path, partitioning={"partition_width": 60.0})
    assert _settings(path)[0] == 300.0
