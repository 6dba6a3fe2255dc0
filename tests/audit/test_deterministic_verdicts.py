"""The same spans give the same verdicts: whatever the order rows were stored in, the batches
they came in and DuckDB's thread count, every verdict column of ``attributions`` is equal.

Two ways a pick used to depend on the build: floating-point sums (the prefill fits) whose last
bits follow the order rows reach the aggregate, and ties between candidates or causes broken by
that noise. The synthetic case below makes the tie exact (two alternatives with the same
calibration points, hence the same estimate) and the verdict hinge on which one is picked.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from relation_rows import MS, T0, RawRows

import semconv
from audit._store import Store
from routeaudit._demo import SAMPLE_DIR

VERDICT = ("request_id, request_key, cause, coalesce(sub_kind, '') as sub_kind, is_primary, excess_ms, "
           "confidence, evidence, evidence_source, replica")
"""Every verdict column of ``attributions``."""


def build_sample(path: Path, *, seed: int, batches: int, threads: int) -> list[tuple[Any, ...]]:
    """A store of the committed sample, its traces appended in ``batches`` calls in an order
    shuffled by ``seed`` (0: as stored), rows shuffled within each call; its verdicts."""
    tables = {t: pq.read_table(SAMPLE_DIR / f"{t}.parquet") for t in ("raw_spans", "raw_span_events")}
    spans, events = tables["raw_spans"], tables["raw_span_events"]
    traces = sorted(set(spans.column("trace_id").to_pylist()))
    rng = random.Random(seed)
    if seed:
        rng.shuffle(traces)
    store = Store(path, threads=threads, incremental=False)
    try:
        for k in range(batches):
            chunk = pa.array(traces[k::batches])
            s = spans.filter(pc.is_in(spans["trace_id"], chunk))
            order = list(range(s.num_rows))
            if seed:
                rng.shuffle(order)
            store.append(spans=s.take(pa.array(order)),
                         events=events.filter(pc.is_in(events["trace_id"], chunk)))
        store.refresh()
        return store._con.execute(f"select {VERDICT} from attributions order by all").fetchall()
    finally:
        store.close()


@pytest.fixture(scope="module")
def sample_verdicts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[list[tuple[Any, ...]]]]:
    d = tmp_path_factory.mktemp("deterministic")
    yield [build_sample(d / "a.duckdb", seed=0, batches=1, threads=4),
           build_sample(d / "b.duckdb", seed=7, batches=5, threads=1)]


def test_the_sample_gives_the_same_verdicts_however_it_was_stored(
        sample_verdicts: list[list[tuple[Any, ...]]]) -> None:
    first, second = sample_verdicts
    assert len(first) > 100, "the sample has slow requests to explain"
    assert first == second


REPLICAS = {"A": "10.0.0.1:8000", "B": "10.0.0.2:8000", "C": "10.0.0.3:8000"}


def traced(rows: RawRows, n: int, replica: str, *, at_ms: float, queue_ms: float,
           prefill_ms: float, tokens: int, seen: dict[str, tuple[int, int]] | None = None) -> None:
    """One request's trace: client, decision (A, B and C as candidates, as ``seen`` waiting
    and running, else idle), forward and replica span, 500 ms of decode."""
    t, rid, b = f"{n:x}a", f"tie-{n}", T0 + int(at_ms * MS)
    host = REPLICAS[replica]
    ttft = queue_ms + prefill_ms
    e2e = ttft + 500.0
    router = {semconv.HOST_NAME: "router-host", semconv.ROUTER_ID: "r1", semconv.RUN_ID: "tie"}
    rows.span(t, f"{n:x}c", None, semconv.SPAN_CLIENT, kind="client", start_ns=b,
              end_ns=b + int((e2e + 30) * MS),
              attrs={semconv.COMPONENT: "client", semconv.REQUEST_ID: rid,
                     semconv.REQUEST_INPUT_TOKENS: tokens, semconv.REQUEST_STREAM: True,
                     semconv.STATUS: "ok", semconv.CLIENT_TTFT_MS: ttft + 20.0,
                     semconv.CLIENT_E2E_MS: e2e + 30.0, semconv.USAGE_OUTPUT_TOKENS: 11},
              resource={semconv.HOST_NAME: "client-host", semconv.RUN_ID: "tie"})
    events = [
        (semconv.EVENT_CANDIDATE, b + 2 * MS, {
            semconv.CANDIDATE_REPLICA: h, semconv.CANDIDATE_ELIGIBLE: True,
            semconv.CANDIDATE_CHOSEN: name == replica,
            semconv.CANDIDATE_WAITING: (seen or {}).get(name, (0, 0))[0],
            semconv.CANDIDATE_RUNNING: (seen or {}).get(name, (0, 0))[1],
            semconv.CANDIDATE_TELEMETRY_AGE_MS: 50.0,
            semconv.CANDIDATE_PREDICTED_CACHED_TOKENS: 0})
        for name, h in REPLICAS.items()]
    rows.span(t, f"{n:x}d", f"{n:x}c", semconv.SPAN_DECISION, start_ns=b + MS,
              end_ns=b + 3 * MS,
              attrs={semconv.COMPONENT: "router", semconv.REQUEST_ID: rid, semconv.ATTEMPT: 0,
                     semconv.ROUTER_POLICY: "cache_aware", semconv.DECISION_CHOSEN: host,
                     semconv.DECISION_OUTCOME: "routed", semconv.DECISION_CANDIDATE_COUNT: 3,
                     semconv.DECISION_TIME: b + 2 * MS},
              resource=router, events=events)
    rows.span(t, f"{n:x}f", f"{n:x}d", semconv.SPAN_FORWARD, kind="client",
              start_ns=b + 3 * MS, end_ns=b + int((e2e + 20) * MS),
              attrs={semconv.COMPONENT: "router",
                     semconv.URL_FULL: f"http://{host}/v1/completions",
                     semconv.HTTP_STATUS: "200"}, resource=router)
    rows.span(t, f"{n:x}e", f"{n:x}f", semconv.SPAN_VLLM_REQUEST, kind="server",
              start_ns=b + 5 * MS, end_ns=b + 5 * MS + int(e2e * MS),
              attrs={semconv.GEN_AI_REQUEST_ID: f"cmpl-{rid}",
                     semconv.USAGE_PROMPT_TOKENS: tokens, semconv.USAGE_COMPLETION_TOKENS: 11,
                     semconv.USAGE_CACHE_READ_INPUT_TOKENS: 0,
                     semconv.LATENCY_TTFT_S: ttft / 1000, semconv.LATENCY_E2E_S: e2e / 1000,
                     semconv.LATENCY_QUEUE_S: queue_ms / 1000,
                     semconv.LATENCY_PREFILL_S: prefill_ms / 1000,
                     semconv.LATENCY_DECODE_S: 0.5, semconv.REPLICA_ID: host},
              resource={semconv.HOST_NAME: f"replica-{replica}"})


def tie_rows() -> RawRows:
    """A has ten 1000-token prompts queued at t=0; ``tie-999`` (1000 tokens) is sent there at
    t=100. B and C are idle and were calibrated on the same eight executions (prefill times
    with decimals, as measured: their sums round in the last bits), so their estimated TTFT
    for it is the same number. The router saw A with 1 waiting, B with 0 and C with 3: judged
    against B the choice is misrouting (the router saw A busier than B and still chose it),
    against C it would be stale telemetry (it saw A less busy than C)."""
    rows = RawRows()
    n = 1
    for replica in ("B", "C"):
        for k in range(8):
            tokens = 300 + 137 * k
            traced(rows, n, replica, at_ms=-100_000.0 + 3000 * k, queue_ms=0.0,
                   prefill_ms=tokens * 0.9 + (k * k * 0.1234567) % 7.3, tokens=tokens)
            n += 1
    for i in range(10):
        traced(rows, n, "A", at_ms=0.0, queue_ms=1000.0 * i, prefill_ms=1000.0, tokens=1000)
        n += 1
    traced(rows, 999, "A", at_ms=100.0, queue_ms=9900.0, prefill_ms=1000.0, tokens=1000,
           seen={"A": (1, 0), "B": (0, 0), "C": (3, 0)})
    return rows


def tie_verdicts(path: Path, *, seed: int, batches: int, threads: int) -> list[tuple[Any, ...]]:
    spans, events = tie_rows().tables()
    order = list(range(spans.num_rows))
    random.Random(seed).shuffle(order)
    spans = spans.take(pa.array(order))
    store = Store(path, threads=threads, incremental=False)
    try:
        for k in range(batches):
            part = spans.slice(k * spans.num_rows // batches,
                               (k + 1) * spans.num_rows // batches - k * spans.num_rows // batches)
            # a span's events come with it (Store.append)
            ids = pa.array(set(part.column("span_id").to_pylist()))
            store.append(spans=part, events=events.filter(pc.is_in(events["span_id"], ids)))
        store.refresh()
        return store._con.execute(f"select {VERDICT} from attributions order by all").fetchall()
    finally:
        store.close()


def test_an_exact_tie_between_alternatives_is_broken_by_the_replica_name(tmp_path: Path) -> None:
    """Three insert orders, in one or two batches, on one or four threads. (With sums of
    doubles in the fits, order 2 picked the other alternative than order 0, and the verdict
    went from misrouting to stale_telemetry or back.)"""
    builds = [tie_verdicts(tmp_path / f"{seed}.duckdb", seed=seed, batches=1 + seed % 2,
                           threads=(1, 4)[seed % 2]) for seed in range(3)]
    differ = [seed for seed, b in enumerate(builds) if b != builds[0]]
    assert differ == [], "insert orders whose verdicts differ from order 0's"
    (s,) = [r for r in builds[0] if r[0] == "tie-999" and r[4]]
    # the tie goes to B (named first), against which the choice is a plain misroute
    assert s[2] == "misrouting", s
    assert f"{REPLICAS['B']}: true waiting=0" in s[7]
