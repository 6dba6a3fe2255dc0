"""The committed sample laid end to end as minutes of continuous traffic, for the tests of
incremental refresh and retention, and a store with partitions small enough for it."""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
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


def tiled_sample(copies: int = COPIES) -> dict[str, pa.Table]:
    """The raw tables of ``copies`` copies of the sample, end to end (built once per process
    for each ``copies``; Arrow tables are immutable, the dict is the caller's own)."""
    return dict(_tiled(copies))


@functools.cache
def _tiled(copies: int) -> dict[str, pa.Table]:
    con = duckdb.connect()
    try:
        for t in RAW_TABLES:
            con.register(f"base_{t}", pq.read_table(SAMPLE_DIR / f"{t}.parquet"))
        lo, hi = con.execute("select min(start_ns), max(end_ns) from base_raw_spans").fetchall()[0]
        shift = hi - lo + 20 * 10**9
        spans, events = [], []
        for k in range(copies):
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


def new_store(path: Path, incremental: bool | None, **options: Any) -> Store:
    """An empty store with :data:`SETTINGS` (``options``: the Store's other arguments)."""
    store = Store(path, incremental=incremental, **options)
    store._con.execute("insert or replace into routeaudit_meta select * from (values "
                       + ", ".join(f"('{k}', '{v}')" for k, v in SETTINGS.items()) + ")")
    return store


def batches(raw: dict[str, pa.Table], seed: int, batches: int = 16) -> list[dict[str, pa.Table]]:
    """Spans cut by their end time (an exporter sends a span when it ends) into batches
    batches, each span moved to a neighbouring batch with probability 1/4; one batch resent;
    each span's events with it; scrapes by scrape time."""
    rng = random.Random(seed)
    spans, events, snaps = raw["raw_spans"], raw["raw_span_events"], raw["raw_snapshots"]
    ends = spans.column("end_ns").to_pylist()
    lo, hi = min(ends), max(ends) + 1
    width = (hi - lo) / batches
    which = []
    for e in ends:
        b = int((e - lo) / width)
        if rng.random() < 0.25:
            b += rng.choice((-1, 1, 2))
        which.append(min(max(b, 0), batches - 1))
    scrape_at = snaps.column("scraped_ns").to_pylist()
    out: list[dict[str, pa.Table]] = []
    keys = [f"{t}:{s}" for t, s in zip(spans.column("trace_id").to_pylist(),
                                         spans.column("span_id").to_pylist(), strict=True)]
    ev_keys = pc.binary_join_element_wise(events.column("trace_id"), events.column("span_id"), ":")
    for b in range(batches):
        mask = pa.array([w == b for w in which], pa.bool_())
        part = spans.filter(mask)
        chosen = pa.array([k for k, w in zip(keys, which, strict=True) if w == b], pa.string())
        ev = events.filter(pc.is_in(ev_keys, value_set=chosen))
        t_lo, t_hi = lo + b * width, lo + (b + 1) * width
        sn = snaps.filter(pa.array([(t_lo <= s < t_hi) or (b == 0 and s < t_lo)
                                    or (b == batches - 1 and s >= t_hi) for s in scrape_at], pa.bool_()))
        out.append({"spans": part, "events": ev, "snapshots": sn})
    resent = rng.randrange(1, batches - 1)
    out.insert(resent + 2, {"spans": out[resent]["spans"], "events": out[resent]["events"],
                            "snapshots": out[resent]["snapshots"].slice(0, 0)})
    return out


def _norm(v: Any) -> Any:
    if isinstance(v, float):
        return None if v != v else round(v, 6)
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _norm(x)) for k, x in v.items()))
    return v


def relation_rows(store: Store, relation: str) -> list[str]:
    """A relation's rows as a reader of the store sees them (closed partitions with the DuckDB
    rows), each a comparable string (floats to 6 places), sorted."""
    return query_rows(store, f"select * from {relation}")


def query_rows(store: Store, sql: str) -> list[str]:
    """A query's rows, each a comparable string (floats to 6 places), sorted."""
    rows = store.query_arrow(sql).to_pylist()
    return sorted(repr(sorted((k, _norm(v)) for k, v in r.items())) for r in rows)


def assert_span_keys_match(store: Store) -> None:
    """The store's span keys are exactly those of the spans its DuckDB file holds (closed
    partitions' spans have none), each with its span's start."""
    from audit import _span_keys

    key = _span_keys.span_key()
    cur = store._con.cursor()
    try:
        diff = cur.execute(
            f"select (select count(*) from (select span_key, start_ns from main.{_span_keys.SPAN_KEYS_TABLE} "
            f"except all select {key}, start_ns from main.raw_spans)), "
            f"(select count(*) from (select {key}, start_ns from main.raw_spans "
            f"except all select span_key, start_ns from main.{_span_keys.SPAN_KEYS_TABLE}))").fetchall()[0]
    finally:
        cur.close()
    assert diff == (0, 0), f"keys without their span, spans without their key: {diff}"
