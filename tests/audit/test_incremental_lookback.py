"""Equivalence where a verdict depends on a replica's past beyond the windowed summaries: a
request decided minutes after the prefix blocks it shares were served, arriving in a later
batch than that service, gets from an incremental refresh the prefix evidence a one-shot build
gives it.

Partitions here are 10 s with one window partition, so for its windows alone the slice of the
later batch would read back to about 150 s before the decision judged; the blocks were served
190–200 s before it, which only the replica lookback (audit._incremental.LOOKBACK_NS) brings
into the region.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relation_rows import T0, RawRows
from tiled_sample import relation_rows

import semconv
from audit import _incremental, _relations
from audit._store import Store

S = 10**9
MS = 10**6

SETTINGS = {"partition_s": "10", "window_partitions": "1", "lateness_s": "1", "max_request_s": "30"}
"""Narrow partitions and windows: without the replica lookback a slice would not read the
earlier requests."""

BASE = T0 - T0 % (10 * S)
"""The first request's instant, at a partition boundary."""

HASHES = [f"blk{i}" for i in range(4)]
"""The chained prefix block hashes every prompt of the scenario starts with."""

CHOSEN, OTHER, SPARE = "127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003"

PREFIX_COLUMNS = ["prefix_last_served_at", "prefix_shared_blocks", "prefix_shared_frac",
                  "prefix_held_blocks", "cache_source", "cached_assumed_tokens"]

COMPARED = [r for r in _relations.public_relations() if r not in {"raw_span_attributes", "slo_targets"}]


def _request(rows: RawRows, n: int, at: int, replica: str, *, run_s: float = 1.0,
             prompt: int = 100, output: int = 10, cached: int = 0, ttft_s: float = 0.15,
             hashes: list[str] | None = None,
             candidates: tuple[tuple[str, int, float], ...] = ()) -> None:
    """Client -> decision -> forward -> replica, one trace, on hosts whose clocks agree.

    ``candidates``: (replica, predicted cached tokens, KV usage seen) of the decision; the
    chosen one is ``replica``. ``hashes``: the prompt's prefix blocks on the decision span."""
    t, rid = f"{n:x}a", f"req-{n}"
    end = at + int(run_s * S)
    client: dict[str, Any] = {
        semconv.COMPONENT: "client", semconv.REQUEST_ID: rid, semconv.REQUEST_MODEL: "tiny",
        semconv.REQUEST_MAX_TOKENS: 64, semconv.REQUEST_INPUT_TOKENS: prompt,
        semconv.REQUEST_STREAM: True, semconv.REQUEST_ENDPOINT: "/v1/chat/completions",
        semconv.HTTP_METHOD: "POST", semconv.HTTP_STATUS: 200, semconv.STATUS: "ok",
        semconv.CLIENT_TTFT_MS: ttft_s * 1000 + 50, semconv.CLIENT_E2E_MS: run_s * 1000,
        semconv.USAGE_OUTPUT_TOKENS: output, semconv.RESPONSE_FINISH_REASONS: ["stop"]}
    rows.span(t, f"{n:x}c", None, semconv.SPAN_CLIENT, kind="client", start_ns=at, end_ns=end,
              attrs=client, resource={semconv.HOST_NAME: "client-host", semconv.RUN_ID: "run-1"})
    decided = at + 6 * MS
    decision: dict[str, Any] = {
        semconv.COMPONENT: "router", semconv.REQUEST_ID: rid, semconv.ATTEMPT: 0,
        semconv.ROUTER_POLICY: "cache_aware", semconv.DECISION_CHOSEN: f"http://{replica}",
        semconv.DECISION_REASON: "cache_affinity", semconv.DECISION_OUTCOME: "routed",
        semconv.DECISION_CANDIDATE_COUNT: len(candidates) or 1,
        semconv.DECISION_TIME: decided}
    if hashes:
        decision[semconv.REQUEST_PREFIX_HASHES] = hashes
    events = [(semconv.EVENT_CANDIDATE, decided, {
        semconv.CANDIDATE_REPLICA: name, semconv.CANDIDATE_ELIGIBLE: True,
        semconv.CANDIDATE_CHOSEN: name == replica, semconv.CANDIDATE_WAITING: 0,
        semconv.CANDIDATE_RUNNING: 1, semconv.CANDIDATE_KV_USAGE: usage,
        semconv.CANDIDATE_TELEMETRY_TS: decided - 100 * MS, semconv.CANDIDATE_PENDING: 0,
        semconv.CANDIDATE_PREDICTED_CACHED_TOKENS: predicted})
        for name, predicted, usage in candidates or ((replica, 0, 0.0),)]
    router = {semconv.HOST_NAME: "router-host", semconv.ROUTER_ID: "r1"}
    rows.span(t, f"{n:x}d", f"{n:x}c", semconv.SPAN_DECISION, start_ns=at + 5 * MS,
              end_ns=at + 7 * MS, attrs=decision, resource=router, events=events)
    rows.span(t, f"{n:x}f", f"{n:x}d", semconv.SPAN_FORWARD, kind="client",
              start_ns=at + 7 * MS, end_ns=end - 5 * MS,
              attrs={semconv.COMPONENT: "router", semconv.HTTP_STATUS: "200",
                     semconv.URL_FULL: f"http://{replica}/v1/chat/completions"},
              resource=router)
    rows.span(t, f"{n:x}e", f"{n:x}f", semconv.SPAN_VLLM_REQUEST, kind="server",
              start_ns=at + 10 * MS, end_ns=end - 10 * MS,
              attrs={semconv.GEN_AI_REQUEST_ID: f"chatcmpl-{rid}",
                     semconv.USAGE_PROMPT_TOKENS: prompt, semconv.USAGE_COMPLETION_TOKENS: output,
                     semconv.USAGE_CACHE_READ_INPUT_TOKENS: cached,
                     semconv.LATENCY_TTFT_S: ttft_s, semconv.LATENCY_E2E_S: run_s - 0.02,
                     semconv.LATENCY_QUEUE_S: 0.01, semconv.LATENCY_PREFILL_S: ttft_s - 0.1,
                     semconv.LATENCY_DECODE_S: run_s - ttft_s - 0.05, semconv.REPLICA_ID: replica,
                     semconv.RESPONSE_FINISH_REASONS: ["stop"]},
              resource={semconv.HOST_NAME: "replica-host"})


def scenario() -> tuple[RawRows, RawRows]:
    """The earlier traffic (first batch) and the later requests (second batch).

    First: the prompt's blocks served on ``CHOSEN`` (at ``BASE``) and on ``OTHER`` (10 s
    later), then unrelated requests on ``SPARE`` every 10 s for 170 s (the watermark passes the
    early partitions: their verdicts are final before the later requests arrive). Second, 200 s
    after ``BASE``: a long request running on ``OTHER``, and the request judged, sharing the
    prompt's blocks, routed to ``CHOSEN`` on a prediction of cache it did not find there, with
    ``OTHER`` (busy, KV usage seen) the alternative."""
    early, late = RawRows(), RawRows()
    _request(early, 1, BASE, CHOSEN, hashes=HASHES)
    _request(early, 2, BASE + 10 * S, OTHER, hashes=HASHES)
    for k in range(1, 18):
        _request(early, 100 + k, BASE + k * 10 * S + 3 * S, SPARE)
    _request(late, 3, BASE + 185 * S, OTHER, run_s=25.0, prompt=1000, output=400)
    _request(late, 4, BASE + 200 * S, CHOSEN, run_s=5.0, prompt=400, cached=0, ttft_s=2.9,
             hashes=HASHES + ["blk-own"],
             candidates=((CHOSEN, 256, 0.3), (OTHER, 256, 0.2)))
    return early, late


def _store(path: Path, incremental: bool) -> Store:
    store = Store(path, incremental=incremental)
    store._con.execute("insert or replace into routeaudit_meta select * from (values "
                       + ", ".join(f"('{k}', '{v}')" for k, v in SETTINGS.items()) + ")")
    return store


def _append(store: Store, rows: RawRows) -> None:
    spans, events = rows.tables()
    store.append(spans=spans, events=events)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Store, list[str]]]:
    """The one-shot build, the store refreshed after each batch, and how it was refreshed
    (each refresh's kind, then the early requests' verdicts as final after the first one)."""
    d = tmp_path_factory.mktemp("lookback")
    early, late = scenario()
    one = _store(d / "one.duckdb", incremental=False)
    inc = _store(d / "inc.duckdb", incremental=True)
    seen: list[str] = []
    try:
        for rows in (early, late):
            _append(one, rows)
            _append(inc, rows)
            inc.refresh()
            seen.append(inc.last_refresh_kind)
            if rows is early:
                seen += inc.query_arrow(
                    "select request_id || ':' || verdict_final from requests "
                    "where request_id in ('req-1', 'req-2') order by 1").column(0).to_pylist()
        one.refresh()
        yield one, inc, seen
    finally:
        one.close()
        inc.close()


def _prefix_rows(store: Store) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = store.query_arrow(
        f"select r.request_id, s.replica, {', '.join('s.' + c for c in PREFIX_COLUMNS)} "
        "from int_attr_candidates_state as s join requests as r using (request_key) "
        "where s.replica is not null order by all").to_pylist()
    return rows


def test_the_later_request_is_judged_by_a_slice_on_the_earlier_service(
        stores: tuple[Store, Store, list[str]]) -> None:
    one, _, seen = stores
    # both refreshes by slices; the earlier requests were final before the later arrived (no
    # finalisation re-opens their partitions: only the lookback brings them into the region)
    assert seen == ["slice", "req-1:true", "req-2:true", "slice"]
    # the scenario exercises the lookback: in the one-shot build the judged request found its
    # blocks served long before on both replicas, and the alternative still held them
    judged = {r["replica"]: r for r in _prefix_rows(one) if r["request_id"] == "req-4"}
    chosen, other = judged[CHOSEN], judged[OTHER]
    decided = BASE + 200 * S + 6 * MS
    served = chosen["prefix_last_served_at"]
    assert served is not None and 100 * S < decided - served.timestamp() * S < 300 * S, served
    assert chosen["prefix_shared_blocks"] == len(HASHES)
    assert other["cache_source"] == "prefix_history" and other["prefix_held_blocks"] == len(HASHES)
    # and the verdict follows: the cache the router predicted there was evicted after the
    # decision (without the earlier service it would never have been cached)
    causes = one.query_arrow("select cause, sub_kind from attributions "
                             "where request_id = 'req-4' and is_primary").to_pylist()
    assert causes == [{"cause": "eviction", "sub_kind": "evicted_after_decision"}]


def test_prefix_evidence_equals_the_one_shot_build(stores: tuple[Store, Store, list[str]]) -> None:
    one, inc, _ = stores
    assert _prefix_rows(inc) == _prefix_rows(one)


@pytest.mark.parametrize("relation", COMPARED)
def test_slices_give_the_one_shot_relations(stores: tuple[Store, Store, list[str]], relation: str) -> None:
    one, inc, _ = stores
    a, b = relation_rows(one, relation), relation_rows(inc, relation)
    assert a == b, (f"{relation}: one-shot {len(a)} rows, incremental {len(b)}\n"
                    f"only one-shot: {sorted(set(a) - set(b))[:3]}\n"
                    f"only incremental: {sorted(set(b) - set(a))[:3]}")


def test_a_slice_reads_each_earlier_candidate_once(tmp_path: Path) -> None:
    """The candidates of the lookback's decisions come from the store, once each: a slice whose
    region holds none of them must not also reconstruct them (from the run's replicas) beside
    the stored rows, which would count every earlier decision twice in what reads them
    (herding episodes, the in-flight ordering)."""
    early, late = scenario()
    inc = _store(tmp_path / "inc.duckdb", incremental=True)
    try:
        _append(inc, early)
        inc.refresh()
        _append(inc, late)
        seen: dict[str, list[tuple[Any, ...]]] = {}
        cur = inc._con.cursor()

        def on_built(step: str, _: float) -> None:
            if step == "build int_attr_candidates_state":
                seen["twice"] = cur.execute(
                    "select r.request_id, c.replica, count(*) "
                    "from temp.main.int_attr_candidates_resolved as c "
                    "join temp.main.int_attr_decisions_resolved as r using (decision_key) "
                    "group by all having count(*) > 1 order by all").fetchall()
                seen["lookback"] = cur.execute(
                    "select distinct r.request_id from temp.main.int_attr_candidates_resolved "
                    "join temp.main.int_attr_decisions_resolved as r using (decision_key) "
                    "where r.request_id in ('req-1', 'req-2') order by 1").fetchall()

        try:
            assert _incremental.refresh(cur, on_built=on_built) is not None
        finally:
            cur.close()
        # the scenario puts earlier decisions in the slice's lookback (their candidates are read)
        assert seen["lookback"] == [("req-1",), ("req-2",)]
        assert seen["twice"] == []
    finally:
        inc.close()
