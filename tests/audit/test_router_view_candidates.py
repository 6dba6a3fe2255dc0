"""Reconstructed candidates take the router's own view: a real vllm-router capture (decisions
without candidates) plus scrape rows written the way the scraper writes them, the router's
/metrics appearing, failing and competing with a second router's.

A decision's view of a worker is the deciding router's latest ``source = 'router'`` row about it
at or before the decision, when exactly one router target answered with workers' rows at its
latest scrape then; else the engines' latest scrape. Ground truth is the scrape timeline built
here, not the relations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from relation_rows import CAPTURE_RUNS, query, store_from_pb

from audit._store import Store
from collectors.scrape import SCHEMA
from collectors.scrape._parse import failed_row, parse_metrics

ROUTER_A = "http://127.0.0.1:29000/metrics"
ROUTER_B = "http://127.0.0.1:29001/metrics"
WORKERS = ("127.0.0.1:18001", "127.0.0.1:18002")
MS = 1_000_000


def _engine_rows(at_ns: int, waiting: float) -> list[dict[str, Any]]:
    rows = []
    for w in WORKERS:
        text = f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n' \
               f'vllm:num_requests_running{{engine="0"}} 1\n'
        rows += parse_metrics(text, f"http://{w}/metrics", at_ns)
    return rows


def _router_rows(target: str, at_ns: int, in_flight: dict[str, int]) -> list[dict[str, Any]]:
    """vllm-router's per-worker series, as its /metrics gives them."""
    lines = ["# TYPE vllm_router_running_requests gauge"]
    lines += [f'vllm_router_running_requests{{worker="http://{w}"}} {n}'
              for w, n in in_flight.items()]
    lines += ["# TYPE vllm_router_worker_health gauge"]
    lines += [f'vllm_router_worker_health{{worker="http://{w}"}} 1' for w in in_flight]
    rows = parse_metrics("\n".join(lines) + "\n", target, at_ns)
    assert rows and {r["source"] for r in rows} == {"router"}
    return rows


def _between(times: list[int], i: int) -> int:
    """An instant strictly between decision i - 1 and decision i."""
    return (times[i - 1] + times[i]) // 2


@pytest.fixture(scope="module")
def store(captures: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    _, files = CAPTURE_RUNS["vllmr_round_robin"]
    st = store_from_pb(tmp_path_factory.mktemp("rv") / "rv.duckdb",
                       [captures / "otlp" / f for f in files])
    t = sorted(query(st, "select decided_ns from decisions")["decided_ns"].to_list())
    assert len(t) >= 17
    rows: list[dict[str, Any]] = []
    rows += _engine_rows(t[0] - 1000 * MS, waiting=5)
    rows.append(failed_row(ROUTER_A, t[0] - 2000 * MS, "ConnectError: refused"))
    # a router whose families are not registered yet answers like an engine knowing nothing
    # (the scraper writes such a row until it has seen the target answer as a router)
    self_row = parse_metrics("# TYPE process_cpu_seconds_total counter\n"
                             "process_cpu_seconds_total 1\n", ROUTER_A, t[0] - 5 * MS)
    assert [r["source"] for r in self_row] == ["replica"]
    rows += self_row
    rows += _router_rows(ROUTER_A, _between(t, 1), {WORKERS[0]: 1, WORKERS[1]: 2})
    rows += _router_rows(ROUTER_A, _between(t, 3), {WORKERS[0]: 3})  # names only one worker
    rows.append(failed_row(ROUTER_A, _between(t, 6), "ReadTimeout: timed out"))
    rows += _router_rows(ROUTER_A, _between(t, 9), {WORKERS[0]: 4, WORKERS[1]: 6})
    rows += _router_rows(ROUTER_B, _between(t, 12), {WORKERS[0]: 9, WORKERS[1]: 9})
    rows.append(failed_row(ROUTER_B, _between(t, 15), "ConnectError: refused"))
    st.append(snapshots=pa.Table.from_pylist(rows, schema=SCHEMA))
    st.refresh()
    yield st, t
    st.close()


def _chosen(st: Store) -> dict[int, dict[str, Any]]:
    got = query(st, """
        select d.decided_ns, c.replica, c.seen_waiting, c.seen_running, c.seen_pending,
            c.telemetry_ts, c.telemetry_age_ms, c.evidence_source,
            v.view_source, v.view_target, v.router_healthy
        from decisions as d
        inner join int_attr_candidates_resolved as c
            on c.request_key = d.request_key and c.chosen
        left join int_attr_candidates_router_view as v
            on v.decision_key = c.decision_key and v.replica = c.replica""")
    out = {r["decided_ns"]: r for r in got.iter_rows(named=True)}
    assert len(out) == got.height, "one chosen candidate per decision"
    return out


def test_reconstructed_candidates_take_the_deciding_routers_view(store: Any) -> None:
    st, t = store
    chosen = _chosen(st)
    worker_of = {r["decided_ns"]: r["replica"] for r in chosen.values()}
    expected: dict[int, tuple[str | None, int | None]] = {}
    for i, ns in enumerate(t):
        w = worker_of[ns]
        if i < 1 or 6 <= i < 9 or 12 <= i < 15:
            # before the router's first workers' row; its latest scrape failed; two routers
            expected[ns] = (None, None)
        elif 1 <= i < 3:
            expected[ns] = (ROUTER_A, 1 if w == WORKERS[0] else 2)
        elif 3 <= i < 6:
            # the latest scrape names only WORKERS[0]; the other keeps the older row
            expected[ns] = (ROUTER_A, 3 if w == WORKERS[0] else 2)
        else:  # 9..11, and 15.. when the second router's scrape failed
            expected[ns] = (ROUTER_A, 4 if w == WORKERS[0] else 6)
    got = {ns: (r["view_target"], r["seen_pending"]) for ns, r in chosen.items()}
    assert got == expected
    for r in chosen.values():
        assert r["evidence_source"] == "reconstructed"
        assert r["telemetry_ts"] is not None and r["telemetry_age_ms"] >= 0, r
        if r["view_target"] is None:
            # the engines' scrape: what the router could at best have seen
            assert (r["seen_waiting"], r["seen_running"], r["seen_pending"]) == (5, 1, None), r
            assert r["view_source"] is None
        else:
            # vllm-router re-exports no engine load: the view has its in-flight count only
            assert r["view_source"] == "router_metrics" and r["router_healthy"] is True, r
            assert r["seen_waiting"] is None and r["seen_running"] is None, r


def test_the_router_view_is_read_at_or_before_the_decision(store: Any) -> None:
    st, t = store
    rows = query(st, """
        select v.view_ts, v.view_age_ms, d.decided_at
        from int_attr_candidates_router_view as v
        inner join int_attr_decisions_resolved as d using (decision_key)""")
    assert rows.height > 0
    for r in rows.iter_rows(named=True):
        assert r["view_ts"] <= r["decided_at"], r
        want = (r["decided_at"] - r["view_ts"]).total_seconds() * 1000
        assert r["view_age_ms"] == pytest.approx(want, abs=0.002), r
    # one row per worker the router names, for decisions reconstructed from its spans only
    per = query(st, "select decision_key, count(*) as n, bool_and(not d.recorded) as third_party "
                    "from int_attr_candidates_router_view inner join int_attr_decisions_resolved "
                    "as d using (decision_key) group by all")
    assert set(per["n"].to_list()) <= {1, 2} and all(per["third_party"].to_list())


def test_recorded_decisions_keep_their_own_view(make_store: Any) -> None:
    from relation_rows import RawRows, one_request

    rows = RawRows()
    one_request(rows)
    st = make_store(rows)
    spans = query(st, "select decided_ns from decisions")["decided_ns"].to_list()
    snaps = _router_rows(ROUTER_A, spans[0] - 10 * MS, {WORKERS[0]: 7, WORKERS[1]: 7})
    st.append(snapshots=pa.Table.from_pylist(snaps, schema=SCHEMA))
    st.refresh()
    assert query(st, "select count(*) as n from int_attr_candidates_router_view")["n"].item() == 0
    got = query(st, "select replica, seen_pending, evidence_source from "
                    "int_attr_candidates_resolved order by replica")
    assert got.rows() == [("127.0.0.1:18001", 1, "recorded"), ("127.0.0.1:18002", None, "recorded")]


def test_slices_give_the_one_shot_router_view(store: Any) -> None:
    """The slice property: a slice reads raw rows from its margin before it up to its margin
    after it; a router's rows after a decision (the second router appearing, a failure) must
    not change that decision's view."""
    from audit._slices import Slice, install_slice, owned_rows_sql

    st, t = store
    width = 40 * MS
    relations = ["int_attr_candidates_router_view", "int_attr_candidates_resolved"]
    whole: dict[str, list[str]] = {}
    sliced: dict[str, list[str]] = {r: [] for r in relations}
    con = st._con.cursor()  # the store tuned its connection (cursors inherit it)
    try:
        for rel in relations:
            whole[rel] = sorted(repr(r) for r in con.execute(f"select * from {rel}").fetchall())
        start = t[0] - t[0] % width
        for lo in range(start, t[-1] + 1, width):
            cur = st._con.cursor()
            try:
                sl = Slice(lo, lo + width, 3000 * MS, 0)
                install_slice(cur, sl)
                for rel in relations:
                    cols = [r[0] for r in cur.execute(f"describe {rel}").fetchall()]
                    sliced[rel] += [repr(r) for r in cur.execute(
                        owned_rows_sql(rel, sl, cols)).fetchall()]
            finally:
                cur.close()
    finally:
        con.close()
    for rel in relations:
        assert whole[rel], rel
        assert sorted(sliced[rel]) == whole[rel], rel
