"""Request ids repeat: two runs of the same requests in one store are judged apart.

Capture runs reuse ``client-req-000``, a testbed scenario replayed twice reuses its ids, and a
client may reuse ``X-Request-Id``. The store's key is ``request_key``; here the committed sample
data is stored next to a copy of itself that differs only where two real runs would (trace ids,
run ids, an hour later) and keeps every request id, and the whole pipeline (staging, marts,
attribution) must judge each run exactly as it judges the sample alone.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest

from audit import SLO
from audit import open as open_store
from audit._store import Store
from routeaudit._demo import SAMPLE_DIR, load_sample_data

_SHIFT_NS = 3600 * 10**9 * 24  # a day later: no replica state carries over
_SPAN_NS = ("start_ns", "end_ns", "received_ns", "a_decision_time_ns")
_EVENT_NS = ("time_ns", "c_telemetry_ts_ns")
_SLO = SLO(ttft_ms=200, tpot_ms=6)  # most of the sample misses it: plenty to attribute
_COLS = "request_id, cause, sub_kind, excess_ms, is_primary, confidence, evidence"


def _second_run_of_the_sample() -> dict[str, object]:
    """The sample's raw rows as another run of the same requests: same request ids."""
    con = duckdb.connect()
    spans = con.sql(
        f"select * replace (md5(trace_id || '-again') as trace_id, "
        f"{', '.join(f'{c} + {_SHIFT_NS} as {c}' for c in _SPAN_NS)}, "
        "a_run_id || '-again' as a_run_id, r_run_id || '-again' as r_run_id) "
        f"from '{SAMPLE_DIR / 'raw_spans.parquet'}'").to_arrow_table()
    events = con.sql(
        f"select * replace (md5(trace_id || '-again') as trace_id, "
        f"{', '.join(f'{c} + {_SHIFT_NS} as {c}' for c in _EVENT_NS)}) "
        f"from '{SAMPLE_DIR / 'raw_span_events.parquet'}'").to_arrow_table()
    snapshots = con.sql(
        f"select * replace (scraped_ns + {_SHIFT_NS} as scraped_ns) "
        f"from '{SAMPLE_DIR / 'raw_snapshots.parquet'}'").to_arrow_table()
    return {"spans": spans, "events": events, "snapshots": snapshots}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("repeated")
    alone, twice = folder / "alone.duckdb", folder / "twice.duckdb"
    store = Store(alone)
    load_sample_data(store)
    store.close()
    store = Store(twice)
    load_sample_data(store)
    store.append(**_second_run_of_the_sample())  # type: ignore[arg-type]
    store.close()
    return alone, twice


def _attributions(path: Path, where: str = "true") -> pl.DataFrame:
    reader = open_store(path, slo=_SLO)
    return reader.query(f"select {_COLS} from attributions where {where} order by all")


def test_the_copy_repeats_every_request_id(stores: tuple[Path, Path]) -> None:
    reader = open_store(stores[1])
    r = reader.query("select count(*) as n, count(distinct request_key) as keys, "
                     "count(distinct request_id) as ids from requests").row(0, named=True)
    assert r["n"] == r["keys"] == 2 * r["ids"] > 0


def test_each_run_is_judged_as_if_alone(stores: tuple[Path, Path]) -> None:
    alone, twice = stores
    runs = open_store(alone).query("select distinct run_id from requests order by 1")["run_id"]
    assert len(runs) >= 1
    for run in runs:
        expected = _attributions(alone, f"run_id = '{run}'")
        assert expected.height > 0
        for copy in (run, f"{run}-again"):
            got = _attributions(twice, f"run_id = '{copy}'")
            assert got.equals(expected), copy


def test_slow_requests_keep_one_row_per_request(stores: tuple[Path, Path]) -> None:
    alone, twice = stores
    n_alone = open_store(alone, slo=_SLO).query("select count(*) as n from slow_requests")["n"][0]
    got = open_store(twice, slo=_SLO).query(
        "select count(*) as n, count(distinct request_key) as keys from slow_requests")
    assert got["n"][0] == got["keys"][0] == 2 * n_alone
