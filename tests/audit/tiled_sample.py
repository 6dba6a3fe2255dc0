"""The committed sample laid end to end as minutes of continuous traffic, for the tests of
incremental refresh and retention, and a store with partitions small enough for it."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from audit._store import Store
from audit.schema import RAW_TABLES
from routeaudit._demo import SAMPLE_DIR

SETTINGS = {"partition_s": "60", "window_partitions": "2", "lateness_s": "5", "max_request_s": "60"}
"""Partitions of 60 s: the tiled sample spans about ten of them."""

COPIES = 4
"""The sample (a 150 s replay) is laid end to end this many times, each copy a run of its own
20 s after the previous one on the same replicas, so the store spans minutes of continuous
traffic: more than a slice reads back (audit._incremental.LOOKBACK_NS), and prefix blocks,
in-flight work and windows reach across copies."""

_ID_COLUMNS = ("a_request_id", "a_gen_ai_request_id", "a_router_request_id", "a_rid")
_SPAN_NS = ("start_ns", "end_ns", "received_ns", "a_decision_time_ns")
_EVENT_NS = ("time_ns", "c_telemetry_ts_ns")


def tiled_sample() -> dict[str, pa.Table]:
    """The raw tables of :data:`COPIES` copies of the sample, end to end."""
    con = duckdb.connect()
    try:
        for t in RAW_TABLES:
            con.register(f"base_{t}", pq.read_table(SAMPLE_DIR / f"{t}.parquet"))
        lo, hi = con.execute("select min(start_ns), max(end_ns) from base_raw_spans").fetchall()[0]
        shift = hi - lo + 20 * 10**9
        spans, events = [], []
        for k in range(COPIES):
            tag = f"-c{k}"
            trace = f"md5(trace_id || '{tag}')" if k else "trace_id"
            repl = [f"{trace} as trace_id"] + [f"{c} + {k * shift} as {c}" for c in _SPAN_NS]
            repl += [f"a_run_id || '{tag}' as a_run_id", f"r_run_id || '{tag}' as r_run_id"]
            repl += [f"{c} || '{tag}' as {c}" for c in _ID_COLUMNS]
            spans.append(con.sql(f"select * replace ({', '.join(repl)}) "
                                     "from base_raw_spans").to_arrow_table())
            erepl = [f"{trace} as trace_id"] + [f"{c} + {k * shift} as {c}" for c in _EVENT_NS]
            events.append(con.sql(f"select * replace ({', '.join(erepl)}) "
                                      "from base_raw_span_events").to_arrow_table())
        snaps = con.sql("select * from base_raw_snapshots").to_arrow_table()
    finally:
        con.close()
    return {"raw_spans": pa.concat_tables(spans), "raw_span_events": pa.concat_tables(events),
            "raw_snapshots": snaps}


def new_store(path: Path, incremental: bool) -> Store:
    """An empty store with :data:`SETTINGS`."""
    store = Store(path, incremental=incremental)
    store._con.execute("insert or replace into routeaudit_meta select * from (values "
                       + ", ".join(f"('{k}', '{v}')" for k, v in SETTINGS.items()) + ")")
    return store


