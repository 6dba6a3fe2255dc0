"""Summaries over a window of partitions (prefill fits, client-gap medians, fleet medians): a
drifting replica is followed partition by partition, and partitions stored later never move an
earlier partition's summaries or verdicts (docs/architecture.md, "Always-on analysis")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pytest
from relation_rows import MS, T0, RawRows, query

import semconv
from audit._store import Store

PARTITION_S = 60
WINDOW = 2
P0 = T0 // (PARTITION_S * 10**9)
"""The first partition of the scenario (T0 is a multiple of the partition width)."""

REPLICAS = ("127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003")
SLOW = REPLICAS[0]
PROMPTS = (300, 600, 900, 1200)


def _request(rows: RawRows, n: int, start_ns: int, replica: str, tokens: int,
             ms_per_token: float, client_gap_ms: float) -> None:
    """Client -> decision over every replica (all idle) -> forward -> replica, one trace; the
    replica prefills ``tokens`` at ``ms_per_token``; the client sees its first token
    ``client_gap_ms`` after the replica's."""
    t, rid = f"{n:x}a", f"req-{n}"
    prefill_ms = tokens * ms_per_token
    ttft_ms = 1.0 + prefill_ms
    e2e_ms = ttft_ms + 200.0
    client_end = start_ns + int((e2e_ms + client_gap_ms + 10) * MS)
    rows.span(
        t, f"{n:x}c", None, semconv.SPAN_CLIENT, kind="client", start_ns=start_ns, end_ns=client_end,
        attrs={semconv.COMPONENT: "client", semconv.REQUEST_ID: rid, semconv.REQUEST_STREAM: True,
               semconv.REQUEST_INPUT_TOKENS: tokens, semconv.HTTP_STATUS: 200, semconv.STATUS: "ok",
               semconv.CLIENT_TTFT_MS: ttft_ms + client_gap_ms,
               semconv.CLIENT_E2E_MS: e2e_ms + client_gap_ms, semconv.USAGE_OUTPUT_TOKENS: 11},
        resource={semconv.HOST_NAME: "client-host", semconv.RUN_ID: "run-1"},
    )
    decided = start_ns + 2 * MS
    rows.span(
        t, f"{n:x}d", f"{n:x}c", semconv.SPAN_DECISION, start_ns=start_ns + MS, end_ns=decided,
        attrs={semconv.COMPONENT: "router", semconv.REQUEST_ID: rid, semconv.ATTEMPT: 0,
               semconv.ROUTER_POLICY: "least_load", semconv.DECISION_CHOSEN: replica,
               semconv.DECISION_OUTCOME: "routed", semconv.DECISION_CANDIDATE_COUNT: len(REPLICAS),
               semconv.DECISION_TIME: decided},
        resource={semconv.HOST_NAME: "router-host", semconv.ROUTER_ID: "r1"},
        events=[(semconv.EVENT_CANDIDATE, decided, {
            semconv.CANDIDATE_REPLICA: r, semconv.CANDIDATE_ELIGIBLE: True,
            semconv.CANDIDATE_CHOSEN: r == replica, semconv.CANDIDATE_WAITING: 0,
            semconv.CANDIDATE_RUNNING: 0, semconv.CANDIDATE_PREDICTED_CACHED_TOKENS: 0,
        }) for r in REPLICAS],
    )
    rows.span(
        t, f"{n:x}f", f"{n:x}d", semconv.SPAN_FORWARD, kind="client",
        start_ns=decided, end_ns=client_end - MS,
        attrs={semconv.COMPONENT: "router", semconv.URL_FULL: f"http://{replica}/v1/chat/completions",
               semconv.HTTP_STATUS: "200"},
        resource={semconv.HOST_NAME: "router-host", semconv.ROUTER_ID: "r1"},
    )
    arrive = decided + MS
    rows.span(
        t, f"{n:x}e", f"{n:x}f", semconv.SPAN_VLLM_REQUEST, kind="server",
        start_ns=arrive, end_ns=arrive + int(e2e_ms * MS),
        attrs={semconv.REPLICA_ID: replica, semconv.GEN_AI_REQUEST_ID: f"chatcmpl-{rid}",
               semconv.USAGE_PROMPT_TOKENS: tokens, semconv.USAGE_COMPLETION_TOKENS: 11,
               semconv.LATENCY_QUEUE_S: 0.001, semconv.LATENCY_PREFILL_S: prefill_ms / 1000,
               semconv.LATENCY_TTFT_S: ttft_ms / 1000, semconv.LATENCY_DECODE_S: 0.2,
               semconv.LATENCY_E2E_S: e2e_ms / 1000, semconv.RESPONSE_FINISH_REASONS: ["stop"]},
        resource={semconv.HOST_NAME: "replica-host"},
    )


def _partition(rows: RawRows, part: int, slow_ms_per_token: float, client_gap_ms: float) -> None:
    """One partition of traffic: every replica gets each prompt length once, one request every
    4.5 s (so no two overlap on a replica); the others prefill at 1 ms/token."""
    start = (P0 + part) * PARTITION_S * 10**9 + 1000 * MS
    i = 0
    for tokens in PROMPTS:
        for replica in REPLICAS:
            speed = slow_ms_per_token if replica == SLOW else 1.0
            _request(rows, part * 100 + i, start + i * 4500 * MS, replica, tokens, speed, client_gap_ms)
            i += 1


def _early() -> RawRows:
    """Partitions 0..5: the slow replica's prefill runs at 1 ms/token, then at 2 from 3 on."""
    rows = RawRows()
    for part in range(6):
        _partition(rows, part, 1.0 if part < 3 else 2.0, client_gap_ms=20.0)
    return rows


def _later() -> RawRows:
    """The next partition and a much later one: slower again (4 ms/token), clients far away."""
    rows = RawRows()
    for part in (6, 30):
        _partition(rows, part, 4.0, client_gap_ms=800.0)
    return rows


FITS = (f"select part - {P0} as p, replica, prefill_n, fit_slope, fit_intercept, fit_ratio, "
        "decode_ms_per_token, pooled_slope, pooled_ratio, idle_n, idle_slope "
        "from int_attr_replica_fits")
GAPS = f"select part - {P0} as p, run_gap_p50_ms from int_attr_client_gaps"
ESTIMATED = (f"select r.part - {P0} as p, e.request_key, e.replica, e.calibrated_from, "
             "e.prefill_ms_per_token, e.fleet_prefill_ms_per_token, e.ttft_est_ms "
             "from int_attr_candidates_estimated as e inner join requests as r using (request_key)")
ATTRIBUTIONS = f"select * exclude (verdict_final) replace (part - {P0} as part) from attributions"


def _rounded(value: Any) -> Any:
    # a parallel aggregate adds in no fixed order: the last bits of a float sum vary by build
    # (an intercept of 0 comes out as ±1e-13)
    return round(float(f"{value:.9g}"), 6) + 0.0 if isinstance(value, float) else value


def _rows(store: Store, sql: str) -> list[dict[str, Any]]:
    found = [{k: _rounded(v) for k, v in r.items()} for r in query(store, sql).to_dicts()]
    return sorted(found, key=repr)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, list[dict[str, Any]]]]]:
    """The summaries of a store holding partitions 0..5, before and after the later partitions
    were appended to it."""
    path = tmp_path_factory.mktemp("windowed") / "audit.duckdb"
    con = duckdb.connect(str(path))
    con.execute("create table routeaudit_meta (key varchar primary key, value varchar)")
    con.execute("insert into routeaudit_meta values ('partition_s', ?), ('window_partitions', ?)",
                [str(PARTITION_S), str(WINDOW)])
    con.close()
    store = Store(path)
    seen: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for name, rows in (("early", _early()), ("later", _later())):
            spans, events = rows.tables()
            store.append(spans=spans, events=events)
            store.refresh()
            seen[name] = {what: _rows(store, sql) for what, sql in
                          (("fits", FITS), ("gaps", GAPS), ("estimated", ESTIMATED),
                           ("attributions", ATTRIBUTIONS))}
        yield seen
    finally:
        store.close()


def _fit(fits: list[dict[str, Any]], part: int, replica: str) -> dict[str, Any]:
    found = [f for f in fits if f["p"] == part and f["replica"] == replica]
    assert len(found) == 1, (part, replica, found)
    return found[0]


def test_a_replica_slowing_down_is_followed_partition_by_partition(
        stores: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    fits = stores["early"]["fits"]
    assert {f["p"] for f in fits} == set(range(6))
    # partition 2 learns from partitions 0..2 (1 ms/token), 5 from 3..5 (2 ms/token)
    assert _fit(fits, 2, SLOW)["fit_slope"] == pytest.approx(1.0)
    assert _fit(fits, 5, SLOW)["fit_slope"] == pytest.approx(2.0)
    assert _fit(fits, 5, SLOW)["prefill_n"] == 3 * len(PROMPTS)
    assert 1.0 < _fit(fits, 3, SLOW)["fit_ratio"] < 2.0
    assert _fit(fits, 5, REPLICAS[1])["fit_slope"] == pytest.approx(1.0)
    # a request of partition 5 is estimated on the slow replica at its speed then, against a
    # fleet median of 1 ms/token
    est = [e for e in stores["early"]["estimated"] if e["p"] == 5 and e["replica"] == SLOW]
    assert est and all(e["calibrated_from"] == "replica" for e in est)
    assert all(e["prefill_ms_per_token"] == pytest.approx(2.0) for e in est)
    assert all(e["fleet_prefill_ms_per_token"] == pytest.approx(1.0) for e in est)
    early = [e for e in stores["early"]["estimated"] if e["p"] == 2 and e["replica"] == SLOW]
    assert early and all(e["prefill_ms_per_token"] == pytest.approx(1.0) for e in early)


def test_later_partitions_leave_earlier_summaries_and_verdicts_unchanged(
        stores: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    before, after = stores["early"], stores["later"]
    for what in ("fits", "gaps", "estimated"):
        kept = [r for r in after[what] if r["p"] < 6]
        assert kept == before[what], what
    kept = [r for r in after["attributions"] if r["part"] < 6]
    assert kept == before["attributions"]
    assert {r["part"] for r in before["attributions"]} >= {3, 4, 5}, "slow requests to judge"
    # the later partitions have summaries of their own: partition 30's window is itself
    assert _fit(after["fits"], 30, SLOW)["fit_slope"] == pytest.approx(4.0)
    assert _fit(after["fits"], 6, SLOW)["prefill_n"] == 3 * len(PROMPTS)
    gaps = {g["p"]: g["run_gap_p50_ms"] for g in after["gaps"]}
    assert gaps[5] == pytest.approx(20.0) and gaps[30] == pytest.approx(800.0)
    assert {a["part"] for a in after["attributions"]} >= {6, 30}
