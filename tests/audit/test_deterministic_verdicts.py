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
from test_attribution import Fleet, rows, seen

from audit._store import Store
from routeaudit._demo import SAMPLE_DIR

VERDICT = ("request_key, cause, coalesce(sub_kind, '') as sub_kind, is_primary, excess_ms, "
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


def tie_fleet(order_seed: int) -> Fleet:
    """A has ten 1000-token prompts queued; S (1000 tokens) is sent there at t=100. B and C are
    idle and were calibrated on the same eight executions, so their estimated TTFT for S is
    the same number. The router saw A with 1 waiting, B with 0 and C with 3: judged against B,
    S is misrouting (the router saw A busier than B and still chose it); against C it would be
    stale telemetry (the router saw A less busy than C). The executions are stored in an order
    shuffled by ``order_seed``."""
    f = Fleet()
    f.backlog("A", 10)
    for replica in ("B", "C"):
        for k in range(8):
            tokens = 300 + 137 * k
            e = f.served(f"cal{replica}{k}", replica, arrive=-100_000.0 + 3000 * k, queue=0.0,
                         input_tokens=tokens)
            # prefill times with decimals, as measured: their sums round in the last bits
            prefill = tokens * 0.9 + (k * k * 0.1234567) % 7.3
            e.update(prefill_ms=prefill, ttft_ms=prefill, e2e_ms=prefill + 500.0)
    f.decision("S", at_ms=100.0, chosen="A", candidates=[
        {"replica": "A", "predicted_cached_tokens": 0, **seen(1, 0)},
        {"replica": "B", "predicted_cached_tokens": 0, **seen(0, 0)},
        {"replica": "C", "predicted_cached_tokens": 0, **seen(3, 0)},
    ])
    f.served("S", "A", arrive=100.0, queue=9900.0, input_tokens=1000)
    random.Random(order_seed).shuffle(f.rows["executions"])
    return f


def test_an_exact_tie_between_alternatives_is_broken_by_the_replica_name() -> None:
    verdicts = set()
    for seed in range(4):
        con = tie_fleet(seed).store()
        for threads in (1, 4):
            con.execute(f"set threads = {threads}")
            verdicts.add(tuple(
                tuple(r.values()) for r in rows(
                    con, f"select {VERDICT} from attributions where request_id = 'S' order by all")
            ))
        con.close()
    assert len(verdicts) == 1, verdicts
    (got,) = verdicts
    primary = [r for r in got if r[3]]
    assert len(primary) == 1
    # the tie goes to B (named first), against which the choice is a plain misroute
    assert primary[0][1] == "misrouting", primary
    assert "B: true waiting=0" in primary[0][6]
