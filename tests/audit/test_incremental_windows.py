"""Equivalence with wide partitions: a slice recomputes only its replicas' lookback from raw rows
and reads the windowed summaries' earlier partitions as stored rows (audit._incremental:
PART_CONTEXT, WINDOW_INPUTS), and still holds the relations of a one-shot build.

With the 60 s partitions of test_incremental the windows lie inside the lookback, so no stored
rows are read; here partitions are 150 s wide (two of them before a slice's own reach back 300
to 450 s, beyond the 390 s it recomputes), over the sample tiled six times (about 17 minutes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from tiled_sample import batches, query_rows, relation_rows, tiled_sample

from audit import _closed, _incremental, _relations
from audit._store import Store

SETTINGS = {"partition_s": "240", "window_partitions": "2", "lateness_s": "5",
            "max_request_s": "60"}
COPIES = 6
BATCHES = 11
AHEAD_NS = 15 * 10**9
COMPARED = [r for r in _relations.public_relations() if r not in {"raw_span_attributes", "slo_targets"}]
WINDOWED = ["int_clock_offsets", "int_clock_bounds_per_domain_pair", "int_clock_domain_spans",
            "int_attr_replica_fits", "int_attr_client_gaps"]


def _store(path: Path, incremental: bool) -> Store:
    store = Store(path, incremental=incremental)
    store._con.execute("insert or replace into routeaudit_meta select * from (values "
                       + ", ".join(f"('{k}', '{v}')" for k, v in SETTINGS.items()) + ")")
    return store


def _one_run_per_policy(raw: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """The copies of each run joined into one run: windowed summaries are per run, so only a
    run longer than a slice's recomputed region reads the stored rows of its earlier requests
    (as a fleet without run ids, one run that never ends, always does). And one replica's
    clock skewed and drifting, so that clock offsets depend on their windows, and another's
    15 s ahead, beyond what a slice assumes before it has measured it."""
    con = duckdb.connect()
    try:
        con.register("s", raw["raw_spans"])
        con.register("e", raw["raw_span_events"])
        t = int(con.execute("select min(start_ns) from s").fetchall()[0][0])
        # replica-1's clock runs 40 ms ahead and drifts 20 us/s: its offsets differ partition by
        # partition, and a window's bounds are those of all its partitions
        skew = f"(40000000 + (start_ns - {t}) // 50000)"
        con.execute(f"create table shifted as select trace_id, span_id, {skew} as skew_ns "
                    f"from s where host_name = 'replica-1' union all "
                    f"select trace_id, span_id, {AHEAD_NS} from s where host_name = 'replica-2'")
        spans = con.sql(
            "select s.* replace (regexp_replace(a_run_id, '-c[0-9]+$', '') as a_run_id, "
            "regexp_replace(r_run_id, '-c[0-9]+$', '') as r_run_id, "
            "start_ns + coalesce(k.skew_ns, 0) as start_ns, end_ns + coalesce(k.skew_ns, 0) as end_ns) "
            "from s left join shifted as k using (trace_id, span_id)").to_arrow_table()
        events = con.sql("select e.* replace (time_ns + coalesce(k.skew_ns, 0) as time_ns) "
                         "from e left join shifted as k using (trace_id, span_id)").to_arrow_table()
    finally:
        con.close()
    return {**raw, "raw_spans": spans, "raw_span_events": events}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    patch = pytest.MonkeyPatch()
    patch.setattr(_relations, "CACHE_MIN_SPANS", 0)
    stored_requests: dict[str, list[int]] = {"_context_window": [], "_context_lookback": []}
    original = _incremental._context_requests

    def counting(con: Any, *args: Any) -> None:
        original(con, *args)
        for kind, counts in stored_requests.items():
            counts.append(int(con.execute(f"select count(*) from {kind}").fetchall()[0][0]))

    patch.setattr(_incremental, "_context_requests", counting)
    assumed: list[int] = []
    planning = _incremental.plan

    def recording(con: Any, parts: Any, skew_ns: int = _incremental.SKEW_NS) -> Any:
        pl = planning(con, parts, skew_ns)
        if pl is not None:
            assumed.append(pl.skew_ns)
        return pl

    patch.setattr(_incremental, "plan", recording)
    d = tmp_path_factory.mktemp("windows")
    raw = _one_run_per_policy(tiled_sample(COPIES))
    one = _store(d / "one.duckdb", incremental=False)
    one.append(spans=raw["raw_spans"], events=raw["raw_span_events"],
               snapshots=raw["raw_snapshots"])
    one.refresh()
    inc = _store(d / "inc.duckdb", incremental=True)
    for batch in batches(raw, seed=5, batches=BATCHES):
        inc.append(spans=batch["spans"], events=batch["events"], snapshots=batch["snapshots"])
        inc.refresh()
    try:
        yield {"one": one, "inc": inc, "stored_requests": stored_requests, "assumed": assumed}
    finally:
        one.close()
        inc.close()
        patch.undo()


def test_slices_read_stored_rows_of_earlier_partitions(stores: dict[str, Any]) -> None:
    # the windowed summaries, and the relations reading the replicas' past, of most slices
    # read requests they did not recompute
    for kind, counts in stores["stored_requests"].items():
        used = [n for n in counts if n > 0]
        assert len(used) >= 2, (kind, counts)


def test_slices_assume_the_measured_skew_and_check_it(stores: dict[str, Any]) -> None:
    assumed = stores["assumed"]
    # before replica-2's offset is measured a slice assumes 2 s, finds 15 s and runs again
    # assuming 60 s; once it is stored, slices assume it plus the margin
    assert _incremental.SKEW_MARGIN_NS in assumed, assumed
    assert _incremental.SKEW_NS in assumed, assumed
    measured = [s for s in assumed if AHEAD_NS < s < _incremental.SKEW_NS]
    assert len(measured) >= len(assumed) // 2, assumed


@pytest.mark.parametrize("relation", COMPARED + WINDOWED)
def test_wide_partitions_give_the_one_shot_relations(stores: dict[str, Any], relation: str) -> None:
    one, inc = stores["one"], stores["inc"]
    if relation in WINDOWED:
        # steps between raw rows and the marts are not kept for closed partitions
        until = _closed.closed_until(inc._con) or 0
        a, b = (query_rows(store, f"select * from {relation} where part >= {until}")
                for store in (one, inc))
    else:
        a, b = relation_rows(one, relation), relation_rows(inc, relation)
    only_one = sorted(set(a) - set(b))[:3]
    only_inc = sorted(set(b) - set(a))[:3]
    assert len(a) == len(b) and not only_one and not only_inc, (
        f"{relation}: one-shot {len(a)} rows, incremental {len(b)}\n"
        f"only one-shot: {only_one}\nonly incremental: {only_inc}")
